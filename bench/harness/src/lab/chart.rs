//! Bar charts of the lab results (PNG).
//!
//! The lab's table is exact but long: one row per corpus × scenario with throughput, bytes on
//! the wire and CPU figures. This module draws the same numbers as one PNG that can be read at a
//! glance, e.g. in a README or a pull request, so that a reader sees in a second whether the
//! near-storage agent beats the baseline on the 1 Gbit/s link, by how much, and what the host
//! pays for it in CPU.
//!
//! The chart is a stack of [`Panel`]s sharing one title and subtitle. In each panel the bars are
//! grouped by corpus (r50k, cl100k, o200k: the x axis) and coloured by scenario (baseline S3
//! read, agent with u16 / bits:N / zstd, DPU-style agent chain, in-process ceiling), with the
//! same colour for a scenario in every panel and a legend per panel. The lab draws:
//!
//! - **throughput relative to the baseline**: tokens/s of each scenario divided by the
//!   baseline's tokens/s for the same corpus, with a dashed reference line at 1.0 and the ratio
//!   written above each bar (`1.97×`); bars above the line are faster than narrowing raw int32
//!   on the host;
//! - **consumer CPU per token**: CPU time the training host spends per token delivered (lower is
//!   better), which shows whether a scenario buys its speed by burning host cores.
//!
//! Text is rendered with plotters' `ab_glyph` backend, which ships no fonts: DejaVu Sans is
//! loaded at run time from the usual system paths (Debian's `fonts-dejavu-core`) and registered
//! once per process.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{bail, Context};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One bar.
pub struct Bar {
    /// The x-axis group the bar belongs to (e.g. the corpus).
    pub group: String,
    /// The series the bar belongs to (e.g. the scenario); picks the colour and the legend entry.
    pub label: String,
    /// Bar height, ≥ 0; NaN or +∞ (a failed measurement) draws no bar, just `n/a`.
    pub value: f64,
    /// Text drawn just above the bar (e.g. `1.97×`); empty for none.
    pub note: String,
}

/// One chart panel: bars grouped by `group` (in first-seen order), one colour per distinct `label` (consistent across groups, with a legend).
pub struct Panel {
    /// Panel title, drawn above its legend.
    pub title: String,
    /// Y-axis description (quantity and unit).
    pub y_label: String,
    /// The bars, in any order; groups and labels keep their first-seen order.
    pub bars: Vec<Bar>,
    /// A horizontal dashed line at this value, with its text to the right of the plot.
    pub reference: Option<(f64, String)>,
}

/// Image width in pixels.
const WIDTH: u32 = 1400;
/// Height of the title block at the top of the image.
const HEADER_HEIGHT: u32 = 100;
/// Height of each panel.
const PANEL_HEIGHT: u32 = 450;

/// The font family name the DejaVu files are registered under.
const FAMILY: &str = "sans-serif";

/// Tableau 10: distinct, colour-blind-friendlier than plotters' defaults.
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x4e, 0x79, 0xa7),
    RGBColor(0xf2, 0x8e, 0x2b),
    RGBColor(0x59, 0xa1, 0x4f),
    RGBColor(0xe1, 0x57, 0x59),
    RGBColor(0x76, 0xb7, 0xb2),
    RGBColor(0xb0, 0x7a, 0xa1),
    RGBColor(0xed, 0xc9, 0x48),
    RGBColor(0x9c, 0x75, 0x5f),
    RGBColor(0xff, 0x9d, 0xa7),
    RGBColor(0xba, 0xb0, 0xac),
];
const TEXT: RGBColor = RGBColor(0x22, 0x22, 0x22);
const MUTED: RGBColor = RGBColor(0x55, 0x55, 0x55);
const GRID: RGBColor = RGBColor(0xe4, 0xe4, 0xe4);
const AXIS: RGBColor = RGBColor(0x88, 0x88, 0x88);

