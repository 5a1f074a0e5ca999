//! Unit tests of `report::plots` (moved unchanged from its inline `mod tests`).
//! Owns: the module's unit tests and their fixtures.
//! Must not: hold code the module itself uses.

use super::*;

/// Fake FedeRiCo weights: uniform at first, converging to equal weight on the client's group.
fn converging(k: usize, groups: &[usize], rounds: usize) -> Vec<Vec<Vec<f64>>> {
    (0..rounds)
        .map(|r| {
            let t = 1.0 - (-(r as f64) / (rounds as f64 / 5.0)).exp();
            (0..k)
                .map(|i| {
                    let same = groups.iter().filter(|&&g| g == groups[i]).count() as f64;
                    let raw: Vec<f64> = (0..k)
                        .map(|j| {
                            let target = if groups[j] == groups[i] {
                                1.0 / same
                            } else {
                                0.0
                            };
                            let phase =
                                (r as f64 * 0.02 * (1.0 + j as f64 * 0.13) + i as f64).sin();
                            let wiggle = 0.03 * (1.0 - t * 0.5) * (1.0 + phase)
                                + 0.01 * ((r * 7 + j) % 5) as f64 / 5.0;
                            (1.0 - t) / k as f64 + t * target + wiggle
                        })
                        .collect();
                    let sum: f64 = raw.iter().sum();
                    raw.iter().map(|w| w / sum).collect()
                })
                .collect()
        })
        .collect()
}

/// Checks the file is a complete SVG document whose tags balance, and returns it.
fn read_svg(path: &Path) -> String {
    let svg = std::fs::read_to_string(path).expect("plot written");
    assert!(
        svg.trim_start().starts_with("<svg"),
        "not an SVG: {}",
        &svg[..svg.len().min(80)]
    );
    assert!(svg.trim_end().ends_with("</svg>"));
    let mut stack = Vec::new();
    let mut rest = svg.as_str();
    while let Some(start) = rest.find('<') {
        let end = start + rest[start..].find('>').expect("unclosed tag");
        let tag = &rest[start + 1..end];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop(), Some(name.trim()), "mismatched </{name}>");
        } else if !tag.ends_with('/') && !tag.starts_with('?') && !tag.starts_with('!') {
            stack.push(tag.split_whitespace().next().unwrap_or(""));
        }
        rest = &rest[end + 1..];
    }
    assert!(stack.is_empty(), "unclosed: {stack:?}");
    svg
}

/// The text shown by each `<text>` element.
fn text_of(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .map(|t| {
            let body = &t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()];
            body.trim().to_string()
        })
        .collect()
}

/// Point counts of each polyline.
fn polylines(svg: &str) -> Vec<usize> {
    svg.split("<polyline")
        .skip(1)
        .map(|p| {
            let pts = &p[p.find("points=\"").unwrap() + 8..];
            pts[..pts.find('"').unwrap()].split_whitespace().count()
        })
        .collect()
}

#[test]
fn weights_figure_has_a_panel_per_client_and_group_legend() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weights.svg");
    let groups = [0, 0, 1, 1, 2, 2, 3, 3];
    let rounds: Vec<usize> = (0..50).map(|r| r * 10).collect();
    weights_over_rounds(&path, &rounds, &converging(8, &groups, 50), Some(&groups)).unwrap();
    let svg = read_svg(&path);
    let texts = text_of(&svg);
    for (i, g) in groups.iter().enumerate() {
        let caption = format!("client {i} (group {g})");
        assert!(texts.contains(&caption), "{caption} missing: {texts:?}");
    }
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with("Collaborator weights over rounds"))
    );
    for g in 0..4 {
        assert!(texts.contains(&format!("peer in group {g}")), "{texts:?}");
    }
    assert!(texts.contains(&"round".to_string()) && texts.contains(&"weight".to_string()));
    assert!(
        !texts.iter().any(|t| t.starts_with("peer 7")),
        "peers listed despite groups"
    );
    // 64 lines, 50 points each.
    let lines = polylines(&svg);
    assert_eq!(lines.iter().filter(|&&n| n == 50).count(), 64, "{lines:?}");
}

#[test]
fn weights_figure_subsamples_and_skips_nan() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weights.svg");
    let groups: Vec<usize> = (0..8).map(|i| i % 2).collect();
    let rounds: Vec<usize> = (1..=1500).collect();
    let mut w = converging(8, &groups, 1500);
    w[700][3][5] = f64::NAN;
    weights_over_rounds(&path, &rounds, &w, Some(&groups)).unwrap();
    let svg = read_svg(&path);
    assert!(!svg.contains("NaN"), "NaN reached the SVG");
    let lines = polylines(&svg);
    assert!(lines.len() >= 64, "{}", lines.len());
    assert!(lines.iter().all(|&n| n <= MAX_POINTS_PER_LINE), "{lines:?}");
    assert!(lines.contains(&MAX_POINTS_PER_LINE), "{lines:?}");
}

