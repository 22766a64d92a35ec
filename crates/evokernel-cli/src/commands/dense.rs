//! `bench --op dense-conv` and `tune --op dense-conv`: dense and grouped convolution
//! cases (spec flags with --out-channels/--groups, or a dense suite) verified against the
//! oracle and timed by the library on Vulkan and the CPU, or the Vulkan direct shader's
//! configs searched; printed as tables, saved as JSON.

use std::path::PathBuf;

use evokernel::backend::BackendChoice;
use evokernel::dense::bench::{bench_dense, DenseCaseReport, DenseKernel};
use evokernel::dense::tune::{tune_dense_case, TUNED_SHADERS};
use evokernel::dense::{load_dense_suite, DenseConvSpec};
use evokernel::external::ExternalTimes;
use evokernel::tune::TunePlan;
use evokernel::vulkan::dense_coopmat::CoopmatConfig;
use evokernel::vulkan::dense_coopmat2::Coopmat2Config;
use evokernel::vulkan::dense_direct::DirectConfig;
use evokernel::vulkan::dense_winograd::WinogradConfig;
use evokernel::vulkan::dense_winograd_coopmat2::WinogradCoopmat2Config;
use evokernel::vulkan::depth_rotate::RotateConfig;
use evokernel::vulkan::depth_rotate_cl::RotateClConfig;
use evokernel::vulkan::tile::TileConfig;
use evokernel::vulkan::VulkanDevice;
use evokernel::{Error, Pass};
use serde::Serialize;

use crate::args::{Common, GemmArgs, ProblemArgs};
use crate::output::{log_trial, spinner, write_json_or_keep};
use crate::table;

#[derive(Serialize)]
struct DenseReport {
    device: Option<String>,
    seed: u64,
    cases: Vec<DenseCaseReport>,
}

/// Flags that mean something only for other problems, refused rather than ignored.
fn refuse_other_flags(common: &Common, gemm: &GemmArgs) -> Result<(), Error> {
    let given = [
        ("--bias", common.bias),
        (
            "--activation",
            common.activation != evokernel::Activation::None,
        ),
        ("--residual", common.residual),
        ("--plot", common.plot.is_some()),
        (
            "--pass",
            common.pass.passes().len() != 1 || common.pass.passes()[0] != evokernel::Pass::Forward,
        ),
        (
            "--m/--n/--k",
            gemm.m.is_some() || gemm.n.is_some() || gemm.k.is_some(),
        ),
    ];
    if let Some((flag, _)) = given.iter().find(|g| g.1) {
        return Err(Error::parse(
            "--op dense-conv",
            flag,
            "the dense convolution takes the spec flags with --out-channels/--groups (or --suite dense), --only cpu|dense_naive|dense_direct|dense_winograd|dense_coopmat|dense_coopmat2|dense_winograd_coopmat2|tile|depth_rotate|depth_rotate_cl, --config dense_direct:...|dense_winograd:...|dense_coopmat:...|dense_coopmat2:...|dense_winograd_coopmat2:...|tile:...|depth_rotate:...|depth_rotate_cl:..., --backend auto|cpu|vulkan, --reference FILE",
        ));
    }
    Ok(())
}

