//! Figures with plotters: FPR against merge interval, one figure per filter type (thesis
//! Figure 6.1), as SVG and PNG. Text is drawn with the bundled DejaVu Sans (ab_glyph), so no
//! system font or fontconfig is needed.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::full_palette::{BLUE_600, GREEN_700, GREY_600, ORANGE_700, PURPLE_500};

use super::error::EvalError;
use super::fpr::{PointRow, Split};
use super::variant::{Design, Kind};

/// DejaVu Sans 2.37 (Bitstream Vera license, see `assets/fonts/LICENSE-DejaVu.txt`).
static DEJAVU_SANS: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

/// Registers the bundled font as plotters' `sans-serif` family (once per process).
pub fn register_fonts() -> Result<(), EvalError> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, DEJAVU_SANS).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(EvalError::Plot {
            path: PathBuf::from("assets/fonts/DejaVuSans.ttf"),
            reason: "the bundled font did not load".into(),
        })
    }
}

const PANEL: (u32, u32) = (1000, 600);

fn split_color(split: Split) -> RGBColor {
    match split {
        Split::Ratio(50) => BLUE_600,
        Split::Ratio(80) => ORANGE_700,
        Split::Ratio(99) => GREEN_700,
        Split::Ratio(_) => RED,
        Split::Synced => PURPLE_500,
        Split::AllLocal => GREY_600,
    }
}

/// `1k`, `10k`, `1M`: merge intervals as axis labels.
fn ops_label(x: f64) -> String {
    let x = x.round();
    if x >= 1e6 {
        format!("{}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{}k", x / 1e3)
    } else {
        format!("{x}")
    }
}

fn theory_label(kind: Kind) -> &'static str {
    match kind {
        Kind::Gbf => "theory (Eq. 3.1)",
        Kind::Gcf | Kind::Orcf => "theory (2c/2^l)",
        _ => "configured bound",
    }
}

