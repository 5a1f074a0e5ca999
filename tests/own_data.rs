//! A researcher's own data through `federico simulate`: a CSV file cut by label groups, an IDX
//! set of 8×8 images cut IID, and a folder of PNG images, one sub-folder per silo (natural
//! partitions), each written here by a small deterministic generator, with a scenario file
//! beside it that names the data by relative paths. Every algorithm runs on each for a few
//! rounds on two seeds, from another working directory, and must beat chance.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

const ALL: &str = "[\"local\", \"fedavg\", \"fedavg_plus\", \"federico\", \"fedcollab\", \"hcct\", \"feddisco\", \"fedsac\"]";
const CLASSES: usize = 4;

/// A small deterministic generator (xorshift), so the fixtures need no RNG crate.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Class `k`'s 8×8 image: a bright 4×4 quadrant (k = 0..4) on dim noise.
fn image(k: usize, g: &mut Gen) -> Vec<u8> {
    (0..64)
        .map(|p| {
            let (y, x) = (p / 8, p % 8);
            let quad = (y / 4) * 2 + x / 4;
            let base = if quad == k { 200.0 } else { 30.0 };
            (base + 50.0 * g.next()) as u8
        })
        .collect()
}

fn write_csv(dir: &Path) {
    let mut g = Gen(7);
    let mut text = String::from("f0,f1,f2,f3,f4,f5,diagnosis\n");
    for i in 0..480 {
        let k = i % CLASSES;
        let cells: Vec<String> = (0..6)
            .map(|j| {
                let centre = if j % CLASSES == k { 3.0 } else { 0.0 };
                format!("{:.3}", centre + g.next() - 0.5)
            })
            .collect();
        text += &format!(
            "{},{}\n",
            cells.join(","),
            ["flu", "cold", "covid", "none"][k]
        );
    }
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("data/patients.csv"), text).unwrap();
}

fn write_idx(dir: &Path) {
    let mut g = Gen(11);
    let n = 480u32;
    let (mut img, mut lbl) = (Vec::new(), Vec::new());
    for v in [0x803u32, n, 8, 8] {
        img.extend_from_slice(&v.to_be_bytes());
    }
    for v in [0x801u32, n] {
        lbl.extend_from_slice(&v.to_be_bytes());
    }
    for i in 0..n as usize {
        img.extend(image(i % CLASSES, &mut g));
        lbl.push((i % CLASSES) as u8);
    }
    std::fs::create_dir_all(dir.join("data")).unwrap();
    std::fs::write(dir.join("data/images-idx3-ubyte"), img).unwrap();
    std::fs::write(dir.join("data/labels-idx1-ubyte"), lbl).unwrap();
}

/// Four silos, each with two of the four classes (silo s holds classes s and s+1 mod 4).
fn write_folders(dir: &Path) {
    let mut g = Gen(13);
    let names = ["circle", "cross", "square", "star"];
    for s in 0..4 {
        for k in [s, (s + 1) % CLASSES] {
            let d = dir.join(format!("data/silos/hospital-{s}/{}", names[k]));
            std::fs::create_dir_all(&d).unwrap();
            for i in 0..30 {
                let px = image(k, &mut g);
                image::GrayImage::from_raw(8, 8, px)
                    .unwrap()
                    .save(d.join(format!("{i:03}.png")))
                    .unwrap();
            }
        }
    }
}

fn scenario(name: &str, data: &str, split: &str, model: &str) -> String {
    format!(
        "name = \"{name}\"\nseeds = [1, 2]\nrounds = 10\neval_every = 10\nthreads = 2\n\
         algorithms = {ALL}\n\n[data]\n{data}\n\n[split]\n{split}\n\n[model]\n{model}\n\n\
         [train]\nlr = 0.05\nbatch_size = 20\n\n[federico]\nneighbours = 2\nmstep = \"full\"\n\n\
         [fedcollab]\ndisc_hidden = 8\ndisc_max_rounds = 50\n\n[fedsac]\nlocal_steps = 20\n\n\
         [feddisco]\nlocal_epochs = 2\nlr = 0.1\n"
    )
}

