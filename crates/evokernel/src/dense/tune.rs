//! Tuning the Vulkan direct convolution: `dense_direct`'s configs that fit a spec on the
//! device (its shared memory and invocations, read from the device) searched with the
//! same tuner as the convolutions and the GEMM (`tune::search`: exhaustive or
//! evolutionary), each candidate checked against the f64 oracle's sampled positions
//! before it is timed; the best recorded in the same `tune.json` (key
//! `DenseConvSpec::key()`, variant `dense_direct`, stale when the shader changes). The
//! bench runs the tuned config where there is one.

use super::bench::positions_for;
use super::reference::dense_reference_at;
use super::spec::DenseConvSpec;
use crate::bench::{time_launches, Protocol};
use crate::error::{Error, Result};
use crate::tensor::{compare, HostTensor, TensorData};
use crate::tune::{
    search, CacheEntry, SearchProgress, TuneCache, TunePlan, TuneReport, TuneRow, TuneTarget,
};
use crate::variants::{Config, Param};
use crate::vulkan::dense_direct::{prepare_dense_direct, DirectConfig, SOURCE};
use crate::vulkan::VulkanDevice;

/// The variant name tuned configs are recorded under.
pub const VARIANT: &str = DirectConfig::NAME;

/// The tune target of a Vulkan device: its name, driver version and Vulkan API.
pub fn target_of(dev: &VulkanDevice) -> TuneTarget {
    let i = dev.info();
    TuneTarget::new(
        &i.name,
        &i.driver_version.to_string(),
        &format!("vulkan {}", i.api_version),
    )
}

/// What a cached entry was tuned with: the shader source and the target.
pub fn kernel_hash(target: &TuneTarget) -> String {
    crate::cache::stable_hash(&[
        VARIANT.as_bytes(),
        SOURCE.as_bytes(),
        target.nvrtc.as_bytes(),
    ])
}

/// The configs that fit `spec` on `dev`, as the tuner's configs, and the parameters
/// (each with the values those configs take).
pub fn tuning_space(dev: &VulkanDevice, spec: &DenseConvSpec) -> (Vec<Config>, Vec<Param>) {
    let all: Vec<Config> = DirectConfig::space(dev.info(), spec)
        .iter()
        .map(DirectConfig::to_config)
        .collect();
    let params = DirectConfig::NAMES
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

/// The tuned config of `spec` on `dev`, if the cache has a current one that still fits.
pub fn tuned_config(
    cache: &TuneCache,
    dev: &VulkanDevice,
    spec: &DenseConvSpec,
) -> Option<DirectConfig> {
    let target = target_of(dev);
    let e = cache.get_current(&target, &spec.key(), VARIANT, &kernel_hash(&target))?;
    let c: DirectConfig = e.config.parse().ok()?;
    c.fits(dev.info(), spec).is_ok().then_some(c)
}

/// Tunes `dense_direct` for `spec` on `dev` (or reports the cached result unless
/// `plan.retune`); records the best in `cache`. `progress` sees each timed candidate.
pub fn tune_dense(
    dev: &VulkanDevice,
    spec: &DenseConvSpec,
    plan: &TunePlan,
    protocol: &Protocol,
    seed: u64,
    cache: &mut TuneCache,
    progress: &mut dyn FnMut(SearchProgress),
) -> Result<TuneRow> {
    let target = target_of(dev);
    let hash = kernel_hash(&target);
    let default = DirectConfig::default_for(dev.info(), spec)?;
    let (all, params) = tuning_space(dev, spec);
    let size = all.len();
    if !plan.retune {
        if let Some(e) = cache.get_current(&target, &spec.key(), VARIANT, &hash) {
            return Ok(TuneRow::cached(VARIANT, default.to_string(), e, size));
        }
    }
    let x = HostTensor::random_normal(spec.dtype(), &spec.input_shape(), seed);
    let w = HostTensor::random_normal(spec.dtype(), &spec.weight_shape(), seed ^ 1);
    let positions = positions_for(spec, seed);
    let want = dense_reference_at(spec, &x, &w, &positions)?;
    let time = |cfg: DirectConfig| -> Result<std::result::Result<f64, String>> {
        let run = prepare_dense_direct(dev, spec, &x, &w, Some(cfg))?;
        run.launch()?;
        let y = run.output()?;
        let got: Vec<f32> = positions.iter().map(|&i| y.get_f64(i) as f32).collect();
        let c = compare(
            &HostTensor::from_data(&[got.len()], TensorData::F32(got))?,
            &want,
        )?;
        if !c.passes(spec.dtype()) {
            return Ok(Err(format!("wrong result: rel L2 {:.2e}", c.rel_l2)));
        }
        let t = time_launches(
            protocol,
            |_| {
                run.launch()?.ok_or_else(|| Error::BackendUnavailable {
                    backend: "vulkan".into(),
                    reason: "the device's compute queue has no timestamps".into(),
                })
            },
            1,
        )?;
        Ok(Ok(t.median_ms))
    };
    let cost = |c: &Config| -> std::result::Result<f64, String> {
        let cfg = DirectConfig::from_config(c).map_err(|e| e.to_string())?;
        time(cfg).unwrap_or_else(|e| Err(e.to_string()))
    };
    let strategy = plan.strategy(size, seed);
    let result = search(
        all,
        &params,
        strategy,
        &[default.to_config()],
        |_| {},
        cost,
        progress,
    );
    let default_ms = match result
        .trials
        .iter()
        .find(|t| t.config == default.to_config().to_string())
        .and_then(|t| t.ms)
    {
        Some(ms) => Some(ms),
        None => time(default)?.ok(),
    };
    let best = result
        .best
        .as_ref()
        .and_then(|b| DirectConfig::from_config(&b.0).ok());
    if let (Some(b), Some((_, ms))) = (best, &result.best) {
        cache.record(CacheEntry {
            device: target.device.clone(),
            driver: target.driver.clone(),
            spec_key: spec.key(),
            variant: VARIANT.into(),
            config: b.to_string(),
            ms: *ms,
            date_utc: crate::tune::utc_now(),
            kernel_hash: hash,
            trials: result.trial_records(),
        })?;
    }
    Ok(TuneRow::searched(
        VARIANT,
        default.to_string(),
        default_ms,
        best.map(|c| c.to_string()),
        &strategy,
        result,
    ))
}

/// `tune_dense` on one named case with the default cache (`tune.json`).
pub fn tune_dense_case(
    dev: &VulkanDevice,
    name: &str,
    spec: &DenseConvSpec,
    plan: &TunePlan,
    protocol: &Protocol,
    seed: u64,
    progress: &mut dyn FnMut(SearchProgress),
) -> Result<TuneReport> {
    let mut cache = TuneCache::open_default();
    let cache_warning = cache.warning.clone();
    let row = tune_dense(dev, spec, plan, protocol, seed, &mut cache, progress)?;
    Ok(TuneReport {
        name: name.to_string(),
        spec: spec.to_string(),
        key: spec.key(),
        cache: cache.path().display().to_string(),
        cache_warning,
        rows: vec![row],
    })
}
