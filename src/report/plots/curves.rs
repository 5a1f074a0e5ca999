//! The metric figure: test accuracy (or MSE) per round, one line per algorithm, with a shaded
//! mean ± std band where the points carry a spread over seeds.
//! Owns: [`metric_bands`] (the figure) and [`metric_curves`] (plain lines, no bands, values as
//! given), their axis ranges, units and legend.
//! Must not: compute the means or spreads (`report::bands` does), or name algorithms (callers
//! pass the labels).

use super::canvas::render;
use super::{
    FONT, GRID, MAX_POINTS_PER_LINE, PlotError, colours, finite_bounds, label_decimals, plot_error,
    round_range, subsample,
};
use plotters::prelude::*;
use std::path::Path;

/// One point of a line: a round, the mean there and the spread drawn around it (0: none).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CurvePoint {
    /// Round, counted from 1.
    pub round: usize,
    /// The line's value (a mean over seeds).
    pub mean: f64,
    /// Half the band's height (a standard deviation over seeds); 0 or NaN draws no band.
    pub std: f64,
}

/// One line: its legend label and its points in round order.
#[derive(Clone, Debug, PartialEq)]
pub struct Curve {
    /// The legend entry (an algorithm's display name).
    pub label: String,
    /// The points, by round.
    pub points: Vec<CurvePoint>,
}

/// The y axis of a metric figure.
#[derive(Clone, Copy, Debug)]
pub struct Axis<'a> {
    /// Axis title.
    pub label: &'a str,
    /// An accuracy in [0, 1]: the axis spans all of it and the legend sits bottom right (curves
    /// rise); otherwise the axis is scaled to the data and the legend sits top right.
    pub accuracy: bool,
    /// Values (means and spreads) are drawn ×100, for an axis in percent.
    pub percent: bool,
}

/// One line per series (algorithm): `(round, value)` points. `metric` labels the y axis
/// ("accuracy" is drawn on [0, 1]; anything else is scaled to the data).
///
/// Series longer than 500 points are subsampled evenly; non-finite values leave gaps. The legend
/// sits bottom right for accuracy (curves rise) and top right otherwise (losses fall). This is
/// [`metric_bands`] without bands, units or display names: values and labels as given.
///
/// Errors: no series, a series without points, no finite value at all, or the file cannot be
/// written (its parent directory must exist).
pub fn metric_curves(
    path: &Path,
    title: &str,
    metric: &str,
    series: &[(String, Vec<(usize, f64)>)],
) -> Result<(), PlotError> {
    let curves: Vec<Curve> = series
        .iter()
        .map(|(label, points)| Curve {
            label: label.clone(),
            points: points
                .iter()
                .map(|&(round, mean)| CurvePoint {
                    round,
                    mean,
                    std: 0.0,
                })
                .collect(),
        })
        .collect();
    let accuracy = metric.eq_ignore_ascii_case("accuracy") || metric.eq_ignore_ascii_case("acc");
    let axis = Axis {
        label: metric,
        accuracy,
        percent: false,
    };
    metric_bands(path, title, axis, &curves)
}