/// Runs the scenario from another working directory; returns every algorithm's accuracy.
fn simulate(dir: &Path, file: &str) -> Vec<(String, f64)> {
    let out = dir.join(format!("out-{file}"));
    let elsewhere = tempfile::tempdir().unwrap();
    let res = Command::new(env!("CARGO_BIN_EXE_federico"))
        .current_dir(elsewhere.path())
        .arg("simulate")
        .arg(dir.join("project").join(file))
        .arg("--out")
        .arg(&out)
        .arg("--quiet")
        .output()
        .unwrap();
    assert!(
        res.status.success(),
        "{file}: {}",
        String::from_utf8_lossy(&res.stderr)
    );
    eprint!("{}", String::from_utf8_lossy(&res.stdout));
    let text = std::fs::read_to_string(out.join("summary.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["algorithms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["algorithm"].as_str().unwrap().to_string(),
                a["accuracy"].as_f64().unwrap(),
            )
        })
        .collect()
}

fn check(file: &str, results: &[(String, f64)]) {
    assert_eq!(results.len(), 8, "{file}: every algorithm ran: {results:?}");
    let chance = 1.0 / CLASSES as f64;
    for (alg, acc) in results {
        assert!(
            *acc > chance + 0.15,
            "{file}: {alg} at {acc:.3} is not above chance ({chance})"
        );
    }
}

#[test]
fn own_csv_idx_and_image_folders_run_every_algorithm() {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("project");
    write_csv(&project);
    write_idx(&project);
    write_folders(&project);
    let files = [
        (
            "csv.toml",
            scenario(
                "own-csv",
                "source = \"csv\"\nfiles = [\"data/patients.csv\"]\nlabel_column = \"diagnosis\"\nsamples = 400",
                "kind = \"label_groups\"\nclients = 4\ngroups = 2\nassign = \"balanced\"",
                "kind = \"softmax\"",
            ),
        ),
        (
            "idx.toml",
            scenario(
                "own-idx",
                "source = \"idx\"\nfiles = [\"data/images-idx3-ubyte\", \"data/labels-idx1-ubyte\"]",
                "kind = \"iid\"\nclients = 4",
                "kind = \"cnn\"\nconv = [4]",
            ),
        ),
        (
            "images.toml",
            scenario(
                "own-images",
                "source = \"images\"\nsilos = \"data/silos\"",
                "kind = \"natural\"",
                "kind = \"mlp\"\nhidden = [16]",
            ),
        ),
    ];
    for (file, text) in &files {
        std::fs::write(project.join(file), text).unwrap();
    }
    for (file, _) in &files {
        let results = simulate(tmp.path(), file);
        check(file, &results);
    }
}

/// Four silos of image folders, silos 0–1 holding classes 0 and 1 and silos 2–3 classes 2 and
/// 3, under class folders named `names`.
fn write_split_folders(dir: &Path, names: [&str; CLASSES]) {
    let mut g = Gen(17);
    for s in 0..4 {
        for k in if s < 2 { [0, 1] } else { [2, 3] } {
            let d = dir.join(format!("silos/silo-{s}/{}", names[k]));
            std::fs::create_dir_all(&d).unwrap();
            for i in 0..30 {
                image::GrayImage::from_raw(8, 8, image(k, &mut g))
                    .unwrap()
                    .save(d.join(format!("{i:03}.png")))
                    .unwrap();
            }
        }
    }
}

