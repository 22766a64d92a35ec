//! Verify, then time, dense/grouped convolution kernels on one case: the CPU backend and
//! the Vulkan shaders (naive, direct, Winograd F(2x2, 3x3), cooperative matrices, and for depthwise specs the
//! tiled and rotating ones; forced, tuned or default configs). Each is checked against
//! the f64 oracle first (every output of a small case, 2048 sampled
//! positions plus the first and last of a large one) and timed only if it passes:
//! Vulkan launches by timestamps around the dispatch, the CPU by the wall clock.

use serde::Serialize;

use super::reference::dense_reference_at;
use super::spec::DenseConvSpec;
use super::tune::{tuned_config, TunableShader};
use crate::bench::{time_launches, Protocol, Timing};
use crate::error::{Error, Result};
use crate::external::ReferenceTime;
use crate::tensor::{compare, Comparison, HostTensor, SplitMix64, TensorData};
use crate::vulkan::dense_coopmat::CoopmatConfig;
use crate::vulkan::dense_coopmat2::Coopmat2Config;
use crate::vulkan::dense_direct::DirectConfig;
use crate::vulkan::dense_naive::prepare_dense_naive;
use crate::vulkan::dense_winograd::WinogradConfig;
use crate::vulkan::dense_winograd_coopmat2::WinogradCoopmat2Config;
use crate::vulkan::depth_rotate::RotateConfig;
use crate::vulkan::depth_rotate_cl::RotateClConfig;
use crate::vulkan::tile::TileConfig;
use crate::vulkan::{VulkanDevice, VulkanRun};

/// Outputs checked on a large case (plus its first and last).
const SAMPLES: usize = 2048;

/// A kernel of the dense ladder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenseKernel {
    /// The CPU backend (`dense::cpu`).
    Cpu,
    /// Vulkan, one invocation an output.
    VulkanNaive,
    /// Vulkan, tiled direct convolution; None: the tuned config, else the device's default.
    VulkanDirect(Option<DirectConfig>),
    /// Vulkan, Winograd F(2x2, 3x3) (3 x 3 kernels, stride 1); None: the device's default.
    VulkanWinograd(Option<WinogradConfig>),
    /// Vulkan, the implicit GEMM on cooperative matrices (dense f16 channels-last, where
    /// the device has them); None: the tuned config, else the device's default.
    VulkanCoopmat(Option<CoopmatConfig>),
    /// Vulkan, the implicit GEMM on workgroup-scope cooperative matrices
    /// (`VK_NV_cooperative_matrix2`; dense f16 channels-last); None: the tuned config,
    /// else the device's default.
    VulkanCoopmat2(Option<Coopmat2Config>),
    /// Vulkan, Winograd F(2x2, 3x3) around `dense_coopmat2`'s GEMM (3 x 3 kernels, stride
    /// 1, dense f16 channels-last, where the device has the matrices); None: the tuned
    /// config, else the device's default.
    VulkanWinogradCoopmat2(Option<WinogradCoopmat2Config>),
    /// Vulkan, the depthwise tiled shader (`vulkan::tile`; groups = in = out channels
    /// only); None: the tuned config, else the device's default.
    VulkanDepthwiseTile(Option<TileConfig>),
    /// Vulkan, the depthwise FMA depth rotation (`vulkan::depth_rotate`; depthwise specs
    /// with depth stride and dilation 1); None: the tuned config, else the device's
    /// default.
    VulkanDepthRotate(Option<RotateConfig>),
    /// Vulkan, the channels-last depth rotation with lanes over channels
    /// (`vulkan::depth_rotate_cl`); None: the tuned config, else the device's default.
    VulkanDepthRotateCl(Option<RotateClConfig>),
}

