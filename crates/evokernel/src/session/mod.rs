//! A measuring session on one backend: resolves `--backend`, calibrates the device's
//! ceilings once, and evaluates cases (oracle, checks, timings) into reports; tuning.rs
//! runs the config searches on the same session.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

mod report;
mod tuning;
pub use crate::tune::utc_now;
pub use report::{
    is_reference_row, CaseReport, DeviceInfo, RowReport, RunReport, REPORT_SCHEMA_VERSION,
};
pub use tuning::{SearchKind, Shard, TuneEvent, TunePlan, TuneReport, TuneRow};

use crate::backend::{rotation_sets, BackendChoice, ConvRun, CpuRun, ProblemData};
use crate::bench::{throughput, time_one, time_pair, Ceilings, Protocol};
use crate::cpu::{self, Isa};
use crate::cuda::cudnn::CudnnRun;
use crate::cuda::cudnn_graph::CudnnGraphRun;
use crate::cuda::run::{DeviceProblem, KernelRun};
use crate::cuda::CudaDevice;
use crate::dispatch::kernel_problem;
use crate::engine::{ConvProblem, Engine};
use crate::epilogue::Epilogue;
use crate::error::{Error, Result};
use crate::external::ExternalTimes;
use crate::pass::Pass;
use crate::spec::ConvSpec;
use crate::variants::{registry, Config};
use crate::verify::{check, oracle};

/// How to evaluate a case.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Options {
    /// Seed of the random inputs (printed in every report).
    pub seed: u64,
    /// Time the implementations that pass, or only verify them.
    pub time: bool,
    pub protocol: Protocol,
    /// Configs to use instead of the variants' defaults (`--config`, `EVOKERNEL_CONFIG`).
    pub configs: Vec<Config>,
    /// Only these implementations (variant names, `cudnn`, `cudnn-legacy`); empty means all.
    pub only: Vec<String>,
    /// The fused epilogue every case runs with (`--bias`, `--activation`, `--residual`).
    #[serde(default)]
    pub epilogue: Epilogue,
    /// The pass every case measures (`--pass`); the epilogue is narrowed to what the
    /// pass takes (`Pass::epilogue`).
    #[serde(default)]
    pub pass: Pass,
    /// Times of outside implementations measured in the same GPU call (`--reference`),
    /// reported beside each case and in the ratio to the best reference.
    #[serde(skip)]
    pub references: Option<Arc<ExternalTimes>>,
}

impl Options {
    fn wants(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == name)
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            seed: 20261122,
            time: true,
            protocol: Protocol::default(),
            configs: Vec::new(),
            only: Vec::new(),
            epilogue: Epilogue::NONE,
            pass: Pass::Forward,
            references: None,
        }
    }
}

/// A measuring session: the engine whose plans it measures, the device's ceilings.
pub struct Session {
    engine: Engine,
    ceilings: Option<Ceilings>,
    device: DeviceInfo,
}

/// Progress messages for a CLI to show (e.g. "oracle", "time cpu-avx512").
pub type Progress<'a> = &'a mut dyn FnMut(&str);

impl Session {
    /// Opens the backend asked for; `auto` takes the first GPU when one works and says
    /// why not in the device detail when it falls back to the CPU.
    pub fn open(choice: BackendChoice) -> Result<Self> {
        let cpu = |why: Option<String>| Session {
            engine: Engine::cpu(),
            ceilings: None,
            device: DeviceInfo {
                backend: "cpu".into(),
                name: cpu_name(),
                detail: format!(
                    "{} threads, {}{}",
                    rayon::current_num_threads(),
                    Isa::detect().name(),
                    why.map(|w| format!("; no GPU: {w}")).unwrap_or_default()
                ),
                gpu: None,
            },
        };
        match choice {
            BackendChoice::Cpu => Ok(cpu(None)),
            BackendChoice::Cuda => Self::open_cuda(0),
            BackendChoice::Vulkan => Err(Error::BackendUnavailable {
                backend: "vulkan".into(),
                reason: "run, verify, profile and the depthwise bench take cpu or cuda; on \
                         Vulkan, `evokernel bench --op dense-conv --backend vulkan` runs and \
                         checks depthwise specs (`--suite public`, `--suite channels-last`, or \
                         the spec flags with --groups and --out-channels equal to the \
                         channels) beside dense and grouped ones, and `evokernel tune --op \
                         dense-conv --backend vulkan` tunes them"
                    .into(),
            }),
            BackendChoice::Auto => match crate::cuda::probe() {
                Err(_) => Ok(cpu(None)),
                Ok(()) => Self::open_cuda(0).or_else(|e| Ok(cpu(Some(e.to_string())))),
            },
        }
    }