/// `predict` on an image folder maps its class sub-folders to the model's classes by name: a
/// silo holding classes 2 and 3 (folders `2` and `3`, or `square` and `star`) is scored on
/// those classes, not on classes 0 and 1 (the folders' positions, which scored 0 % before
/// every model named its classes), and a folder the model does not know is refused by name.
#[test]
fn predict_reads_image_folders_by_class_name_for_numeric_and_text_names() {
    for names in [["0", "1", "2", "3"], ["circle", "cross", "square", "star"]] {
        let tmp = tempfile::tempdir().unwrap();
        write_split_folders(tmp.path(), names);
        let text = "name = \"split-images\"\nseeds = [1]\nrounds = 10\neval_every = 10\n\
                    threads = 2\nalgorithms = [\"local\", \"federico\"]\n\n[data]\n\
                    source = \"images\"\nsilos = \"silos\"\n\n[split]\nkind = \"natural\"\n\n\
                    [model]\nkind = \"softmax\"\n\n[train]\nlr = 0.05\nbatch_size = 20\n\n\
                    [federico]\nneighbours = 2\nmstep = \"full\"\n";
        std::fs::write(tmp.path().join("images.toml"), text).unwrap();
        let run = |args: &[&str]| {
            Command::new(env!("CARGO_BIN_EXE_federico"))
                .current_dir(tmp.path())
                .args(args)
                .output()
                .unwrap()
        };
        let out = run(&[
            "simulate",
            "images.toml",
            "--export",
            "--quiet",
            "--out",
            "run",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for alg in ["local", "federico"] {
            let model = format!("run/seed-1/models/{alg}/silo-2/model.json");
            let card: Value =
                serde_json::from_str(&std::fs::read_to_string(tmp.path().join(&model)).unwrap())
                    .unwrap();
            assert_eq!(card["class_names"], serde_json::json!(names), "{alg}");
            let out = run(&["predict", "--model", &model, "--data", "silos/silo-2"]);
            let said = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{names:?} {alg}: {said}");
            let rows = String::from_utf8_lossy(&out.stdout);
            let (mut right, mut total) = (0, 0);
            for l in rows.lines().skip(1) {
                let f: Vec<&str> = l.split(',').collect();
                assert!(
                    f[2] == names[2] || f[2] == names[3],
                    "silo-2's labels are its own classes: {l}"
                );
                right += usize::from(f[1] == f[2]);
                total += 1;
            }
            assert_eq!(total, 60);
            assert!(
                right as f64 / total as f64 > 0.8,
                "{names:?} {alg}: {right} of {total} right\n{said}"
            );
        }
        // A class the model never had is refused, naming the folder.
        let odd = tmp.path().join("odd/ghost");
        std::fs::create_dir_all(&odd).unwrap();
        std::fs::copy(
            tmp.path()
                .join(format!("silos/silo-2/{}/000.png", names[2])),
            odd.join("a.png"),
        )
        .unwrap();
        let out = run(&[
            "predict",
            "--model",
            "run/seed-1/models/local/silo-2/model.json",
            "--data",
            "odd",
        ]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            said.contains("class folder \"ghost\" is not one of the model's classes"),
            "{said}"
        );
    }
}

/// One RGB image among grey ones turns the whole data set into 3-channel images: the run says
/// so, naming the file, where it used to widen the data (and the model) silently.
#[test]
fn a_colour_image_among_grey_ones_is_warned_about() {
    let tmp = tempfile::tempdir().unwrap();
    write_split_folders(tmp.path(), ["0", "1", "2", "3"]);
    let odd = tmp.path().join("silos/silo-1/0/007.png");
    image::RgbImage::from_pixel(8, 8, image::Rgb([200, 10, 10]))
        .save(&odd)
        .unwrap();
    let text = "name = \"rgb\"\nseeds = [1]\nrounds = 1\nalgorithms = [\"local\"]\n\n[data]\n\
                source = \"images\"\nsilos = \"silos\"\n\n[split]\nkind = \"natural\"\n\n\
                [model]\nkind = \"softmax\"\n";
    std::fs::write(tmp.path().join("rgb.toml"), text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_federico"))
        .current_dir(tmp.path())
        .args(["simulate", "rgb.toml", "--quiet", "--out", "run"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("silos/silo-1: 1 of 60 images are in colour (the first: ")
            && err.contains("silo-1/0/007.png"),
        "{err}"
    );
    assert!(
        err.contains("silos/silo-0: grey images read as RGB, 3 channels"),
        "{err}"
    );
}