/// Renders the panels stacked vertically into one PNG.
///
/// The image is 1400 px wide and 100 px (title) + 450 px per panel high.
pub fn render_png(
    path: &Path,
    title: &str,
    subtitle: &str,
    panels: &[Panel],
) -> anyhow::Result<()> {
    for panel in panels {
        for bar in &panel.bars {
            if bar.value < 0.0 {
                bail!(
                    "chart panel {:?}: bar {:?}/{:?} has value {}, expected a value >= 0",
                    panel.title,
                    bar.group,
                    bar.label,
                    bar.value
                );
            }
        }
        if let Some((value, text)) = &panel.reference {
            if !value.is_finite() || *value < 0.0 {
                bail!(
                    "chart panel {:?}: reference {text:?} at {value}, expected a finite value >= 0",
                    panel.title
                );
            }
        }
    }
    ensure_fonts()?;

    let height = HEADER_HEIGHT + PANEL_HEIGHT * panels.len() as u32;
    let root = BitMapBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (header, body) = root.split_vertically(HEADER_HEIGHT);
    let centre_top = Pos::new(HPos::Center, VPos::Top);
    header.draw(&Text::new(
        title.to_string(),
        (WIDTH as i32 / 2, 22),
        font(30, FontStyle::Bold).color(&TEXT).pos(centre_top),
    ))?;
    header.draw(&Text::new(
        subtitle.to_string(),
        (WIDTH as i32 / 2, 64),
        font(18, FontStyle::Normal).color(&MUTED).pos(centre_top),
    ))?;

    // One colour per label across all panels, so a scenario looks the same everywhere.
    let all_labels = first_seen(
        panels
            .iter()
            .flat_map(|p| p.bars.iter().map(|b| b.label.as_str())),
    );
    let colour_of = |label: &str| {
        let i = all_labels.iter().position(|l| *l == label).unwrap_or(0);
        colour(i)
    };

    // Room right of the plots for the reference lines' text; the same in every panel so
    // that the plots line up.
    let mut margin_right = 40;
    for (_, text) in panels.iter().filter_map(|p| p.reference.as_ref()) {
        let (w, _) = root.estimate_text_size(text, &font(16, FontStyle::Normal))?;
        margin_right = margin_right.max(w as i32 + 24);
    }

    if !panels.is_empty() {
        let areas = body.split_evenly((panels.len(), 1));
        for (panel, area) in panels.iter().zip(&areas) {
            draw_panel(&root, area, panel, &colour_of, margin_right)
                .with_context(|| format!("drawing chart panel {:?}", panel.title))?;
        }
    }
    root.present()
        .with_context(|| format!("writing chart {}", path.display()))?;
    Ok(())
}

/// Font size of the notes above the bars, before shrinking to fit.
const NOTE_SIZE: u32 = 15;
/// At most this many y-axis ticks.
const Y_TICKS: usize = 8;

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

