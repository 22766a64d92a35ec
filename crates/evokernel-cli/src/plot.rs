//! Plots of a run report, PNG and SVG: the ladder (time per implementation, log scale,
//! with cuDNN and the floor as reference lines) and a roofline (measured ceilings and
//! each implementation's achieved point).

use std::path::{Path, PathBuf};

use evokernel::session::{CaseReport, RunReport};
use evokernel::Error;
use plotters::coord::Shift;
use plotters::prelude::*;

/// DejaVu Sans (free license in assets/DejaVuSans.LICENSE): text renders the same on
/// every machine, with no system fonts needed.
const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

fn register_font() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The embedded font is valid; if registration failed, text would be missing, not wrong.
        let _ = plotters::style::register_font(FAMILY, FontStyle::Normal, FONT);
    });
}

fn plot_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Io {
        action: "cannot draw plot",
        path: path.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    }
}

/// Writes `ladder-<case>.{png,svg}` for every timed case and `roofline.{png,svg}`;
/// returns the files written.
pub fn write_all(report: &RunReport, dir: &Path) -> Result<Vec<PathBuf>, Error> {
    check_plottable(report)?;
    register_font();
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        action: "cannot create plot folder",
        path: dir.to_path_buf(),
        source,
    })?;
    let mut written = Vec::new();
    for case in report
        .cases
        .iter()
        .filter(|c| c.rows.iter().any(|r| r.timing.is_some()))
    {
        let stem = format!("ladder-{}", sanitize(&case.name));
        for ext in ["png", "svg"] {
            let path = dir.join(format!("{stem}.{ext}"));
            let title = format!("{}: {} on {}", case.name, case.spec, report.device.name);
            match ext {
                "png" => ladder(
                    BitMapBackend::new(&path, (1100, 520)).into_drawing_area(),
                    case,
                    &title,
                ),
                _ => ladder(
                    SVGBackend::new(&path, (1100, 520)).into_drawing_area(),
                    case,
                    &title,
                ),
            }
            .map_err(|e| plot_err(&path, e))?;
            written.push(path);
        }
    }
    if report.ceilings.is_some()
        && report
            .cases
            .iter()
            .any(|c| c.rows.iter().any(|r| r.throughput.is_some()))
    {
        for ext in ["png", "svg"] {
            let path = dir.join(format!("roofline.{ext}"));
            match ext {
                "png" => roofline(
                    BitMapBackend::new(&path, (1000, 650)).into_drawing_area(),
                    report,
                ),
                _ => roofline(
                    SVGBackend::new(&path, (1000, 650)).into_drawing_area(),
                    report,
                ),
            }
            .map_err(|e| plot_err(&path, e))?;
            written.push(path);
        }
    }
    Ok(written)
}

fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// Log axes over absurd values (a median of 0, a ceiling of 1e308) never finish drawing:
/// every value a plot reads must be finite and within what a measurement can give.
fn check_plottable(report: &RunReport) -> Result<(), Error> {
    let bad = |what: String, v: f64| Error::Parse {
        what: "run report",
        text: format!("{what} = {v}"),
        expected: "a finite positive value below 1e12 (a report written by evokernel --json)"
            .into(),
    };
    let sane = |v: f64| v.is_finite() && v > 0.0 && v < 1e12;
    if let Some(c) = report.ceilings {
        for (what, v) in [("copy_gbps", c.copy_gbps), ("fma_gflops", c.fma_gflops)]
            .into_iter()
            .chain(c.tensor_gflops.map(|t| ("tensor_gflops", t)))
        {
            if !sane(v) {
                return Err(bad(format!("ceilings.{what}"), v));
            }
        }
    }
    for case in &report.cases {
        if let Some(f) = case.floor_ms {
            if !sane(f) {
                return Err(bad(format!("{}: floor_ms", case.name), f));
            }
        }
        if !(case.flops as f64).is_finite() || case.min_bytes == 0 {
            return Err(bad(
                format!("{}: min_bytes", case.name),
                case.min_bytes as f64,
            ));
        }
        for r in &case.rows {
            if let Some(t) = r.timing {
                for v in [t.median_ms, t.min_ms, t.max_ms] {
                    if !sane(v) {
                        return Err(bad(format!("{} {}: timing", case.name, r.name), v));
                    }
                }
            }
            if let Some(s) = r.speedup_vs_baseline {
                if !sane(s) {
                    return Err(bad(format!("{} {}: speedup", case.name, r.name), s));
                }
            }
        }
    }
    Ok(())
}

