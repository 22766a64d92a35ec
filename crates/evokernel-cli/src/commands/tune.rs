//! `evokernel tune`: a progress bar per variant, then a table of default vs tuned.

use evokernel::backend::BackendChoice;
use evokernel::session::{Options, Session, TuneEvent, TunePlan};
use evokernel::{ConvSpec, Error, Pass};
use indicatif::{ProgressBar, ProgressStyle};

use crate::args::Common;
use crate::output::{log_trial, write_json_or_keep};
use crate::table;

pub fn run(
    common: &Common,
    cases: Vec<(String, ConvSpec)>,
    opts: &Options,
    plan: &TunePlan,
) -> Result<bool, Error> {
    let backend: BackendChoice = common.backend;
    let mut session = Session::open(backend)?;
    let dev = session.device().clone();
    println!(
        "evokernel tune: {} ({}; {}), seed {}",
        dev.name, dev.backend, dev.detail, opts.seed
    );
    let mut reports = Vec::new();
    // One tuning per pass asked for (`--pass all`: the forward, grad-input, grad-weight).
    let mut runs = Vec::new();
    for pass in common.pass.passes() {
        for (name, spec) in &cases {
            let name = match pass {
                Pass::Forward => name.clone(),
                _ => format!("{name} {pass}"),
            };
            runs.push((pass, name, spec));
        }
    }
    for (pass, name, spec) in runs {
        let opts = &Options {
            pass,
            ..opts.clone()
        };
        let bar = ProgressBar::new(1);
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        let mut current = String::new();
        let mut on_event = |e: TuneEvent| match e {
            TuneEvent::Stage(s) => bar.set_message(format!("{name}: {s}")),
            TuneEvent::Start { variant, space } => {
                current = variant.to_string();
                bar.reset();
                bar.set_length(space as u64);
                bar.set_message(format!("{name}: {variant}"));
            }
            TuneEvent::Trial {
                done,
                planned,
                best_ms,
                last,
            } => {
                log_trial(&bar, &name, done, planned, last);
                bar.set_length(planned as u64);
                bar.set_position(done as u64);
                bar.set_message(format!(
                    "{name}: {current} best {}",
                    best_ms
                        .map(|m| format!("{m:.3} ms"))
                        .unwrap_or_else(|| "-".into())
                ));
            }
        };
        let report = session.tune(&name, spec, opts, plan, &mut on_event);
        bar.finish_and_clear();
        let report = report?;
        if let Some(w) = &report.cache_warning {
            eprintln!("warning: {w}");
        }
        reports.push(report);
    }
    println!("{}", table::tuning(&reports));
    if let Some(path) = &common.json {
        write_json_or_keep(path, &reports);
    }
    Ok(true)
}