fn draw_panel(
    root: &Area<'_>,
    area: &Area<'_>,
    panel: &Panel,
    colour_of: &dyn Fn(&str) -> RGBColor,
    margin_right: i32,
) -> anyhow::Result<()> {
    let (width, _) = area.dim_in_pixel();
    let width = width as i32;
    area.draw(&Text::new(
        panel.title.clone(),
        (width / 2, 14),
        font(22, FontStyle::Bold)
            .color(&TEXT)
            .pos(Pos::new(HPos::Center, VPos::Top)),
    ))?;

    let groups = first_seen(panel.bars.iter().map(|b| b.group.as_str()));
    let labels = first_seen(panel.bars.iter().map(|b| b.label.as_str()));
    let legend_bottom = draw_legend(area, &labels, colour_of, 52, width)?;

    if groups.is_empty() {
        area.draw(&Text::new(
            "no data",
            (width / 2, legend_bottom + 120),
            font(18, FontStyle::Normal)
                .color(&MUTED)
                .pos(Pos::new(HPos::Center, VPos::Center)),
        ))?;
        return Ok(());
    }

    let reference_style = font(16, FontStyle::Normal).color(&MUTED);

    let max_value = panel
        .bars
        .iter()
        .map(|b| b.value)
        .filter(|v| v.is_finite())
        .chain(panel.reference.as_ref().map(|r| r.0))
        .fold(0.0_f64, f64::max);
    let y_max = if max_value > 0.0 {
        max_value * 1.18
    } else {
        1.0
    };
    // As many decimals as the ticks plotters will pick need, the same for all of them.
    let ticks = RangedCoordf64::from(0.0..y_max).key_points(Y_TICKS);
    let y_decimals = (0..4)
        .find(|&d| {
            let scale = 10f64.powi(d as i32);
            ticks
                .iter()
                .all(|t| ((t * scale).round() - t * scale).abs() < 1e-6)
        })
        .unwrap_or(4);

    let n_groups = groups.len();
    let x_range = -0.5..n_groups as f64 - 0.5;
    let mut chart = ChartBuilder::on(area)
        .margin_top(legend_bottom + 8)
        .margin_bottom(8)
        .margin_left(16)
        .margin_right(margin_right)
        .x_label_area_size(40)
        .y_label_area_size(76)
        .build_cartesian_2d(x_range, 0.0..y_max)?;

    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(panel.y_label.as_str())
        .y_labels(Y_TICKS)
        .y_label_formatter(&|y| format!("{y:.y_decimals$}"))
        .x_labels(0)
        .y_label_style(font(16, FontStyle::Normal).color(&TEXT))
        .axis_desc_style(font(16, FontStyle::Normal).color(&TEXT))
        .axis_style(AXIS)
        .bold_line_style(GRID)
        .light_line_style(TRANSPARENT)
        .draw()?;

    // The reference line goes behind the bars and their notes.
    if let Some((value, text)) = &panel.reference {
        let x_end = n_groups as f64 - 0.5;
        chart.draw_series(DashedLineSeries::new(
            [(-0.5, *value), (x_end, *value)],
            10,
            6,
            MUTED.stroke_width(2),
        ))?;
        // Drawn on the root, in backend pixels, so it can sit in the right margin.
        let (px, py) = chart.backend_coord(&(x_end, *value));
        root.draw(&Text::new(
            text.clone(),
            (px + 8, py),
            reference_style.pos(Pos::new(HPos::Left, VPos::Center)),
        ))?;
    }

    // Group names under the x axis, drawn on the root in backend pixels (outside the plot).
    let group_style = font(18, FontStyle::Normal)
        .color(&TEXT)
        .pos(Pos::new(HPos::Center, VPos::Top));
    for (gi, group) in groups.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(gi as f64, 0.0));
        root.draw(&Text::new(
            group.to_string(),
            (px, py + 10),
            group_style.clone(),
        ))?;
    }

    // Bars of a group sit side by side, centred on the group; every bar has the same width
    // (that of the fullest group), and labels missing from a group leave no gap.
    let max_in_group = groups
        .iter()
        .map(|g| panel.bars.iter().filter(|b| b.group == *g).count())
        .max()
        .unwrap_or(1)
        .max(1);
    let bar_width = 0.84 / max_in_group as f64;
    let gap = bar_width * 0.08;
    let bar_pixels = {
        let (left, _) = chart.backend_coord(&(0.0, 0.0));
        let (right, _) = chart.backend_coord(&(bar_width, 0.0));
        (right - left) as f64
    };
    // Notes go on top of all the bars, so a wide one is never hidden by a neighbour.
    let mut notes = Vec::new();
    for (gi, group) in groups.iter().enumerate() {
        let mut in_group: Vec<&Bar> = panel.bars.iter().filter(|b| b.group == *group).collect();
        in_group.sort_by_key(|b| labels.iter().position(|l| *l == b.label));
        let start = gi as f64 - bar_width * in_group.len() as f64 / 2.0;
        for (j, bar) in in_group.iter().enumerate() {
            let x0 = start + j as f64 * bar_width + gap / 2.0;
            let x1 = x0 + bar_width - gap;
            if !bar.value.is_finite() {
                notes.push(((x0 + x1) / 2.0, 0.0, "n/a"));
                continue;
            }
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x0, 0.0), (x1, bar.value)],
                colour_of(&bar.label).filled(),
            )))?;
            if !bar.note.is_empty() {
                notes.push(((x0 + x1) / 2.0, bar.value, bar.note.as_str()));
            }
        }
    }
    for (x, value, note) in notes {
        // Shrink a note that is wider than its bar's slot, so neighbours don't collide.
        let (w, _) = area.estimate_text_size(note, &font(NOTE_SIZE, FontStyle::Normal))?;
        let size = if w as f64 > bar_pixels {
            ((NOTE_SIZE as f64 * bar_pixels / w as f64).floor() as u32).max(9)
        } else {
            NOTE_SIZE
        };
        let style = font(size, FontStyle::Normal)
            .color(&TEXT)
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        chart.draw_series(std::iter::once(
            EmptyElement::at((x, value)) + Text::new(note.to_string(), (0, -5), style),
        ))?;
    }
    Ok(())
}