impl DenseKernel {
    /// The kernel's name (as `--only` takes it).
    pub fn name(&self) -> &'static str {
        match self {
            DenseKernel::Cpu => "cpu",
            DenseKernel::VulkanNaive => "dense_naive",
            DenseKernel::VulkanDirect(_) => DirectConfig::NAME,
            DenseKernel::VulkanWinograd(_) => WinogradConfig::NAME,
            DenseKernel::VulkanCoopmat(_) => CoopmatConfig::NAME,
            DenseKernel::VulkanCoopmat2(_) => Coopmat2Config::NAME,
            DenseKernel::VulkanWinogradCoopmat2(_) => WinogradCoopmat2Config::NAME,
            DenseKernel::VulkanDepthwiseTile(_) => TileConfig::NAME,
            DenseKernel::VulkanDepthRotate(_) => RotateConfig::NAME,
            DenseKernel::VulkanDepthRotateCl(_) => RotateClConfig::NAME,
        }
    }

    /// Whether its config is forced (`--config`), not tuned or the device's default.
    pub fn is_forced(&self) -> bool {
        match self {
            DenseKernel::Cpu | DenseKernel::VulkanNaive => false,
            DenseKernel::VulkanDirect(c) => c.is_some(),
            DenseKernel::VulkanWinograd(c) => c.is_some(),
            DenseKernel::VulkanCoopmat(c) => c.is_some(),
            DenseKernel::VulkanCoopmat2(c) => c.is_some(),
            DenseKernel::VulkanWinogradCoopmat2(c) => c.is_some(),
            DenseKernel::VulkanDepthwiseTile(c) => c.is_some(),
            DenseKernel::VulkanDepthRotate(c) => c.is_some(),
            DenseKernel::VulkanDepthRotateCl(c) => c.is_some(),
        }
    }

    /// Whether it runs only depthwise specs (groups = input = output channels).
    pub fn depthwise_only(&self) -> bool {
        matches!(
            self,
            DenseKernel::VulkanDepthwiseTile(_)
                | DenseKernel::VulkanDepthRotate(_)
                | DenseKernel::VulkanDepthRotateCl(_)
        )
    }

    pub fn backend(&self) -> &'static str {
        match self {
            DenseKernel::Cpu => "cpu",
            _ => "vulkan",
        }
    }
}

/// One kernel on one case.
#[derive(Clone, Debug, Serialize)]
pub struct DenseCandidate {
    /// `cpu`, `dense_naive` or the direct shader's full config.
    pub kernel: String,
    pub backend: &'static str,
    /// Against the oracle at the checked positions (absent when it did not run).
    pub check: Option<Comparison>,
    pub passed: bool,
    /// Absent when the kernel failed the check or did not run.
    pub timing: Option<Timing>,
    pub tflops: Option<f64>,
    /// The memory floor's bytes over the median time.
    pub gbps: Option<f64>,
    /// Why it did not run (refused config, no 16-bit storage, device error).
    pub error: Option<String>,
    /// The fastest outside reference's time over this kernel's (> 1: faster).
    pub vs_reference: Option<f64>,
    /// The driver's statistics of the compiled shader (`name value`: registers, code
    /// size), where the device reports them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<String>,
    /// A kernel of several dispatches (`dense_winograd_coopmat2`): the time in each (its
    /// shader, ms), medians of the last launch of runs like a timing sample's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub stages: Vec<(String, f64)>,
}

/// One case of a dense bench.
#[derive(Clone, Debug, Serialize)]
pub struct DenseCaseReport {
    pub name: String,
    pub spec: String,
    pub key: String,
    pub flops: u64,
    pub min_bytes: u64,
    /// Output positions the oracle checked.
    pub checked: usize,
    pub device: Option<String>,
    /// Outside times of the same case (PyTorch's `F.convNd`, `--reference FILE`).
    pub references: Vec<ReferenceTime>,
    pub candidates: Vec<DenseCandidate>,
    /// The fastest candidate that passed, by index into `candidates`.
    pub best: Option<usize>,
}

impl DenseCaseReport {
    /// Whether every candidate that ran passed the oracle.
    pub fn passed(&self) -> bool {
        self.candidates
            .iter()
            .all(|c| c.passed || c.check.is_none())
    }
}