/// The cases: `--suite FILE` (`dense` the embedded dense suite; a depthwise suite such as
/// `public` as its depthwise twins) filtered by `--case`, or the spec flags' one problem.
fn cases(gemm: &GemmArgs, problem: &ProblemArgs) -> Result<Vec<(String, DenseConvSpec)>, Error> {
    if let Some(path) = &problem.suite {
        if gemm.out_channels.is_some() || gemm.groups.is_some() {
            return Err(Error::parse(
                "--out-channels/--groups",
                "given with --suite",
                "a suite's cases carry their own channels and groups",
            ));
        }
        let all = load_dense_suite(path)?;
        if let Some(want) = problem
            .case
            .iter()
            .find(|w| !all.iter().any(|c| &c.name == *w))
        {
            return Err(Error::Suite {
                path: PathBuf::from(path),
                message: format!(
                    "has no case '{want}'; its cases are: {}",
                    all.iter()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        return Ok(all
            .into_iter()
            .filter(|c| problem.case.is_empty() || problem.case.contains(&c.name))
            .map(|c| (c.name, c.spec))
            .collect());
    }
    let params = problem.params()?;
    let spec = DenseConvSpec::from_params(
        &params,
        gemm.out_channels.unwrap_or(params.c),
        gemm.groups.unwrap_or(1),
    )?;
    Ok(vec![("spec".to_string(), spec)])
}

/// The kernels to run on `spec`: `--config` and `--only` names, else the backend's ladder
/// (Vulkan's shaders where a Vulkan device opens, Winograd and the cooperative-matrix
/// shader where they apply; else the CPU).
fn kernels(
    common: &Common,
    vk: Option<&VulkanDevice>,
    spec: &DenseConvSpec,
) -> Result<Vec<DenseKernel>, Error> {
    let mut out = Vec::new();
    for name in &common.only {
        out.push(match name.as_str() {
            "cpu" => DenseKernel::Cpu,
            "dense_naive" => DenseKernel::VulkanNaive,
            "dense_direct" => DenseKernel::VulkanDirect(None),
            "dense_winograd" => DenseKernel::VulkanWinograd(None),
            "dense_coopmat" => DenseKernel::VulkanCoopmat(None),
            "dense_coopmat2" => DenseKernel::VulkanCoopmat2(None),
            "dense_winograd_coopmat2" => DenseKernel::VulkanWinogradCoopmat2(None),
            "tile" => DenseKernel::VulkanDepthwiseTile(None),
            "depth_rotate" => DenseKernel::VulkanDepthRotate(None),
            "depth_rotate_cl" => DenseKernel::VulkanDepthRotateCl(None),
            other => {
                return Err(Error::parse(
                    "--only",
                    other,
                    "the dense convolution's kernels are cpu, dense_naive, dense_direct, dense_winograd, dense_coopmat, dense_coopmat2, dense_winograd_coopmat2 and (depthwise specs) tile, depth_rotate, depth_rotate_cl",
                ))
            }
        });
    }
    for c in &common.config {
        // The name before ':' picks the shader (depth_rotate_cl is not depth_rotate).
        let name = c.split(':').next().unwrap_or_default().trim();
        let forced = match name {
            WinogradConfig::NAME => DenseKernel::VulkanWinograd(Some(c.parse()?)),
            CoopmatConfig::NAME => DenseKernel::VulkanCoopmat(Some(c.parse()?)),
            Coopmat2Config::NAME => DenseKernel::VulkanCoopmat2(Some(c.parse()?)),
            WinogradCoopmat2Config::NAME => DenseKernel::VulkanWinogradCoopmat2(Some(c.parse()?)),
            TileConfig::NAME => DenseKernel::VulkanDepthwiseTile(Some(c.parse()?)),
            RotateConfig::NAME => DenseKernel::VulkanDepthRotate(Some(c.parse()?)),
            RotateClConfig::NAME => DenseKernel::VulkanDepthRotateCl(Some(c.parse()?)),
            _ => DenseKernel::VulkanDirect(Some(c.parse::<DirectConfig>()?)),
        };
        add_forced(&mut out, forced);
    }
    if out.is_empty() {
        out = match (common.backend, vk) {
            (BackendChoice::Cpu, _) | (BackendChoice::Auto, None) => vec![DenseKernel::Cpu],
            // Depthwise: the depthwise tiled shader (the dense tiles would hold one
            // channel of each channel tile).
            _ if spec.is_depthwise() => {
                let mut v = vec![
                    DenseKernel::VulkanNaive,
                    DenseKernel::VulkanDepthwiseTile(None),
                ];
                if RotateConfig::applies(spec.geometry()).is_ok() {
                    v.push(DenseKernel::VulkanDepthRotate(None));
                }
                if RotateClConfig::applies(spec.geometry()).is_ok() {
                    v.push(DenseKernel::VulkanDepthRotateCl(None));
                }
                v
            }
            _ => {
                let mut v = vec![DenseKernel::VulkanNaive, DenseKernel::VulkanDirect(None)];
                if WinogradConfig::applies(spec).is_ok() {
                    v.push(DenseKernel::VulkanWinograd(None));
                }
                if vk.is_some_and(|d| CoopmatConfig::applies(d.info(), spec).is_ok()) {
                    v.push(DenseKernel::VulkanCoopmat(None));
                }
                if vk.is_some_and(|d| Coopmat2Config::applies(d.info(), spec).is_ok()) {
                    v.push(DenseKernel::VulkanCoopmat2(None));
                }
                if vk.is_some_and(|d| WinogradCoopmat2Config::applies(d.info(), spec).is_ok()) {
                    v.push(DenseKernel::VulkanWinogradCoopmat2(None));
                }
                v
            }
        };
    }
    Ok(out)
}

/// A config for a shader `--only` also names replaces its default row: `--only X
/// --config X:..` runs X once, on that config (not the default first, then it).
fn add_forced(out: &mut Vec<DenseKernel>, forced: DenseKernel) {
    match out
        .iter()
        .position(|k| k.name() == forced.name() && !k.is_forced())
    {
        Some(i) => out[i] = forced,
        None => out.push(forced),
    }
}

/// `bench --op dense-conv`.
pub fn run(
    common: &Common,
    gemm: &GemmArgs,
    problem: &ProblemArgs,
    iters: usize,
) -> Result<bool, Error> {
    refuse_other_flags(common, gemm)?;
    let protocol = crate::args::protocol(iters)?;
    if let Some(path) = &common.json {
        crate::args::check_output_path(path)?;
    }
    let cases = cases(gemm, problem)?;
    let references = common
        .reference
        .as_deref()
        .map(ExternalTimes::load)
        .transpose()?;
    let vk = match common.backend {
        BackendChoice::Cuda => {
            return Err(Error::BackendUnavailable {
                backend: "cuda".into(),
                reason: "the dense convolution runs on Vulkan (the H100 has a Vulkan driver: \
                         --backend vulkan) and the CPU"
                    .into(),
            })
        }
        BackendChoice::Cpu => None,
        BackendChoice::Vulkan => Some(VulkanDevice::open(0)?),
        BackendChoice::Auto => VulkanDevice::open(0).ok(),
    };
    // Flags checked before any work: the first case's list (the others differ only in
    // whether Winograd applies).
    if let Some((_, first)) = cases.first() {
        kernels(common, vk.as_ref(), first)?;
    }
    match &vk {
        Some(d) => {
            let i = d.info();
            println!(
                "evokernel bench --op dense-conv: {} (Vulkan {}, subgroup {}, {} B shared), seed {}",
                i.name, i.api_version, i.subgroup_size, i.max_shared_bytes, common.seed
            );
        }
        None => println!(
            "evokernel bench --op dense-conv: CPU ({} threads), seed {}",
            rayon_threads(),
            common.seed
        ),
    }
    let mut report = DenseReport {
        device: vk.as_ref().map(|d| d.info().name.clone()),
        seed: common.seed,
        cases: Vec::new(),
    };
    for (name, spec) in &cases {
        let kernels = kernels(common, vk.as_ref(), spec)?;
        let bar = spinner(&format!("{name}: {spec}"));
        let refs = references
            .as_ref()
            .map(|r| r.times(name, Pass::Forward))
            .unwrap_or_default();
        let case = bench_dense(
            vk.as_ref(),
            name,
            spec,
            &kernels,
            &protocol,
            common.seed,
            refs,
        );
        bar.finish_and_clear();
        let case = case?;
        println!("{}", table::dense(std::slice::from_ref(&case)));
        report.cases.push(case);
    }
    if let Some(path) = &common.json {
        write_json_or_keep(path, &report);
    }
    Ok(report.cases.iter().all(DenseCaseReport::passed))
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `tune --op dense-conv`: the Vulkan shaders' configs searched per case (`--only`
/// narrows the shaders), the best in tune.json (bench then runs them).
pub fn tune(
    common: &Common,
    gemm: &GemmArgs,
    problem: &ProblemArgs,
    iters: usize,
    plan: &TunePlan,
) -> Result<bool, Error> {
    refuse_other_flags(common, gemm)?;
    if let Some(c) = common.config.first() {
        return Err(Error::parse(
            "--config",
            c,
            "tune searches the shaders' configs itself; --config is for bench (--only picks \
             the shaders to tune)",
        ));
    }
    if let Some(o) = common
        .only
        .iter()
        .find(|o| !TUNED_SHADERS.contains(&o.as_str()))
    {
        return Err(Error::parse(
            "--only",
            o,
            format!("tune searches {}", TUNED_SHADERS.join(", ")),
        ));
    }
    if common.backend == BackendChoice::Cpu || common.backend == BackendChoice::Cuda {
        return Err(Error::BackendUnavailable {
            backend: format!("{:?}", common.backend).to_lowercase(),
            reason: "tune --op dense-conv searches the Vulkan shader's configs: --backend vulkan (or auto)".into(),
        });
    }
    let protocol = crate::args::protocol(iters)?;
    if let Some(path) = &common.json {
        crate::args::check_output_path(path)?;
    }
    let cases = cases(gemm, problem)?;
    let dev = VulkanDevice::open(0)?;
    println!(
        "evokernel tune --op dense-conv: {} (Vulkan {}), seed {}",
        dev.info().name,
        dev.info().api_version,
        common.seed
    );
    let mut reports = Vec::new();
    for (name, spec) in &cases {
        let bar = spinner(&format!("{name}: tuning"));
        let r = tune_dense_case(
            &dev,
            name,
            spec,
            plan,
            &protocol,
            common.seed,
            &common.only,
            &mut |p| {
                log_trial(&bar, name, p.done, p.planned, p.last);
                bar.set_message(format!(
                    "{name}: {}/{} timed, best {}",
                    p.done,
                    p.planned,
                    p.best_ms.map_or("-".into(), |b| format!("{b:.4} ms"))
                ))
            },
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forced_config_replaces_the_default_row_of_its_shader() {
        let forced = || {
            DenseKernel::VulkanDepthRotate(Some(
                "depth_rotate:workgroup=128,out_w=3,out_h=2,rows=6,direct=0"
                    .parse()
                    .unwrap(),
            ))
        };
        let mut out = vec![
            DenseKernel::VulkanDepthRotate(None),
            DenseKernel::VulkanDepthwiseTile(None),
        ];
        add_forced(&mut out, forced());
        assert_eq!(out.len(), 2);
        assert!(out[0].is_forced() && !out[1].is_forced());
        // A second forced config of the same shader is a second row.
        add_forced(&mut out, forced());
        assert_eq!(out.len(), 3);
        // Without --only, the forced config is the only row.
        let mut alone = Vec::new();
        add_forced(&mut alone, forced());
        assert_eq!(alone.len(), 1);
    }
}