/// Draws the legend centred in rows starting at `top`; returns the y just below it.
fn draw_legend(
    area: &Area<'_>,
    labels: &[&str],
    colour_of: &dyn Fn(&str) -> RGBColor,
    top: i32,
    width: i32,
) -> anyhow::Result<i32> {
    const SWATCH: i32 = 14;
    const ROW: i32 = 26;
    const ITEM_GAP: i32 = 28;
    let style = font(16, FontStyle::Normal).color(&TEXT);
    let mut items = Vec::with_capacity(labels.len());
    for label in labels {
        let (w, _) = area.estimate_text_size(label, &style)?;
        items.push((*label, SWATCH + 7 + w as i32));
    }
    // Greedy rows that fit in the panel width.
    let max_row = width - 80;
    let mut rows: Vec<Vec<(&str, i32)>> = Vec::new();
    let mut row_width = 0;
    for item in items {
        match rows.last_mut() {
            Some(row) if row_width + ITEM_GAP + item.1 <= max_row => {
                row_width += ITEM_GAP + item.1;
                row.push(item);
            }
            _ => {
                row_width = item.1;
                rows.push(vec![item]);
            }
        }
    }
    for (r, row) in rows.iter().enumerate() {
        let total: i32 = row.iter().map(|i| i.1).sum::<i32>() + ITEM_GAP * (row.len() as i32 - 1);
        let mut x = (width - total) / 2;
        let y = top + r as i32 * ROW + ROW / 2;
        for (label, item_width) in row {
            area.draw(&Rectangle::new(
                [(x, y - SWATCH / 2), (x + SWATCH, y + SWATCH / 2)],
                colour_of(label).filled(),
            ))?;
            area.draw(&Text::new(
                label.to_string(),
                (x + SWATCH + 7, y),
                style.pos(Pos::new(HPos::Left, VPos::Center)),
            ))?;
            x += item_width + ITEM_GAP;
        }
    }
    Ok(top + rows.len() as i32 * ROW)
}

fn font(size: u32, style: FontStyle) -> TextStyle<'static> {
    TextStyle::from((FAMILY, size as f64, style))
}

fn colour(i: usize) -> RGBColor {
    if i < PALETTE.len() {
        PALETTE[i]
    } else {
        // Beyond the palette: spread hues by the golden angle.
        let hue = (i as f64 * 0.618_034).fract();
        let (r, g, b) = HSLColor(hue, 0.55, 0.55).rgb();
        RGBColor(r, g, b)
    }
}

/// Distinct items in first-seen order.
fn first_seen<'a>(items: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen: Vec<&str> = Vec::new();
    for item in items {
        if !seen.contains(&item) {
            seen.push(item);
        }
    }
    seen
}

/// Where DejaVu Sans usually lives: Debian/Ubuntu (`fonts-dejavu-core`), Fedora, Arch, Alpine,
/// FreeBSD, Homebrew.
const REGULAR_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/ttf-dejavu/DejaVuSans.ttf",
    "/usr/local/share/fonts/dejavu/DejaVuSans.ttf",
    "/opt/homebrew/share/fonts/DejaVuSans.ttf",
];
const BOLD_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans-Bold.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans-Bold.ttf",
    "/usr/share/fonts/TTF/DejaVuSans-Bold.ttf",
    "/usr/share/fonts/ttf-dejavu/DejaVuSans-Bold.ttf",
    "/usr/local/share/fonts/dejavu/DejaVuSans-Bold.ttf",
    "/opt/homebrew/share/fonts/DejaVuSans-Bold.ttf",
];

