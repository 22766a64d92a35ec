//! `evokernel profile` after the measuring run: each kernel re-run alone under Nsight
//! Compute, then the verdicts, JSON and plots.

use std::path::PathBuf;

use evokernel::profile::{profile_run, Ncu};
use evokernel::session::RunReport;
use evokernel::variants::registry;
use evokernel::{ConvSpec, Error, Layout};

use crate::args::Common;
use crate::output::{spinner, write_json_or_keep};
use crate::{plot, table};

/// `evokernel profile` after the run: each kernel re-run alone under ncu (this binary's
/// `bench` with the row's exact config), then the verdicts, JSON and plots.
pub fn report(
    report: RunReport,
    cases: &[(String, ConvSpec)],
    common: &Common,
    no_counters: bool,
    out: &std::path::Path,
) -> Result<(), Error> {
    let (ncu, exe) = counters_setup(no_counters)?;
    let seed = report.options.seed;
    let bar = spinner("profiling");
    let profiled = profile_run(report, |case, row| {
        let (metrics, ncu) = match ncu.as_ref()? {
            Ok(found) => found,
            Err(e) => return Some(Err(Error::Profiler { message: e.clone() })),
        };
        bar.set_message(format!("{}: {} under ncu", case.name, row.name));
        // Backward cases are named "<case> <pass>" (measure::run).
        let spec = &cases
            .iter()
            .find(|(n, _)| *n == case.name || format!("{n} {}", case.pass) == case.name)?
            .1;
        let variant = registry().into_iter().find(|v| v.name() == row.name)?;
        let mut args = vec!["bench".to_string()];
        args.extend(spec_flags(spec));
        args.extend(["--only".into(), row.name.clone()]);
        args.extend(["--pass".into(), case.pass.name().into()]);
        if let Some(cfg) = &row.config {
            args.extend(["--config".into(), cfg.clone()]);
        }
        args.extend([
            "--iters".into(),
            "1".into(),
            "--backend".into(),
            "cuda".into(),
        ]);
        args.extend(["--seed".into(), seed.to_string()]);
        let function = row
            .config
            .as_deref()
            .and_then(|c| c.parse::<evokernel::variants::Config>().ok())
            .map_or_else(
                || variant.kernel_function(),
                |c| variant.kernel_function_of(&c),
            );
        let regex = format!("^{function}$");
        Some(ncu.profile(&regex, metrics, &exe, &args))
    });
    bar.finish_and_clear();
    println!("{}", table::profile(&profiled.kernels));
    if let Some(path) = &common.json {
        write_json_or_keep(path, &profiled);
    }
    let dir = common.plot.as_deref().unwrap_or(out);
    for f in plot::write_all(&profiled.run, dir)? {
        println!("plot written to {}", f.display());
    }
    Ok(())
}

/// Nsight Compute and its metric list (None: --no-counters; Err: why there are none,
/// warned once) and this executable, which the profilers re-run under it.
pub type NcuSetup = Option<Result<(Vec<String>, Ncu), String>>;
pub fn counters_setup(no_counters: bool) -> Result<(NcuSetup, PathBuf), Error> {
    let ncu = (!no_counters).then(|| {
        Ncu::locate()
            .and_then(|n| Ok((n.metrics()?, n)))
            .map_err(|e| e.to_string())
    });
    if let Some(Err(e)) = &ncu {
        eprintln!("warning: no counters: {e}");
    }
    let exe = std::env::current_exe().map_err(|source| Error::Io {
        action: "cannot find this executable to re-run under ncu",
        path: PathBuf::from("evokernel"),
        source,
    })?;
    Ok((ncu, exe))
}

/// The `bench` flags that describe `spec` exactly.
pub fn spec_flags(spec: &ConvSpec) -> Vec<String> {
    let off = 3 - spec.spatial_dims();
    let join = |v: &[usize]| {
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join("x")
    };
    let (before, after) = (spec.pad_before3(), spec.pad_after3());
    let pads = (off..3)
        .map(|i| format!("{}:{}", before[i], after[i]))
        .collect::<Vec<_>>()
        .join(",");
    vec![
        "--input".into(),
        join(spec.input_dims()),
        "--channels".into(),
        spec.c().to_string(),
        "--batch".into(),
        spec.n().to_string(),
        "--kernel".into(),
        join(spec.kernel_dims()),
        "--stride".into(),
        join(&spec.stride3()[off..]),
        "--dilation".into(),
        join(&spec.dilation3()[off..]),
        "--padding".into(),
        pads,
        "--layout".into(),
        match spec.layout() {
            Layout::ChannelsFirst => "channels-first".into(),
            Layout::ChannelsLast => "channels-last".into(),
        },
        "--dtype".into(),
        spec.dtype().to_string(),
    ]
}
