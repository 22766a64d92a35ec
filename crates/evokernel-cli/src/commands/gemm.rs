//! `bench --op scaled-mm`: the fp8 scaled GEMM's cases (flags or a GEMM suite) verified
//! and timed against cuBLASLt by the library; printed as a table, saved as JSON.

use std::path::PathBuf;

use evokernel::gemm::{bench_scaled_mm, load_gemm_suite, GemmCase, GemmKernel, ScaledMmSpec};
use evokernel::{Engine, Error};
use serde::Serialize;

use crate::args::{Common, GemmArgs};
use crate::output::{spinner, write_json_or_keep};
use crate::table;

#[derive(Serialize)]
struct GemmReport {
    device: String,
    seed: u64,
    cases: Vec<GemmCase>,
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

pub fn run(
    common: &Common,
    gemm: &GemmArgs,
    suite: Option<&PathBuf>,
    only_cases: &[String],
    iters: usize,
) -> Result<bool, Error> {
    refuse_conv_flags(common)?;
    let protocol = crate::args::protocol(iters)?;
    if let Some(path) = &common.json {
        crate::args::check_output_path(path)?;
    }
    let configs = common
        .config
        .iter()
        .map(|c| c.parse::<GemmKernel>())
        .collect::<Result<Vec<_>, _>>()?;
    let cases = cases(gemm, suite, only_cases, common.bias)?;
    if common.backend == evokernel::backend::BackendChoice::Cpu {
        return Err(Error::BackendUnavailable {
            backend: "cpu".into(),
            reason: "the fp8 GEMM is measured on a CUDA GPU only (the CPU backend's GEMM is the test reference)".into(),
        });
    }
    let engine = Engine::cuda(0)?;
    let dev = engine.device().ok_or_else(|| Error::BackendUnavailable {
        backend: "cuda".into(),
        reason: "no CUDA device".into(),
    })?;
    println!(
        "evokernel bench --op scaled-mm: {} ({}), seed {}",
        dev.info().name,
        dev.info().arch(),
        common.seed
    );
    let mut report = GemmReport {
        device: dev.info().name.clone(),
        seed: common.seed,
        cases: Vec::new(),
    };
    // Each case's rows as soon as it is measured (a suite of large GEMMs takes minutes).
    for (name, spec) in &cases {
        let bar = spinner(&format!("{name}: {spec}"));
        let case = bench_scaled_mm(dev, name, spec, &configs, &protocol, common.seed);
        bar.finish_and_clear();
        let case = case?;
        println!("{}", table::gemm(std::slice::from_ref(&case)));
        report.cases.push(case);
    }
    if report.cases.len() > 1 {
        println!("{}", table::gemm_summary(&report.cases));
    }
    if let Some(path) = &common.json {
        write_json_or_keep(path, &report);
    }
    Ok(report.cases.iter().all(GemmCase::passed))
}
