//! Tuning orchestration: for each variant, its valid configs searched on the device
//! (candidates compiled ahead in the background, verified, timed), the best recorded in
//! the tune cache, and a report per case.

use super::{utc_now, Options, Session};
use crate::backend::{rotation_sets, ProblemData};
use crate::bench::time_one;
use crate::cuda::run::{DeviceProblem, KernelRun};
use crate::cuda::CudaDevice;
use crate::engine::ConvProblem;
use crate::error::{Error, Result};
use crate::spec::ConvSpec;
use crate::tune::{search, CacheEntry, SearchProgress, TuneCache};
pub use crate::tune::{SearchKind, Shard, TunePlan, TuneReport, TuneRow};
use crate::variants::{kernel_hash, registry, valid_configs, Config, Instance};
use crate::verify::{check, oracle};

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
        /// The candidate just timed: its config, and its time or why it failed.
        last: &'a crate::tune::Trial,
    },
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
        plan.check()?;
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
        dev.set_l2_sweep(opts.protocol.sweep_l2)?;
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
            if plan.reads_cache() {
                if let Some(e) = cache.get_current(
                    &target,
                    &crate::dispatch::tune_key(&conv, &kernel),
                    v.name(),
                    &hash,
                ) {
                    rows.push(TuneRow::cached(
                        v.name(),
                        default.to_string(),
                        e,
                        valid_configs(v, spec).len(),
                    ));
                    continue;
                }
            }
            let all = plan.candidates(valid_configs(v, spec));
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
                            last: p.last,
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
            if let (Some((best, ms)), true) = (&result.best, plan.records()) {
                cache.record(CacheEntry {
                    device: target.device.clone(),
                    driver: target.driver.clone(),
                    spec_key: crate::dispatch::tune_key(&conv, &kernel),
                    variant: v.name().to_string(),
                    config: Instance::new(spec, best.clone()).to_string(),
                    ms: *ms,
                    date_utc: utc_now(),
                    kernel_hash: hash.clone(),
                    trials: result.trial_records(),
                })?;
            }
            let best_config = result.best.as_ref().map(|b| b.0.to_string());
            rows.push(TuneRow::searched(
                v.name(),
                default.to_string(),
                default_ms,
                best_config,
                plan.label(&strategy),
                result,
            ));
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