    /// A session on GPU `ordinal`.
    pub fn open_cuda(ordinal: usize) -> Result<Self> {
        let dev = Arc::new(CudaDevice::open(ordinal)?);
        let i = dev.info().clone();
        Ok(Session {
            device: DeviceInfo {
                backend: "cuda".into(),
                name: i.name.clone(),
                detail: format!(
                    "sm_{}{}, {} SMs, driver {}, NVRTC {}, cuDNN {}",
                    i.compute_capability.0,
                    i.compute_capability.1,
                    i.sms,
                    i.driver_version,
                    i.nvrtc_version.as_deref().unwrap_or("-"),
                    i.cudnn_version.as_deref().unwrap_or("absent")
                ),
                gpu: Some(i),
            },
            engine: Engine::on_device(dev),
            ceilings: None,
        })
    }

    pub fn device(&self) -> &DeviceInfo {
        &self.device
    }

    /// The device's measured ceilings (measured on first use, then kept).
    pub fn ceilings(&mut self) -> Result<Ceilings> {
        if let Some(c) = self.ceilings {
            return Ok(c);
        }
        let c = match self.engine.device() {
            None => cpu::calibrate(),
            Some(dev) => crate::cuda::calibrate::calibrate(dev)?,
        };
        self.ceilings = Some(c);
        Ok(c)
    }

    /// The problems `evokernel run` shows: the seed problem, and on a GPU also its
    /// channels-last twin (the layout the channels_last rung is for).
    pub fn demo_cases(&self) -> Vec<(String, ConvSpec)> {
        let seed = crate::spec::ConvParams::seed()
            .validate()
            .expect("the embedded seed problem is valid");
        let mut cases = vec![("seed".to_string(), seed.clone())];
        if self.cuda().is_some() {
            cases.push((
                "seed-ndhwc".to_string(),
                seed.with_layout(crate::spec::Layout::ChannelsLast),
            ));
        }
        cases
    }

    /// The CUDA device, when the session runs on one.
    pub fn cuda(&self) -> Option<&CudaDevice> {
        self.engine.device().map(|d| d.as_ref())
    }