/// Reads the first candidate font file that exists.
fn load_font(candidates: &[PathBuf]) -> anyhow::Result<(PathBuf, Vec<u8>)> {
    for path in candidates {
        if let Ok(bytes) = std::fs::read(path) {
            return Ok((path.clone(), bytes));
        }
    }
    let tried: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
    bail!(
        "no font for the lab chart: tried {}; install DejaVu Sans (Debian/Ubuntu: apt-get install fonts-dejavu-core)",
        tried.join(", ")
    )
}

/// Registers DejaVu Sans (and its bold face when present) with plotters, once per process;
/// a failed attempt is retried on the next call.
fn ensure_fonts() -> anyhow::Result<()> {
    static REGISTERED: Mutex<bool> = Mutex::new(false);
    let mut registered = REGISTERED.lock().unwrap_or_else(|e| e.into_inner());
    if *registered {
        return Ok(());
    }
    let paths = |c: &[&str]| c.iter().map(PathBuf::from).collect::<Vec<_>>();
    let (regular_path, regular) = load_font(&paths(REGULAR_CANDIDATES))?;
    register(FontStyle::Normal, &regular_path, regular)?;
    // Bold is optional: plotters falls back to the regular face.
    if let Ok((bold_path, bold)) = load_font(&paths(BOLD_CANDIDATES)) {
        register(FontStyle::Bold, &bold_path, bold)?;
    }
    *registered = true;
    Ok(())
}

