//! Plots (plotters), each written as SVG with a PNG beside it: collaborator weights over rounds
//! (the paper's Figure 3), the final weight matrix as a heatmap, and a metric per round per
//! algorithm, with mean ± std bands over seeds.
//! Owns: the figures ([`weights_over_rounds`], [`weight_heatmap`] here; [`metric_bands`] and
//! [`metric_curves`] in `curves.rs`), their shared scales, colours and legends, and the caps that
//! keep a file small; `canvas.rs` draws each figure as SVG and PNG with the bundled font.
//! Must not: read run files or compute statistics; callers pass plain numbers.

use std::error::Error;
use std::path::Path;

mod canvas;
mod curves;

pub use canvas::PNG_SCALE;
use canvas::{Area, render};
pub use curves::{Axis, Curve, CurvePoint, metric_bands, metric_curves};

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Errors writing a plot.
#[derive(Debug, thiserror::Error)]
#[error("plotting {path}: {reason}")]
pub struct PlotError {
    /// The file being written.
    pub path: String,
    /// What failed.
    pub reason: String,
}

/// At most this many points are drawn per line; longer histories are subsampled evenly (first and
/// last round always kept).
const MAX_POINTS_PER_LINE: usize = 500;
/// The weights figure draws K² lines; their points together stay under this budget (a 32-client
/// run keeps ~150 points per line) so the SVG stays a few MB at most.
const MAX_POINTS_PER_FIGURE: usize = 150_000;
/// At most this many groups (or peers, without groups) are listed one by one in a legend.
const MAX_LEGEND_ENTRIES: usize = 12;
/// Heatmap cells carry their value (2 decimals) up to this many clients.
const MAX_ANNOTATED_CLIENTS: usize = 12;

const FONT: &str = canvas::FONT_FAMILY;
/// Tableau 10: distinct, readable on white.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];
const GRID: RGBColor = RGBColor(225, 225, 225);
const MISSING: RGBColor = RGBColor(200, 200, 200);

fn plot_error(path: &Path, reason: impl ToString) -> PlotError {
    PlotError {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// `n` evenly spaced colours: the Tableau palette up to 10, hues around the wheel beyond.
fn colours(n: usize) -> Vec<RGBColor> {
    if n <= PALETTE.len() {
        return PALETTE[..n].to_vec();
    }
    (0..n)
        .map(|k| {
            let c = HSLColor(k as f64 / n as f64, 0.65, 0.45)
                .to_backend_color()
                .rgb;
            RGBColor(c.0, c.1, c.2)
        })
        .collect()
}

/// Colour of each client by group: groups are ranked (sorted distinct ids) so ids need not be
/// contiguous. Also returns the sorted distinct groups and their colours, for legends.
fn group_colours(groups: &[usize]) -> (Vec<RGBColor>, Vec<usize>, Vec<RGBColor>) {
    let mut distinct = groups.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    let palette = colours(distinct.len());
    let per_client = groups
        .iter()
        .map(|g| palette[distinct.binary_search(g).unwrap_or(0)])
        .collect();
    (per_client, distinct, palette)
}

/// Indices `0..n` thinned evenly to at most `max` (at least 2), keeping the first and the last.
fn subsample(n: usize, max: usize) -> Vec<usize> {
    let max = max.max(2);
    if n <= max {
        return (0..n).collect();
    }
    let mut idx: Vec<usize> = (0..max)
        .map(|k| ((k as f64) * (n - 1) as f64 / (max - 1) as f64).round() as usize)
        .collect();
    idx.dedup();
    idx
}

/// Splits a line at non-finite values, so a NaN leaves a gap instead of a wild segment.
fn finite_segments<X: Copy>(points: impl IntoIterator<Item = (X, f64)>) -> Vec<Vec<(X, f64)>> {
    let mut segments = Vec::new();
    let mut current = Vec::new();
    for (x, y) in points {
        if y.is_finite() {
            current.push((x, y));
        } else if !current.is_empty() {
            segments.push(std::mem::take(&mut current));
        }
    }
    if !current.is_empty() {
        segments.push(current);
    }
    segments
}

/// The x range of a round axis; a single round still gets a non-empty range.
fn round_range(rounds: impl Iterator<Item = usize>) -> std::ops::Range<i64> {
    let (lo, hi) = rounds.fold((i64::MAX, i64::MIN), |(lo, hi), r| {
        (lo.min(r as i64), hi.max(r as i64))
    });
    if lo >= hi { lo..lo + 1 } else { lo..hi }
}

/// Finite min and max of the values, or `None` when there is no finite value.
fn finite_bounds(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((f64::min(lo, v), f64::max(hi, v))),
        })
}