    /// The engine whose plans the session measures.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Verifies (and with `opts.time`, times) every implementation of the session's
    /// backend that applies to `spec`.
    pub fn evaluate(
        &mut self,
        name: &str,
        spec: &ConvSpec,
        opts: &Options,
        progress: Progress,
    ) -> Result<CaseReport> {
        crate::variants::check_forced(&opts.configs, spec)?;
        let conv = ConvProblem::new(spec.clone())
            .with_epilogue(opts.pass.epilogue(opts.epilogue))
            .with_pass(opts.pass);
        conv.check()?;
        let sets = if opts.time {
            rotation_sets(&conv, self.cache_bytes())
        } else {
            1
        };
        if self.engine.forced() != opts.configs.as_slice() {
            self.engine.set_forced(opts.configs.clone());
        }
        self.check_memory(&conv, sets)?;
        progress("generating inputs");
        let problem = ProblemData::random_fused(&conv, opts.seed, sets);
        progress("running the f64 oracle");
        let reference = oracle(&problem)?;
        let floor_ms = if opts.time {
            Some(self.ceilings()?.floor_ms(&conv))
        } else {
            None
        };
        let mut skipped = Vec::new();
        let mut baseline_search = Vec::new();
        let mut dispatch = None;
        let mut dispatch_error = None;
        let engine = &self.engine;
        let rows = match engine.device() {
            None => {
                let mut run = CpuRun::new(&problem, engine.plan(&conv)?);
                vec![measure(
                    &mut run, None, &problem, &reference, sets, opts, floor_ms, progress,
                )?]
            }
            Some(dev) => {
                dev.set_l2_sweep(opts.protocol.sweep_l2)?;
                progress("uploading inputs");
                let dp = DeviceProblem::upload(dev, &problem)?;
                match engine.choose(&conv) {
                    Ok(c) => dispatch = Some(c),
                    Err(e) => dispatch_error = Some(e.to_string()),
                }
                let mut rows = Vec::new();
                // In process, cuDNN's rows: its backend API's best engine (`cudnn`, the
                // baseline every kernel is timed against) and its legacy API's search
                // (`cudnn-legacy`, forward only). Neither fuses an epilogue.
                let plain = conv.epilogue.is_none();
                let mut baseline: Option<CudnnGraphRun> = None;
                if opts.wants("cudnn") && !plain {
                    skipped.push(("cudnn".into(), "cuDNN has no fused epilogue".into()));
                } else if opts.wants("cudnn") {
                    progress("cuDNN: searching engines");
                    match CudnnGraphRun::new(&dp) {
                        Err(e) => skipped.push(("cudnn".to_string(), e.to_string())),
                        Ok(mut b) => {
                            let mut row = measure(
                                &mut b, None, &problem, &reference, sets, opts, floor_ms, progress,
                            )?;
                            row.note = Some(b.describe());
                            baseline_search = b.search().to_vec();
                            let passed = row.verdict.passed;
                            rows.push(row);
                            baseline = passed.then_some(b);
                        }
                    }
                }
                if opts.wants("cudnn-legacy") {
                    if !plain || conv.pass != Pass::Forward {
                        skipped.push((
                            "cudnn-legacy".into(),
                            "the legacy API's row is the plain forward only".into(),
                        ));
                    } else {
                        progress("cuDNN legacy: searching algorithms");
                        match CudnnRun::new(&dp) {
                            Err(e) => skipped.push(("cudnn-legacy".to_string(), e.to_string())),
                            Ok(mut b) => {
                                let base = baseline.as_mut().map(|b| b as &mut dyn ConvRun);
                                let mut row = measure(
                                    &mut b, base, &problem, &reference, sets, opts, floor_ms,
                                    progress,
                                )?;
                                row.note = Some(format!("cuDNN legacy API, {}", b.algorithm()));
                                rows.push(row);
                            }
                        }
                    }
                }
                // The candidates of this pass (variants of other passes are not
                // candidates, not skips) with their configs, compiled ahead on all cores.
                let mut candidates = Vec::new();
                for v in registry().into_iter().filter(|v| opts.wants(v.name())) {
                    let Some(kernel) = kernel_problem(v, &conv) else {
                        continue;
                    };
                    match v.applies(&kernel.spec) {
                        Err(reason) => skipped.push((v.name().to_string(), reason)),
                        Ok(()) => {
                            let (config, source) = engine.config_for(v, &conv);
                            candidates.push((v, config, source));
                        }
                    }
                }
                progress("compiling the kernels");
                let todo: Vec<(ConvProblem, Config)> = candidates
                    .iter()
                    .map(|(_, c, _)| (conv.clone(), c.clone()))
                    .collect();
                engine.precompile(&todo);
                for (v, config, source) in candidates {
                    progress(&format!("compiling {config}"));
                    let mut run = match KernelRun::new(&dp, engine, &config) {
                        Ok(run) => run,
                        // E.g. a size past the kernels' 32-bit per-dim indices.
                        Err(e @ Error::NotApplicable { .. }) => {
                            skipped.push((v.name().to_string(), e.to_string()));
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    let base = baseline.as_mut().map(|b| b as &mut dyn ConvRun);
                    let mut row = measure(
                        &mut run, base, &problem, &reference, sets, opts, floor_ms, progress,
                    )?;
                    let (ms, hit) = run.compile_ms();
                    row.config = Some(config.to_string());
                    row.instance = Some(run.plan().instance_name());
                    row.resources = run.resources();
                    row.note = Some(format!(
                        "{}{}; jit {ms:.0} ms{}",
                        source.label(),
                        if v.pass() != conv.pass {
                            ", on the flipped twin"
                        } else {
                            ""
                        },
                        if hit { " (cached)" } else { "" }
                    ));
                    rows.push(row);
                }
                rows
            }
        };
        Ok(CaseReport {
            name: name.to_string(),
            spec: spec.to_string(),
            key: conv.key(),
            flops: conv.flops(),
            min_bytes: conv.min_bytes(),
            floor_ms,
            seed: opts.seed,
            input_sets: sets,
            rows,
            skipped,
            baseline_search,
            epilogue: conv.epilogue,
            dispatch,
            dispatch_error,
            pass: conv.pass,
            references: opts
                .references
                .as_ref()
                .map(|r| r.times(name, conv.pass))
                .unwrap_or_default(),
        })
    }

    pub fn report(&self, opts: &Options, cases: Vec<CaseReport>) -> RunReport {
        RunReport {
            schema_version: REPORT_SCHEMA_VERSION,
            evokernel_version: env!("CARGO_PKG_VERSION").to_string(),
            commit: env!("EVOKERNEL_COMMIT").to_string(),
            date_utc: utc_now(),
            device: self.device.clone(),
            ceilings: self.ceilings,
            options: opts.clone(),
            cases,
            warnings: self.engine.tune_cache().warning.iter().cloned().collect(),
        }
    }

    /// Refuses a case whose measuring run would not fit the host's (and the device's)
    /// free memory, before anything is allocated.
    pub(crate) fn check_memory(&self, problem: &ConvProblem, sets: usize) -> Result<()> {
        let what = format!("measuring {problem} ({sets} input sets and the f64 oracle)");
        let cpu = self.engine.device().is_none();
        crate::memory::check(
            &what,
            "host",
            crate::memory::measuring_host_bytes(problem, sets, cpu),
            crate::memory::host_available(),
        )?;
        if let Some(dev) = self.engine.device() {
            crate::memory::check(
                &what,
                "device",
                crate::memory::measuring_device_bytes(problem, sets),
                Some(dev.free_memory()?),
            )?;
        }
        Ok(())
    }

    /// Last-level cache of the device, which small problems are rotated past.
    fn cache_bytes(&self) -> u64 {
        match self.engine.device() {
            None => cpu_llc_bytes(),
            Some(d) => d.info().l2_bytes,
        }
    }
}

/// Verifies one implementation and, when it passes and timing was asked for, times it
/// (against the baseline, alternating, when there is one).
#[allow(clippy::too_many_arguments)]
fn measure(
    run: &mut dyn ConvRun,
    baseline: Option<&mut dyn ConvRun>,
    problem: &ProblemData,
    reference: &[f64],
    sets: usize,
    opts: &Options,
    floor_ms: Option<f64>,
    progress: Progress,
) -> Result<RowReport> {
    let name = run.name();
    progress(&format!("verifying {name}"));
    let verdict = check(run, problem, reference)?;
    let mut row = RowReport::new(name.clone(), verdict);
    if opts.time && verdict.passed {
        progress(&format!("timing {name}"));
        let t = match baseline {
            Some(b) => {
                let pair = time_pair(run, b, sets, &opts.protocol)?;
                row.speedup_vs_baseline = Some(pair.speedup);
                pair.candidate
            }
            None => time_one(run, sets, &opts.protocol)?,
        };
        row.timing = Some(t);
        row.throughput = floor_ms.map(|f| throughput(&problem.problem(), t.median_ms, f));
    }
    Ok(row)
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn cpu_llc_bytes() -> u64 {
    let parse = |s: &str| -> Option<u64> {
        let s = s.trim();
        let (num, mult) = match s.strip_suffix('K') {
            Some(n) => (n, 1 << 10),
            None => match s.strip_suffix('M') {
                Some(n) => (n, 1 << 20),
                None => (s, 1),
            },
        };
        num.parse::<u64>().ok().map(|v| v * mult)
    };
    (0..8)
        .filter_map(|i| {
            std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu0/cache/index{i}/size"))
                .ok()
        })
        .filter_map(|s| parse(&s))
        .max()
        .unwrap_or(32 << 20)
}
