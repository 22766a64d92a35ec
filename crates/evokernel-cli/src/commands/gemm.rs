//! `bench --op scaled-mm` and `tune --op scaled-mm`: the fp8 scaled GEMM's cases (flags or
//! a GEMM suite) verified and timed against cuBLASLt, or tuned, by the library; printed
//! as tables, saved as JSON.

use std::path::PathBuf;

use evokernel::bench::Protocol;
use evokernel::gemm::tune::tune_case;
use evokernel::gemm::{bench_scaled_mm, load_gemm_suite, GemmCase, GemmKernel, ScaledMmSpec};
use evokernel::profile::{profile_gemm, KernelProfile, SmLimits};
use evokernel::session::TunePlan;
use evokernel::{Engine, Error};
use serde::Serialize;

use crate::args::{Common, GemmArgs, ProblemArgs};
use crate::output::{log_trial, spinner, write_json_or_keep};
use crate::table;

#[derive(Serialize)]
struct GemmReport {
    device: String,
    seed: u64,
    cases: Vec<GemmCase>,
    /// `profile`: each kernel that ran, with its resources, occupancy and counters.
    #[serde(skip_serializing_if = "Option::is_none")]
    kernels: Option<Vec<KernelProfile>>,
}

/// Flags that mean something only for convolutions, refused rather than ignored.
fn refuse_conv_flags(common: &Common) -> Result<(), Error> {
    let given = [
        ("--only", !common.only.is_empty()),
        (
            "--activation",
            common.activation != evokernel::Activation::None,
        ),
        ("--residual", common.residual),
        ("--reference", common.reference.is_some()),
        ("--plot", common.plot.is_some()),
        (
            "--pass",
            common.pass.passes().len() != 1 || common.pass.passes()[0] != evokernel::Pass::Forward,
        ),
    ];
    if let Some((flag, _)) = given.iter().find(|g| g.1) {
        return Err(Error::parse(
            "--op scaled-mm",
            flag,
            "this flag applies to convolutions; the GEMM takes --m/--n/--k or --suite, --scaling, --out-dtype, --bias, --config scaled_mm_wgmma:...",
        ));
    }
    Ok(())
}

