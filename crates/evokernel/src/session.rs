//! A measuring session on one backend: resolves `--backend`, calibrates the device's
//! ceilings once, and evaluates cases (oracle, checks, timings) into reports.

use serde::{Deserialize, Serialize};

use crate::backend::{rotation_sets, BackendChoice, ConvRun, CpuRun, Problem};
use crate::bench::{throughput, time_one, time_pair, Ceilings, Protocol, Throughput, Timing};
use crate::cpu::{self, Isa};
use crate::cuda::cudnn::CudnnRun;
use crate::cuda::run::{DeviceProblem, KernelRun};
use crate::cuda::{CudaDevice, GpuInfo, KernelResources};
use crate::dispatch::{choose, Choice};
use crate::error::{Error, Result};
use crate::spec::ConvSpec;
use crate::tune::{search, CacheEntry, SearchProgress, Strategy, TuneCache};
use crate::variants::{registry, valid_configs, Config, Variant};
use crate::verify::{check, oracle, Verdict};

/// What a report says about the machine it ran on.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub backend: String,
    pub name: String,
    pub detail: String,
    /// The GPU's properties, on the CUDA backend.
    pub gpu: Option<GpuInfo>,
}

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
    /// Only these implementations (variant names, `cudnn`); empty means all.
    pub only: Vec<String>,
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
        }
    }
}

/// One implementation's line in a case report. Timings exist only for passing checks.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RowReport {
    pub name: String,
    /// The config a kernel variant ran with (`variant:k=v,...`).
    pub config: Option<String>,
    pub verdict: Verdict,
    pub timing: Option<Timing>,
    pub throughput: Option<Throughput>,
    /// Median over A B pairs of baseline time / this time, when a baseline ran.
    pub speedup_vs_baseline: Option<f64>,
    pub resources: Option<KernelResources>,
    /// E.g. the algorithm cuDNN chose, or the JIT time.
    pub note: Option<String>,
}

impl RowReport {
    fn new(name: String, verdict: Verdict) -> Self {
        RowReport {
            name,
            config: None,
            verdict,
            timing: None,
            throughput: None,
            speedup_vs_baseline: None,
            resources: None,
            note: None,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CaseReport {
    pub name: String,
    pub spec: String,
    pub key: String,
    pub flops: u64,
    pub min_bytes: u64,
    pub floor_ms: Option<f64>,
    pub seed: u64,
    pub input_sets: usize,
    pub rows: Vec<RowReport>,
    /// Implementations that do not apply to this case, and why.
    pub skipped: Vec<(String, String)>,
    /// What cuDNN's algorithm search measured, when the baseline ran.
    pub baseline_search: Vec<crate::cuda::cudnn::AlgoTime>,
    /// The kernel evokernel picks for this spec on this device, or why none can take
    /// it (GPU only).
    #[serde(default)]
    pub dispatch: Option<std::result::Result<Choice, String>>,
}

impl CaseReport {
    pub fn passed(&self) -> bool {
        self.rows.iter().all(|r| r.verdict.passed)
    }
}

/// Everything one command measured, as written by `--json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunReport {
    pub evokernel_version: String,
    pub commit: String,
    pub date_utc: String,
    pub device: DeviceInfo,
    pub ceilings: Option<Ceilings>,
    pub options: Options,
    pub cases: Vec<CaseReport>,
}

/// Which search `tune` runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SearchKind {
    /// Exhaustive for spaces of up to 16 configs, else evolutionary.
    #[default]
    Auto,
    Exhaustive,
    Evolutionary,
}

impl std::str::FromStr for SearchKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(SearchKind::Auto),
            "exhaustive" => Ok(SearchKind::Exhaustive),
            "evolutionary" | "evo" => Ok(SearchKind::Evolutionary),
            _ => Err(Error::parse(
                "search",
                s,
                "expected auto, exhaustive or evolutionary",
            )),
        }
    }
}

/// How to tune: the search, an evolutionary budget (candidates; default a quarter of
/// the space) and time limit, and whether to ignore cached results.
#[derive(Clone, Debug)]
pub struct TunePlan {
    pub search: SearchKind,
    pub max_candidates: Option<usize>,
    pub max_seconds: f64,
    pub retune: bool,
}

