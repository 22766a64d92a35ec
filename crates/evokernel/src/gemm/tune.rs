//! Tuning the scaled GEMM: `scaled_mm_wgmma`'s configs that fit a spec searched with the
//! same tuner as the convolutions (`tune::search`: exhaustive or evolutionary), each
//! candidate checked against the f64 oracle's sampled positions before it is timed; the
//! best recorded in the same `tune.json` (key `ScaledMmSpec::key()`, variant
//! `scaled_mm_wgmma`, stale when the kernel source or NVRTC changes). `bench` picks the
//! tuned config for the wgmma rung when there is one.

use super::bench::positions_for;
use super::kernel::GemmKernel;
use super::reference::{gemm_gate_at, scaled_mm_reference_at};
use super::run::ScaledMmRun;
use super::wgmma::{WgmmaConfig, SOURCE};
use super::{ScaledMmData, ScaledMmSpec};
use crate::bench::{time_launches, Protocol};
use crate::cuda::CudaDevice;
use crate::error::Result;
use crate::tune::{
    search, CacheEntry, SearchProgress, TuneCache, TunePlan, TuneReport, TuneRow, TuneTarget,
};
use crate::variants::{Config, Param};

/// The variant name tuned configs are recorded under.
pub const VARIANT: &str = super::wgmma::NAME;

/// The tune target of a CUDA device (what its tuned numbers hold for).
pub fn target_of(dev: &CudaDevice) -> TuneTarget {
    let i = dev.info();
    TuneTarget::new(
        &i.name,
        &i.driver_version,
        i.nvrtc_version.as_deref().unwrap_or("-"),
    )
}

/// What a cached entry was tuned with: the kernel source, the common header, NVRTC.
pub fn kernel_hash(nvrtc: &str) -> String {
    crate::cache::stable_hash(&[
        VARIANT.as_bytes(),
        SOURCE.as_bytes(),
        crate::cuda::jit::COMMON_HEADER.as_bytes(),
        nvrtc.as_bytes(),
    ])
}

fn to_config(c: &WgmmaConfig) -> Config {
    let mut cfg = Config::new(VARIANT, &[]);
    for (name, v) in WgmmaConfig::NAMES.iter().zip(c.values()) {
        cfg.values.insert(name.to_string(), v as i64);
    }
    cfg
}

/// The configs of the family that fit `spec`, as the tuner's configs, and the space's
/// parameters (each with the values those configs take).
pub fn tuning_space(spec: &ScaledMmSpec) -> (Vec<Config>, Vec<Param>) {
    let fitting: Vec<WgmmaConfig> = WgmmaConfig::space()
        .into_iter()
        .filter(|c| c.fits(spec).is_ok())
        .collect();
    let all: Vec<Config> = fitting.iter().map(to_config).collect();
    let params = WgmmaConfig::NAMES
        .iter()
        .map(|&name| {
            let mut values: Vec<i64> = all.iter().map(|c| c.values[name]).collect();
            values.sort_unstable();
            values.dedup();
            Param { name, values }
        })
        .collect();
    (all, params)
}

/// The tuned config of `spec` on `target`, if the cache has a current one.
pub fn tuned_config(
    cache: &TuneCache,
    target: &TuneTarget,
    spec: &ScaledMmSpec,
) -> Option<WgmmaConfig> {
    let e = cache.get_current(target, &spec.key(), VARIANT, &kernel_hash(&target.nvrtc))?;
    let c: GemmKernel = e.config.parse().ok()?;
    match c {
        GemmKernel::Wgmma(w) if w.fits(spec).is_ok() => Some(w),
        _ => None,
    }
}