#[test]
fn weights_figure_without_groups_and_with_many_clients() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w4.svg");
    let rounds = [0, 1, 2];
    weights_over_rounds(&path, &rounds, &converging(4, &[0, 1, 2, 3], 3), None).unwrap();
    let texts = text_of(&read_svg(&path));
    assert!(
        texts.contains(&"client 3".to_string()) && texts.contains(&"peer 3".to_string()),
        "{texts:?}"
    );

    let path = dir.path().join("w32.svg");
    let groups: Vec<usize> = (0..32).map(|i| i / 8).collect();
    let rounds: Vec<usize> = (0..1000).collect();
    weights_over_rounds(&path, &rounds, &converging(32, &groups, 1000), None).unwrap();
    let svg = read_svg(&path);
    let texts = text_of(&svg);
    assert!(texts.contains(&"client 31".to_string()));
    assert!(
        !texts.iter().any(|t| t.starts_with("peer ")),
        "32 peers listed: {texts:?}"
    );
    assert!(texts.contains(&"one colour per peer j".to_string()));
    assert!(
        polylines(&svg)
            .iter()
            .all(|&n| n * 32 * 32 <= MAX_POINTS_PER_FIGURE)
    );
}

#[test]
fn weights_figure_rejects_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.svg");
    let good = converging(3, &[0, 0, 1], 2);
    let err = weights_over_rounds(&path, &[], &[], None).unwrap_err();
    assert!(err.reason.contains("no rounds"), "{err}");
    let err = weights_over_rounds(&path, &[0], &good, None).unwrap_err();
    assert!(
        err.reason.contains("2 weight matrices for 1 rounds"),
        "{err}"
    );
    let err = weights_over_rounds(&path, &[0], &[vec![]], None).unwrap_err();
    assert!(err.reason.contains("no clients"), "{err}");
    let mut ragged = good.clone();
    ragged[1][2].pop();
    let err = weights_over_rounds(&path, &[0, 1], &ragged, None).unwrap_err();
    assert!(
        err.reason.contains("ragged") && err.reason.contains("round 1"),
        "{err}"
    );
    let mut short = good.clone();
    short[0].pop();
    assert!(weights_over_rounds(&path, &[0, 1], &short, None).is_err());
    let err = weights_over_rounds(&path, &[0, 1], &good, Some(&[0, 1])).unwrap_err();
    assert!(err.reason.contains("2 groups given for 3 clients"), "{err}");
    assert!(!path.exists(), "file written despite errors");

    let missing = dir.path().join("no-such-dir").join("w.svg");
    let err = weights_over_rounds(&missing, &[0, 1], &good, None).unwrap_err();
    assert!(err.path.contains("no-such-dir"), "{err}");
    assert!(
        weights_over_rounds(dir.path(), &[0, 1], &good, None).is_err(),
        "wrote over a directory"
    );
}

#[test]
fn heatmap_prints_values_for_few_clients_only() {
    let dir = tempfile::tempdir().unwrap();
    let groups = [0, 0, 1, 1, 2, 2, 3, 3];
    let mut w = converging(8, &groups, 200).pop().unwrap();
    w[0][0] = 0.0777;
    w[0][1] = 1.0 - 0.0777 - w[0][2..].iter().sum::<f64>();
    let path = dir.path().join("heat.svg");
    weight_heatmap(&path, "Final weights (seed 7)", &w, Some(&groups)).unwrap();
    let texts = text_of(&read_svg(&path));
    assert!(
        texts.contains(&"Final weights (seed 7)".to_string()),
        "{texts:?}"
    );
    assert!(texts.contains(&"0.08".to_string()), "{texts:?}");
    assert!(texts.contains(&"7 (g3)".to_string()), "{texts:?}");
    assert!(
        texts.contains(&"client i".to_string()) && texts.contains(&"model j (peer)".to_string())
    );
    // 64 cell values, plus 5 colour-bar ticks.
    let two_decimals = texts
        .iter()
        .filter(|t| t.len() == 4 && t.starts_with("0."))
        .count();
    assert!(two_decimals >= 64, "{two_decimals}: {texts:?}");

    let groups: Vec<usize> = (0..16).map(|i| i / 4).collect();
    let mut w = converging(16, &groups, 200).pop().unwrap();
    w[0][0] = 0.0777;
    let path = dir.path().join("heat16.svg");
    weight_heatmap(&path, "sixteen", &w, None).unwrap();
    let texts = text_of(&read_svg(&path));
    assert!(
        !texts.contains(&"0.08".to_string()),
        "cell values printed for K = 16"
    );
    assert!(texts.contains(&"15".to_string()) && !texts.iter().any(|t| t.contains("(g")));
}

