//! PNG line charts with plotters, drawn with the DejaVu Sans font shipped in the repository
//! (`assets/fonts`), so a plot looks the same on a machine without system fonts.

use std::path::Path;
use std::sync::Once;

use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

const FONT: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

/// One line of a chart.
#[derive(Clone, Debug)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// A chart: title, axis labels, lines.
pub struct Chart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub series: &'a [Series],
    /// Mark each point (sparse sweeps) or only draw the line (dense curves such as CDFs).
    pub markers: bool,
    /// Where the legend goes: a corner the lines leave free.
    pub legend_at: SeriesLabelPosition,
}

fn register() -> Result<(), String> {
    static REGISTERED: Once = Once::new();
    let mut result = Ok(());
    REGISTERED.call_once(|| {
        result = register_font(FAMILY, FontStyle::Normal, FONT)
            .map_err(|_| "the shipped font is not a valid TTF".to_string());
    });
    result
}

/// The range of `values` with 5% headroom, never empty.
fn span(values: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    if hi - lo < 1e-9 {
        hi = lo + 1.0;
    }
    let pad = (hi - lo) * 0.05;
    (if from_zero { lo } else { lo - pad }, hi + pad)
}

/// An axis tick: whole numbers on wide axes, two or three decimals on narrow ones.
fn tick(value: f64, width: f64) -> String {
    if width >= 20.0 {
        format!("{value:.0}")
    } else if width >= 2.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// Draws `chart` into the PNG at `path`.
pub fn line_chart(path: &Path, chart: &Chart) -> Result<(), String> {
    register()?;
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let points = || chart.series.iter().flat_map(|s| s.points.iter());
    let (x0, x1) = span(points().map(|p| p.0), false);
    let (y0, y1) = span(points().map(|p| p.1), true);
    let root = BitMapBackend::new(path, (960, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut ctx = ChartBuilder::on(&root)
        .caption(chart.title, (FAMILY, 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| err(&e))?;
    ctx.configure_mesh()
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .y_label_formatter(&|v| tick(*v, y1 - y0))
        .x_label_formatter(&|v| tick(*v, x1 - x0))
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 16))
        .draw()
        .map_err(|e| err(&e))?;
    if chart.series.iter().all(|s| s.points.is_empty()) {
        // Say why the chart is empty rather than leave a blank grid.
        let (w, h) = root.dim_in_pixel();
        root.draw(&Text::new(
            "no data: the target(s) reported null for this metric",
            (w as i32 / 4, h as i32 / 2),
            (FAMILY, 20),
        ))
        .map_err(|e| err(&e))?;
        return root.present().map_err(|e| err(&e));
    }
    for (i, series) in chart.series.iter().enumerate() {
        if series.points.is_empty() {
            continue;
        }
        let color = Palette99::pick(i).to_rgba();
        let style = ShapeStyle::from(color).stroke_width(2);
        ctx.draw_series(LineSeries::new(series.points.iter().copied(), style))
            .map_err(|e| err(&e))?
            .label(series.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        if chart.markers {
            ctx.draw_series(
                series
                    .points
                    .iter()
                    .map(|p| Circle::new(*p, 3, ShapeStyle::from(color).filled())),
            )
            .map_err(|e| err(&e))?;
        }
    }
    ctx.configure_series_labels()
        .label_font((FAMILY, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(chart.legend_at.clone())
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_png() {
        let path = std::env::temp_dir().join(format!("zc-plot-{}.png", std::process::id()));
        let series = [
            Series {
                label: "a".into(),
                points: vec![(1.0, 2.0), (2.0, 3.0)],
            },
            Series {
                label: "empty".into(),
                points: vec![],
            },
        ];
        line_chart(
            &path,
            &Chart {
                title: "test",
                x_label: "x",
                y_label: "y",
                series: &series,
                markers: true,
                legend_at: SeriesLabelPosition::UpperLeft,
            },
        )
        .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
    }

    #[test]
    fn an_empty_chart_says_so() {
        let path = std::env::temp_dir().join(format!("zc-plot-empty-{}.png", std::process::id()));
        let chart = Chart {
            title: "nothing",
            x_label: "x",
            y_label: "y",
            series: &[],
            markers: false,
            legend_at: SeriesLabelPosition::LowerRight,
        };
        line_chart(&path, &chart).unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() > 0);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn spans_are_never_empty() {
        assert_eq!(span([].into_iter(), true), (0.0, 1.0));
        let (lo, hi) = span([5.0, 5.0].into_iter(), true);
        assert!(lo <= 0.0 && hi > 5.0);
    }
}