/// Tunes `scaled_mm_wgmma` for `spec` on `dev` (or reports the cached result unless
/// `plan.retune`); records the best in `cache`. `progress` sees each timed candidate.
pub fn tune_scaled_mm(
    dev: &CudaDevice,
    spec: &ScaledMmSpec,
    plan: &TunePlan,
    protocol: &Protocol,
    seed: u64,
    cache: &mut TuneCache,
    progress: &mut dyn FnMut(SearchProgress),
) -> Result<TuneRow> {
    plan.check()?;
    let target = target_of(dev);
    let hash = kernel_hash(&target.nvrtc);
    let default = WgmmaConfig::default_for(spec);
    let (all, params) = tuning_space(spec);
    let all = plan.candidates(all);
    let size = all.len();
    if plan.reads_cache() {
        if let Some(e) = cache.get_current(&target, &spec.key(), VARIANT, &hash) {
            return Ok(TuneRow::cached(VARIANT, default.to_string(), e, size));
        }
    }
    precompile(dev, spec, &all);
    let data = ScaledMmData::random(spec, seed);
    let positions = positions_for(spec, seed);
    let want = scaled_mm_reference_at(spec, &data, &positions)?;
    let time = |cfg: WgmmaConfig| -> Result<std::result::Result<f64, String>> {
        let mut run = ScaledMmRun::new(dev, spec, &data, GemmKernel::Wgmma(cfg))?;
        run.launch()?;
        let v = gemm_gate_at(&run.output()?, spec.n(), &positions, &want)?;
        if !v.passed {
            return Ok(Err(format!(
                "wrong result: rel L2 {:.2e}, max abs {:.2e}",
                v.rel_l2, v.max_abs
            )));
        }
        Ok(Ok(time_launches(protocol, |_| run.launch(), 1)?.median_ms))
    };
    let cost = |c: &Config| -> std::result::Result<f64, String> {
        let cfg = WgmmaConfig::from_config(c).map_err(|e| e.to_string())?;
        time(cfg).unwrap_or_else(|e| Err(e.to_string()))
    };
    let strategy = plan.strategy(size, seed);
    let result = search(
        all,
        &params,
        strategy,
        &[to_config(&default)],
        |_| {},
        cost,
        progress,
    );
    let default_ms = match result
        .trials
        .iter()
        .find(|t| t.config == to_config(&default).to_string())
        .and_then(|t| t.ms)
    {
        Some(ms) => Some(ms),
        None => time(default)?.ok(),
    };
    if let (Some((best, ms)), true) = (&result.best, plan.records()) {
        cache.record(CacheEntry {
            device: target.device.clone(),
            driver: target.driver.clone(),
            spec_key: spec.key(),
            variant: VARIANT.into(),
            config: WgmmaConfig::from_config(best)?.to_string(),
            ms: *ms,
            date_utc: crate::tune::utc_now(),
            kernel_hash: hash,
            trials: result.trial_records(),
        })?;
    }
    let best_config = result
        .best
        .as_ref()
        .and_then(|b| WgmmaConfig::from_config(&b.0).ok())
        .map(|c| c.to_string());
    Ok(TuneRow::searched(
        VARIANT,
        default.to_string(),
        default_ms,
        best_config,
        plan.label(&strategy),
        result,
    ))
}

/// Compiles every kernel specialization `configs` use, in parallel, into the CUBIN cache
/// before any is timed: one NVRTC compile is ~1 s and the space holds hundreds, which
/// one at a time between timings dominated a search (and kept the CPU busy beside the
/// clock). A failed compile is left to the candidate's own trial to report.
fn precompile(dev: &CudaDevice, spec: &ScaledMmSpec, configs: &[Config]) {
    use rayon::prelude::*;
    let mut exprs: Vec<String> = configs
        .iter()
        .filter_map(|c| WgmmaConfig::from_config(c).ok())
        .flat_map(|w| {
            let mut e = vec![w.specialization(spec)];
            if w.splits > 1 {
                e.push(w.finalize_specialization(spec));
            }
            e
        })
        .collect();
    exprs.sort_unstable();
    exprs.dedup();
    exprs.par_iter().for_each(|e| {
        let _ = dev.jit().compile_for(VARIANT, SOURCE, e, true);
    });
}

