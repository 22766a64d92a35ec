//! Tuning the Vulkan dense shaders (`dense_direct`, and `dense_winograd` and
//! `dense_coopmat` where they apply): the configs that fit a spec on the device (its shared memory and
//! invocations, read from the device) searched with the same tuner as the convolutions
//! and the GEMM (`tune::search`: exhaustive or evolutionary), each candidate checked
//! against the f64 oracle's sampled positions before it is timed; the best recorded in
//! the same `tune.json` (key `DenseConvSpec::key()`, the shader's name as the variant,
//! stale when the shader changes). The bench runs the tuned configs.

use super::bench::{check_at, positions_for, time_vulkan};
use super::reference::dense_reference_at;
use super::spec::DenseConvSpec;
use crate::bench::Protocol;
use crate::error::{Error, Result};
use crate::tensor::HostTensor;
use crate::tune::{
    search, CacheEntry, SearchProgress, TuneCache, TunePlan, TuneReport, TuneRow, TuneTarget,
};
use crate::variants::{Config, Param};
use crate::vulkan::dense_coopmat::{self, prepare_dense_coopmat, CoopmatConfig};
use crate::vulkan::dense_direct::{self, prepare_dense_direct, DirectConfig};
use crate::vulkan::dense_winograd::{self, prepare_dense_winograd, WinogradConfig};
use crate::vulkan::{VulkanDevice, VulkanDeviceInfo, VulkanRun};

/// A Vulkan dense shader whose typed config the tuner searches.
pub trait TunableShader:
    Copy + PartialEq + std::fmt::Display + std::str::FromStr<Err = Error>
{
    /// The variant name its configs are forced, tuned and cached under.
    const NAME: &'static str;
    const NAMES: &'static [&'static str];
    const SOURCE: &'static str;
    fn values(&self) -> Vec<u32>;
    fn space(info: &VulkanDeviceInfo, spec: &DenseConvSpec) -> Vec<Self>;
    fn default_for(info: &VulkanDeviceInfo, spec: &DenseConvSpec) -> Result<Self>;
    fn fits(
        &self,
        info: &VulkanDeviceInfo,
        spec: &DenseConvSpec,
    ) -> std::result::Result<(), String>;
    fn prepare<'d>(
        dev: &'d VulkanDevice,
        spec: &DenseConvSpec,
        x: &HostTensor,
        w: &HostTensor,
        config: Self,
    ) -> Result<VulkanRun<'d>>;

    /// The tuner's form of a config.
    fn to_config(&self) -> Config {
        let pairs: Vec<(&str, i64)> = Self::NAMES
            .iter()
            .zip(self.values())
            .map(|(n, v)| (*n, v as i64))
            .collect();
        Config::new(Self::NAME, &pairs)
    }

    /// From the tuner's form (its text parsed as `--config` is).
    fn from_config(c: &Config) -> Result<Self> {
        c.to_string().parse()
    }
}

/// A shader config's inherent methods as its `TunableShader` view.
macro_rules! tunable {
    ($config:ty, $source:path, $prepare:path) => {
        impl TunableShader for $config {
            const NAME: &'static str = <$config>::NAME;
            const NAMES: &'static [&'static str] = &<$config>::NAMES;
            const SOURCE: &'static str = $source;
            fn values(&self) -> Vec<u32> {
                <$config>::values(self).to_vec()
            }
            fn space(info: &VulkanDeviceInfo, spec: &DenseConvSpec) -> Vec<Self> {
                <$config>::space(info, spec)
            }
            fn default_for(info: &VulkanDeviceInfo, spec: &DenseConvSpec) -> Result<Self> {
                <$config>::default_for(info, spec)
            }
            fn fits(
                &self,
                info: &VulkanDeviceInfo,
                spec: &DenseConvSpec,
            ) -> std::result::Result<(), String> {
                <$config>::fits(self, info, spec)
            }
            fn prepare<'d>(
                dev: &'d VulkanDevice,
                spec: &DenseConvSpec,
                x: &HostTensor,
                w: &HostTensor,
                config: Self,
            ) -> Result<VulkanRun<'d>> {
                $prepare(dev, spec, x, w, Some(config))
            }
        }
    };
}

tunable!(DirectConfig, dense_direct::SOURCE, prepare_dense_direct);
tunable!(CoopmatConfig, dense_coopmat::SOURCE, prepare_dense_coopmat);
tunable!(
    WinogradConfig,
    dense_winograd::SOURCE,
    prepare_dense_winograd
);

/// The tune target of a Vulkan device: its name, driver version and Vulkan API.
pub fn target_of(dev: &VulkanDevice) -> TuneTarget {
    let i = dev.info();
    TuneTarget::new(
        &i.name,
        &i.driver_version.to_string(),
        &format!("vulkan {}", i.api_version),
    )
}

/// What a cached entry of shader `S` was tuned with: its source and the target.
pub fn kernel_hash<S: TunableShader>(target: &TuneTarget) -> String {
    crate::cache::stable_hash(&[
        S::NAME.as_bytes(),
        S::SOURCE.as_bytes(),
        target.nvrtc.as_bytes(),
    ])
}