#[test]
fn heatmap_handles_nan_and_rejects_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("heat.svg");
    let nan = vec![vec![0.5, f64::NAN], vec![0.3, 0.7]];
    weight_heatmap(&path, "t", &nan, None).unwrap();
    let svg = read_svg(&path);
    assert!(text_of(&svg).contains(&"NaN".to_string()));
    std::fs::remove_file(&path).unwrap();

    let err = weight_heatmap(&path, "t", &[], None).unwrap_err();
    assert!(err.reason.contains("empty"), "{err}");
    let err = weight_heatmap(&path, "t", &[vec![1.0, 0.0], vec![1.0]], None).unwrap_err();
    assert!(err.reason.contains("ragged"), "{err}");
    let err = weight_heatmap(
        &path,
        "t",
        &[vec![0.5, 0.5, 0.0], vec![0.5, 0.5, 0.0]],
        None,
    )
    .unwrap_err();
    assert!(
        err.reason.contains("row 0 has 3 values, expected 2"),
        "{err}"
    );
    let err = weight_heatmap(&path, "t", &[vec![1.0]], Some(&[0, 1])).unwrap_err();
    assert!(err.reason.contains("groups"), "{err}");
    assert!(!path.exists());
    let missing = dir.path().join("missing").join("h.svg");
    assert!(weight_heatmap(&missing, "t", &[vec![1.0]], None).is_err());
}

fn curves() -> Vec<(String, Vec<(usize, f64)>)> {
    let names = ["local", "fedavg", "fedavg_plus", "federico"];
    names
        .iter()
        .enumerate()
        .map(|(a, name)| {
            let top = 0.6 + 0.1 * a as f64;
            let points = (0..1500)
                .map(|r| (r, top * (1.0 - (-(r as f64) / 200.0).exp())))
                .collect();
            (name.to_string(), points)
        })
        .collect()
}

#[test]
fn metric_curves_names_every_algorithm() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("acc.svg");
    metric_curves(
        &path,
        "Test accuracy (CIFAR-10, label split)",
        "accuracy",
        &curves(),
    )
    .unwrap();
    let svg = read_svg(&path);
    let texts = text_of(&svg);
    for t in [
        "Test accuracy (CIFAR-10, label split)",
        "accuracy",
        "round",
        "local",
        "fedavg",
        "fedavg_plus",
        "federico",
    ] {
        assert!(texts.contains(&t.to_string()), "{t} missing: {texts:?}");
    }
    // [0, 1] axis for accuracy.
    assert!(
        texts.contains(&"1.0".to_string()) && texts.contains(&"0.0".to_string()),
        "{texts:?}"
    );
    let lines = polylines(&svg);
    assert!(lines.iter().all(|&n| n <= MAX_POINTS_PER_LINE), "{lines:?}");
}

#[test]
fn metric_curves_scale_other_metrics_to_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mse.svg");
    let series = vec![
        (
            "local".to_string(),
            vec![(0, 0.031), (10, 0.022), (20, f64::NAN), (30, 0.02)],
        ),
        (
            "federico".to_string(),
            vec![(0, 0.03), (10, 0.015), (20, 0.012), (30, 0.011)],
        ),
        (
            "diverged".to_string(),
            vec![(0, f64::NAN), (10, f64::INFINITY)],
        ),
    ];
    metric_curves(&path, "MSE", "mse", &series).unwrap();
    let svg = read_svg(&path);
    assert!(!svg.contains("NaN"));
    let texts = text_of(&svg);
    assert!(texts.contains(&"mse".to_string()) && texts.contains(&"federico".to_string()));
    assert!(
        texts.contains(&"diverged".to_string()),
        "all-NaN series not in the legend"
    );
    assert!(
        !texts.contains(&"1.0".to_string()),
        "MSE drawn on [0, 1]: {texts:?}"
    );
    assert!(texts.contains(&"0.020".to_string()), "{texts:?}");
}