/// Flat output positions to check: all of a small output, else a seeded sample.
pub fn positions_for(spec: &DenseConvSpec, seed: u64) -> Vec<usize> {
    let len = spec.output_len();
    if len <= 4 * SAMPLES {
        return (0..len).collect();
    }
    let mut rng = SplitMix64::new(seed ^ 0xd5e5);
    let mut v: Vec<usize> = (0..SAMPLES)
        .map(|_| (rng.next_u64() % len as u64) as usize)
        .chain([0, len - 1])
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// `y` against the oracle's values `want` at flat `positions`.
pub(crate) fn check_at(y: &HostTensor, positions: &[usize], want: &[f64]) -> Result<Comparison> {
    let got: Vec<f32> = positions.iter().map(|&i| y.get_f64(i) as f32).collect();
    let sub = HostTensor::from_data(&[got.len()], TensorData::F32(got))?;
    compare(&sub, want)
}

/// Verifies and times `kernels` on one case (`vk` for the Vulkan ones; without it they
/// are reported as not run, with the reason), each against the fastest of `references`
/// (outside times of the same case, measured in the same GPU call).
#[allow(clippy::too_many_arguments)]
pub fn bench_dense(
    vk: Option<&VulkanDevice>,
    name: &str,
    spec: &DenseConvSpec,
    kernels: &[DenseKernel],
    protocol: &Protocol,
    seed: u64,
    references: Vec<ReferenceTime>,
) -> Result<DenseCaseReport> {
    let x = HostTensor::random_normal(spec.dtype(), &spec.input_shape(), seed);
    let w = HostTensor::random_normal(spec.dtype(), &spec.weight_shape(), seed ^ 1);
    let positions = positions_for(spec, seed);
    let want = dense_reference_at(spec, &x, &w, &positions)?;
    let mut candidates = Vec::new();
    for k in kernels {
        let c = match run_one(vk, spec, *k, &x, &w, &positions, &want, protocol) {
            Ok(c) => c,
            Err((kernel, e)) => DenseCandidate {
                kernel,
                backend: k.backend(),
                check: None,
                passed: false,
                timing: None,
                tflops: None,
                gbps: None,
                error: Some(e.to_string()),
                vs_reference: None,
                resources: Vec::new(),
                stages: Vec::new(),
            },
        };
        candidates.push(c);
    }
    let fastest_reference = references
        .iter()
        .map(|r| r.median_ms)
        .min_by(f64::total_cmp);
    for c in &mut candidates {
        c.vs_reference = fastest_reference
            .zip(c.timing.as_ref())
            .map(|(r, t)| r / t.median_ms);
    }
    let best = candidates
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.timing.as_ref().map(|t| (i, t.median_ms)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(i, _)| i);
    Ok(DenseCaseReport {
        name: name.to_string(),
        spec: spec.to_string(),
        key: spec.key(),
        flops: spec.flops(),
        min_bytes: spec.min_bytes(),
        checked: positions.len(),
        device: vk.map(|d| d.info().name.clone()),
        references,
        candidates,
        best,
    })
}

/// A prepared Vulkan run timed by the timestamps around runs of back-to-back launches.
pub(crate) fn time_vulkan(run: &VulkanRun<'_>, protocol: &Protocol) -> Result<Timing> {
    let timed = |reps: usize| {
        run.launch_repeated(reps)?
            .ok_or_else(|| Error::BackendUnavailable {
                backend: "vulkan".into(),
                reason: "the device's compute queue has no timestamps to time a dispatch by".into(),
            })
    };
    // A sample is a run of back-to-back launches of at least SAMPLE_MS (one launch of a
    // 50 us kernel alone would leave the GPU idle, at idle clocks, between submissions),
    // sized by single launches.
    let mut singles = [0.0; SINGLE_LAUNCHES];
    for t in &mut singles {
        *t = timed(1)?;
    }
    let reps = launches_a_sample(&singles);
    time_launches(&protocol.per_sample(reps), |_| timed(reps), 1)
}

/// Single launches a sample's size is taken from.
const SINGLE_LAUNCHES: usize = 3;

/// Launches a timing sample holds: enough for SAMPLE_MS at the fastest of the single
/// launches' times (1 to 200). The fastest, not the first: a first launch slowed by work
/// the driver leaves to it made every sample one launch, timed at idle clocks between
/// submissions: ~2x slow for the whole measurement (the likely cause of the tuner's
/// 2.25x readings in runs 402 and 405-407; H200 run 410: the same times as the first
/// launch's sizing at steady clocks, and no 2x reading in a serial search of 102 configs).
fn launches_a_sample(singles: &[f64]) -> usize {
    let fastest = singles.iter().copied().fold(f64::INFINITY, f64::min);
    ((SAMPLE_MS / fastest.max(1e-4)).ceil() as usize).clamp(1, 200)
}

/// The device time a Vulkan timing sample runs (launches back to back), ms.
const SAMPLE_MS: f64 = 2.0;

/// A CPU run timed by the wall clock: one warm-up and at most five timed (a CPU run of a
/// large case takes seconds).
fn time_cpu(
    spec: &DenseConvSpec,
    x: &HostTensor,
    w: &HostTensor,
    protocol: &Protocol,
) -> Result<Timing> {
    let cpu = Protocol {
        warmup_launches: 1,
        warmup_ms: 0.0,
        launches: protocol.launches.clamp(1, 5),
        min_ms: 0.0,
        sweep_l2: false,
    };
    let mut out = HostTensor::zeros(spec.dtype(), &spec.output_shape());
    time_launches(
        &cpu,
        |_| {
            let t = std::time::Instant::now();
            super::conv_dense_cpu(spec, x, w, &mut out)?;
            Ok(t.elapsed().as_secs_f64() * 1e3)
        },
        1,
    )
}

/// A Vulkan kernel prepared on `x` and `w`: its config forced, else tuned (tune.json) for
/// the shaders the tuner searches, else the device's default (resolved by the shader's
/// prepare function). The bool says whether the config came from the tune cache.
fn prepare_vulkan<'d>(
    dev: &'d VulkanDevice,
    spec: &DenseConvSpec,
    kernel: DenseKernel,
    x: &HostTensor,
    w: &HostTensor,
) -> Result<(VulkanRun<'d>, bool)> {
    fn tunable<'d, S: TunableShader>(
        dev: &'d VulkanDevice,
        spec: &DenseConvSpec,
        forced: Option<S>,
        x: &HostTensor,
        w: &HostTensor,
    ) -> Result<(VulkanRun<'d>, bool)> {
        let tuned = match forced {
            Some(_) => None,
            None => tuned_config::<S>(&crate::tune::TuneCache::open_default(), dev, spec),
        };
        let config = match forced.or(tuned) {
            Some(c) => c,
            None => S::default_for(dev.info(), spec)?,
        };
        Ok((S::prepare(dev, spec, x, w, config)?, tuned.is_some()))
    }
    if kernel.depthwise_only() && !spec.is_depthwise() {
        return Err(Error::NotApplicable {
            variant: kernel.name().into(),
            spec: spec.to_string(),
            reason: "a depthwise shader: groups = input = output channels".into(),
        });
    }
    Ok(match kernel {
        DenseKernel::VulkanNaive => (prepare_dense_naive(dev, spec, x, w)?, false),
        DenseKernel::VulkanDirect(c) => return tunable(dev, spec, c, x, w),
        DenseKernel::VulkanWinograd(c) => return tunable(dev, spec, c, x, w),
        DenseKernel::VulkanCoopmat(c) => return tunable(dev, spec, c, x, w),
        DenseKernel::VulkanCoopmat2(c) => return tunable(dev, spec, c, x, w),
        DenseKernel::VulkanWinogradCoopmat2(c) => return tunable(dev, spec, c, x, w),
        DenseKernel::VulkanDepthwiseTile(c) => return tunable(dev, spec, c, x, w),
        DenseKernel::VulkanDepthRotate(c) => return tunable(dev, spec, c, x, w),
        DenseKernel::VulkanDepthRotateCl(c) => return tunable(dev, spec, c, x, w),
        DenseKernel::Cpu => {
            return Err(Error::BackendUnavailable {
                backend: "vulkan".into(),
                reason: "the CPU backend is not a Vulkan shader".into(),
            })
        }
    })
}

