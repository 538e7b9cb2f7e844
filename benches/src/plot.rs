//! Charts of benchmark results, drawn as one SVG file.
//!
//! This module owns drawing, nothing else: it takes figures already
//! measured, as [`Chart`]s of [`Series`] of (message size, figure) points,
//! and draws them with [`write_svg`]. It must not know how the figures were
//! measured, which benchmark, implementation or transport made them, the
//! table and JSON formats they were read from, or the command line: callers
//! turn their results into [`Chart`]s, with names and units ready to print.
//!
//! Both axes are logarithmic. The x axis is the message size in bytes,
//! labelled in binary units (1, 8, 64, 512, 4K, 32K, 256K, 2M, ...); the y
//! axis is the figure, labelled 1, 2, 5, 10, ... or by decades for wide
//! ranges. A log axis has no place for 0, so points of 0 bytes (the first
//! size of OSU latency) are left out of charts; so are points whose figure
//! is not finite or not positive. A chart left with no points still
//! renders, with a "no data" note, and a series left with none is marked
//! "(no data)" in its legend.
//!
//! Fonts: plotters is built without its `ttf` and `ab_glyph` features (see
//! the workspace `Cargo.toml`), so it sizes text with its own estimate and
//! the SVG backend writes plain `<text>` elements in the `sans-serif`
//! family for the viewer to render: no font file is read, and drawing works
//! on a machine with no fonts installed.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One line on a chart: an implementation or transport and its figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// The name shown in the legend.
    pub name: String,
    /// (message size in bytes, figure) points. Points of 0 bytes, and
    /// points whose figure is not finite or not positive, are not drawn
    /// (both axes are logarithmic).
    pub points: Vec<(usize, f64)>,
}

/// One chart: a title, the y axis label (with unit), the series.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// The title drawn above the chart.
    pub title: String,
    /// The y axis label, with its unit, e.g. "latency (us)".
    pub y_label: String,
    /// The lines, each with its own colour and marker.
    pub series: Vec<Series>,
}

/// Writes `charts` side by side (one row, or a grid of 2 columns if more
/// than 2) into one SVG file at `path`, under a `title`.
///
/// Each chart is about 600x450 pixels, so two charts make a 1200x500 file.
/// Both axes are logarithmic: points of 0 bytes and points whose figure is
/// not finite or not positive are left out (see the [module
/// documentation](self)). An error (drawing, or creating or writing the
/// file) comes back as a message naming `path`; the file is written only
/// once the whole drawing has succeeded.
pub fn write_svg(path: &Path, title: &str, charts: &[Chart]) -> Result<(), String> {
    let svg = render(title, charts)
        .map_err(|e| format!("cannot draw the chart for {}: {e}", path.display()))?;
    std::fs::write(path, svg).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Width of one chart's cell, in pixels.
const CELL_W: u32 = 600;
/// Height of one chart's cell, in pixels.
const CELL_H: u32 = 450;
/// Height of the strip holding the file's title.
const TITLE_H: u32 = 50;
/// Height of the strip holding a chart's title.
const CAPTION_H: u32 = 34;
/// Margins around a chart's axes: top, bottom, left, right.
const MARGIN: (u32, u32, u32, u32) = (6, 6, 8, 24);
/// Height of the area under the plot for the x tick labels and label.
const X_LABEL_AREA: u32 = 50;
/// Font family: generic, resolved by whatever renders the SVG.
const FONT: &str = "sans-serif";
/// Font sizes, in plotters units (the SVG `font-size` is this / 1.24).
const TITLE_SIZE: f64 = 28.0;
/// Size of a chart's title.
const CAPTION_SIZE: f64 = 22.0;
/// Size of the axis labels ("message size (bytes)", the y label).
const DESC_SIZE: f64 = 18.0;
/// Size of the tick labels.
const TICK_SIZE: f64 = 16.0;
/// Size of the legend's names.
const LEGEND_SIZE: f64 = 16.0;
/// Legend: padding inside its box, and the width of its line samples.
const LEGEND_MARGIN: u32 = 8;
/// Width of the legend's line sample area.
const LEGEND_SAMPLE: u32 = 34;
/// Legend: gap between its box and the plot's edges (plotters' own).
const LEGEND_GAP: u32 = 5;
/// The most of the plot's height given up to make room for the legend.
const MAX_HEADROOM: f64 = 0.45;
/// Marker radius, in pixels.
const MARKER_R: i32 = 4;

/// Series colours, in order: Okabe and Ito's colour-blind-safe set (less
/// its yellow, too pale on white), then a few more distinct ones.
const COLOURS: [RGBColor; 10] = [
    RGBColor(0, 114, 178),   // blue
    RGBColor(213, 94, 0),    // vermillion
    RGBColor(0, 158, 115),   // bluish green
    RGBColor(204, 121, 167), // reddish purple
    RGBColor(230, 159, 0),   // orange
    RGBColor(86, 180, 233),  // sky blue
    RGBColor(0, 0, 0),       // black
    RGBColor(140, 86, 75),   // brown
    RGBColor(127, 127, 127), // grey
    RGBColor(188, 189, 34),  // olive
];

/// Colour of the light (minor) grid lines.
const LIGHT_GRID: RGBColor = RGBColor(238, 238, 238);
/// Colour of the bold (labelled) grid lines.
const BOLD_GRID: RGBColor = RGBColor(205, 205, 205);

/// A plotters error, or anything else with a message, as a string.
fn msg<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Draws the whole file into a string.
fn render(title: &str, charts: &[Chart]) -> Result<String, String> {
    let (cols, rows) = grid(charts.len());
    let size = (CELL_W * cols, TITLE_H + CELL_H * rows);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        root.fill(&WHITE).map_err(msg)?;
        let (head, body) = root.split_vertically(TITLE_H);
        draw_centered(&head, title, bold(TITLE_SIZE))?;
        if charts.is_empty() {
            draw_centered(&body, "no data", note_style())?;
        }
        let cells = body.split_evenly((rows as usize, cols as usize));
        for (chart, cell) in charts.iter().zip(&cells) {
            draw_chart(cell, chart)?;
        }
        root.present().map_err(msg)?;
    }
    Ok(svg)
}

