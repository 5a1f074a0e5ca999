//! The final table printed after a run: algorithm × mean ± std over seeds.
//! Owns: the table's layout and number formatting.
//! Must not: print; it returns the text.

/// One row: an algorithm and its metric on each seed.
#[derive(Clone, Debug)]
pub struct Row {
    /// Algorithm name.
    pub algorithm: String,
    /// Metric value per seed.
    pub values: Vec<f64>,
}

/// Mean and sample standard deviation (0 for a single value).
///
/// The standard deviation divides by `n - 1`. An empty slice gives `(NaN, NaN)`; a NaN among the
/// values makes both NaN.
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    if n == 1 {
        // Still NaN when the value is: 0 * NaN.
        return (mean, 0.0 * mean);
    }
    let ss: f64 = values.iter().map(|v| (v - mean) * (v - mean)).sum();
    (mean, (ss / (n - 1) as f64).sqrt())
}

/// Formats one value: ×100 with two decimals when `percent`; otherwise four decimals, switching
/// to scientific notation (4 significant digits) for magnitudes below 0.001 or from 10⁶ up, where
/// four fixed decimals would hide the value or run wide.
fn format_value(v: f64, percent: bool) -> String {
    if percent {
        return format!("{:.2}", v * 100.0);
    }
    let a = v.abs();
    if v.is_finite() && v != 0.0 && !(1e-3..1e6).contains(&a) {
        format!("{v:.3e}")
    } else {
        format!("{v:.4}")
    }
}

/// `text` padded with spaces to `width` characters (not bytes: "±" is one character).
fn pad(text: &str, width: usize, right: bool) -> String {
    let fill = " ".repeat(width.saturating_sub(text.chars().count()));
    if right {
        format!("{fill}{text}")
    } else {
        format!("{text}{fill}")
    }
}