/// One line per curve (algorithm) through the means, and a shaded band of ± one spread around
/// it in the line's colour (drawn under every line) where the spread is positive.
///
/// With `axis.percent` every value is drawn ×100 and accuracy spans 0–100; bands are clipped to
/// the axis. Curves longer than 500 points are subsampled evenly; non-finite means leave gaps in
/// the line and its band. Up to 30 points per curve are marked with dots.
///
/// Errors: no curves, a curve without points, no finite mean at all, or the file cannot be
/// written (its parent directory must exist).
pub fn metric_bands(
    path: &Path,
    title: &str,
    axis: Axis<'_>,
    curves: &[Curve],
) -> Result<(), PlotError> {
    if curves.is_empty() {
        return Err(plot_error(path, "no series to plot"));
    }
    if let Some(c) = curves.iter().find(|c| c.points.is_empty()) {
        return Err(plot_error(
            path,
            format!("series {:?} has no points", c.label),
        ));
    }
    let unit = if axis.percent { 100.0 } else { 1.0 };
    let all_means = || curves.iter().flat_map(|c| c.points.iter().map(|p| p.mean));
    let Some((lo, hi)) = finite_bounds(all_means()) else {
        return Err(plot_error(path, "no finite value to plot"));
    };
    let (lo, hi) = (lo * unit, hi * unit);
    let y_range = if axis.accuracy {
        lo.min(0.0)..hi.max(unit)
    } else {
        // Leave room for the bands too.
        let spread = curves
            .iter()
            .flat_map(|c| c.points.iter())
            .filter(|p| p.mean.is_finite() && p.std.is_finite())
            .map(|p| p.std * unit)
            .fold(0.0, f64::max);
        let (lo, hi) = (lo - spread, hi + spread);
        let pad = if hi > lo {
            (hi - lo) * 0.05
        } else {
            lo.abs().max(1.0) * 0.1
        };
        (lo - pad)..(hi + pad)
    };
    let x_range = round_range(curves.iter().flat_map(|c| c.points.iter().map(|p| p.round)));
    let colour = colours(curves.len());
    // Subsampled points, in axis units; a band point is clipped to the axis.
    let shown: Vec<Vec<ShownPoint>> = curves
        .iter()
        .map(|c| {
            subsample(c.points.len(), MAX_POINTS_PER_LINE)
                .into_iter()
                .map(|t| {
                    let p = c.points[t];
                    let band = (p.std.is_finite() && p.std > 0.0).then(|| {
                        let clip = |v: f64| v.clamp(y_range.start, y_range.end);
                        (clip((p.mean - p.std) * unit), clip((p.mean + p.std) * unit))
                    });
                    (p.round as i64, p.mean * unit, band)
                })
                .collect()
        })
        .collect();

    render(path, (960, 600), |root| {
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FONT, 26))
            .margin(16)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(x_range.clone(), y_range.clone())?;
        let decimals = label_decimals(y_range.end - y_range.start, 6);
        chart
            .configure_mesh()
            .x_desc("round")
            .y_desc(axis.label)
            .bold_line_style(GRID)
            .light_line_style(TRANSPARENT)
            .y_label_formatter(&|v| format!("{v:.decimals$}"))
            .label_style((FONT, 15))
            .axis_desc_style((FONT, 17))
            .draw()?;

        // Bands first, so that every line is drawn over every band.
        for (points, &c) in shown.iter().zip(&colour) {
            for run in band_runs(points) {
                let outline: Vec<(i64, f64)> = run
                    .iter()
                    .map(|&(x, _, (_, up))| (x, up))
                    .chain(run.iter().rev().map(|&(x, _, (down, _))| (x, down)))
                    .collect();
                chart.draw_series(std::iter::once(Polygon::new(outline, c.mix(0.2).filled())))?;
            }
        }
        for ((curve, points), &c) in curves.iter().zip(&shown).zip(&colour) {
            let mut segments = super::finite_segments(points.iter().map(|&(x, y, _)| (x, y)));
            if segments.is_empty() {
                // All NaN: nothing to draw, but the algorithm still gets its legend entry.
                segments.push(Vec::new());
            }
            let few = points.len() <= 30;
            for (s, segment) in segments.into_iter().enumerate() {
                if few {
                    chart.draw_series(segment.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
                }
                let line = chart.draw_series(LineSeries::new(segment, c.stroke_width(2)))?;
                if s == 0 {
                    line.label(curve.label.clone()).legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 24, y)], c.stroke_width(3))
                    });
                }
            }
        }
        chart
            .configure_series_labels()
            .position(if axis.accuracy {
                SeriesLabelPosition::LowerRight
            } else {
                SeriesLabelPosition::UpperRight
            })
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.5))
            .label_font((FONT, 16))
            .margin(12)
            .draw()?;
        Ok(())
    })
}

/// A band point: round, mean, and (lower, upper) edges.
type BandPoint = (i64, f64, (f64, f64));
/// A point as drawn: round, mean, and the band's edges where it has one.
type ShownPoint = (i64, f64, Option<(f64, f64)>);

/// The runs of consecutive points that have a band and a finite mean: one polygon each.
fn band_runs(points: &[ShownPoint]) -> Vec<Vec<BandPoint>> {
    let mut runs = Vec::new();
    let mut current: Vec<BandPoint> = Vec::new();
    for &(x, y, band) in points {
        match band {
            Some(b) if y.is_finite() => current.push((x, y, b)),
            _ => {
                if current.len() > 1 {
                    runs.push(std::mem::take(&mut current));
                }
                current.clear();
            }
        }
    }
    if current.len() > 1 {
        runs.push(current);
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn band_runs_split_at_gaps_and_drop_single_points() {
        let pts = [
            (1, 0.5, Some((0.4, 0.6))),
            (2, 0.6, Some((0.5, 0.7))),
            (3, f64::NAN, Some((0.0, 0.0))),
            (4, 0.7, Some((0.6, 0.8))),
            (5, 0.7, None),
            (6, 0.8, Some((0.7, 0.9))),
            (7, 0.9, Some((0.8, 1.0))),
            (8, 0.9, Some((0.8, 1.0))),
        ];
        let runs = band_runs(&pts);
        assert_eq!(runs.len(), 2, "{runs:?}");
        assert_eq!(runs[0].iter().map(|p| p.0).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(runs[1].iter().map(|p| p.0).collect::<Vec<_>>(), [6, 7, 8]);
    }
}