/// The cases: `--suite FILE` (or `gemm`, the embedded suite) filtered by `--case`, or
/// the one problem of --m/--n/--k.
fn cases(
    gemm: &GemmArgs,
    suite: Option<&PathBuf>,
    only: &[String],
    bias: bool,
) -> Result<Vec<(String, ScaledMmSpec)>, Error> {
    if let Some(path) = suite {
        let all = load_gemm_suite(path, gemm.scaling, gemm.out_dtype, bias)?;
        if let Some(want) = only.iter().find(|w| !all.iter().any(|c| &c.0 == *w)) {
            return Err(Error::Suite {
                path: path.clone(),
                message: format!(
                    "has no case '{want}'; its cases are: {}",
                    all.iter()
                        .map(|c| c.0.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        return Ok(all
            .into_iter()
            .filter(|c| only.is_empty() || only.contains(&c.0))
            .collect());
    }
    match (gemm.m, gemm.n, gemm.k) {
        (Some(m), Some(n), Some(k)) => Ok(vec![(
            "gemm".to_string(),
            ScaledMmSpec::new(m, n, k, gemm.scaling, gemm.out_dtype, bias)?,
        )]),
        _ => Err(Error::InvalidSpec {
            field: "--m/--n/--k".into(),
            value: "missing".into(),
            expected: "give --m M --n N --k K, or --suite gemm".into(),
        }),
    }
}

/// What both GEMM commands check before any GPU work, then the device.
struct Setup {
    protocol: Protocol,
    /// `--config` kernels (bench and profile; tune refuses them).
    configs: Vec<GemmKernel>,
    cases: Vec<(String, ScaledMmSpec)>,
    engine: Engine,
}

fn setup(
    title: &str,
    common: &Common,
    gemm: &GemmArgs,
    problem: &ProblemArgs,
    iters: usize,
) -> Result<Setup, Error> {
    refuse_conv_flags(common)?;
    if problem.input.is_some() || problem.kernel.is_some() {
        return Err(Error::parse(
            "--op scaled-mm",
            "--input/--kernel",
            "the GEMM takes --m, --n and --k (or --suite gemm)",
        ));
    }
    let protocol = crate::args::protocol(iters)?;
    let configs = common
        .config
        .iter()
        .map(|c| c.parse::<GemmKernel>())
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(path) = &common.json {
        crate::args::check_output_path(path)?;
    }
    let cases = cases(gemm, problem.suite.as_ref(), &problem.case, common.bias)?;
    if common.backend == evokernel::backend::BackendChoice::Cpu {
        return Err(Error::BackendUnavailable {
            backend: "cpu".into(),
            reason: "the fp8 GEMM is measured on a CUDA GPU only (the CPU backend's GEMM is the test reference)".into(),
        });
    }
    let engine = Engine::cuda(0)?;
    let info = engine.device().map(|d| d.info().clone());
    if let Some(i) = info {
        println!(
            "evokernel {title} --op scaled-mm: {} ({}), seed {}",
            i.name,
            i.arch(),
            common.seed
        );
    }
    Ok(Setup {
        protocol,
        configs,
        cases,
        engine,
    })
}

fn device(engine: &Engine) -> Result<&evokernel::cuda::CudaDevice, Error> {
    engine
        .device()
        .map(|d| d.as_ref())
        .ok_or_else(|| Error::BackendUnavailable {
            backend: "cuda".into(),
            reason: "no CUDA device".into(),
        })
}

/// `tune --op scaled-mm`: the wgmma rung's configs searched per case, the best in tune.json.
pub fn tune(
    common: &Common,
    gemm: &GemmArgs,
    problem: &ProblemArgs,
    iters: usize,
    plan: &TunePlan,
) -> Result<bool, Error> {
    if !common.config.is_empty() {
        return Err(Error::parse(
            "--config",
            &common.config[0],
            "tune searches the configs itself; --config is for bench",
        ));
    }
    let s = setup("tune", common, gemm, problem, iters)?;
    let dev = device(&s.engine)?;
    let mut reports = Vec::new();
    for (name, spec) in &s.cases {
        let bar = spinner(&format!("{name}: tuning scaled_mm_wgmma"));
        let r = tune_case(dev, name, spec, plan, &s.protocol, common.seed, &mut |p| {
            log_trial(&bar, name, p.done, p.planned, p.last);
            bar.set_message(format!(
                "{name}: {}/{} timed, best {}",
                p.done,
                p.planned,
                p.best_ms.map_or("-".into(), |b| format!("{b:.4} ms"))
            ))
        });
        bar.finish_and_clear();
        reports.push(r?);
    }
    println!("{}", table::tuning(&reports));
    if let Some(path) = &common.json {
        write_json_or_keep(path, &reports);
    }
    Ok(reports
        .iter()
        .all(|r| r.rows.iter().all(|row| row.best_ms.is_some())))
}

pub fn run(
    common: &Common,
    gemm: &GemmArgs,
    problem: &ProblemArgs,
    iters: usize,
) -> Result<bool, Error> {
    let s = setup("bench", common, gemm, problem, iters)?;
    let report = measure(&s, common)?;
    if let Some(path) = &common.json {
        write_json_or_keep(path, &report);
    }
    Ok(report.cases.iter().all(GemmCase::passed))
}

/// Every case measured (the `--config` kernels, else the ladder), each printed as soon
/// as it is (a suite of large GEMMs takes minutes), then the summary.
fn measure(s: &Setup, common: &Common) -> Result<GemmReport, Error> {
    let configs = &s.configs;
    let dev = device(&s.engine)?;
    let mut report = GemmReport {
        device: dev.info().name.clone(),
        seed: common.seed,
        cases: Vec::new(),
        kernels: None,
    };
    for (name, spec) in &s.cases {
        let bar = spinner(&format!("{name}: {spec}"));
        let case = bench_scaled_mm(dev, name, spec, configs, &s.protocol, common.seed);
        bar.finish_and_clear();
        let case = case?;
        println!("{}", table::gemm(std::slice::from_ref(&case)));
        report.cases.push(case);
    }
    if report.cases.len() > 1 {
        println!("{}", table::gemm_summary(&report.cases));
    }
    Ok(report)
}

/// `profile --op scaled-mm`: the bench, then each kernel that ran re-run alone under
/// Nsight Compute (this binary's `bench` with the candidate's exact config), resources,
/// occupancy and the verdict beside it.
pub fn profile(
    common: &Common,
    gemm: &GemmArgs,
    problem: &ProblemArgs,
    iters: usize,
    no_counters: bool,
) -> Result<bool, Error> {
    let s = setup("profile", common, gemm, problem, iters)?;
    let mut report = measure(&s, common)?;
    let (ncu, exe) = super::profile::counters_setup(no_counters)?;
    let limits = device(&s.engine)?
        .info()
        .sm_limits
        .unwrap_or(SmLimits::HOPPER);
    let bar = spinner("profiling");
    let kernels = profile_gemm(&report.cases, &limits, |case, cand| {
        let (metrics, ncu) = match ncu.as_ref()? {
            Ok(found) => found,
            Err(e) => return Some(Err(Error::Profiler { message: e.clone() })),
        };
        bar.set_message(format!("{}: {} under ncu", case.name, cand.config));
        let mut args: Vec<String> = ["bench", "--op", "scaled-mm"].map(String::from).to_vec();
        for (flag, v) in [("--m", case.m), ("--n", case.n), ("--k", case.k)] {
            args.extend([flag.to_string(), v.to_string()]);
        }
        args.extend([
            "--scaling".into(),
            gemm.scaling.name().into(),
            "--out-dtype".into(),
            gemm.out_dtype.to_string(),
            "--config".into(),
            cand.config.clone(),
            "--iters".into(),
            "1".into(),
            "--seed".into(),
            common.seed.to_string(),
        ]);
        if common.bias {
            args.push("--bias".into());
        }
        Some(ncu.profile(&format!("^{}$", cand.variant), metrics, &exe, &args))
    });
    bar.finish_and_clear();
    println!("{}", table::profile(&kernels));
    report.kernels = Some(kernels);
    if let Some(path) = &common.json {
        write_json_or_keep(path, &report);
    }
    Ok(report.cases.iter().all(GemmCase::passed))
}