/// `tune_scaled_mm` on one named case with the default cache (`tune.json`), as the
/// report `tune` prints for convolutions.
pub fn tune_case(
    dev: &CudaDevice,
    name: &str,
    spec: &ScaledMmSpec,
    plan: &TunePlan,
    protocol: &Protocol,
    seed: u64,
    progress: &mut dyn FnMut(SearchProgress),
) -> Result<TuneReport> {
    let mut cache = TuneCache::open_default();
    let cache_warning = cache.warning.clone();
    let row = tune_scaled_mm(dev, spec, plan, protocol, seed, &mut cache, progress)?;
    Ok(TuneReport {
        name: name.to_string(),
        spec: spec.to_string(),
        key: spec.key(),
        cache: cache.path().display().to_string(),
        cache_warning,
        rows: vec![row],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::Scaling;
    use crate::tune::{SearchKind, Strategy};
    use crate::DType;

    /// A made-up cost with one best config and a smooth landscape around it.
    fn synthetic(c: &Config) -> f64 {
        let v = |k: &str| c.values[k] as f64;
        1.0 + (v("bn") - 256.0).abs() / 256.0
            + (v("stages") - 4.0).abs() * 0.05
            + (v("group_m") - 8.0).abs() * 0.004
            + (v("splits") - 1.0) * 0.1
            + (v("consumers") - 2.0).abs() * 0.3
            + v("persistent") * 0.01
            + (v("cluster") - 2.0).abs() * 0.03
    }

    #[test]
    fn the_space_is_the_fitting_family_and_round_trips() {
        let spec =
            ScaledMmSpec::new(8192, 8192, 8192, Scaling::RowWise, DType::Bf16, false).unwrap();
        let (all, params) = tuning_space(&spec);
        assert!(all.len() > 100, "{}", all.len());
        assert_eq!(params.len(), WgmmaConfig::NAMES.len());
        for c in &all {
            let w = WgmmaConfig::from_config(c).unwrap();
            assert!(w.fits(&spec).is_ok());
            assert_eq!(to_config(&w), *c);
            assert_eq!(
                w.to_string().parse::<GemmKernel>().unwrap(),
                GemmKernel::Wgmma(w)
            );
        }
        assert!(all.contains(&to_config(&WgmmaConfig::default_for(&spec))));
        // Block-wise scaling keeps bn <= 192 (a partial set beside the total): the space
        // says so.
        let bw =
            ScaledMmSpec::new(8192, 8192, 8192, Scaling::BlockWise, DType::Bf16, false).unwrap();
        let (_, p) = tuning_space(&bw);
        assert_eq!(p[0].values, vec![64, 128, 192]);
    }

    /// The check, on a synthetic landscape: the evolutionary search within a
    /// quarter of the space finds a config within 3% of exhaustive's.
    #[test]
    fn evolutionary_search_lands_within_three_percent_of_exhaustive() {
        let spec =
            ScaledMmSpec::new(4096, 4096, 4096, Scaling::PerTensor, DType::Bf16, false).unwrap();
        let (all, params) = tuning_space(&spec);
        let exhaustive = search(
            all.clone(),
            &params,
            Strategy::Exhaustive,
            &[],
            |_| {},
            |c| Ok(synthetic(c)),
            |_| {},
        );
        let best = exhaustive.best.unwrap().1;
        let plan = TunePlan {
            search: SearchKind::Evolutionary,
            max_candidates: None,
            max_seconds: 60.0,
            retune: true,
            shard: None,
        };
        for seed in [1, 2, 3] {
            let default = to_config(&WgmmaConfig::default_for(&spec));
            let evo = search(
                all.clone(),
                &params,
                plan.strategy(all.len(), seed),
                &[default],
                |_| {},
                |c| Ok(synthetic(c)),
                |_| {},
            );
            assert!(
                evo.trials.len() <= all.len() / 4 + 6,
                "{}",
                evo.trials.len()
            );
            let got = evo.best.unwrap().1;
            assert!(got <= best * 1.03, "seed {seed}: {got} vs {best}");
        }
    }
}