/// (columns, rows) for `n` charts: one row of up to 2, else 2 columns.
fn grid(n: usize) -> (u32, u32) {
    let n = n.max(1) as u32;
    if n <= 2 {
        (n, 1)
    } else {
        (2, n.div_ceil(2))
    }
}

/// A bold font of `size`.
fn bold(size: f64) -> TextStyle<'static> {
    (FONT, size).into_font().style(FontStyle::Bold).into()
}

/// The style of the "no data" note.
fn note_style() -> TextStyle<'static> {
    (FONT, CAPTION_SIZE)
        .into_font()
        .color(&RGBColor(120, 120, 120))
}

/// Draws `text` at the centre of `area`.
fn draw_centered(
    area: &DrawingArea<SVGBackend, Shift>,
    text: &str,
    style: TextStyle,
) -> Result<(), String> {
    let (w, h) = area.dim_in_pixel();
    let style = style.pos(Pos::new(HPos::Center, VPos::Center));
    area.draw(&Text::new(text, (w as i32 / 2, h as i32 / 2), style))
        .map_err(msg)
}

/// One series' drawable points, sorted by size: (size, figure), both > 0.
fn usable(points: &[(usize, f64)]) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = points
        .iter()
        .filter(|&&(size, y)| size > 0 && y.is_finite() && y > 0.0)
        .map(|&(size, y)| (size as f64, y))
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// A log axis: its range, labelled (bold) ticks and unlabelled grid lines.
#[derive(Debug, Clone, PartialEq)]
struct Axis {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
    light: Vec<f64>,
}

impl Axis {
    /// Where `v` falls on the axis: 0 at `lo`, 1 at `hi`.
    fn fraction(&self, v: f64) -> f64 {
        (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln())
    }
}

/// Room left beyond the outermost grid lines, as a part of the axis, so
/// that markers there are not cut.
const PAD: f64 = 0.03;

