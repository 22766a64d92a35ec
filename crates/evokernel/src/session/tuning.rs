//! Tuning orchestration: for each variant, its valid configs searched on the device
//! (candidates compiled ahead in the background, verified, timed), the best recorded in
//! the tune cache, and a report per case.

use serde::Serialize;

use super::{utc_now, Options, Session};
use crate::backend::{rotation_sets, ProblemData};
use crate::bench::time_one;
use crate::cuda::run::{DeviceProblem, KernelRun};
use crate::cuda::CudaDevice;
use crate::engine::ConvProblem;
use crate::error::{Error, Result};
use crate::spec::ConvSpec;
use crate::tune::{search, CacheEntry, SearchProgress, Strategy, TrialRecord, TuneCache};
use crate::variants::{kernel_hash, registry, valid_configs, Config, Instance};
use crate::verify::{check, oracle};

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

impl Session {
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
        let engine = &self.engine;
        let Some(dev) = engine.device() else {
            return Err(Error::BackendUnavailable {
                backend: "cpu".into(),
                reason:
                    "the CPU backend has no kernel configs to tune; tuning needs --backend cuda"
                        .into(),
            });
        };
        let dev: &CudaDevice = dev;
        let conv = ConvProblem::new(spec.clone())
            .with_epilogue(opts.pass.epilogue(opts.epilogue))
            .with_pass(opts.pass);
        conv.check()?;
        let sets = rotation_sets(&conv, self.cache_bytes());
        self.check_memory(&conv, sets)?;
        progress(TuneEvent::Stage("generating inputs and the oracle"));
        let problem = ProblemData::random_fused(&conv, opts.seed, sets);
        let reference = oracle(&problem)?;
        let dp = DeviceProblem::upload(dev, &problem)?;
        let mut cache = TuneCache::open_default();
        let cache_warning = cache.warning.clone();
        let target = engine.tune_target();
        let mut rows = Vec::new();
        for v in registry().into_iter().filter(|v| opts.wants(v.name())) {
            // The problem v's kernel computes (grad-input on a forward variant: the
            // flipped twin's forward, whose tuned results it shares).
            let Some(kernel) = crate::dispatch::kernel_problem(v, &conv) else {
                continue;
            };
            let spec = &kernel.spec;
            if v.applies(spec).is_err() {
                continue;
            }
            let space = v.space(spec);
            let hash = kernel_hash(v, &target.nvrtc);
            let default = v.default_config(spec);
            if !plan.retune {
                if let Some(e) = cache.get_current(&target, &kernel.key(), v.name(), &hash) {
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
            let cost = |c: &Config| -> std::result::Result<f64, String> {
                let mut run = KernelRun::new(&dp, engine, c).map_err(|e| e.to_string())?;
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
                    let work: Vec<(ConvProblem, Config)> =
                        configs.iter().map(|c| (conv.clone(), c.clone())).collect();
                    scope.spawn(move || engine.precompile(&work));
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
                    let mut run = KernelRun::new(&dp, engine, &default)?;
                    Some(time_one(&mut run, sets, &opts.protocol)?.median_ms)
                }
            };
            if let Some((best, ms)) = &result.best {
                cache.record(CacheEntry {
                    device: target.device.clone(),
                    driver: target.driver.clone(),
                    spec_key: kernel.key(),
                    variant: v.name().to_string(),
                    config: Instance::new(spec, best.clone()).to_string(),
                    ms: *ms,
                    date_utc: utc_now(),
                    kernel_hash: hash.clone(),
                    trials: result
                        .trials
                        .iter()
                        .map(|t| TrialRecord {
                            config: t.config.clone(),
                            ms: t.ms,
                        })
                        .collect(),
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
        // Later plans of this session pick up what was just tuned.
        self.engine.reload_tune_cache();
        Ok(TuneReport {
            name: name.to_string(),
            spec: spec.to_string(),
            key: conv.key(),
            cache: cache.path().display().to_string(),
            cache_warning,
            rows,
        })
    }
}
