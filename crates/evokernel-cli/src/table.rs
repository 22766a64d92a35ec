//! Human-readable tables of a run report.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, CellAlignment, Table};
use evokernel::session::RunReport;

fn num(x: Option<f64>, digits: usize) -> String {
    x.map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

fn sci(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else {
        format!("{x:.2e}")
    }
}

/// One row per (case, implementation): timings only when the implementation was timed.
pub fn render(report: &RunReport) -> String {
    let timed = report
        .cases
        .iter()
        .any(|c| c.rows.iter().any(|r| r.timing.is_some()));
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    let mut header = vec!["case", "spec", "impl", "check", "rel L2", "max err"];
    if timed {
        header.extend([
            "median ms",
            "min ms",
            "max ms",
            "GFLOP/s",
            "GB/s",
            "% floor",
        ]);
    }
    t.set_header(header);
    for case in &report.cases {
        for row in &case.rows {
            let v = &row.verdict;
            let status = if v.passed {
                "PASS".to_string()
            } else if v.comparison.non_finite > 0 {
                format!("FAIL ({} non-finite)", v.comparison.non_finite)
            } else {
                format!("FAIL (gate {:.0e})", v.gate)
            };
            let mut cells = vec![
                Cell::new(&case.name),
                Cell::new(&case.spec),
                Cell::new(&row.name),
                Cell::new(status),
                Cell::new(sci(v.comparison.rel_l2)).set_alignment(CellAlignment::Right),
                Cell::new(sci(v.comparison.max_abs_rel)).set_alignment(CellAlignment::Right),
            ];
            if timed {
                let tm = row.timing;
                let tp = row.throughput;
                for s in [
                    num(tm.map(|x| x.median_ms), 3),
                    num(tm.map(|x| x.min_ms), 3),
                    num(tm.map(|x| x.max_ms), 3),
                    num(tp.map(|x| x.gflops), 1),
                    num(tp.map(|x| x.gbps), 1),
                    num(tp.map(|x| x.pct_of_floor), 1),
                ] {
                    cells.push(Cell::new(s).set_alignment(CellAlignment::Right));
                }
            }
            t.add_row(cells);
        }
    }
    let floors: Vec<String> = report
        .cases
        .iter()
        .filter_map(|c| c.floor_ms.map(|f| format!("{} {:.3} ms", c.name, f)))
        .collect();
    let mut out = t.to_string();
    if !floors.is_empty() {
        out.push_str(&format!(
            "\nfloor (max of bytes/copy and flops/FMA rate): {}",
            floors.join(", ")
        ));
    }
    out
}