impl Default for TunePlan {
    fn default() -> Self {
        TunePlan {
            search: SearchKind::Auto,
            max_candidates: None,
            max_seconds: 60.0,
            retune: false,
        }
    }
}

impl TunePlan {
    fn strategy(&self, size: usize, seed: u64) -> Strategy {
        let evolutionary = Strategy::Evolutionary {
            population: 6.min(size.max(1)),
            max_candidates: self.max_candidates.unwrap_or((size / 4).max(6)),
            max_seconds: self.max_seconds,
            seed,
        };
        match self.search {
            SearchKind::Exhaustive => Strategy::Exhaustive,
            SearchKind::Evolutionary => evolutionary,
            SearchKind::Auto if size <= 16 => Strategy::Exhaustive,
            SearchKind::Auto => evolutionary,
        }
    }
}

/// What `tune` reports as it goes.
pub enum TuneEvent<'a> {
    Stage(&'a str),
    Start {
        variant: &'a str,
        space: usize,
    },
    Trial {
        done: usize,
        planned: usize,
        best_ms: Option<f64>,
        config: &'a str,
    },
}

/// One variant's tuning outcome.
#[derive(Clone, Debug, Serialize)]
pub struct TuneRow {
    pub variant: String,
    /// True when the result came from the cache and nothing was timed.
    pub from_cache: bool,
    pub default_config: String,
    pub default_ms: Option<f64>,
    pub best_config: Option<String>,
    pub best_ms: Option<f64>,
    pub space_size: usize,
    /// Candidates timed (compiled, verified, measured or failed).
    pub timed: usize,
    pub failed: usize,
    pub seconds: f64,
    pub strategy: String,
    /// Every candidate timed, with its time or why it failed.
    pub trials: Vec<crate::tune::Trial>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TuneReport {
    pub name: String,
    pub spec: String,
    pub key: String,
    pub cache: String,
    pub cache_warning: Option<String>,
    pub rows: Vec<TuneRow>,
}

/// Backend a session runs on.
enum Backend {
    Cpu,
    Cuda(Box<CudaDevice>),
}

pub struct Session {
    backend: Backend,
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
            backend: Backend::Cpu,
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
            BackendChoice::Cuda => Self::open_cuda(),
            BackendChoice::Auto => match crate::cuda::probe() {
                Err(_) => Ok(cpu(None)),
                Ok(()) => Self::open_cuda().or_else(|e| Ok(cpu(Some(e.to_string())))),
            },
        }
    }

    fn open_cuda() -> Result<Self> {
        let dev = CudaDevice::open(0)?;
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
            backend: Backend::Cuda(Box::new(dev)),
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
        let c = match &self.backend {
            Backend::Cpu => cpu::calibrate(),
            Backend::Cuda(dev) => crate::cuda::calibrate::calibrate(dev)?,
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
        match &self.backend {
            Backend::Cuda(d) => Some(d),
            Backend::Cpu => None,
        }
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
        let sets = if opts.time {
            rotation_sets(spec, self.cache_bytes())
        } else {
            1
        };
        progress("generating inputs");
        let problem = Problem::random(spec, opts.seed, sets);
        progress("running the f64 oracle");
        let reference = oracle(&problem)?;
        let floor_ms = if opts.time {
            Some(self.ceilings()?.floor_ms(spec))
        } else {
            None
        };
        let mut skipped = Vec::new();
        let mut baseline_search = Vec::new();
        let mut dispatch = None;
        let rows = match &self.backend {
            Backend::Cpu => {
                let mut run = CpuRun::new(&problem);
                vec![measure(
                    &mut run, None, &problem, &reference, sets, opts, floor_ms, progress,
                )?]
            }
            Backend::Cuda(dev) => {
                progress("uploading inputs");
                let dp = DeviceProblem::upload(dev, &problem)?;
                let tune_cache = TuneCache::open_default();
                let info = dev.info();
                dispatch = Some(choose(
                    spec,
                    &info.name,
                    &info.driver_version,
                    &tune_cache,
                    &opts.configs,
                ));
                let mut rows = Vec::new();
                progress("cuDNN: searching algorithms");
                let mut baseline = match opts.wants("cudnn").then(|| CudnnRun::new(&dp)) {
                    Some(Ok(b)) => Some(b),
                    Some(Err(e)) => {
                        skipped.push(("cudnn".to_string(), e.to_string()));
                        None
                    }
                    None => None,
                };
                if let Some(b) = baseline.as_mut() {
                    let mut row = measure(
                        b, None, &problem, &reference, sets, opts, floor_ms, progress,
                    )?;
                    row.note = Some(format!("cuDNN {}", b.algorithm()));
                    baseline_search = b.search().to_vec();
                    if !row.verdict.passed {
                        baseline = None;
                    }
                    rows.push(row);
                }
                for v in registry().into_iter().filter(|v| opts.wants(v.name())) {
                    if let Err(reason) = v.applies(spec) {
                        skipped.push((v.name().to_string(), reason));
                        continue;
                    }
                    let (config, source) = choose_config(dev, &tune_cache, opts, v, spec);
                    progress(&format!("compiling {config}"));
                    let mut run = match KernelRun::new(&dp, v, &config) {
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
                    row.resources = Some(run.resources());
                    row.note = Some(format!(
                        "{source}; jit {ms:.0} ms{}",
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
            key: spec.key(),
            flops: spec.flops(),
            min_bytes: spec.min_bytes(),
            floor_ms,
            seed: opts.seed,
            input_sets: sets,
            rows,
            skipped,
            baseline_search,
            dispatch,
        })
    }

    /// Tunes every applicable variant (or those in `opts.only`) for `spec`: candidates
    /// are compiled ahead in the background, verified against the oracle, timed by the
    /// protocol; the best goes to the cache. A variant already in the cache for this
    /// device, driver and spec is reported from it, not re-tuned, unless `retune`.
    pub fn tune(
        &mut self,
        name: &str,
        spec: &ConvSpec,
        opts: &Options,
        plan: &TunePlan,
        progress: &mut dyn FnMut(TuneEvent),
    ) -> Result<TuneReport> {
        let Backend::Cuda(dev) = &self.backend else {
            return Err(Error::BackendUnavailable {
                backend: "cpu".into(),
                reason:
                    "the CPU backend has no kernel configs to tune; tuning needs --backend cuda"
                        .into(),
            });
        };
        let dev: &CudaDevice = dev;
        let sets = rotation_sets(spec, self.cache_bytes());
        progress(TuneEvent::Stage("generating inputs and the oracle"));
        let problem = Problem::random(spec, opts.seed, sets);
        let reference = oracle(&problem)?;
        let dp = DeviceProblem::upload(dev, &problem)?;
        let mut cache = TuneCache::open_default();
        let cache_warning = cache.warning.clone();
        let info = dev.info().clone();
        let mut rows = Vec::new();
        for v in registry().into_iter().filter(|v| opts.wants(v.name())) {
            if v.applies(spec).is_err() {
                continue;
            }
            let space = v.space(spec);
            let default = v.default_config(spec);
            if !plan.retune {
                if let Some(e) = cache.get(&info.name, &info.driver_version, &spec.key(), v.name())
                {
                    rows.push(TuneRow {
                        variant: v.name().to_string(),
                        from_cache: true,
                        default_config: default.to_string(),
                        default_ms: None,
                        best_config: Some(e.config.clone()),
                        best_ms: Some(e.ms),
                        space_size: valid_configs(v, spec).len(),
                        timed: 0,
                        failed: 0,
                        seconds: 0.0,
                        strategy: format!("cached {}", e.date_utc),
                        trials: Vec::new(),
                    });
                    continue;
                }
            }
            let all = valid_configs(v, spec);
            let size = all.len();
            let strategy = plan.strategy(size, opts.seed);
            progress(TuneEvent::Start {
                variant: v.name(),
                space: size,
            });
            let jit = dev.jit();
            let cost = |c: &Config| -> std::result::Result<f64, String> {
                let mut run = KernelRun::new(&dp, v, c).map_err(|e| e.to_string())?;
                let verdict = check(&mut run, &problem, &reference).map_err(|e| e.to_string())?;
                if !verdict.passed {
                    return Err(format!(
                        "wrong result: rel L2 {:.2e}, {} non-finite",
                        verdict.comparison.rel_l2, verdict.comparison.non_finite
                    ));
                }
                time_one(&mut run, sets, &opts.protocol)
                    .map(|t| t.median_ms)
                    .map_err(|e| e.to_string())
            };
            let result = std::thread::scope(|scope| {
                // Compile the next candidates on other cores while this thread times.
                let prepare = |configs: &[Config]| {
                    let work: Vec<String> = configs
                        .iter()
                        .filter_map(|c| v.specialization(spec, c).ok())
                        .collect();
                    scope.spawn(move || {
                        use rayon::prelude::*;
                        work.par_iter().for_each(|expr| {
                            let _ = jit.compile(v.name(), v.source(), expr);
                        });
                    });
                };
                search(
                    all,
                    &space,
                    strategy,
                    std::slice::from_ref(&default),
                    prepare,
                    cost,
                    |p: SearchProgress| {
                        progress(TuneEvent::Trial {
                            done: p.done,
                            planned: p.planned,
                            best_ms: p.best_ms,
                            config: &p.last.config,
                        })
                    },
                )
            });
            let default_ms = result
                .trials
                .iter()
                .find(|t| t.config == default.to_string())
                .and_then(|t| t.ms);
            let default_ms = match default_ms {
                Some(ms) => Some(ms),
                None => {
                    let mut run = KernelRun::new(&dp, v, &default)?;
                    Some(time_one(&mut run, sets, &opts.protocol)?.median_ms)
                }
            };
            if let Some((best, ms)) = &result.best {
                cache.record(CacheEntry {
                    device: info.name.clone(),
                    driver: info.driver_version.clone(),
                    spec_key: spec.key(),
                    variant: v.name().to_string(),
                    config: best.to_string(),
                    ms: *ms,
                    date_utc: utc_now(),
                })?;
            }
            rows.push(TuneRow {
                variant: v.name().to_string(),
                from_cache: false,
                default_config: default.to_string(),
                default_ms,
                best_config: result.best.as_ref().map(|b| b.0.to_string()),
                best_ms: result.best.as_ref().map(|b| b.1),
                space_size: result.space_size,
                timed: result.trials.len(),
                failed: result.trials.iter().filter(|t| t.ms.is_none()).count(),
                seconds: result.seconds,
                strategy: strategy.label(),
                trials: result.trials,
            });
        }
        Ok(TuneReport {
            name: name.to_string(),
            spec: spec.to_string(),
            key: spec.key(),
            cache: cache.path().display().to_string(),
            cache_warning,
            rows,
        })
    }

    pub fn report(&self, opts: &Options, cases: Vec<CaseReport>) -> RunReport {
        RunReport {
            evokernel_version: env!("CARGO_PKG_VERSION").to_string(),
            commit: env!("EVOKERNEL_COMMIT").to_string(),
            date_utc: utc_now(),
            device: self.device.clone(),
            ceilings: self.ceilings,
            options: opts.clone(),
            cases,
        }
    }

    /// Last-level cache of the device, which small problems are rotated past.
    fn cache_bytes(&self) -> u64 {
        match &self.backend {
            Backend::Cpu => cpu_llc_bytes(),
            Backend::Cuda(d) => d.info().l2_bytes,
        }
    }
}

/// The config a variant runs with, and where it came from: forced (`--config`,
/// `EVOKERNEL_CONFIG`), tuned (the cache, for this device, driver and spec), or default.
fn choose_config(
    dev: &CudaDevice,
    cache: &TuneCache,
    opts: &Options,
    v: &dyn Variant,
    spec: &ConvSpec,
) -> (Config, &'static str) {
    if let Some(c) = opts.configs.iter().find(|c| c.variant == v.name()) {
        return (c.clone(), "forced");
    }
    let i = dev.info();
    if let Some(e) = cache.get(&i.name, &i.driver_version, &spec.key(), v.name()) {
        if let Ok(c) = e.config.parse::<Config>() {
            if crate::variants::check_config(v, spec, &c).is_ok() {
                return (c, "tuned");
            }
        }
    }
    (v.default_config(spec), "default")
}

/// Verifies one implementation and, when it passes and timing was asked for, times it
/// (against the baseline, alternating, when there is one).
#[allow(clippy::too_many_arguments)]
fn measure(
    run: &mut dyn ConvRun,
    baseline: Option<&mut dyn ConvRun>,
    problem: &Problem,
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
        row.throughput = floor_ms.map(|f| throughput(&problem.spec, t.median_ms, f));
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

/// `YYYY-MM-DDTHH:MM:SSZ` from the system clock (civil-from-days, no time-zone data).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}