/// The size axis for sizes from `min` to `max` (> 0): powers of 2 from
/// the one at or below `min` to the one at or above `max`, labelled every
/// 1, 2, 3, ... powers so that at most 9 are.
fn size_axis(min: f64, max: f64) -> Axis {
    let mut e0 = min.log2().floor() as i32;
    let mut e1 = max.log2().ceil() as i32;
    if e0 == e1 {
        if e0 > 0 {
            e0 -= 1;
        }
        e1 += 1;
    }
    let labelled = |step: i32| (e0..=e1).filter(|e| e.rem_euclid(step) == 0).count();
    let step = [1, 2, 3, 4, 5, 10, 20]
        .into_iter()
        .find(|&s| labelled(s) <= 9)
        .unwrap_or(30);
    let (ticks, light): (Vec<i32>, Vec<i32>) = (e0..=e1).partition(|e| e.rem_euclid(step) == 0);
    let pad = 2f64.powf(f64::from(e1 - e0) * PAD);
    Axis {
        lo: 2f64.powi(e0) / pad,
        hi: 2f64.powi(e1) * pad,
        ticks: ticks.into_iter().map(|e| 2f64.powi(e)).collect(),
        light: light.into_iter().map(|e| 2f64.powi(e)).collect(),
    }
}

/// The `i`th value of the 1-2-5 sequence: ..., 0.5, 1, 2, 5, 10, 20, ...
/// (`nice(0)` is 1).
fn nice(i: i32) -> f64 {
    let mantissa = [1.0, 2.0, 5.0][i.rem_euclid(3) as usize];
    mantissa * 10f64.powi(i.div_euclid(3))
}

/// The index of the largest 1-2-5 value not above `v` (> 0).
fn nice_floor(v: f64) -> i32 {
    let mut i = 3 * v.log10().floor() as i32;
    while nice(i + 1) <= v * (1.0 + 1e-9) {
        i += 1;
    }
    while nice(i) > v * (1.0 + 1e-9) {
        i -= 1;
    }
    i
}

/// The index of the smallest 1-2-5 value not below `v` (> 0).
fn nice_ceil(v: f64) -> i32 {
    let mut i = nice_floor(v);
    if nice(i) < v * (1.0 - 1e-9) {
        i += 1;
    }
    i
}

/// The figure axis for figures from `min` to `max` (> 0), whose top is
/// raised to at least `top` (`top` <= `max` leaves it as it is): bounds
/// on the 1-2-5 sequence; ticks at 1, 2, 5 when it spans little more than
/// 2 decades, else at decades (every 1, 2, 3, ... so that at most 8 are).
fn figure_axis(min: f64, max: f64, top: f64) -> Axis {
    let mut i0 = nice_floor(min);
    let mut i1 = nice_ceil(max);
    if i0 == i1 {
        i0 -= 1;
        i1 += 1;
    }
    let (lo, hi) = (nice(i0), nice(i1).max(top));
    let within = |v: f64| v >= lo * (1.0 - 1e-9) && v <= hi * (1.0 + 1e-9);
    let (ticks, light): (Vec<f64>, Vec<f64>) = if i1 - i0 <= 7 {
        let ticks: Vec<f64> = (i0..=nice_ceil(hi))
            .map(nice)
            .filter(|&v| within(v))
            .collect();
        let light = decade_multiples(lo, hi)
            .into_iter()
            .filter(|&v| within(v) && !ticks.iter().any(|&t| (t / v - 1.0).abs() < 1e-9))
            .collect();
        (ticks, light)
    } else {
        let (d0, d1) = (lo.log10().ceil() as i32, hi.log10().floor() as i32);
        let labelled = |step: i32| (d0..=d1).filter(|d| d.rem_euclid(step) == 0).count();
        let step = [1, 2, 3, 5, 10, 20, 50]
            .into_iter()
            .find(|&s| labelled(s) <= 8)
            .unwrap_or(100);
        let (ticks, others): (Vec<i32>, Vec<i32>) =
            (d0..=d1).partition(|d| d.rem_euclid(step) == 0);
        let ticks = ticks.into_iter().map(|d| 10f64.powi(d)).collect();
        let light = if step == 1 {
            decade_multiples(lo, hi)
                .into_iter()
                .filter(|&v| within(v) && (v.log10() - v.log10().round()).abs() > 1e-9)
                .collect()
        } else {
            others.into_iter().map(|d| 10f64.powi(d)).collect()
        };
        (ticks, light)
    };
    let pad = (hi / lo).powf(PAD);
    Axis {
        lo: lo / pad,
        hi: hi * pad,
        ticks,
        light,
    }
}