/// The configs of `S` that fit `spec` on `dev`, as the tuner's configs, and the
/// parameters (each with the values those configs take).
pub fn tuning_space<S: TunableShader>(
    dev: &VulkanDevice,
    spec: &DenseConvSpec,
) -> (Vec<Config>, Vec<Param>) {
    let all: Vec<Config> = S::space(dev.info(), spec)
        .iter()
        .map(S::to_config)
        .collect();
    let params = S::NAMES
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

/// The tuned config of shader `S` for `spec` on `dev`, if the cache has a current one
/// that still fits.
pub fn tuned_config<S: TunableShader>(
    cache: &TuneCache,
    dev: &VulkanDevice,
    spec: &DenseConvSpec,
) -> Option<S> {
    let target = target_of(dev);
    let e = cache.get_current(&target, &spec.key(), S::NAME, &kernel_hash::<S>(&target))?;
    let c: S = e.config.parse().ok()?;
    c.fits(dev.info(), spec).is_ok().then_some(c)
}

/// Tunes shader `S` for `spec` on `dev` (or reports the cached result unless
/// `plan.retune`); records the best in `cache`. `progress` sees each timed candidate.
pub fn tune_dense<S: TunableShader>(
    dev: &VulkanDevice,
    spec: &DenseConvSpec,
    plan: &TunePlan,
    protocol: &Protocol,
    seed: u64,
    cache: &mut TuneCache,
    progress: &mut dyn FnMut(SearchProgress),
) -> Result<TuneRow> {
    let target = target_of(dev);
    let hash = kernel_hash::<S>(&target);
    let default = S::default_for(dev.info(), spec)?;
    let (all, params) = tuning_space::<S>(dev, spec);
    let size = all.len();
    if !plan.retune {
        if let Some(e) = cache.get_current(&target, &spec.key(), S::NAME, &hash) {
            return Ok(TuneRow::cached(S::NAME, default.to_string(), e, size));
        }
    }
    let x = HostTensor::random_normal(spec.dtype(), &spec.input_shape(), seed);
    let w = HostTensor::random_normal(spec.dtype(), &spec.weight_shape(), seed ^ 1);
    let positions = positions_for(spec, seed);
    let want = dense_reference_at(spec, &x, &w, &positions)?;
    let time = |cfg: S| -> Result<std::result::Result<f64, String>> {
        let run = S::prepare(dev, spec, &x, &w, cfg)?;
        run.launch()?;
        let c = check_at(&run.output()?, &positions, &want)?;
        if !c.passes(spec.dtype()) {
            return Ok(Err(format!("wrong result: rel L2 {:.2e}", c.rel_l2)));
        }
        Ok(Ok(time_vulkan(&run, protocol)?.median_ms))
    };
    let cost = |c: &Config| -> std::result::Result<f64, String> {
        let cfg = S::from_config(c).map_err(|e| e.to_string())?;
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
    let best = result.best.as_ref().and_then(|b| S::from_config(&b.0).ok());
    if let (Some(b), Some((_, ms))) = (best, &result.best) {
        cache.record(CacheEntry {
            device: target.device.clone(),
            driver: target.driver.clone(),
            spec_key: spec.key(),
            variant: S::NAME.into(),
            config: b.to_string(),
            ms: *ms,
            date_utc: crate::tune::utc_now(),
            kernel_hash: hash,
            trials: result.trial_records(),
        })?;
    }
    Ok(TuneRow::searched(
        S::NAME,
        default.to_string(),
        default_ms,
        best.map(|c| c.to_string()),
        &strategy,
        result,
    ))
}

/// The shaders `tune_dense_case` searches, by name.
pub const TUNED_SHADERS: [&str; 3] = [
    DirectConfig::NAME,
    WinogradConfig::NAME,
    CoopmatConfig::NAME,
];

/// `tune_dense` on one named case with the default cache (`tune.json`): `dense_direct`,
/// and `dense_winograd` and `dense_coopmat` where they apply; `only` (names of
/// `TUNED_SHADERS`) narrows that, empty for all.
#[allow(clippy::too_many_arguments)]
pub fn tune_dense_case(
    dev: &VulkanDevice,
    name: &str,
    spec: &DenseConvSpec,
    plan: &TunePlan,
    protocol: &Protocol,
    seed: u64,
    only: &[String],
    progress: &mut dyn FnMut(SearchProgress),
) -> Result<TuneReport> {
    if let Some(o) = only.iter().find(|o| !TUNED_SHADERS.contains(&o.as_str())) {
        return Err(Error::parse(
            "a tuned shader",
            o,
            format!("one of {}", TUNED_SHADERS.join(", ")),
        ));
    }
    let wanted = |n: &str| only.is_empty() || only.iter().any(|o| o == n);
    // A shader asked for by name that cannot run this spec here is an error, not an
    // empty report.
    let named = |n: &str, applies: std::result::Result<(), String>| match applies {
        Err(reason) if only.iter().any(|o| o == n) => Err(Error::NotApplicable {
            variant: n.to_string(),
            spec: spec.to_string(),
            reason,
        }),
        other => Ok(other.is_ok()),
    };
    let winograd = named(WinogradConfig::NAME, WinogradConfig::applies(spec))?;
    let coopmat = named(
        CoopmatConfig::NAME,
        CoopmatConfig::applies(dev.info(), spec),
    )?;
    let mut cache = TuneCache::open_default();
    let cache_warning = cache.warning.clone();
    let mut rows = Vec::new();
    if wanted(DirectConfig::NAME) {
        rows.push(tune_dense::<DirectConfig>(
            dev, spec, plan, protocol, seed, &mut cache, progress,
        )?);
    }
    if wanted(WinogradConfig::NAME) && winograd {
        rows.push(tune_dense::<WinogradConfig>(
            dev, spec, plan, protocol, seed, &mut cache, progress,
        )?);
    }
    if wanted(CoopmatConfig::NAME) && coopmat {
        rows.push(tune_dense::<CoopmatConfig>(
            dev, spec, plan, protocol, seed, &mut cache, progress,
        )?);
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