/// Checks a K×K matrix; `what` names it in the error.
fn check_square(path: &Path, what: &str, m: &[Vec<f64>], k: usize) -> Result<(), PlotError> {
    if m.len() != k {
        return Err(plot_error(
            path,
            format!("{what} has {} rows, expected {k}", m.len()),
        ));
    }
    if let Some((i, row)) = m.iter().enumerate().find(|(_, row)| row.len() != k) {
        return Err(plot_error(
            path,
            format!(
                "{what}: row {i} has {} values, expected {k} (ragged matrix)",
                row.len()
            ),
        ));
    }
    Ok(())
}

fn check_groups(path: &Path, groups: Option<&[usize]>, k: usize) -> Result<(), PlotError> {
    match groups {
        Some(g) if g.len() != k => Err(plot_error(
            path,
            format!("{} groups given for {k} clients", g.len()),
        )),
        _ => Ok(()),
    }
}

/// A legend entry: a short line in `colour` of `width`, then `label`; without a colour, only the
/// label (a note).
struct LegendEntry {
    colour: Option<RGBColor>,
    width: u32,
    label: String,
}

impl LegendEntry {
    /// Width in pixels. The naive font estimate (no font files) is ~0.46 em per character; be
    /// generous so labels never overlap.
    fn px(&self) -> i32 {
        let line = if self.colour.is_some() { 34 } else { 0 };
        line + (self.label.chars().count() as i32) * 8 + 18
    }
}

