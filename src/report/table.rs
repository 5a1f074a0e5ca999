//! The final table printed after a run: algorithm × mean ± std over seeds.
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
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    let _ = values;
    todo!()
}

/// Renders an aligned text table. `percent` prints values ×100 with two decimals (accuracy),
/// otherwise four significant decimals (MSE). Columns: algorithm, mean ± std, seeds, and the
/// per-seed values.
pub fn render(metric: &str, percent: bool, rows: &[Row]) -> String {
    let _ = (metric, percent, rows);
    todo!()
}