/// Horizontal bars of median time per implementation (log scale), fastest at the top.
fn ladder<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    case: &CaseReport,
    title: &str,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let mut rows: Vec<(&str, f64, Option<f64>)> = case
        .rows
        .iter()
        .filter_map(|r| {
            r.timing
                .map(|t| (r.name.as_str(), t.median_ms, r.speedup_vs_baseline))
        })
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    let baseline = rows.iter().find(|r| r.0 == "cudnn").map(|r| r.1);
    let lo = rows
        .iter()
        .map(|r| r.1)
        .chain(case.floor_ms)
        .fold(f64::MAX, f64::min)
        / 2.0;
    let hi = rows.iter().map(|r| r.1).fold(0.0, f64::max) * 4.0;
    let n = rows.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FAMILY, 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(120)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..n as f64)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("median ms per launch (log scale)")
        .x_label_formatter(&|v| format!("{v}"))
        .y_labels(n.max(1) * 2 + 1)
        .y_label_formatter(&|y| {
            let i = y.floor() as usize;
            if (y - y.floor() - 0.5).abs() < 1e-6 && i < n {
                rows[i].0.to_string()
            } else {
                String::new()
            }
        })
        .label_style((FAMILY, 14))
        .draw()?;
    for (i, (name, ms, speedup)) in rows.iter().enumerate() {
        let color = if *name == "cudnn" {
            RGBColor(200, 70, 60)
        } else {
            RGBColor(60, 110, 190)
        };
        chart.draw_series(std::iter::once(Rectangle::new(
            [(lo, i as f64 + 0.15), (*ms, i as f64 + 0.85)],
            color.filled(),
        )))?;
        let label = match speedup {
            Some(s) => format!("{ms:.3} ms  ({s:.1}x cuDNN)"),
            None => format!("{ms:.3} ms"),
        };
        chart.draw_series(std::iter::once(Text::new(
            label,
            (*ms * 1.08, i as f64 + 0.35),
            (FAMILY, 14).into_font(),
        )))?;
    }
    if let Some(f) = case.floor_ms {
        chart
            .draw_series(LineSeries::new(
                vec![(f, 0.0), (f, n as f64)],
                BLACK.stroke_width(2),
            ))?
            .label(format!("floor {f:.3} ms"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.stroke_width(2)));
    }
    if let Some(b) = baseline {
        chart
            .draw_series(LineSeries::new(
                vec![(b, 0.0), (b, n as f64)],
                RGBColor(200, 70, 60).stroke_width(1),
            ))?
            .label(format!("cuDNN {b:.2} ms"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RGBColor(200, 70, 60)));
    }
    finish(&mut chart, &root, SeriesLabelPosition::UpperRight)
}

/// Draws the legend and writes the file.
fn finish<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    root: &DrawingArea<DB, Shift>,
    position: SeriesLabelPosition,
) -> DrawResult
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .position(position)
        .label_font((FAMILY, 14))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Roofline: arithmetic intensity (FLOP per minimum byte) against achieved GFLOP/s,
/// under the measured copy bandwidth and compute ceilings.
fn roofline<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, report: &RunReport) -> DrawResult
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let Some(c) = report.ceilings else {
        return Ok(());
    };
    let peak = c.tensor_gflops.unwrap_or(0.0).max(c.fma_gflops);
    let (x0, x1) = (0.5f64, 2000f64);
    let y1 = peak * 3.0;
    let y0 = report
        .cases
        .iter()
        .flat_map(|k| k.rows.iter().filter_map(|r| r.throughput.map(|t| t.gflops)))
        .fold(c.copy_gbps * x0, f64::min)
        / 3.0;
    let title = format!(
        "roofline on {} (ceilings measured in this run)",
        report.device.name
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FAMILY, 18))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("FLOP per byte of minimum traffic (log)")
        .y_desc("GFLOP/s (log)")
        .x_label_formatter(&|v| format!("{v}"))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .label_style((FAMILY, 14))
        .draw()?;
    let xs: Vec<f64> = (0..=60)
        .map(|i| x0 * (x1 / x0).powf(i as f64 / 60.0))
        .collect();
    let mut roof = |ceiling: f64, label: String, color: RGBColor| -> DrawResult {
        chart
            .draw_series(LineSeries::new(
                xs.iter().map(|&x| (x, (c.copy_gbps * x).min(ceiling))),
                color.stroke_width(2),
            ))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        Ok(())
    };
    roof(
        c.fma_gflops,
        format!(
            "copy {:.0} GB/s, f32 FMA {:.1} TFLOP/s",
            c.copy_gbps,
            c.fma_gflops / 1e3
        ),
        RGBColor(90, 90, 90),
    )?;
    if let Some(t) = c.tensor_gflops {
        roof(
            t,
            format!("bf16 mma.sync {:.0} TFLOP/s", t / 1e3),
            RGBColor(60, 150, 80),
        )?;
    }
    let palette = [
        RGBColor(200, 70, 60),
        RGBColor(60, 110, 190),
        RGBColor(230, 150, 30),
        RGBColor(130, 80, 170),
        RGBColor(40, 160, 160),
        RGBColor(120, 120, 40),
    ];
    for case in &report.cases {
        let ai = case.flops as f64 / case.min_bytes as f64;
        for (i, r) in case.rows.iter().enumerate() {
            let Some(t) = r.throughput else { continue };
            let color = palette[i % palette.len()];
            chart.draw_series(std::iter::once(Circle::new(
                (ai, t.gflops),
                5,
                color.filled(),
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                format!("{} {} ({:.1}% of floor)", case.name, r.name, t.pct_of_floor),
                (ai * 1.12, t.gflops),
                (FAMILY, 13).into_font(),
            )))?;
        }
    }
    finish(&mut chart, &root, SeriesLabelPosition::UpperLeft)
}
