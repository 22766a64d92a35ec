//! `run`, `verify`, `bench` and the measuring half of `profile`: a session evaluates
//! each case (oracle, checks, timings of the engine's plans) and the report is printed,
//! saved and plotted.

use std::path::PathBuf;

use evokernel::backend::BackendChoice;
use evokernel::session::{CaseReport, Options, Session};
use evokernel::{ConvSpec, Error, Pass};

use crate::args::Common;
use crate::output::{spinner, write_json_or_keep};
use crate::{plot, table};

/// Runs the cases (the seed problem when none); `profile` = Some((no_counters, out))
/// hands the report to `profile`. `Ok(false)` when a check failed.
pub fn run(
    common: Common,
    cases: Vec<(String, ConvSpec)>,
    options: Options,
    title: &str,
    profile: Option<(bool, PathBuf)>,
) -> Result<bool, Error> {
    let backend: BackendChoice = common.backend;
    let mut session = Session::open(backend)?;
    if profile.is_some() && session.cuda().is_none() {
        return Err(Error::BackendUnavailable {
            backend: "cuda".into(),
            reason: "profile reads kernel resources and hardware counters, which exist only on \
                     a CUDA GPU (evokernel run/bench time the CPU backend)"
                .into(),
        });
    }
    let cases = if cases.is_empty() {
        session.demo_cases()
    } else {
        cases
    };
    let dev = session.device().clone();
    println!(
        "evokernel {title}: {} ({}; {}), seed {}",
        dev.name, dev.backend, dev.detail, options.seed
    );
    if options.time {
        let bar = spinner("calibrating the device's ceilings");
        let c = session.ceilings();
        bar.finish_and_clear();
        let c = c?;
        println!(
            "ceilings: copy {:.1} GB/s, f32 FMA {:.1} GFLOP/s{}",
            c.copy_gbps,
            c.fma_gflops,
            c.tensor_gflops
                .map(|t| format!(", tensor {t:.0} GFLOP/s"))
                .unwrap_or_default()
        );
    }
    let mut reports: Vec<CaseReport> = Vec::new();
    let mut options = options;
    for pass in common.pass.passes() {
        options.pass = pass;
        for (name, spec) in &cases {
            let name = match pass {
                Pass::Forward => name.clone(),
                _ => format!("{name} {pass}"),
            };
            let bar = spinner(&format!("{name}: starting"));
            let mut progress = |msg: &str| bar.set_message(format!("{name}: {msg}"));
            let report = session.evaluate(&name, spec, &options, &mut progress);
            bar.finish_and_clear();
            reports.push(report?);
        }
    }
    let all_passed = reports.iter().all(CaseReport::passed);
    let report = session.report(&options, reports);
    println!("{}", table::render(&report));
    if let Some((no_counters, out)) = profile {
        return super::profile::report(report, &cases, &common, no_counters, &out)
            .map(|()| all_passed);
    }
    if let Some(path) = &common.json {
        write_json_or_keep(path, &report);
    }
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    if let Some(dir) = &common.plot {
        for f in plot::write_all(&report, dir)? {
            println!("plot written to {}", f.display());
        }
    }
    if !all_passed {
        eprintln!("error: some implementations failed verification (see the table)");
    }
    for case in &report.cases {
        for r in case.rows.iter().filter(|r| !r.verdict.passed) {
            if evokernel::session::is_reference_row(&r.name) {
                eprintln!(
                    "note: {}: the reference {} missed the gate; it is left out of the best reference",
                    case.name, r.name
                );
            }
        }
    }
    Ok(all_passed)
}