/// One kernel checked against the oracle and, if it passes, timed; `Err((name, reason))`
/// when it cannot run.
#[allow(clippy::too_many_arguments)]
fn run_one(
    vk: Option<&VulkanDevice>,
    spec: &DenseConvSpec,
    kernel: DenseKernel,
    x: &HostTensor,
    w: &HostTensor,
    positions: &[usize],
    want: &[f64],
    protocol: &Protocol,
) -> std::result::Result<DenseCandidate, (String, Error)> {
    let named = |label: &str| {
        let label = label.to_string();
        move |e: Error| (label.clone(), e)
    };
    let (label, y, vulkan) = match kernel {
        DenseKernel::Cpu => {
            let mut y = HostTensor::nan(spec.dtype(), &spec.output_shape());
            super::conv_dense_cpu(spec, x, w, &mut y).map_err(named("cpu"))?;
            ("cpu".to_string(), y, None)
        }
        _ => {
            let dev = vk.ok_or_else(|| {
                named(kernel.name())(Error::BackendUnavailable {
                    backend: "vulkan".into(),
                    reason: "no Vulkan device was opened (scripts/install-vulkan.sh installs \
                             Mesa's lavapipe)"
                        .into(),
                })
            })?;
            let (run, tuned) =
                prepare_vulkan(dev, spec, kernel, x, w).map_err(named(kernel.name()))?;
            let label = format!("{}{}", run.config(), if tuned { " (tuned)" } else { "" });
            run.launch().map_err(named(&label))?;
            let y = run.output().map_err(named(&label))?;
            (label, y, Some(run))
        }
    };
    let check = check_at(&y, positions, want).map_err(named(&label))?;
    let passed = check.passes(spec.dtype());
    let timing = match (&vulkan, passed) {
        (_, false) => None,
        (Some(run), true) => Some(time_vulkan(run, protocol).map_err(named(&label))?),
        (None, true) => Some(time_cpu(spec, x, w, protocol).map_err(named(&label))?),
    };
    let ms = timing.as_ref().map(|t| t.median_ms);
    let resources = match &vulkan {
        Some(run) => run.statistics().map_err(named(&label))?,
        None => Vec::new(),
    };
    // Where the time of a timed chain goes: five runs of 20 launches (steady clocks).
    let stages = match (&vulkan, &timing) {
        (Some(run), Some(_)) => run.stage_times(5, 20).map_err(named(&label))?,
        _ => Vec::new(),
    };
    Ok(DenseCandidate {
        kernel: label,
        backend: kernel.backend(),
        check: Some(check),
        passed,
        tflops: ms.map(|ms| spec.flops() as f64 / ms * 1e-9),
        gbps: ms.map(|ms| spec.min_bytes() as f64 / ms * 1e-6),
        timing,
        error: None,
        vs_reference: None,
        resources,
        stages,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_is_sized_by_the_fastest_single_launch() {
        // A 40 us kernel: 50 launches make 2 ms, whatever the first launch cost.
        assert_eq!(launches_a_sample(&[0.04, 0.04, 0.04]), 50);
        assert_eq!(launches_a_sample(&[5.0, 0.04, 0.041]), 50);
        // Long kernels are timed one launch a sample; tiny ones at most 200.
        assert_eq!(launches_a_sample(&[3.0, 2.5, 2.6]), 1);
        assert_eq!(launches_a_sample(&[0.001, 0.001, 0.001]), 200);
        assert_eq!(launches_a_sample(&[]), 1);
    }
}
