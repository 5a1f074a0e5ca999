//! Unit tests of a scenario's own data: sources, paths, natural partitions, pool sizes.
//! Owns: those tests and their small generated fixtures (written into temp folders).
//! Must not: hold code the module itself uses.

use super::*;
use crate::learn::{Federation, Labels};
use std::path::Path;

/// A CSV with a header `x0,x1,site,label`: `n` rows, class names `cat`/`dog`/`emu` by row,
/// site `a`/`b` by row parity.
fn write_csv(path: &Path, n: usize) {
    let mut text = String::from("x0,x1,site,label\n");
    for i in 0..n {
        let class = ["cat", "dog", "emu"][i % 3];
        let site = if i % 2 == 0 { "a" } else { "b" };
        text += &format!("{},{},{site},{class}\n", i % 3, (i * 7 % 5) as f32 / 5.0);
    }
    std::fs::write(path, text).unwrap();
}

/// Writes `text` as `dir/scenario.toml` and loads it.
fn load(dir: &Path, text: &str) -> Result<Scenario, ScenarioError> {
    let p = dir.join("scenario.toml");
    std::fs::write(&p, text).unwrap();
    Scenario::load(&p)
}

fn federation(s: &Scenario, seed: u64) -> Federation {
    let data = s.load_real(None).unwrap();
    s.federation(data.as_ref(), &mut Scenario::data_rng(seed))
        .unwrap()
}

fn ids(d: &crate::learn::Dataset) -> Vec<u32> {
    match &d.labels {
        Labels::Class { ids, .. } => ids.clone(),
        Labels::Real(_) => unreachable!(),
    }
}

#[test]
fn csv_pool_by_header_name_relative_to_the_scenario_file() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("data")).unwrap();
    write_csv(&tmp.path().join("data/pool.csv"), 300);
    // Features as read (`standardize = false`): the test below reads them back.
    let text = "[data]\nsource = \"csv\"\nfiles = [\"data/pool.csv\"]\nlabel_column = \"label\"\n\
                silo_column = \"site\"\nstandardize = false\n[split]\nkind = \"natural\"\n";
    // From another working directory: the path is the scenario file's.
    let s = load(tmp.path(), text).unwrap();
    assert_eq!(s.split.clients, 2, "two sites");
    let f = federation(&s, 1);
    assert_eq!(f.clients.len(), 2);
    for c in &f.clients {
        assert_eq!(c.train.len() + c.test.len(), 150);
        assert_eq!(
            c.train.sample_shape,
            [2],
            "the site column is not a feature"
        );
        assert_eq!(c.train.num_classes(), Some(3));
    }
    // Class names sorted: cat 0, dog 1, emu 2; feature x0 is the class index.
    let c = &f.clients[0].train;
    for (i, y) in ids(c).iter().enumerate() {
        assert_eq!(c.row(i)[0], *y as f32);
    }
    // One pool cut by a partitioner instead, sized in samples.
    let text = "[data]\nsource = \"csv\"\nfiles = [\"data/pool.csv\"]\nlabel_column = \"label\"\n\
                samples = 240\n[split]\nkind = \"iid\"\nclients = 4\n";
    let e = federation_err(tmp.path(), text);
    assert!(e.contains("\"site\"") && e.contains("not a number"), "{e}");
    std::fs::write(
        tmp.path().join("data/pool.csv"),
        std::fs::read_to_string(tmp.path().join("data/pool.csv"))
            .unwrap()
            .replace(",a,", ",")
            .replace(",b,", ",")
            .replace(",site,", ","),
    )
    .unwrap();
    let s = load(tmp.path(), text).unwrap();
    let f = federation(&s, 1);
    assert_eq!(f.clients.len(), 4);
    assert!(f.clients.iter().all(|c| c.train.len() + c.test.len() == 60));
    // Same seed, same split.
    let g = federation(&s, 1);
    assert!(
        f.clients
            .iter()
            .zip(&g.clients)
            .all(|(a, b)| a.train == b.train)
    );
}