/// Renders an aligned text table. `percent` prints values ×100 with two decimals (accuracy),
/// otherwise four significant decimals (MSE). Columns: algorithm, mean ± std, seeds, and the
/// per-seed values.
///
/// Layout: a header naming the metric (with `(%)` when `percent`), a rule of dashes, then one line
/// per row in the given order. Columns are separated by two spaces; the algorithm is
/// left-aligned, numbers right-aligned so their decimal points line up (means and standard
/// deviations in their own sub-columns, per-seed values all to one width). Non-percent values use
/// four decimals, or scientific notation with 4 significant digits below 0.001 (so a small MSE is
/// not printed as `0.0000`). A row without values shows `NaN ± NaN` and 0 seeds. Lines carry no
/// trailing spaces; the text ends with a newline.
pub fn render(metric: &str, percent: bool, rows: &[Row]) -> String {
    const GAP: &str = "  ";
    let unit = if percent { " (%)" } else { "" };
    let header = [
        "algorithm".to_string(),
        format!("{metric}{unit} mean ± std"),
        "seeds".to_string(),
        "per-seed values".to_string(),
    ];

    let stats: Vec<(String, String)> = rows
        .iter()
        .map(|row| {
            let (mean, std) = mean_std(&row.values);
            (format_value(mean, percent), format_value(std, percent))
        })
        .collect();
    let mean_w = stats
        .iter()
        .map(|(m, _)| m.chars().count())
        .max()
        .unwrap_or(0);
    let std_w = stats
        .iter()
        .map(|(_, s)| s.chars().count())
        .max()
        .unwrap_or(0);
    let per_seed: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            row.values
                .iter()
                .map(|&v| format_value(v, percent))
                .collect()
        })
        .collect();
    let value_w = per_seed
        .iter()
        .flatten()
        .map(|v| v.chars().count())
        .max()
        .unwrap_or(0);

    let cells: Vec<[String; 4]> = rows
        .iter()
        .zip(&stats)
        .zip(&per_seed)
        .map(|((row, (mean, std)), values)| {
            let values: Vec<String> = values.iter().map(|v| pad(v, value_w, true)).collect();
            [
                row.algorithm.clone(),
                format!("{} ± {}", pad(mean, mean_w, true), pad(std, std_w, true)),
                row.values.len().to_string(),
                values.join(" "),
            ]
        })
        .collect();

    let mut widths = header.clone().map(|h| h.chars().count());
    for line in &cells {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.chars().count());
        }
    }
    // Algorithm left-aligned, the rest right-aligned; the last column is not padded on the left
    // beyond its own values' alignment, so it reads as a list.
    let format_line = |line: &[String; 4], header: bool| {
        let parts = [
            pad(&line[0], widths[0], false),
            pad(&line[1], widths[1], !header),
            pad(&line[2], widths[2], !header),
            line[3].clone(),
        ];
        parts.join(GAP).trim_end().to_string()
    };

    let mut out = String::new();
    out.push_str(&format_line(&header, true));
    out.push('\n');
    out.push_str(&"-".repeat(widths.iter().sum::<usize>() + GAP.len() * (widths.len() - 1)));
    out.push('\n');
    for line in &cells {
        out.push_str(&format_line(line, false));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, values: &[f64]) -> Row {
        Row {
            algorithm: name.to_string(),
            values: values.to_vec(),
        }
    }

    /// Character column of the first `needle` in `line`.
    fn column(line: &str, needle: &str) -> usize {
        let byte = line
            .find(needle)
            .unwrap_or_else(|| panic!("{needle:?} not in {line:?}"));
        line[..byte].chars().count()
    }

    #[test]
    fn mean_std_uses_the_sample_deviation() {
        let (m, s) = mean_std(&[1.0, 2.0, 3.0, 4.0]);
        assert!((m - 2.5).abs() < 1e-12);
        assert!((s - (5.0f64 / 3.0).sqrt()).abs() < 1e-12, "{s}");
        let (m, s) = mean_std(&[0.8, 0.9]);
        assert!((m - 0.85).abs() < 1e-12);
        assert!((s - 0.05 * 2f64.sqrt()).abs() < 1e-12, "{s}");
    }

    #[test]
    fn mean_std_of_one_and_of_none() {
        assert_eq!(mean_std(&[0.7]), (0.7, 0.0));
        let (m, s) = mean_std(&[]);
        assert!(m.is_nan() && s.is_nan());
        let (m, s) = mean_std(&[1.0, f64::NAN]);
        assert!(m.is_nan() && s.is_nan());
    }

    #[test]
    fn percent_table_is_aligned() {
        let rows = [
            row("local", &[0.5, 0.52, 0.51]),
            row("fedavg", &[0.8731, 0.8512, 0.9]),
            row("federico", &[0.9, 0.95]),
            row("fedavg_plus", &[0.09]),
        ];
        let text = render("accuracy", true, &rows);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2 + rows.len(), "{text}");
        assert!(text.ends_with('\n'));
        assert!(lines[0].starts_with("algorithm"), "{text}");
        assert!(lines[0].contains("accuracy (%) mean ± std"), "{text}");
        assert!(
            lines[0].contains("seeds") && lines[0].contains("per-seed values"),
            "{text}"
        );
        assert!(lines[1].chars().all(|c| c == '-'), "{text}");
        assert!(
            lines.iter().all(|l| l.trim_end() == *l),
            "trailing spaces:\n{text}"
        );

        // Percent with two decimals: 0.8731 -> 87.31; mean of fedavg = 87.48.
        let fedavg = lines[3];
        assert!(fedavg.starts_with("fedavg "), "{text}");
        assert!(fedavg.contains("87.48 ±"), "{fedavg}");
        assert!(fedavg.contains("87.31 85.12 90.00"), "{fedavg}");
        assert!(lines[5].contains("  9.00 ± 0.00"), "{text}");
        assert!(lines[5].contains("fedavg_plus"), "{text}");
        assert!(!text.contains("0.8731"), "{text}");

        // Columns line up: the ±, the seed count and the first per-seed value.
        let data = &lines[2..];
        let pm: Vec<usize> = data.iter().map(|l| column(l, "±")).collect();
        assert!(pm.iter().all(|&c| c == pm[0]), "± misaligned:\n{text}");
        let seeds_end = column(lines[0], "seeds") + "seeds".len();
        for (line, n) in data.iter().zip(["3", "3", "2", "1"]) {
            let chars: Vec<char> = line.chars().collect();
            assert_eq!(
                chars[seeds_end - 1].to_string(),
                n,
                "seed count misaligned:\n{text}"
            );
            assert_eq!(chars[seeds_end], ' ', "{text}");
        }
        let values_at = column(lines[0], "per-seed");
        let firsts: Vec<&str> = data
            .iter()
            .map(|l| &l[l.char_indices().nth(values_at).unwrap().0..])
            .collect();
        assert_eq!(
            firsts,
            [
                "50.00 52.00 51.00",
                "87.31 85.12 90.00",
                "90.00 95.00",
                " 9.00"
            ],
            "{text}"
        );
    }

    #[test]
    fn mse_uses_four_decimals_and_scientific_when_tiny() {
        let rows = [
            row("local", &[0.012345, 0.0123]),
            row("federico", &[0.00001234]),
        ];
        let text = render("mse", false, &rows);
        assert!(
            text.lines().next().unwrap().contains("mse mean ± std"),
            "{text}"
        );
        assert!(!text.contains('%'), "{text}");
        assert!(text.contains("0.0123"), "{text}");
        assert!(text.contains("1.234e-5"), "{text}");
        assert!(
            text.contains("1.234e-5 ±"),
            "tiny MSE mean not shown:\n{text}"
        );
        assert_eq!(format_value(1.5, false), "1.5000");
        assert_eq!(format_value(0.0, false), "0.0000");
        assert_eq!(format_value(0.123456, true), "12.35");
    }

    #[test]
    fn rows_without_values_and_no_rows() {
        let text = render("accuracy", true, &[row("broken", &[]), row("ok", &[0.5])]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[2].starts_with("broken") && lines[2].contains("NaN ±"),
            "{text}"
        );
        assert_eq!(column(lines[2], "±"), column(lines[3], "±"), "{text}");
        let empty = render("accuracy", true, &[]);
        assert_eq!(empty.lines().count(), 2, "{empty}");
    }
}