#[test]
fn metric_curves_reject_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.svg");
    let err = metric_curves(&path, "t", "accuracy", &[]).unwrap_err();
    assert!(err.reason.contains("no series"), "{err}");
    let err = metric_curves(&path, "t", "accuracy", &[("fedavg".to_string(), vec![])]).unwrap_err();
    assert!(err.reason.contains("\"fedavg\" has no points"), "{err}");
    let err =
        metric_curves(&path, "t", "mse", &[("a".to_string(), vec![(0, f64::NAN)])]).unwrap_err();
    assert!(err.reason.contains("finite"), "{err}");
    assert!(!path.exists());
    let missing = dir.path().join("missing").join("m.svg");
    let err = metric_curves(&missing, "t", "accuracy", &curves()).unwrap_err();
    assert!(err.to_string().starts_with("plotting "), "{err}");
}

#[test]
fn helpers() {
    assert_eq!(subsample(5, 10), vec![0, 1, 2, 3, 4]);
    let s = subsample(1500, 500);
    assert_eq!(s.len(), 500);
    assert_eq!((s[0], s[499]), (0, 1499));
    assert!(s.windows(2).all(|w| w[0] < w[1]));
    let seg = finite_segments([
        (0, 1.0),
        (1, f64::NAN),
        (2, 2.0),
        (3, 3.0),
        (4, f64::INFINITY),
    ]);
    assert_eq!(seg, vec![vec![(0, 1.0)], vec![(2, 2.0), (3, 3.0)]]);
    assert_eq!(round_range([4].into_iter()), 4..5);
    assert_eq!(group_colours(&[7, 3, 7]).1, vec![3, 7]);
    assert_eq!(blues(0.0), RGBColor(247, 251, 255));
    assert_eq!(blues(1.0), RGBColor(8, 48, 107));
    assert_eq!(nice_scale(0.47), (0.5, 0.1));
    assert_eq!(nice_scale(0.1), (0.1, 0.02));
    assert_eq!(nice_scale(0.3), (0.3, 0.1));
    assert_eq!(nice_scale(0.97), (1.0, 0.2));
    assert_eq!(nice_scale(0.0), (1.0, 0.25));
    let (top, step) = nice_scale(0.031);
    assert!(
        (top - 0.04).abs() < 1e-12 && (step - 0.01).abs() < 1e-12,
        "{top} {step}"
    );
    assert_eq!(
        (step_decimals(0.25), step_decimals(0.1), step_decimals(5.0)),
        (2, 1, 0)
    );
    assert_eq!(label_decimals(1.0, 3), 1);
    assert_eq!(label_decimals(0.05, 6), 3);
}

/// Writes sample figures for a person to look at:
/// `FEDERICO_PLOT_SAMPLES=/tmp/plots cargo test --lib render_samples -- --ignored`.
#[test]
#[ignore = "writes sample figures to $FEDERICO_PLOT_SAMPLES"]
fn render_samples() {
    let dir = std::path::PathBuf::from(
        std::env::var("FEDERICO_PLOT_SAMPLES").unwrap_or("/tmp/federico-plots".into()),
    );
    std::fs::create_dir_all(&dir).unwrap();
    for (name, k, n_groups) in [("k8g2", 8, 2), ("k8g4", 8, 4), ("k32g4", 32, 4)] {
        let groups: Vec<usize> = (0..k).map(|i| i % n_groups).collect();
        let rounds: Vec<usize> = (0..1500).collect();
        let w = converging(k, &groups, 1500);
        weights_over_rounds(
            &dir.join(format!("weights_{name}.svg")),
            &rounds,
            &w,
            Some(&groups),
        )
        .unwrap();
        let title = format!("Final collaborator weights ({k} clients, {n_groups} groups)");
        weight_heatmap(
            &dir.join(format!("heatmap_{name}.svg")),
            &title,
            w.last().unwrap(),
            Some(&groups),
        )
        .unwrap();
    }
    let groups: Vec<usize> = (0..32).map(|i| i / 8).collect();
    let w = converging(32, &groups, 300);
    weights_over_rounds(
        &dir.join("weights_k32_nogroups.svg"),
        &(0..300).collect::<Vec<_>>(),
        &w,
        None,
    )
    .unwrap();
    let w = converging(8, &[0, 0, 0, 0, 1, 1, 1, 1], 100);
    weights_over_rounds(
        &dir.join("weights_k8_nogroups.svg"),
        &(0..100).collect::<Vec<_>>(),
        &w,
        None,
    )
    .unwrap();
    metric_curves(
        &dir.join("accuracy.svg"),
        "Test accuracy per round",
        "accuracy",
        &curves(),
    )
    .unwrap();
    let mse: Vec<_> = curves()
        .into_iter()
        .map(|(n, p)| {
            (
                n,
                p.into_iter()
                    .map(|(r, v)| (r * 2, 0.05 * (1.0 - v)))
                    .collect(),
            )
        })
        .collect();
    metric_curves(&dir.join("mse.svg"), "Test MSE per round", "mse", &mse).unwrap();
}