/// 1, 2, ... 9 times each power of 10 from `lo`'s decade to `hi`'s.
fn decade_multiples(lo: f64, hi: f64) -> Vec<f64> {
    let (d0, d1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    (d0..=d1)
        .flat_map(|d| (1..10).map(move |m| f64::from(m) * 10f64.powi(d)))
        .collect()
}

/// A size label in binary units: 1, 512, 4K, 2M, 1G; non-powers of 2 as
/// e.g. 1.5K.
fn size_label(v: f64) -> String {
    let v = v.round();
    for (unit, scale) in [("G", 1u64 << 30), ("M", 1 << 20), ("K", 1 << 10)] {
        let scale = scale as f64;
        if v >= scale {
            let n = v / scale;
            return if n.fract() == 0.0 {
                format!("{n}{unit}")
            } else {
                format!("{}{unit}", trim(n, 1))
            };
        }
    }
    format!("{v}")
}

/// A figure label: 0.01, 0.5, 2, 500, 20000, 1e6, 1e-4.
fn figure_label(v: f64) -> String {
    if !(1e-3..1e6).contains(&v) {
        let exp = v.log10().floor();
        let mantissa = v / 10f64.powf(exp);
        if (mantissa - 1.0).abs() < 1e-6 {
            format!("1e{exp}")
        } else {
            format!("{}e{exp}", trim(mantissa, 2))
        }
    } else if v >= 1.0 {
        format!("{}", v.round())
    } else {
        trim(v, 4)
    }
}

/// `v` with up to `decimals` decimals, without trailing zeros.
fn trim(v: f64, decimals: usize) -> String {
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Width of `text` in `size`, as plotters estimates it.
fn text_width(text: &str, size: f64) -> u32 {
    (FONT, size)
        .into_font()
        .box_size(text)
        .map(|(w, _)| w)
        .unwrap_or_else(|_| (size * 0.6 * text.len() as f64) as u32)
}

/// Width of the area left of the plot: tick labels, the y label turned on
/// its side, gaps.
fn y_label_area(axis: &Axis) -> u32 {
    let widest = axis
        .ticks
        .iter()
        .map(|&t| text_width(&figure_label(t), TICK_SIZE))
        .max()
        .unwrap_or(0);
    widest + DESC_SIZE as u32 + 22
}

/// Size of the plot itself (inside the axes) for a given y label area.
fn plot_dims(y_area: u32) -> (f64, f64) {
    let (top, bottom, left, right) = MARGIN;
    let w = CELL_W - left - right - y_area;
    let h = CELL_H - CAPTION_H - top - bottom - X_LABEL_AREA;
    (f64::from(w), f64::from(h))
}

/// Size of the legend box in pixels for these names, as plotters lays it
/// out (lines 1.25 font sizes apart), with a little to spare.
fn legend_dims(names: &[String]) -> (f64, f64) {
    let widest = names
        .iter()
        .map(|n| text_width(n, LEGEND_SIZE))
        .max()
        .unwrap_or(0);
    let lines = names.len().max(1) as f64;
    let w = f64::from(widest + LEGEND_SAMPLE + 2 * LEGEND_MARGIN);
    let h = (lines - 1.0) * 1.25 * LEGEND_SIZE + LEGEND_SIZE + f64::from(2 * LEGEND_MARGIN);
    (w + 4.0, h + 4.0)
}

/// The corners a legend may go in, in order of preference: benchmark
/// curves mostly rise with the size, which leaves the upper left empty.
const CORNERS: [SeriesLabelPosition; 4] = [
    SeriesLabelPosition::UpperLeft,
    SeriesLabelPosition::UpperRight,
    SeriesLabelPosition::LowerRight,
    SeriesLabelPosition::LowerLeft,
];

/// How many samples of the lines (in axis fractions, y up) fall in a
/// legend box of `box_frac` (fractions of the plot) in corner `pos`.
fn covered(samples: &[(f64, f64)], box_frac: (f64, f64), pos: &SeriesLabelPosition) -> usize {
    let (w, h) = box_frac;
    let (x0, x1) = match pos {
        SeriesLabelPosition::UpperLeft | SeriesLabelPosition::LowerLeft => (0.0, w),
        _ => (1.0 - w, 1.0),
    };
    let (y0, y1) = match pos {
        SeriesLabelPosition::UpperLeft | SeriesLabelPosition::UpperRight => (1.0 - h, 1.0),
        _ => (0.0, h),
    };
    samples
        .iter()
        .filter(|&&(x, y)| x >= x0 && x <= x1 && y >= y0 && y <= y1)
        .count()
}

/// Points along the lines, as axis fractions (0..1, y up), close enough
/// together to find what a legend box would cover.
fn samples(lines: &[Vec<(f64, f64)>], x: &Axis, y: &Axis) -> Vec<(f64, f64)> {
    let frac = |&(px, py): &(f64, f64)| (x.fraction(px), y.fraction(py));
    let mut out = Vec::new();
    for line in lines {
        let points: Vec<(f64, f64)> = line.iter().map(frac).collect();
        out.extend(points.iter().copied());
        for pair in points.windows(2) {
            let ((ax, ay), (bx, by)) = (pair[0], pair[1]);
            for k in 1..16 {
                let t = f64::from(k) / 16.0;
                out.push((ax + (bx - ax) * t, ay + (by - ay) * t));
            }
        }
    }
    out
}

/// Where the legend goes, and the figure axis with room made for it: the
/// first corner it covers no line in, else the upper left with the y axis
/// raised so that the lines pass under it (giving up at most
/// [`MAX_HEADROOM`] of the height).
fn place_legend(
    lines: &[Vec<(f64, f64)>],
    names: &[String],
    x: &Axis,
    (y_min, y_max): (f64, f64),
) -> (SeriesLabelPosition, Axis) {
    let y = figure_axis(y_min, y_max, 0.0);
    let (plot_w, plot_h) = plot_dims(y_label_area(&y));
    let (legend_w, legend_h) = legend_dims(names);
    let gap = f64::from(LEGEND_GAP) + f64::from(MARKER_R);
    let box_frac = ((legend_w + gap) / plot_w, (legend_h + gap) / plot_h);
    let points = samples(lines, x, &y);
    if let Some(pos) = CORNERS
        .into_iter()
        .find(|pos| covered(&points, box_frac, pos) == 0)
    {
        return (pos, y);
    }
    // Raise the top so that the highest figure is at 1 - room of the
    // height: ln(top) = ln(lo) + (ln(max) - ln(lo)) / (1 - room), where lo
    // is the bottom of the axis before padding.
    let room = box_frac.1.min(MAX_HEADROOM);
    let lo = y.lo * (y.hi / y.lo).powf(PAD / (1.0 + 2.0 * PAD));
    let top = (lo.ln() + (y_max.ln() - lo.ln()) / (1.0 - room)).exp();
    (
        SeriesLabelPosition::UpperLeft,
        figure_axis(y_min, y_max, top),
    )
}

/// A marker's outline, in pixels around its centre: circle, square,
/// triangle up, diamond, triangle down, plus; then round again.
fn marker(i: usize) -> Vec<(i32, i32)> {
    let r = MARKER_R;
    let polar = |n: usize, radius: f64, turn: f64| -> Vec<(i32, i32)> {
        (0..n)
            .map(|k| {
                let a = std::f64::consts::TAU * (k as f64 / n as f64 + turn);
                (
                    (radius * a.cos()).round() as i32,
                    (radius * a.sin()).round() as i32,
                )
            })
            .collect()
    };
    match i % 6 {
        0 => polar(16, f64::from(r), 0.0),
        1 => vec![(-r, -r), (r, -r), (r, r), (-r, r)],
        2 => polar(3, f64::from(r) * 1.35, -0.25),
        3 => polar(4, f64::from(r) * 1.35, 0.0),
        4 => polar(3, f64::from(r) * 1.35, 0.25),
        _ => {
            let t = (r / 3).max(1);
            vec![
                (-t, -r),
                (t, -r),
                (t, -t),
                (r, -t),
                (r, t),
                (t, t),
                (t, r),
                (-t, r),
                (-t, t),
                (-r, t),
                (-r, -t),
                (-t, -t),
            ]
        }
    }
}

/// Draws one chart into its cell.
fn draw_chart(cell: &DrawingArea<SVGBackend, Shift>, chart: &Chart) -> Result<(), String> {
    let (head, area) = cell.split_vertically(CAPTION_H);
    draw_centered(&head, &chart.title, bold(CAPTION_SIZE))?;

    let lines: Vec<Vec<(f64, f64)>> = chart.series.iter().map(|s| usable(&s.points)).collect();
    let all = || lines.iter().flatten();
    let (x, y, pos) = if all().next().is_none() {
        let x = size_axis(1.0, f64::from(1u32 << 22));
        let y = figure_axis(1.0, 10.0, 0.0);
        (x, y, SeriesLabelPosition::UpperLeft)
    } else {
        let fold = |f: fn(f64, f64) -> f64, init: f64, get: fn(&(f64, f64)) -> f64| {
            all().map(get).fold(init, f)
        };
        let x = size_axis(
            fold(f64::min, f64::INFINITY, |p| p.0),
            fold(f64::max, 0.0, |p| p.0),
        );
        let y_range = (
            fold(f64::min, f64::INFINITY, |p| p.1),
            fold(f64::max, 0.0, |p| p.1),
        );
        let names: Vec<String> = chart.series.iter().map(|s| s.name.clone()).collect();
        let (pos, y) = place_legend(&lines, &names, &x, y_range);
        (x, y, pos)
    };

    let (top, bottom, left, right) = MARGIN;
    let mut ctx = ChartBuilder::on(&area)
        .margin_top(top)
        .margin_bottom(bottom)
        .margin_left(left)
        .margin_right(right)
        .x_label_area_size(X_LABEL_AREA)
        .y_label_area_size(y_label_area(&y))
        .build_cartesian_2d(
            (x.lo..x.hi)
                .log_scale()
                .with_key_points(x.ticks.clone())
                .with_light_points(x.light.clone()),
            (y.lo..y.hi)
                .log_scale()
                .with_key_points(y.ticks.clone())
                .with_light_points(y.light.clone()),
        )
        .map_err(msg)?;

    let x_fmt = |v: &f64| size_label(*v);
    let y_fmt = |v: &f64| figure_label(*v);
    ctx.configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc(chart.y_label.as_str())
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .label_style((FONT, TICK_SIZE))
        .axis_desc_style((FONT, DESC_SIZE))
        .bold_line_style(BOLD_GRID.stroke_width(1))
        .light_line_style(LIGHT_GRID.stroke_width(1))
        .axis_style(RGBColor(90, 90, 90))
        .draw()
        .map_err(msg)?;

    if all().next().is_none() {
        let centre = ((x.lo * x.hi).sqrt(), (y.lo * y.hi).sqrt());
        let style = note_style().pos(Pos::new(HPos::Center, VPos::Center));
        ctx.draw_series(std::iter::once(Text::new("no data", centre, style)))
            .map_err(msg)?;
    }

    for (i, (series, points)) in chart.series.iter().zip(&lines).enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let shape = marker(i);
        let label = if points.is_empty() {
            format!("{} (no data)", series.name)
        } else {
            series.name.clone()
        };
        ctx.draw_series(
            points
                .iter()
                .map(|&p| EmptyElement::at(p) + Polygon::new(shape.clone(), colour.filled())),
        )
        .map_err(msg)?;
        let sample = shape
            .iter()
            .map(|&(dx, dy)| (dx + 13, dy))
            .collect::<Vec<_>>();
        ctx.draw_series(LineSeries::new(
            points.iter().copied(),
            colour.stroke_width(2),
        ))
        .map_err(msg)?
        .label(label)
        .legend(move |(lx, ly)| {
            EmptyElement::at((lx, ly))
                + PathElement::new(vec![(0, 0), (26, 0)], colour.stroke_width(2))
                + Polygon::new(sample.clone(), colour.filled())
        });
    }

    if !chart.series.is_empty() {
        ctx.configure_series_labels()
            .position(pos)
            .margin(LEGEND_MARGIN)
            .legend_area_size(LEGEND_SAMPLE)
            .label_font((FONT, LEGEND_SIZE))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(170, 170, 170))
            .draw()
            .map_err(msg)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A file in the temporary directory, removed when dropped.
    struct TempFile(PathBuf);

    impl TempFile {
        fn new(tag: &str) -> Self {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let name = format!("oxbench-plot-{}-{n}-{tag}.svg", std::process::id());
            TempFile(std::env::temp_dir().join(name))
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn sizes() -> impl Iterator<Item = usize> {
        (0..=22).map(|e| 1usize << e)
    }

    fn two_series() -> Chart {
        Chart {
            title: "Latency chart".into(),
            y_label: "latency (us)".into(),
            series: vec![
                Series {
                    name: "oxmpi tcp".into(),
                    points: sizes().map(|s| (s, 20.0 + s as f64 / 1000.0)).collect(),
                },
                Series {
                    name: "raw tcp".into(),
                    points: sizes().map(|s| (s, 15.0 + s as f64 / 1200.0)).collect(),
                },
            ],
        }
    }

    /// Writes `charts`, checks the file looks like SVG, returns its text.
    fn write_and_read(tag: &str, title: &str, charts: &[Chart]) -> String {
        let file = TempFile::new(tag);
        write_svg(&file.0, title, charts).unwrap();
        let svg = std::fs::read_to_string(&file.0).unwrap();
        let svg = svg.trim();
        assert!(
            svg.starts_with("<svg") || svg.starts_with("<?xml"),
            "{}",
            &svg[..svg.len().min(100)]
        );
        assert!(svg.ends_with("</svg>"));
        svg.to_string()
    }

    /// The contents of the SVG's `<text>` elements, trimmed.
    fn texts(svg: &str) -> Vec<&str> {
        svg.split("</text>")
            .filter_map(|part| part.rsplit_once("<text").map(|(_, t)| t))
            .filter_map(|t| t.split_once('>').map(|(_, text)| text.trim()))
            .collect()
    }

    #[test]
    fn two_series_chart() {
        let svg = write_and_read("two", "File title", &[two_series()]);
        for text in [
            "File title",
            "Latency chart",
            "oxmpi tcp",
            "raw tcp",
            "latency (us)",
            "message size (bytes)",
        ] {
            assert!(svg.contains(text), "no {text:?} in the SVG");
        }
        let texts = texts(&svg);
        for label in ["1", "8", "512", "4K", "2M", "10", "100", "1000"] {
            assert!(
                texts.contains(&label),
                "no tick label {label:?} in {texts:?}"
            );
        }
        assert!(svg.contains("width=\"600\""), "one chart is 600 wide");
    }

    #[test]
    fn sizes_and_grid() {
        assert_eq!(grid(0), (1, 1));
        assert_eq!(grid(2), (2, 1));
        assert_eq!(grid(3), (2, 2));
        let mut bandwidth = two_series();
        bandwidth.title = "Bandwidth chart".into();
        bandwidth.y_label = "bandwidth (MB/s)".into();
        let svg = write_and_read("pair", "Pair", &[two_series(), bandwidth]);
        assert!(svg.contains("width=\"1200\"") && svg.contains("height=\"500\""));
        assert!(svg.contains("Bandwidth chart") && svg.contains("bandwidth (MB/s)"));
    }

    #[test]
    fn empty_charts_render() {
        let empty = Chart {
            title: "Nothing".into(),
            y_label: "latency (us)".into(),
            series: vec![],
        };
        let svg = write_and_read("empty", "Empty", std::slice::from_ref(&empty));
        assert!(svg.contains("no data"));
        let unusable = Chart {
            series: vec![Series {
                name: "broken".into(),
                points: vec![(0, 1.0), (8, f64::NAN), (16, -1.0), (32, 0.0)],
            }],
            ..empty
        };
        let svg = write_and_read("unusable", "Unusable", &[unusable]);
        assert!(svg.contains("no data") && svg.contains("broken (no data)"));
        let svg = write_and_read("none", "No charts", &[]);
        assert!(svg.contains("no data"));
    }

    #[test]
    fn missing_directory_is_an_error_naming_the_path() {
        let dir = std::env::temp_dir().join(format!("oxbench-plot-missing-{}", std::process::id()));
        let path = dir.join("chart.svg");
        let err = write_svg(&path, "t", &[two_series()]).unwrap_err();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(!path.exists());
    }

    #[test]
    fn zero_sizes_are_dropped() {
        let chart = Chart {
            title: "Zero".into(),
            y_label: "latency (us)".into(),
            series: vec![Series {
                name: "with zero".into(),
                points: vec![(0, 3.0), (1, 3.1), (2, 3.2)],
            }],
        };
        let svg = write_and_read("zero", "Zero", &[chart]);
        assert!(svg.contains("with zero") && !svg.contains("with zero (no data)"));
        assert_eq!(
            usable(&[(0, 3.0), (2, 3.2), (1, 3.1), (4, f64::INFINITY)]),
            vec![(1.0, 3.1), (2.0, 3.2)]
        );
    }

    #[test]
    fn size_ticks_are_binary() {
        let x = size_axis(1.0, f64::from(1u32 << 22));
        let labels: Vec<String> = x.ticks.iter().map(|&t| size_label(t)).collect();
        assert_eq!(
            labels,
            ["1", "8", "64", "512", "4K", "32K", "256K", "2M"].map(String::from)
        );
        assert_eq!(x.light.len(), 23 - 8);
        assert!(x.lo < 1.0 && x.hi > f64::from(1u32 << 22));
        let one = size_axis(64.0, 64.0);
        assert_eq!(one.ticks, vec![32.0, 64.0, 128.0]);
        assert_eq!(size_label(1536.0), "1.5K");
        assert_eq!(size_label(f64::from(1u32 << 30)), "1G");
    }

    #[test]
    fn figure_ticks() {
        let narrow = figure_axis(3.0, 7.0, 0.0);
        assert_eq!(narrow.ticks, vec![2.0, 5.0, 10.0]);
        assert!(narrow.light.contains(&3.0) && !narrow.light.contains(&5.0));
        let same = figure_axis(5.0, 5.0, 0.0);
        assert_eq!(same.ticks, vec![2.0, 5.0, 10.0]);
        let wide = figure_axis(0.5, 12000.0, 0.0);
        let labels: Vec<String> = wide.ticks.iter().map(|&t| figure_label(t)).collect();
        assert_eq!(
            labels,
            ["1", "10", "100", "1000", "10000"].map(String::from)
        );
        let huge = figure_axis(1e-3, 1e12, 0.0);
        assert!(huge.ticks.len() <= 8 && huge.ticks.len() >= 4);
        let raised = figure_axis(3.0, 7.0, 30.0);
        assert_eq!(raised.ticks, vec![2.0, 5.0, 10.0, 20.0]);
        assert_eq!(figure_label(0.05), "0.05");
        assert_eq!(figure_label(1e6), "1e6");
        assert_eq!(figure_label(2e-4), "2e-4");
    }

    #[test]
    fn legend_avoids_the_lines() {
        // Rising lines: the upper left is free.
        let rising = vec![vec![(1.0, 1.0), (1024.0, 1000.0)]];
        let x = size_axis(1.0, 1024.0);
        let names = vec!["a".to_string()];
        let (pos, y) = place_legend(&rising, &names, &x, (1.0, 1000.0));
        assert!(matches!(pos, SeriesLabelPosition::UpperLeft));
        assert_eq!(y, figure_axis(1.0, 1000.0, 0.0));
        // Flat at the top and the bottom: no corner is free, the axis is
        // raised.
        let flat = vec![
            vec![(1.0, 1.0), (1024.0, 1.0)],
            vec![(1.0, 1000.0), (1024.0, 1000.0)],
        ];
        let names = vec!["a".to_string(), "b".to_string()];
        let (pos, y) = place_legend(&flat, &names, &x, (1.0, 1000.0));
        assert!(matches!(pos, SeriesLabelPosition::UpperLeft));
        assert!(y.hi > figure_axis(1.0, 1000.0, 0.0).hi);
        let points = samples(&flat, &x, &y);
        let (w, h) = legend_dims(&names);
        let (pw, ph) = plot_dims(y_label_area(&y));
        assert_eq!(covered(&points, (w / pw, h / ph), &pos), 0);
    }
}