fn register(style: FontStyle, path: &Path, bytes: Vec<u8>) -> anyhow::Result<()> {
    // plotters keeps the font for the life of the process; this runs at most once per face.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font(FAMILY, style, bytes)
        .map_err(|_| anyhow::anyhow!("{} is not a valid TrueType/OpenType font", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_panels() -> Vec<Panel> {
        let groups = ["r50k (16-bit)", "cl100k (17-bit)", "o200k (18-bit)"];
        let labels = [
            "baseline: S3 int32",
            "agent bits:N",
            "DPU chain + shm ring",
            "in-process (ceiling)",
        ];
        let ratios = [
            [1.0, 1.97, 1.85, 6.2],
            [1.0, 1.86, 1.7, 5.9],
            [1.0, 1.74, 1.6, 5.5],
        ];
        let cpu = [
            [41.0, 9.5, 3.2, 12.0],
            [43.0, 10.1, 3.4, 12.5],
            [44.0, 10.8, 3.3, 13.1],
        ];
        let mut throughput = Vec::new();
        let mut cpu_bars = Vec::new();
        for (g, group) in groups.iter().enumerate() {
            for (l, label) in labels.iter().enumerate() {
                throughput.push(Bar {
                    group: group.to_string(),
                    label: label.to_string(),
                    value: ratios[g][l],
                    note: format!("{:.2}×", ratios[g][l]),
                });
                cpu_bars.push(Bar {
                    group: group.to_string(),
                    label: label.to_string(),
                    value: cpu[g][l],
                    note: format!("{:.1} ns", cpu[g][l]),
                });
            }
        }
        vec![
            Panel {
                title: "Throughput relative to the baseline (tokens/s ÷ baseline tokens/s)".into(),
                y_label: "× baseline tokens/s".into(),
                bars: throughput,
                reference: Some((1.0, "baseline".into())),
            },
            Panel {
                title: "Consumer CPU per token (lower is better)".into(),
                y_label: "CPU ns per token".into(),
                bars: cpu_bars,
                reference: None,
            },
        ]
    }

    fn png_dimensions(bytes: &[u8]) -> (u32, u32) {
        let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        assert_eq!(&bytes[12..16], b"IHDR");
        (be(&bytes[16..20]), be(&bytes[20..24]))
    }

    fn render_sample(path: &Path) -> Vec<u8> {
        render_png(
            path,
            "dquant lab: token delivery over a 1 Gbit/s link",
            "3 corpora × 4 scenarios; bars above the dashed line beat the S3 int32 baseline",
            &sample_panels(),
        )
        .unwrap();
        std::fs::read(path).unwrap()
    }

    #[test]
    fn renders_two_panels_as_png() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = render_sample(&dir.path().join("chart.png"));
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(
            png_dimensions(&bytes),
            (WIDTH, HEADER_HEIGHT + 2 * PANEL_HEIGHT)
        );
        assert!(
            bytes.len() > 20_000,
            "suspiciously small PNG: {} bytes",
            bytes.len()
        );
    }

    #[test]
    fn groups_with_missing_labels_and_empty_panels_render() {
        let dir = tempfile::tempdir().unwrap();
        let bar = |group: &str, label: &str, value: f64| Bar {
            group: group.into(),
            label: label.into(),
            value,
            note: String::new(),
        };
        let panels = [
            Panel {
                title: "ragged".into(),
                y_label: "value".into(),
                bars: vec![
                    bar("a", "x", 0.0),
                    bar("a", "y", 0.3),
                    bar("b", "y", 0.1),
                    bar("b", "x", f64::NAN),
                ],
                reference: Some((2.0, "reference above every bar".into())),
            },
            Panel {
                title: "empty".into(),
                y_label: "value".into(),
                bars: vec![],
                reference: None,
            },
        ];
        let path = dir.path().join("ragged.png");
        render_png(&path, "t", "s", &panels).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(
            png_dimensions(&bytes),
            (WIDTH, HEADER_HEIGHT + 2 * PANEL_HEIGHT)
        );
    }

    #[test]
    fn rejects_negative_values() {
        let dir = tempfile::tempdir().unwrap();
        for value in [-1.0, f64::NEG_INFINITY] {
            let panels = [Panel {
                title: "p".into(),
                y_label: "y".into(),
                bars: vec![Bar {
                    group: "g".into(),
                    label: "l".into(),
                    value,
                    note: String::new(),
                }],
                reference: None,
            }];
            let err = render_png(&dir.path().join("bad.png"), "t", "s", &panels).unwrap_err();
            assert!(err.to_string().contains("expected a value >= 0"), "{err}");
        }
    }

    #[test]
    fn missing_font_error_lists_paths_and_package() {
        let dir = tempfile::tempdir().unwrap();
        let candidates = [
            dir.path().join("a/DejaVuSans.ttf"),
            dir.path().join("b/DejaVuSans.ttf"),
        ];
        let err = load_font(&candidates).unwrap_err().to_string();
        for path in &candidates {
            assert!(err.contains(&path.display().to_string()), "{err}");
        }
        assert!(err.contains("fonts-dejavu-core"), "{err}");
    }

    #[test]
    fn load_font_takes_the_first_existing_candidate() {
        let dir = tempfile::tempdir().unwrap();
        let present = dir.path().join("present.ttf");
        std::fs::write(&present, b"font bytes").unwrap();
        let candidates = [dir.path().join("missing.ttf"), present.clone()];
        let (path, bytes) = load_font(&candidates).unwrap();
        assert_eq!(path, present);
        assert_eq!(bytes, b"font bytes");
    }

    /// Writes the sample chart to /tmp/lab-chart-test.png for a human to look at:
    /// `cargo test -p dquant-bench lab::chart -- --ignored`.
    #[test]
    #[ignore]
    fn write_sample_for_inspection() {
        render_sample(Path::new("/tmp/lab-chart-test.png"));
        let labels: Vec<String> = (0..9)
            .map(|i| format!("scenario number {i} with a long name"))
            .collect();
        let mut bars = Vec::new();
        for (g, group) in ["r50k", "cl100k", "o200k"].iter().enumerate() {
            for (l, label) in labels.iter().enumerate() {
                if (g + l) % 4 != 0 {
                    let value = if (g, l) == (1, 2) {
                        f64::NAN
                    } else {
                        1234.5 * (l + 1) as f64 / (g + 1) as f64
                    };
                    bars.push(Bar {
                        group: group.to_string(),
                        label: label.clone(),
                        value,
                        note: format!("{value:.1} tok/s"),
                    });
                }
            }
        }
        let panels = [Panel {
            title: "ragged groups, many labels".into(),
            y_label: "tokens/s".into(),
            bars,
            reference: Some((3000.0, "a long reference text".into())),
        }];
        render_png(
            Path::new("/tmp/lab-chart-ragged.png"),
            "stress",
            "wrapping legend, shrunk notes",
            &panels,
        )
        .unwrap();
    }
}