/// Draws the figure of one filter type from the averaged points and writes
/// `fig-6.1<panel>-<kind>.svg` and `.png` into `dir`. Scalable types get two panels side by
/// side, the thesis design and the per-writer one, each with its own y scale.
pub fn fpr_figure(kind: Kind, points: &[PointRow], dir: &Path) -> Result<Vec<PathBuf>, EvalError> {
    register_fonts()?;
    let panels: Vec<(Design, Vec<&PointRow>)> = kind
        .designs()
        .iter()
        .map(|&d| {
            let pts = points
                .iter()
                .filter(|p| p.kind == kind.slug() && p.design == d.slug())
                .collect();
            (d, pts)
        })
        .filter(|(_, pts): &(Design, Vec<&PointRow>)| !pts.is_empty())
        .collect();
    if panels.is_empty() {
        return Ok(Vec::new());
    }
    let size = (PANEL.0 * panels.len() as u32, PANEL.1);
    let stem = format!("fig-6.1{}-{}", kind.figure_panel(), kind.slug());
    let svg = dir.join(format!("{stem}.svg"));
    let png = dir.join(format!("{stem}.png"));
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |e: String| EvalError::Plot { path, reason: e }
    };
    draw(
        SVGBackend::new(&svg, size).into_drawing_area(),
        kind,
        &panels,
    )
    .map_err(err(&svg))?;
    draw(
        BitMapBackend::new(&png, size).into_drawing_area(),
        kind,
        &panels,
    )
    .map_err(err(&png))?;
    Ok(vec![svg, png])
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    kind: Kind,
    panels: &[(Design, Vec<&PointRow>)],
) -> Result<(), String> {
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let areas = root.split_evenly((1, panels.len()));
    for (area, (design, pts)) in areas.iter().zip(panels) {
        let title = if panels.len() > 1 {
            format!(
                "Fig. 6.1{}: {}, {}",
                kind.figure_panel(),
                kind.label(),
                design.label()
            )
        } else {
            format!("Fig. 6.1{}: {}", kind.figure_panel(), kind.label())
        };
        panel(area, &title, kind, pts).map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

/// A legend line: a sample of the line style and its label.
struct LegendEntry {
    label: String,
    color: RGBColor,
    width: u32,
    /// Dash and gap lengths; solid when `None`.
    dash: Option<(u32, u32)>,
    marker: bool,
}

/// The y range: from 0 when the values spread widely (scalable filters far over their
/// bound), zoomed around the values otherwise so that small differences stay visible.
fn y_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() || hi <= 0.0 {
        return (0.0, 1.0);
    }
    if hi / lo.max(f64::MIN_POSITIVE) > 1.3 {
        (0.0, hi * 1.1)
    } else {
        let pad = (hi - lo).max(hi * 0.01) * 0.5;
        ((lo - pad).max(0.0), hi + pad)
    }
}

fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    kind: Kind,
    pts: &[&PointRow],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let intervals: Vec<f64> = pts
        .iter()
        .filter(|p| p.split.parse::<Split>().is_ok_and(Split::uses_interval))
        .filter_map(|p| p.interval.map(|i| i as f64))
        .collect();
    let (lo, hi) = intervals
        .iter()
        .fold((f64::INFINITY, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    let (x0, x1) = if intervals.is_empty() {
        (1e2, 1e7)
    } else {
        (lo / 1.5, hi * 1.5)
    };
    let theory = pts.iter().map(|p| p.theory).sum::<f64>() / pts.len().max(1) as f64;
    let (y0, y1) = y_range(
        pts.iter()
            .flat_map(|p| [p.fpr, p.estimated_fpr])
            .chain([theory])
            .map(|v| v * 100.0),
    );

    let (plot_area, legend_area) = area.split_horizontally(area.dim_in_pixel().0 as i32 - 290);
    let mut legend = Vec::new();
    let mut chart = ChartBuilder::on(&plot_area)
        .caption(title, ("sans-serif", 21))
        .margin(14)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d((x0..x1).log_scale(), y0..y1)?;
    chart
        .configure_mesh()
        .x_desc("merge interval (operations; a final merge always follows)")
        .y_desc("empirical FPR (%)")
        .x_label_formatter(&|x| ops_label(*x))
        .y_label_formatter(&|y| format!("{y:.2}"))
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .draw()?;

    for split in [Split::Ratio(50), Split::Ratio(80), Split::Ratio(99)] {
        let label = split.to_string();
        let mut line: Vec<(f64, f64, f64)> = pts
            .iter()
            .filter(|p| p.split == label)
            .filter_map(|p| {
                p.interval
                    .map(|i| (i as f64, p.fpr * 100.0, p.estimated_fpr * 100.0))
            })
            .collect();
        if line.is_empty() {
            continue;
        }
        line.sort_by(|a, b| a.0.total_cmp(&b.0));
        let color = split_color(split);
        chart.draw_series(LineSeries::new(
            line.iter().map(|&(x, y, _)| (x, y)),
            color.stroke_width(2),
        ))?;
        chart.draw_series(
            line.iter()
                .map(|&(x, y, _)| Circle::new((x, y), 4, color.filled())),
        )?;
        // The filter's own estimate at the same points, dotted in the same colour.
        chart.draw_series(DashedLineSeries::new(
            line.iter().map(|&(x, _, e)| (x, e)),
            2,
            5,
            color.mix(0.8).stroke_width(2),
        ))?;
        legend.push(LegendEntry {
            label: format!("{label} split"),
            color,
            width: 2,
            dash: None,
            marker: true,
        });
    }
    // The two references give the same state by construction; the wide purple line under the
    // narrow grey one keeps both visible.
    for (split, label, width, dash, gap) in [
        (Split::Synced, "fully synchronised", 5, 12, 6),
        (Split::AllLocal, "all local (100-0)", 2, 6, 6),
    ] {
        let name = split.to_string();
        if let Some(p) = pts.iter().find(|p| p.split == name) {
            let color = split_color(split);
            let y = p.fpr * 100.0;
            chart.draw_series(DashedLineSeries::new(
                [(x0, y), (x1, y)],
                dash,
                gap,
                color.stroke_width(width),
            ))?;
            legend.push(LegendEntry {
                label: label.into(),
                color,
                width,
                dash: Some((dash, gap)),
                marker: false,
            });
        }
    }
    chart.draw_series(DashedLineSeries::new(
        [(x0, theory * 100.0), (x1, theory * 100.0)],
        6,
        4,
        BLACK.stroke_width(1),
    ))?;
    legend.push(LegendEntry {
        label: theory_label(kind).into(),
        color: BLACK,
        width: 1,
        dash: Some((6, 4)),
        marker: false,
    });
    legend.push(LegendEntry {
        label: "dotted: the filter's estimate".into(),
        color: GREY_600,
        width: 2,
        dash: Some((2, 5)),
        marker: false,
    });
    draw_legend(&legend_area, &legend)
}

fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[LegendEntry],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (x, mut y) = (8, 60);
    let font = ("sans-serif", 15).into_font().color(&BLACK);
    for e in entries {
        let ends = vec![(x, y), (x + 40, y)];
        let style = e.color.stroke_width(e.width);
        match e.dash {
            Some((dash, gap)) => area.draw(&DashedPathElement::new(ends, dash, gap, style))?,
            None => area.draw(&PathElement::new(ends, style))?,
        }
        if e.marker {
            area.draw(&Circle::new((x + 20, y), 4, e.color.filled()))?;
        }
        area.draw(&Text::new(e.label.clone(), (x + 50, y - 8), font.clone()))?;
        y += 26;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(ops_label(1000.0), "1k");
        assert_eq!(ops_label(10_000_000.0), "10M");
        assert_eq!(ops_label(100.0), "100");
    }

    #[test]
    fn y_range_zooms_unless_values_spread() {
        let (lo, hi) = y_range([3.0, 3.1].into_iter());
        assert!(lo > 2.5 && lo < 3.0 && hi > 3.1 && hi < 3.5);
        assert_eq!(y_range([1.0, 30.0].into_iter()).0, 0.0);
    }
}