#[test]
fn natural_silos_from_files_a_pattern_and_mismatches() {
    let tmp = tempfile::tempdir().unwrap();
    let sites = tmp.path().join("sites");
    std::fs::create_dir(&sites).unwrap();
    for (k, n) in [30, 45, 60].iter().enumerate() {
        write_csv(&sites.join(format!("site-{k}.csv")), *n);
    }
    let base = "[data]\nsource = \"csv\"\nlabel_column = \"label\"\n[split]\nkind = \"natural\"\n";
    let listed = base.replace(
        "label_column = \"label\"\n",
        "label_column = \"label\"\nsilos = [\"sites/site-2.csv\", \"sites/site-0.csv\"]\n",
    );
    // The site column is text, and here not named as the silo column: the error names it.
    let e = federation_err(tmp.path(), &listed);
    assert!(e.contains("site-2.csv") && e.contains("\"site\""), "{e}");
    for k in 0..3 {
        let p = sites.join(format!("site-{k}.csv"));
        let t = std::fs::read_to_string(&p).unwrap();
        std::fs::write(
            &p,
            t.replace(",a,", ",")
                .replace(",b,", ",")
                .replace(",site,", ","),
        )
        .unwrap();
    }
    let s = load(tmp.path(), &listed).unwrap();
    assert_eq!(s.split.clients, 2);
    let f = federation(&s, 3);
    assert_eq!(
        f.clients[0].train.len() + f.clients[0].test.len(),
        60,
        "list order"
    );
    let pattern = base.replace(
        "label_column = \"label\"\n",
        "label_column = \"label\"\nsilos = \"sites/site-*.csv\"\n",
    );
    let s = load(tmp.path(), &pattern).unwrap();
    assert_eq!(s.split.clients, 3);
    let sizes: Vec<usize> = federation(&s, 3)
        .clients
        .iter()
        .map(|c| c.train.len() + c.test.len())
        .collect();
    assert_eq!(sizes, [30, 45, 60], "sorted by name");
    // A folder works as the pattern of its entries.
    let folder = pattern.replace("sites/site-*.csv", "sites");
    assert_eq!(load(tmp.path(), &folder).unwrap().split.clients, 3);
    // split.clients given and different: a clear error.
    let e = load(
        tmp.path(),
        &pattern.replace("[split]\n", "[split]\nclients = 4\n"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("split.clients = 4") && e.contains("3 silos"),
        "{e}"
    );
    assert!(
        load(
            tmp.path(),
            &pattern.replace("[split]\n", "[split]\nclients = 3\n")
        )
        .is_ok()
    );
    // Groups, in silo order, by name or number; a count that does not match is an error
    // naming the silos.
    let grouped =
        |groups: &str| pattern.replace("silos = ", &format!("silo_groups = {groups}\nsilos = "));
    let s = load(tmp.path(), &grouped(r#"["north", "south", "north"]"#)).unwrap();
    let g: Vec<Option<usize>> = federation(&s, 3).clients.iter().map(|c| c.group).collect();
    assert_eq!(g, [Some(0), Some(1), Some(0)]);
    let s = load(tmp.path(), &grouped("[7, 7, 2]")).unwrap();
    let g: Vec<Option<usize>> = federation(&s, 3).clients.iter().map(|c| c.group).collect();
    assert_eq!(g, [Some(0), Some(0), Some(1)]);
    let e = federation_err(tmp.path(), &grouped("[0, 1]"));
    assert!(
        e.contains("data.silo_groups has 2 entries")
            && e.contains("3 silos")
            && e.contains("site-2.csv"),
        "{e}"
    );
    // kind must say natural.
    let e = load(tmp.path(), &pattern.replace("natural", "iid"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("split.kind = \"natural\""), "{e}");
    // Other splits know their groups.
    let e = load(tmp.path(), "[data]\nsilo_groups = [0, 1]\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("data.silo_groups is for own data"), "{e}");
    // A silo file with no rows names the file.
    std::fs::write(sites.join("site-1.csv"), "x0,x1,label\n").unwrap();
    let e = federation_err(tmp.path(), &pattern);
    assert!(e.contains("site-1.csv") && e.contains("no samples"), "{e}");
}

fn federation_err(dir: &Path, text: &str) -> String {
    let s = match load(dir, text) {
        Ok(s) => s,
        Err(e) => return e.to_string(),
    };
    match s.load_real(None) {
        Err(e) => e.to_string(),
        Ok(d) => s
            .federation(d.as_ref(), &mut Scenario::data_rng(1))
            .map(|_| ())
            .unwrap_err()
            .to_string(),
    }
}

#[test]
fn bad_csv_input_names_file_line_and_column() {
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("d.csv");
    let text = "[data]\nsource = \"csv\"\nfiles = [\"d.csv\"]\nlabel_column = \"label\"\n\
                [split]\nkind = \"iid\"\nclients = 2\n";
    let e = federation_err(tmp.path(), text);
    assert!(e.contains("d.csv") && e.contains("No such file"), "{e}");
    std::fs::write(&p, "a,b,label\n1,2,x\n1,oops,y\n").unwrap();
    let e = federation_err(tmp.path(), text);
    assert!(
        e.contains("d.csv: line 3: column 1 (\"b\"): \"oops\" is not a number"),
        "{e}"
    );
    std::fs::write(&p, "a,b,y\n1,2,x\n").unwrap();
    let e = federation_err(tmp.path(), text);
    assert!(
        e.contains("d.csv") && e.contains("\"label\" is not a column") && e.contains("a, b, y"),
        "{e}"
    );
    std::fs::write(&p, "1,2,3\n").unwrap();
    let e = federation_err(tmp.path(), text);
    assert!(e.contains("no header row"), "{e}");
}

#[test]
fn samples_and_fraction_size_the_pool_one_way_at_a_time() {
    let tmp = tempfile::tempdir().unwrap();
    let mut text = String::from("a,label\n");
    for i in 0..100 {
        text += &format!("{i},{}\n", i % 2);
    }
    std::fs::write(tmp.path().join("d.csv"), text).unwrap();
    let base =
        "[data]\nsource = \"csv\"\nfiles = [\"d.csv\"]\n[split]\nkind = \"iid\"\nclients = 2\n";
    let both = base.replace("[split]", "samples = 50\nfraction = 0.5\n[split]");
    let e = load(tmp.path(), &both).unwrap_err().to_string();
    assert!(e.contains("not both"), "{e}");
    // --set of one drops the other.
    let p = tmp.path().join("s.toml");
    std::fs::write(&p, base.replace("[split]", "samples = 50\n[split]")).unwrap();
    let s = Scenario::load_with(&p, &["data.fraction=0.5".to_string()]).unwrap();
    assert_eq!((s.data.samples, s.data.fraction), (None, Some(0.5)));
    let by_fraction = federation(&s, 2);
    let s = Scenario::load(&p).unwrap();
    let by_samples = federation(&s, 2);
    assert!(
        by_fraction
            .clients
            .iter()
            .zip(&by_samples.clients)
            .all(|(a, b)| a.train == b.train && a.test == b.test)
    );
    let s = load(
        tmp.path(),
        &base.replace("[split]", "samples = 101\n[split]"),
    )
    .unwrap();
    let e = s
        .federation(
            s.load_real(None).unwrap().as_ref(),
            &mut Scenario::data_rng(1),
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("data.samples = 101") && e.contains("holds 100"),
        "{e}"
    );
    // Own files default to the whole pool.
    let s = load(tmp.path(), base).unwrap();
    let f = federation(&s, 1);
    assert_eq!(
        f.clients
            .iter()
            .map(|c| c.train.len() + c.test.len())
            .sum::<usize>(),
        100
    );
}

#[test]
fn idx_of_any_size_and_image_folders_with_a_test_set() {
    let tmp = tempfile::tempdir().unwrap();
    // 8x8 IDX: 40 images, labels 0..4.
    let n = 40u32;
    let mut img = Vec::new();
    for v in [0x803u32, n, 8, 8] {
        img.extend_from_slice(&v.to_be_bytes());
    }
    img.extend((0..n as usize * 64).map(|i| (i / 64 % 4 * 60) as u8));
    let mut lbl = Vec::new();
    for v in [0x801u32, n] {
        lbl.extend_from_slice(&v.to_be_bytes());
    }
    lbl.extend((0..n).map(|i| (i % 4) as u8));
    std::fs::write(tmp.path().join("img"), img).unwrap();
    std::fs::write(tmp.path().join("lbl"), lbl).unwrap();
    let text = "[data]\nsource = \"idx\"\nfiles = [\"img\", \"lbl\"]\n[split]\nkind = \"label_groups\"\n\
                clients = 4\ngroups = 2\nassign = \"balanced\"\n[model]\nkind = \"cnn\"\nconv = [4]\n";
    let s = load(tmp.path(), text).unwrap();
    let f = federation(&s, 1);
    assert_eq!(f.clients[0].train.sample_shape, [1, 8, 8]);
    let mut per_group = [0, 0];
    for c in &f.clients {
        per_group[c.group.unwrap()] += 1;
    }
    assert_eq!(per_group, [2, 2], "balanced");
    // Images: a folder per silo, a shared test folder scored per silo on its classes.
    use crate::learn::loaders::write_image_folder as write_folder;
    write_folder(&tmp.path().join("s0"), &["cat", "dog"], 6, 8, 8, false);
    write_folder(&tmp.path().join("s1"), &["dog", "emu"], 6, 8, 8, true);
    write_folder(
        &tmp.path().join("test"),
        &["cat", "dog", "emu"],
        3,
        8,
        8,
        false,
    );
    let text = "[data]\nsource = \"images\"\nsilos = [\"s0\", \"s1\"]\ntest_files = [\"test\"]\n\
                [split]\nkind = \"natural\"\n";
    let s = load(tmp.path(), text).unwrap();
    let f = federation(&s, 1);
    assert_eq!(f.clients.len(), 2);
    let c0 = &f.clients[0];
    assert_eq!(c0.train.sample_shape, [3, 8, 8], "grey widened: s1 is RGB");
    assert_eq!(c0.train.len(), 12, "all its samples train");
    assert_eq!(
        ids(&c0.test),
        [0, 0, 0, 1, 1, 1],
        "cat and dog of the test set"
    );
    assert_eq!(ids(&f.clients[1].test), [1, 1, 1, 2, 2, 2]);
    let e = federation_err(tmp.path(), &text.replace("\"s1\"", "\"s9\""));
    assert!(e.contains("s9") && e.contains("no such folder"), "{e}");
}

#[test]
fn csv_features_are_standardized_on_the_silos_training_rows_unless_turned_off() {
    let tmp = tempfile::tempdir().unwrap();
    // Feature x0 = 500 + 80·(class index), x1 in [0, 1): columns in their own units.
    let mut text = String::from("x0,x1,site,label\n");
    for i in 0..300 {
        let class = ["cat", "dog", "emu"][i % 3];
        let site = if i % 2 == 0 { "a" } else { "b" };
        let x0 = 500 + 80 * (i % 3);
        text += &format!("{x0},{},{site},{class}\n", (i * 7 % 5) as f32 / 5.0);
    }
    std::fs::write(tmp.path().join("pool.csv"), text).unwrap();
    let scenario = |extra: &str| {
        format!(
            "[data]\nsource = \"csv\"\nfiles = [\"pool.csv\"]\nlabel_column = \"label\"\n\
             silo_column = \"site\"\n{extra}[split]\nkind = \"natural\"\n"
        )
    };
    let s = load(tmp.path(), &scenario("")).unwrap();
    assert!(s.standardizes(), "on by default for CSV");
    let data = s.load_real(None).unwrap();
    let (f, scale) = s
        .federation_scaled(data.as_ref(), &mut Scenario::data_rng(1))
        .unwrap();
    let scale = scale.expect("a CSV federation is standardized");
    // The constants are the training rows' (both silos together), and they give mean 0 and
    // std 1 there; the test rows are rescaled with the same constants.
    let train: Vec<f32> = f
        .clients
        .iter()
        .flat_map(|c| c.train.features.chunks(2).map(|r| r[0]))
        .collect();
    let n = train.len() as f32;
    let mean = train.iter().sum::<f32>() / n;
    let var = train.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / n;
    assert!(
        mean.abs() < 1e-4 && (var - 1.0).abs() < 1e-3,
        "{mean} {var}"
    );
    assert!((scale.mean[0] - 580.0).abs() < 10.0, "{:?}", scale.mean);
    for c in &f.clients {
        for (i, y) in ids(&c.test).iter().enumerate() {
            let raw = 500.0 + 80.0 * *y as f32;
            assert!((c.test.row(i)[0] - (raw - scale.mean[0]) / scale.std[0]).abs() < 1e-5);
        }
    }
    // The same split as without it: only the values change.
    let off = load(tmp.path(), &scenario("standardize = false\n")).unwrap();
    assert!(!off.standardizes());
    let raw = federation(&off, 1);
    for (a, b) in raw.clients.iter().zip(&f.clients) {
        assert_eq!(ids(&a.train), ids(&b.train));
        assert_eq!(a.train.row(0)[0], 500.0 + 80.0 * ids(&a.train)[0] as f32);
    }
    // Built-in data sets and synthetic sources have no such switch.
    let e = Scenario::parse("[data]\nsource = \"mnist\"\nstandardize = true\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("data.standardize is for own data"), "{e}");
}

#[test]
fn text_labels_name_the_classes_that_exported_models_carry() {
    let tmp = tempfile::tempdir().unwrap();
    write_csv(&tmp.path().join("pool.csv"), 60);
    let text = "[data]\nsource = \"csv\"\nfiles = [\"pool.csv\"]\nlabel_column = \"label\"\n\
                silo_column = \"site\"\n[split]\nkind = \"natural\"\n";
    let s = load(tmp.path(), text).unwrap();
    let names = ["cat", "dog", "emu"].map(String::from);
    assert_eq!(
        s.load_real(None).unwrap().unwrap().class_names(),
        Some(&names[..])
    );
    // A class beyond the names found (`data.classes`) is named by its id: one name a class,
    // as a card needs.
    let more = load(tmp.path(), &text.replace("[split]", "classes = 4\n[split]")).unwrap();
    let loaded = more.load_real(None).unwrap().unwrap();
    assert_eq!(loaded.class_names().unwrap(), ["cat", "dog", "emu", "3"]);
    // Integer labels are the class ids themselves.
    std::fs::write(
        tmp.path().join("ids.csv"),
        "x,site,label\n1,a,0\n2,a,1\n3,b,1\n4,b,0\n",
    )
    .unwrap();
    let ids = load(tmp.path(), &text.replace("pool.csv", "ids.csv")).unwrap();
    assert_eq!(ids.load_real(None).unwrap().unwrap().class_names(), None);
}

/// A Dirichlet split of a 3-class CSV with `split.clusters` unset runs (the default follows the
/// data: 4 clusters, or one a class where fewer); a `clusters` the user wrote that the data
/// cannot hold is refused naming `split.clusters`. The default used to be 4 whatever the data,
/// so the user got an error about a field they never wrote.
#[test]
fn dirichlet_clusters_default_to_the_data_and_a_written_one_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rows = String::from("x0,x1,label\n");
    for i in 0..300 {
        rows += &format!("{},{},{}\n", i % 3, i % 7, ["cat", "dog", "emu"][i % 3]);
    }
    std::fs::write(tmp.path().join("pool.csv"), rows).unwrap();
    let text = "[data]\nsource = \"csv\"\nfiles = [\"pool.csv\"]\nlabel_column = \"label\"\n\
                [split]\nkind = \"dirichlet\"\nclients = 4\nalpha = 0.5\n";
    let s = load(tmp.path(), text).unwrap();
    assert_eq!(s.split.clusters, None);
    assert_eq!(s.split.clusters_for(3), 3);
    assert_eq!(s.split.clusters_for(10), 4);
    let f = federation(&s, 1);
    assert_eq!(f.clients.len(), 4);
    let e = federation_err(tmp.path(), &format!("{text}clusters = 4\n"));
    assert!(
        e.contains("split.clusters = 4 is outside the allowed range 1..=3"),
        "{e}"
    );
}

/// `data.silo_tests`: each silo of `data.silos` scored on its own test file (same form, same
/// order, classes numbered with everything else), training on all its rows; a count that does
/// not match, a pool or a shared test set beside it are errors naming the fields.
#[test]
fn each_silo_is_scored_on_its_own_test_file() {
    let tmp = tempfile::tempdir().unwrap();
    for d in ["sites", "tests"] {
        std::fs::create_dir(tmp.path().join(d)).unwrap();
    }
    let plain = |p: &Path, n: usize, classes: &[&str]| {
        let mut text = String::from("x0,x1,label\n");
        for i in 0..n {
            text += &format!("{},{},{}\n", i % 3, i % 5, classes[i % classes.len()]);
        }
        std::fs::write(p, text).unwrap();
    };
    plain(&tmp.path().join("sites/a.csv"), 30, &["cat", "dog"]);
    plain(&tmp.path().join("sites/b.csv"), 40, &["dog", "emu"]);
    // Silo b's test file holds a class only silo a trains on: its own rows, as they come.
    plain(&tmp.path().join("tests/a.csv"), 7, &["cat"]);
    plain(&tmp.path().join("tests/b.csv"), 9, &["emu", "cat"]);
    let text = "[data]\nsource = \"csv\"\nlabel_column = \"label\"\nsilos = \"sites/*.csv\"\n\
                silo_tests = \"tests/*.csv\"\n[split]\nkind = \"natural\"\n";
    let s = load(tmp.path(), text).unwrap();
    let f = federation(&s, 3);
    let sizes: Vec<(usize, usize)> = f
        .clients
        .iter()
        .map(|c| (c.train.len(), c.test.len()))
        .collect();
    assert_eq!(sizes, [(30, 7), (40, 9)]);
    // One class numbering for all: cat 0, dog 1, emu 2.
    assert_eq!(ids(&f.clients[0].test), vec![0; 7]);
    assert_eq!(ids(&f.clients[1].test)[..2], [2, 0]);
    // The same test rows on every seed (the split's share no longer matters).
    assert_eq!(
        federation(&s, 9).clients[1].test.features,
        f.clients[1].test.features
    );
    // As a list too.
    let listed = text.replace(
        "silo_tests = \"tests/*.csv\"",
        "silo_tests = [\"tests/a.csv\", \"tests/b.csv\"]",
    );
    assert_eq!(
        federation(&load(tmp.path(), &listed).unwrap(), 3).clients[0]
            .test
            .len(),
        7
    );
    let e = load(tmp.path(), &listed.replace(", \"tests/b.csv\"", ""))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("data.silo_tests has 1 entries") && e.contains("has 2"),
        "{e}"
    );
    let e = load(
        tmp.path(),
        &text.replace(
            "silos = \"sites/*.csv\"",
            "test_files = [\"tests/a.csv\"]\nsilos = \"sites/*.csv\"",
        ),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("data.test_files") && e.contains("data.silo_tests"),
        "{e}"
    );
    let e = load(
        tmp.path(),
        "[data]\nsource = \"csv\"\nfiles = [\"sites/a.csv\"]\nsilo_tests = \"tests/*.csv\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("data.silo_tests") && e.contains("needs data.silos"),
        "{e}"
    );
}
