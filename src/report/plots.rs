//! SVG plots (plotters): collaborator weights over rounds (the paper's Figure 3), the final weight
//! matrix as a heatmap, and a metric per round per algorithm.
//! Must not: read run files; callers pass plain numbers.

use std::path::Path;

/// Errors writing a plot.
#[derive(Debug, thiserror::Error)]
#[error("plotting {path}: {reason}")]
pub struct PlotError {
    /// The file being written.
    pub path: String,
    /// What failed.
    pub reason: String,
}

/// One small panel per client `i`, a line per peer `j`: `w_ij` over rounds.
/// `weights[r][i][j]` is the weight at `rounds[r]`. Lines are coloured by the peer's group when
/// `groups` is given, and the panel title names the client's group.
pub fn weights_over_rounds(
    path: &Path,
    rounds: &[usize],
    weights: &[Vec<Vec<f64>>],
    groups: Option<&[usize]>,
) -> Result<(), PlotError> {
    let _ = (path, rounds, weights, groups);
    todo!()
}

/// Heatmap of a K×K weight matrix (row i = client, column j = model), values printed in cells,
/// clients labelled with their group when `groups` is given.
pub fn weight_heatmap(
    path: &Path,
    title: &str,
    weights: &[Vec<f64>],
    groups: Option<&[usize]>,
) -> Result<(), PlotError> {
    let _ = (path, title, weights, groups);
    todo!()
}

/// One line per series (algorithm): `(round, value)` points. `metric` labels the y axis
/// ("accuracy" is drawn on [0, 1]; anything else is scaled to the data).
pub fn metric_curves(
    path: &Path,
    title: &str,
    metric: &str,
    series: &[(String, Vec<(usize, f64)>)],
) -> Result<(), PlotError> {
    let _ = (path, title, metric, series);
    todo!()
}