/// Lays the entries out left to right from `(x, y)`, wrapping before `max_x`; returns the height
/// used.
fn draw_legend(
    area: &Area<'_>,
    entries: &[LegendEntry],
    (x0, y0): (i32, i32),
    max_x: i32,
) -> Result<i32, Box<dyn Error>> {
    const ROW: i32 = 22;
    let style = TextStyle::from((FONT, 15).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    let (mut x, mut y) = (x0, y0 + ROW / 2);
    for e in entries {
        let w = e.px();
        if x > x0 && x + w > max_x {
            x = x0;
            y += ROW;
        }
        let mut text_x = x;
        if let Some(colour) = e.colour {
            area.draw(&PathElement::new(
                vec![(x, y), (x + 26, y)],
                colour.stroke_width(e.width),
            ))?;
            text_x += 32;
        }
        area.draw(&Text::new(e.label.clone(), (text_x, y), style.clone()))?;
        x += w;
    }
    Ok(y + ROW / 2 - y0)
}

/// Height a legend of `entries` takes when wrapped to `width` pixels (must match `draw_legend`).
fn legend_height(entries: &[LegendEntry], width: i32) -> i32 {
    let (mut x, mut rows) = (0, 1);
    for e in entries {
        let w = e.px();
        if x > 0 && x + w > width {
            x = 0;
            rows += 1;
        }
        x += w;
    }
    rows * 22
}

/// One small panel per client `i`, a line per peer `j`: `w_ij` over rounds.
/// `weights[r][i][j]` is the weight at `rounds[r]`. Lines are coloured by the peer's group when
/// `groups` is given, and the panel title names the client's group.
///
/// Panels are laid out in a grid (4×2 for 8 clients, 8×4 for 32). The client's own line
/// (`j == i`) is drawn thicker and on top. The legend lists groups (at most 12; beyond, a note
/// says lines are coloured by group); without groups it lists peers only when there are at most
/// 12, otherwise each peer gets its own hue and no per-peer legend. Long histories are
/// subsampled evenly (at most 500 points per line, fewer when there are many clients). Non-finite
/// weights leave gaps. All panels share one y axis, from 0 to a round number just above the
/// largest weight (1 when some weight is near 1).
///
/// Errors: no rounds, `weights` not one K×K matrix per round (ragged), `groups` not of length K,
/// or the file cannot be written (its parent directory must exist).
pub fn weights_over_rounds(
    path: &Path,
    rounds: &[usize],
    weights: &[Vec<Vec<f64>>],
    groups: Option<&[usize]>,
) -> Result<(), PlotError> {
    if rounds.is_empty() || weights.is_empty() {
        return Err(plot_error(path, "no rounds to plot"));
    }
    if weights.len() != rounds.len() {
        return Err(plot_error(
            path,
            format!(
                "{} weight matrices for {} rounds",
                weights.len(),
                rounds.len()
            ),
        ));
    }
    let k = weights[0].len();
    if k == 0 {
        return Err(plot_error(path, "no clients (empty weight matrix)"));
    }
    for (r, m) in weights.iter().enumerate() {
        check_square(path, &format!("weights at round {}", rounds[r]), m, k)?;
    }
    check_groups(path, groups, k)?;

    let peer_colour: Vec<RGBColor> = match groups {
        Some(g) => group_colours(g).0,
        None => colours(k),
    };
    let mut legend: Vec<LegendEntry> = Vec::new();
    let note = |label: String| LegendEntry {
        colour: None,
        width: 0,
        label,
    };
    match groups {
        Some(g) => {
            let (_, distinct, palette) = group_colours(g);
            if distinct.len() <= MAX_LEGEND_ENTRIES {
                legend.extend(
                    distinct
                        .iter()
                        .zip(&palette)
                        .map(|(g, &colour)| LegendEntry {
                            colour: Some(colour),
                            width: 2,
                            label: format!("peer in group {g}"),
                        }),
                );
            } else {
                legend.push(note(format!(
                    "lines coloured by the peer's group ({} groups)",
                    distinct.len()
                )));
            }
        }
        None if k <= MAX_LEGEND_ENTRIES => legend.extend((0..k).map(|j| LegendEntry {
            colour: Some(peer_colour[j]),
            width: 2,
            label: format!("peer {j}"),
        })),
        None => legend.push(note("one colour per peer j".to_string())),
    }
    legend.push(LegendEntry {
        colour: Some(BLACK),
        width: 4,
        label: "thick: the client itself (j = i)".to_string(),
    });

    let cols = ((2 * k) as f64).sqrt().ceil() as usize;
    let cols = cols.clamp(1, k);
    let rows = k.div_ceil(cols);
    let (panel_w, panel_h) = if k <= 16 { (300, 220) } else { (260, 190) };
    let margin = 10;
    let width = (cols * panel_w) as i32 + 2 * margin;
    let title_h = 44;
    let legend_h = legend_height(&legend, width - 2 * margin) + 8;
    let header_h = title_h + legend_h;
    let height = header_h + (rows * panel_h) as i32 + margin;

    let x_range = round_range(rounds.iter().copied());
    let (y_lo, y_hi) =
        finite_bounds(weights.iter().flatten().flatten().copied()).unwrap_or((0.0, 1.0));
    // One scale for all panels: from 0 to a round number above the largest weight, so a
    // 32-client run (weights ~1/8) is not squashed against the bottom of a [0, 1] axis.
    let y_range = y_lo.min(0.0)..nice_scale(y_hi * 1.02).0;
    let y_decimals = label_decimals(y_range.end - y_range.start, 3);
    let per_line = (MAX_POINTS_PER_FIGURE / (k * k)).clamp(2, MAX_POINTS_PER_LINE);
    let idx = subsample(rounds.len(), per_line);

    render(path, (width as u32, height as u32), |root| {
        let title_style =
            TextStyle::from((FONT, 24).into_font()).pos(Pos::new(HPos::Center, VPos::Center));
        root.draw(&Text::new(
            "Collaborator weights over rounds: panel i shows w_ij for every peer j".to_string(),
            (width / 2, title_h / 2),
            title_style,
        ))?;
        draw_legend(root, &legend, (margin, title_h), width - margin)?;

        let grid = root.margin(header_h as u32, margin as u32, margin as u32, margin as u32);
        let panels = grid.split_evenly((rows, cols));
        for (i, panel) in panels.iter().enumerate().take(k) {
            let caption = match groups {
                Some(g) => format!("client {i} (group {})", g[i]),
                None => format!("client {i}"),
            };
            let mut chart = ChartBuilder::on(panel)
                .caption(caption, (FONT, 17))
                .margin(6)
                .x_label_area_size(34)
                .y_label_area_size(52)
                .build_cartesian_2d(x_range.clone(), y_range.clone())?;
            let (row, col) = (i / cols, i % cols);
            let y_format = |v: &f64| format!("{v:.y_decimals$}");
            let mut mesh = chart.configure_mesh();
            mesh.x_labels(5)
                .y_labels(3)
                .bold_line_style(GRID)
                .light_line_style(TRANSPARENT)
                .y_label_formatter(&y_format)
                .label_style((FONT, 13));
            // Axis names only on the outer panels, so the grid stays light.
            if row == rows - 1 || i + cols >= k {
                mesh.x_desc("round");
            }
            if col == 0 {
                mesh.y_desc("weight");
            }
            mesh.axis_desc_style((FONT, 14)).draw()?;

            let row_of = |j: usize| {
                idx.iter()
                    .map(move |&r| (rounds[r] as i64, weights[r][i][j]))
            };
            let peers = (0..k).filter(|&j| j != i).chain(std::iter::once(i));
            for j in peers {
                let style = peer_colour[j].stroke_width(if j == i { 4 } else { 2 });
                for segment in finite_segments(row_of(j)) {
                    chart.draw_series(LineSeries::new(segment, style))?;
                }
            }
        }
        Ok(())
    })
}

/// Sequential white → dark blue colour map ("Blues") for `t` in [0, 1].
fn blues(t: f64) -> RGBColor {
    const STOPS: [(u8, u8, u8); 5] = [
        (247, 251, 255),
        (198, 219, 239),
        (107, 174, 214),
        (33, 113, 181),
        (8, 48, 107),
    ];
    let t = t.clamp(0.0, 1.0) * (STOPS.len() - 1) as f64;
    let k = (t.floor() as usize).min(STOPS.len() - 2);
    let f = t - k as f64;
    let mix = |a: u8, b: u8| (a as f64 + (b as f64 - a as f64) * f).round() as u8;
    let (a, b) = (STOPS[k], STOPS[k + 1]);
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// Heatmap of a K×K weight matrix (row i = client, column j = model), values printed in cells,
/// clients labelled with their group when `groups` is given.
///
/// Colours run from white (0) to dark blue (a round number at or above the largest weight), with a
/// colour bar;
/// non-finite cells are grey. Cells show their value with 2 decimals when K ≤ 12. With `groups`,
/// row labels read `i (g…)` and a strip in the group's colour (the same colours as
/// [`weights_over_rounds`]) marks each row and column.
///
/// Errors: empty or non-square (ragged) matrix, `groups` not of length K, or the file cannot be
/// written (its parent directory must exist).
pub fn weight_heatmap(
    path: &Path,
    title: &str,
    weights: &[Vec<f64>],
    groups: Option<&[usize]>,
) -> Result<(), PlotError> {
    let k = weights.len();
    if k == 0 {
        return Err(plot_error(path, "empty weight matrix"));
    }
    check_square(path, "weight matrix", weights, k)?;
    check_groups(path, groups, k)?;

    let annotate = k <= MAX_ANNOTATED_CLIENTS;
    let cell: i32 = if annotate {
        56
    } else {
        (640 / k as i32).max(18)
    };
    let strip = if groups.is_some() { 10 } else { 0 };
    let (title_h, left, right, bottom) = (56, 120, 110, 70);
    let (x0, y0) = (left + strip, title_h + strip);
    let side = cell * k as i32;
    let width = x0 + side + right;
    let height = y0 + side + bottom;

    let (lo, hi) = finite_bounds(weights.iter().flatten().copied()).unwrap_or((0.0, 1.0));
    let vmin = lo.min(0.0);
    // From 0, the colour bar ends on a round number with ticks at round steps; a negative weight
    // (not a softmax output, but drawn anyway) falls back to 4 even steps over the data.
    let (vmax, tick_step) = if vmin == 0.0 {
        nice_scale(hi)
    } else {
        let top = hi.max(vmin + 0.01);
        (top, (top - vmin) / 4.0)
    };
    let tick_decimals = if vmin == 0.0 {
        step_decimals(tick_step)
    } else {
        2
    };
    let scale = |v: f64| (v - vmin) / (vmax - vmin);
    let group_colour = groups.map(|g| group_colours(g).0);

    render(path, (width as u32, height as u32), |root| {
        let centre = Pos::new(HPos::Center, VPos::Center);
        root.draw(&Text::new(
            title.to_string(),
            (width / 2, title_h / 2),
            TextStyle::from((FONT, 24).into_font()).pos(centre),
        ))?;

        let value_font = (FONT, if k <= 8 { 17 } else { 14 }).into_font();
        let light_text = WHITE;
        for (i, row) in weights.iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                let (cx, cy) = (x0 + j as i32 * cell, y0 + i as i32 * cell);
                let fill = if v.is_finite() {
                    blues(scale(v))
                } else {
                    MISSING
                };
                root.draw(&Rectangle::new(
                    [(cx, cy), (cx + cell, cy + cell)],
                    fill.filled(),
                ))?;
                if annotate {
                    let text = if v.is_finite() {
                        format!("{v:.2}")
                    } else {
                        "NaN".to_string()
                    };
                    let colour = if v.is_finite() && scale(v) > 0.55 {
                        &light_text
                    } else {
                        &BLACK
                    };
                    let style = TextStyle::from(value_font.clone())
                        .pos(centre)
                        .color(colour);
                    root.draw(&Text::new(text, (cx + cell / 2, cy + cell / 2), style))?;
                }
            }
        }
        // Thin white grid between cells when they are large enough to read it.
        if cell >= 24 {
            for t in 1..k as i32 {
                let p = t * cell;
                let line = WHITE.stroke_width(1);
                root.draw(&PathElement::new(
                    vec![(x0 + p, y0), (x0 + p, y0 + side)],
                    line,
                ))?;
                root.draw(&PathElement::new(
                    vec![(x0, y0 + p), (x0 + side, y0 + p)],
                    line,
                ))?;
            }
        }
        root.draw(&Rectangle::new(
            [(x0, y0), (x0 + side, y0 + side)],
            BLACK.stroke_width(1),
        ))?;

        // Tick labels: every client when they fit, otherwise every other one.
        let label_px = if annotate { 15 } else { 13 };
        let step = if cell >= 16 { 1 } else { 2 };
        let row_style =
            TextStyle::from((FONT, label_px).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
        let col_style =
            TextStyle::from((FONT, label_px).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
        for t in (0..k).step_by(step) {
            let c = t as i32 * cell + cell / 2;
            let row_label = match groups {
                Some(g) => format!("{t} (g{})", g[t]),
                None => t.to_string(),
            };
            root.draw(&Text::new(
                row_label,
                (x0 - strip - 6, y0 + c),
                row_style.clone(),
            ))?;
            root.draw(&Text::new(
                t.to_string(),
                (x0 + c, y0 + side + 6),
                col_style.clone(),
            ))?;
        }
        if let Some(colour) = &group_colour {
            for (t, c) in colour.iter().enumerate() {
                let p = t as i32 * cell;
                root.draw(&Rectangle::new(
                    [(x0 - strip, y0 + p), (x0 - 2, y0 + p + cell)],
                    c.filled(),
                ))?;
                root.draw(&Rectangle::new(
                    [(x0 + p, y0 - strip), (x0 + p + cell, y0 - 2)],
                    c.filled(),
                ))?;
            }
        }
        let axis_style = TextStyle::from((FONT, 17).into_font()).pos(centre);
        root.draw(&Text::new(
            "model j (peer)".to_string(),
            (x0 + side / 2, y0 + side + 44),
            axis_style.clone(),
        ))?;
        root.draw(&Text::new(
            "client i".to_string(),
            (22, y0 + side / 2),
            axis_style.transform(FontTransform::Rotate270),
        ))?;

        // Colour bar: vmin at the bottom, vmax at the top.
        let (bx, bw) = (x0 + side + 24, 18);
        let steps = 64;
        for s in 0..steps {
            let t0 = side * s / steps;
            let t1 = side * (s + 1) / steps;
            let colour = blues(1.0 - (s as f64 + 0.5) / steps as f64);
            root.draw(&Rectangle::new(
                [(bx, y0 + t0), (bx + bw, y0 + t1)],
                colour.filled(),
            ))?;
        }
        root.draw(&Rectangle::new(
            [(bx, y0), (bx + bw, y0 + side)],
            BLACK.stroke_width(1),
        ))?;
        let tick_style =
            TextStyle::from((FONT, 14).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
        let ticks = ((vmax - vmin) / tick_step).round() as i32;
        for t in 0..=ticks {
            let v = vmin + tick_step * t as f64;
            let y = y0 + side - (side as f64 * t as f64 / ticks as f64).round() as i32;
            root.draw(&PathElement::new(
                vec![(bx + bw, y), (bx + bw + 4, y)],
                BLACK.stroke_width(1),
            ))?;
            root.draw(&Text::new(
                format!("{v:.tick_decimals$}"),
                (bx + bw + 7, y),
                tick_style.clone(),
            ))?;
        }
        Ok(())
    })
}

/// Decimals for tick labels spanning `span` with about `ticks` intervals: enough to tell them
/// apart.
fn label_decimals(span: f64, ticks: usize) -> usize {
    if !(span.is_finite() && span > 0.0) {
        return 2;
    }
    let tick = span / ticks.max(1) as f64;
    (-tick.log10().floor()).clamp(0.0, 8.0) as usize
}

/// A round upper bound for values in `[0, max]`: `(top, step)` with `top` a multiple of `step`
/// (1, 2, 2.5 or 5 times a power of ten) and at most 5 steps. Non-positive `max` gives `(1, 0.25)`.
fn nice_scale(max: f64) -> (f64, f64) {
    if !(max.is_finite() && max > 0.0) {
        return (1.0, 0.25);
    }
    // Scale by 10^e by dividing for negative e, so 3 steps of 0.1 give 0.3, not 0.30000000000000004.
    let e = (max / 5.0).log10().floor() as i32;
    let scale = |x: f64| {
        if e >= 0 {
            x * 10f64.powi(e)
        } else {
            x / 10f64.powi(-e)
        }
    };
    let m = [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .find(|&m| scale(m) * 5.0 >= max)
        .unwrap_or(10.0);
    let step = scale(m);
    // The tolerance keeps 0.3 / 0.1 = 3.0000000000000004 from becoming 4 steps.
    let steps = (max / step - 1e-9).ceil().max(1.0);
    (scale(steps * m), step)
}

/// Decimals needed to print multiples of `step` exactly (0.25 -> 2, 0.1 -> 1, 5 -> 0).
fn step_decimals(step: f64) -> usize {
    (0..8)
        .find(|&d| {
            let scaled = step * 10f64.powi(d as i32);
            (scaled - scaled.round()).abs() < 1e-6 * scaled.max(1.0)
        })
        .unwrap_or(8)
}

#[cfg(test)]
mod tests;