/// Decodes a PNG: (width, height, RGB(A) bytes).
fn decode_png(path: &Path) -> (u32, u32, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    assert!(!bytes.is_empty(), "{} is empty", path.display());
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

/// Dark pixels (every channel below 100: text, axes, dark lines) in rows `rows` of an RGB
/// image `width` wide.
fn dark_pixels(rgb: &[u8], width: u32, rows: std::ops::Range<u32>) -> usize {
    rgb.chunks(3)
        .enumerate()
        .filter(|(i, _)| rows.contains(&(*i as u32 / width)))
        .filter(|(_, p)| p.iter().all(|&c| c < 100))
        .count()
}

#[test]
fn bands_in_percent_with_display_labels_and_a_png() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("accuracy.svg");
    let curves: Vec<Curve> = ["FedAvg+", "FedeRiCo"]
        .iter()
        .enumerate()
        .map(|(a, label)| Curve {
            label: label.to_string(),
            points: (1..=20)
                .map(|r| CurvePoint {
                    round: r * 5,
                    mean: 0.4 + 0.2 * a as f64 + 0.01 * r as f64,
                    std: 0.05,
                })
                .collect(),
        })
        .collect();
    let axis = Axis {
        label: "test accuracy (%)",
        accuracy: true,
        percent: true,
    };
    metric_bands(&path, "demo (mean ± std over 3 seeds)", axis, &curves).unwrap();
    let svg = read_svg(&path);
    let texts = text_of(&svg);
    for t in [
        "FedAvg+",
        "FedeRiCo",
        "test accuracy (%)",
        "100",
        "demo (mean ± std over 3 seeds)",
    ] {
        assert!(texts.contains(&t.to_string()), "{t} missing: {texts:?}");
    }
    // One shaded band per curve, under the lines.
    assert_eq!(svg.matches("<polygon").count(), 2, "bands");
    let after_bands = &svg[svg.rfind("<polygon").unwrap()..];
    assert_eq!(
        polylines(after_bands).iter().filter(|&&n| n == 20).count(),
        2,
        "both lines drawn over the bands"
    );

    let (w, h, rgb) = decode_png(&path.with_extension("png"));
    assert_eq!((w, h), (960 * PNG_SCALE, 600 * PNG_SCALE));
    assert_eq!(rgb.len(), (w * h * 3) as usize);
    // The title is drawn: dark pixels in the top band of the image, and none in the margin
    // above it.
    assert!(
        dark_pixels(&rgb, w, 0..60 * PNG_SCALE) > 500,
        "no title text"
    );
    assert_eq!(dark_pixels(&rgb, w, 0..4), 0);
    // Same input, same bytes.
    let first = std::fs::read(path.with_extension("png")).unwrap();
    metric_bands(&path, "demo (mean ± std over 3 seeds)", axis, &curves).unwrap();
    assert_eq!(std::fs::read(path.with_extension("png")).unwrap(), first);
}

#[test]
fn every_figure_writes_a_png_beside_its_svg() {
    let dir = tempfile::tempdir().unwrap();
    let groups = [0, 0, 1, 1];
    let weights = converging(4, &groups, 30);
    let rounds: Vec<usize> = (1..=30).collect();
    let over = dir.path().join("weights_over_rounds.svg");
    weights_over_rounds(&over, &rounds, &weights, Some(&groups)).unwrap();
    let heat = dir.path().join("weights_final.svg");
    weight_heatmap(&heat, "final", weights.last().unwrap(), Some(&groups)).unwrap();
    let plain = dir.path().join("mse.svg");
    metric_curves(&plain, "t", "mse", &curves()).unwrap();
    for svg in [over, heat, plain] {
        let (w, h, rgb) = decode_png(&svg.with_extension("png"));
        assert!(w > 0 && h > 0 && w % PNG_SCALE == 0, "{}", svg.display());
        assert!(
            dark_pixels(&rgb, w, 0..h) > 1000,
            "{} is blank",
            svg.display()
        );
    }
    // A figure that fails writes neither file.
    let bad = dir.path().join("bad.svg");
    assert!(
        metric_bands(
            &bad,
            "t",
            Axis {
                label: "x",
                accuracy: false,
                percent: false
            },
            &[]
        )
        .is_err()
    );
    assert!(!bad.exists() && !bad.with_extension("png").exists());
}
