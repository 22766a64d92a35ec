//! Tuning the Vulkan shaders of `--op dense-conv` (`dense_direct`, and `dense_winograd`,
//! `dense_coopmat`, `dense_coopmat2` and `dense_winograd_coopmat2` where they apply; on depthwise specs `tile`, `depth_rotate` and
//! `depth_rotate_cl`): the configs that fit a spec on the device (its shared memory and
//! invocations, read from the device) searched with the same tuner as the convolutions
//! and the GEMM (`tune::search`: exhaustive or evolutionary), each candidate checked
//! against the f64 oracle's sampled positions before it is timed, the three leaders
//! re-timed side by side (three rounds, interleaved) to pick the best; the best recorded in
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
use crate::vulkan::dense_coopmat2::{self, prepare_dense_coopmat2, Coopmat2Config};
use crate::vulkan::dense_direct::{self, prepare_dense_direct, DirectConfig};
use crate::vulkan::dense_winograd::{self, prepare_dense_winograd, WinogradConfig};
use crate::vulkan::dense_winograd_coopmat2::{
    self, prepare_dense_winograd_coopmat2, WinogradCoopmat2Config,
};
use crate::vulkan::depth_rotate::{self, prepare_depth_rotate, RotateConfig};
use crate::vulkan::depth_rotate_cl::{self, prepare_depth_rotate_cl, RotateClConfig};
use crate::vulkan::tile::{self, prepare_tile, TileConfig};
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

/// A shader config's inherent methods as its `TunableShader` view: a dense shader's take
/// the `DenseConvSpec`; a depthwise shader's (`depthwise`) the depthwise `ConvSpec` it
/// holds, with no configs and refusals on other specs.
macro_rules! tunable {
    ($config:ty, $source:path, $prepare:path) => {
        tunable!(@impl $config, $source, $prepare, |_| Ok(()), whole_spec);
    };
    (depthwise $config:ty, $source:path, $prepare:path, $applies:expr) => {
        tunable!(@impl $config, $source, $prepare, |s| depthwise_applies(s, $applies), depthwise_geometry);
    };
    (@impl $config:ty, $source:path, $prepare:path, $applies:expr, $on:path) => {
        impl TunableShader for $config {
            const NAME: &'static str = <$config>::NAME;
            const NAMES: &'static [&'static str] = &<$config>::NAMES;
            const SOURCE: &'static str = $source;
            fn values(&self) -> Vec<u32> {
                <$config>::values(self).to_vec()
            }
            fn space(info: &VulkanDeviceInfo, spec: &DenseConvSpec) -> Vec<Self> {
                let applies: fn(&DenseConvSpec) -> std::result::Result<(), String> = $applies;
                match applies(spec) {
                    Ok(()) => <$config>::space(info, $on(spec)),
                    Err(_) => Vec::new(),
                }
            }
            fn default_for(info: &VulkanDeviceInfo, spec: &DenseConvSpec) -> Result<Self> {
                let applies: fn(&DenseConvSpec) -> std::result::Result<(), String> = $applies;
                applies(spec).map_err(|reason| Error::NotApplicable {
                    variant: Self::NAME.into(),
                    spec: spec.to_string(),
                    reason,
                })?;
                <$config>::default_for(info, $on(spec))
            }
            fn fits(
                &self,
                info: &VulkanDeviceInfo,
                spec: &DenseConvSpec,
            ) -> std::result::Result<(), String> {
                let applies: fn(&DenseConvSpec) -> std::result::Result<(), String> = $applies;
                applies(spec)?;
                <$config>::fits(self, info, $on(spec))
            }
            fn prepare<'d>(
                dev: &'d VulkanDevice,
                spec: &DenseConvSpec,
                x: &HostTensor,
                w: &HostTensor,
                config: Self,
            ) -> Result<VulkanRun<'d>> {
                $prepare(dev, $on(spec), x, w, Some(config))
            }
        }
    };
}

/// What a dense shader's config methods take: the spec itself.
fn whole_spec(spec: &DenseConvSpec) -> &DenseConvSpec {
    spec
}

/// What a depthwise shader's config methods take: the depthwise `ConvSpec`.
fn depthwise_geometry(spec: &DenseConvSpec) -> &crate::spec::ConvSpec {
    spec.geometry()
}

tunable!(DirectConfig, dense_direct::SOURCE, prepare_dense_direct);
tunable!(CoopmatConfig, dense_coopmat::SOURCE, prepare_dense_coopmat);
tunable!(
    Coopmat2Config,
    dense_coopmat2::SOURCE,
    prepare_dense_coopmat2
);
tunable!(
    WinogradConfig,
    dense_winograd::SOURCE,
    prepare_dense_winograd
);
tunable!(
    WinogradCoopmat2Config,
    dense_winograd_coopmat2::SOURCES,
    prepare_dense_winograd_coopmat2
);

/// Why a depthwise shader does not take `spec`: not depthwise, or `applies` of its
/// geometry says why.
fn depthwise_applies(
    spec: &DenseConvSpec,
    applies: impl FnOnce(&crate::spec::ConvSpec) -> std::result::Result<(), String>,
) -> std::result::Result<(), String> {
    if !spec.is_depthwise() {
        return Err("a depthwise shader: groups = input = output channels".into());
    }
    applies(spec.geometry())
}

tunable!(depthwise TileConfig, tile::SOURCE, prepare_tile, |_| Ok(()));
tunable!(
    depthwise RotateConfig,
    depth_rotate::SOURCE,
    prepare_depth_rotate,
    RotateConfig::applies
);
tunable!(
    depthwise RotateClConfig,
    depth_rotate_cl::SOURCE,
    prepare_depth_rotate_cl,
    RotateClConfig::applies
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

/// Leaders of a search re-timed side by side (`SearchResult::confirm`), and the rounds.
const FINALISTS: usize = 3;
const CONFIRM_ROUNDS: usize = 3;

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
    plan.check()?;
    let target = target_of(dev);
    let hash = kernel_hash::<S>(&target);
    let default = S::default_for(dev.info(), spec)?;
    let (all, params) = tuning_space::<S>(dev, spec);
    let all = plan.candidates(all);
    let size = all.len();
    if plan.reads_cache() {
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
    let mut cost = |c: &Config| -> std::result::Result<f64, String> {
        let cfg = S::from_config(c).map_err(|e| e.to_string())?;
        time(cfg).unwrap_or_else(|e| Err(e.to_string()))
    };
    let strategy = plan.strategy(size, seed);
    let mut result = search(
        all,
        &params,
        strategy,
        &[default.to_config()],
        |_| {},
        &mut cost,
        progress,
    );
    // The leaders again, side by side: the best is the one faster there.
    result.confirm(FINALISTS, CONFIRM_ROUNDS, &mut cost);
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
    if let (Some(b), Some((_, ms)), true) = (best, &result.best, plan.records()) {
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
        plan.label(&strategy),
        result,
    ))
}

/// The shaders `tune_dense_case` searches, by name: the dense ones, then the depthwise.
pub const TUNED_SHADERS: [&str; 8] = [
    DirectConfig::NAME,
    WinogradConfig::NAME,
    CoopmatConfig::NAME,
    Coopmat2Config::NAME,
    WinogradCoopmat2Config::NAME,
    TileConfig::NAME,
    RotateConfig::NAME,
    RotateClConfig::NAME,
];

/// The shaders `tune_dense_case` searches on `spec` (names of `TUNED_SHADERS`): those
/// `only` names, else the bench's ladder (the dense shaders on a dense or grouped spec,
/// the depthwise ones on a depthwise spec) where they apply. A name `only` gives that is
/// not a tuned shader, or whose shader cannot take the spec here, is an error.
pub fn shaders_to_tune(
    info: &VulkanDeviceInfo,
    spec: &DenseConvSpec,
    only: &[String],
) -> Result<Vec<&'static str>> {
    if let Some(o) = only.iter().find(|o| !TUNED_SHADERS.contains(&o.as_str())) {
        return Err(Error::parse(
            "a tuned shader",
            o,
            format!("one of {}", TUNED_SHADERS.join(", ")),
        ));
    }
    let depthwise = spec.is_depthwise();
    // Whether each shader takes the spec, and whether the ladder has it.
    let shaders: [(&'static str, std::result::Result<(), String>, bool); 8] = [
        (DirectConfig::NAME, Ok(()), !depthwise),
        (
            WinogradConfig::NAME,
            WinogradConfig::applies(spec),
            !depthwise,
        ),
        (
            CoopmatConfig::NAME,
            CoopmatConfig::applies(info, spec),
            !depthwise,
        ),
        (
            Coopmat2Config::NAME,
            Coopmat2Config::applies(info, spec),
            !depthwise,
        ),
        (
            WinogradCoopmat2Config::NAME,
            WinogradCoopmat2Config::applies(info, spec),
            !depthwise,
        ),
        (TileConfig::NAME, depthwise_applies(spec, |_| Ok(())), true),
        (
            RotateConfig::NAME,
            depthwise_applies(spec, RotateConfig::applies),
            true,
        ),
        (
            RotateClConfig::NAME,
            depthwise_applies(spec, RotateClConfig::applies),
            true,
        ),
    ];
    let mut wanted = Vec::new();
    for (n, applies, in_ladder) in shaders {
        let named = only.iter().any(|o| o == n);
        match applies {
            // A shader asked for by name that cannot run this spec here is an error, not
            // an empty report.
            Err(reason) if named => {
                return Err(Error::NotApplicable {
                    variant: n.to_string(),
                    spec: spec.to_string(),
                    reason,
                })
            }
            Ok(()) if named || (only.is_empty() && in_ladder) => wanted.push(n),
            _ => {}
        }
    }
    Ok(wanted)
}

/// `tune_dense` on one named case with the default cache (`tune.json`): on a dense or
/// grouped spec `dense_direct`, and `dense_winograd`, `dense_coopmat`, `dense_coopmat2`
/// and `dense_winograd_coopmat2` where they apply; on a depthwise spec `tile`, and `depth_rotate` and `depth_rotate_cl` where they
/// apply (the bench's ladders). `only` (names of `TUNED_SHADERS`) picks instead, empty
/// for the ladder; a shader it names that cannot take the spec is an error.
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
    let wanted = shaders_to_tune(dev.info(), spec, only)?;
    let mut cache = TuneCache::open_default();
    let cache_warning = cache.warning.clone();
    let mut rows = Vec::new();
    for n in wanted {
        let c = &mut cache;
        rows.push(match n {
            DirectConfig::NAME => {
                tune_dense::<DirectConfig>(dev, spec, plan, protocol, seed, c, progress)
            }
            WinogradConfig::NAME => {
                tune_dense::<WinogradConfig>(dev, spec, plan, protocol, seed, c, progress)
            }
            CoopmatConfig::NAME => {
                tune_dense::<CoopmatConfig>(dev, spec, plan, protocol, seed, c, progress)
            }
            Coopmat2Config::NAME => {
                tune_dense::<Coopmat2Config>(dev, spec, plan, protocol, seed, c, progress)
            }
            WinogradCoopmat2Config::NAME => {
                tune_dense::<WinogradCoopmat2Config>(dev, spec, plan, protocol, seed, c, progress)
            }
            TileConfig::NAME => {
                tune_dense::<TileConfig>(dev, spec, plan, protocol, seed, c, progress)
            }
            RotateConfig::NAME => {
                tune_dense::<RotateConfig>(dev, spec, plan, protocol, seed, c, progress)
            }
            _ => tune_dense::<RotateClConfig>(dev, spec, plan, protocol, seed, c, progress),
        }?);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ConvParams, DType, Layout};

    fn spec(c: i64, cout: i64, groups: i64, layout: Layout, stride_d: i64) -> DenseConvSpec {
        let p = ConvParams {
            n: 1,
            c,
            input: vec![4, 9, 9],
            kernel: vec![3, 3, 3],
            stride: vec![stride_d, 1, 1],
            dilation: vec![1, 1, 1],
            padding: vec![[1, 1], [1, 1], [1, 1]],
            layout,
            dtype: DType::F32,
        };
        DenseConvSpec::from_params(&p, cout, groups).unwrap()
    }

    /// The ladder follows the spec (dense shaders on dense specs, depthwise shaders where
    /// they apply on depthwise ones); names pick instead and must apply.
    #[test]
    fn the_tuned_shaders_follow_the_spec_and_the_names() {
        let info = crate::vulkan::device::lavapipe_like();
        let none: [String; 0] = [];
        let cl = Layout::ChannelsLast;
        let dense = spec(8, 8, 1, cl, 1);
        // 3 x 3 x 3: no Winograd; lavapipe: no cooperative matrices.
        assert_eq!(
            shaders_to_tune(&info, &dense, &none).unwrap(),
            ["dense_direct"]
        );
        let dw = spec(8, 8, 8, cl, 1);
        assert_eq!(
            shaders_to_tune(&info, &dw, &none).unwrap(),
            ["tile", "depth_rotate", "depth_rotate_cl"]
        );
        // Channels-first, depth stride 2: neither rotation applies.
        let strided = spec(8, 8, 8, Layout::ChannelsFirst, 2);
        assert_eq!(shaders_to_tune(&info, &strided, &none).unwrap(), ["tile"]);
        let named = ["depth_rotate_cl".to_string()];
        assert_eq!(
            shaders_to_tune(&info, &dw, &named).unwrap(),
            ["depth_rotate_cl"]
        );
        for (s, name, says) in [
            (&dense, "depth_rotate", "depthwise"),
            (&strided, "depth_rotate", "depth stride"),
            (&dw, "dense_coopmat", "cooperative matrix"),
            (&dense, "dense_coopmat2", "VK_NV_cooperative_matrix2"),
            (&dense, "dense_winograd", "3"),
            (&dense, "dense_winograd_coopmat2", "3"),
            (&dw, "tiles", "one of"),
        ] {
            let e = shaders_to_tune(&info, s, &[name.to_string()])
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{name}: {e}");
        }
    }

    /// The depthwise configs' text round-trips through `--config`'s form, and the tuner's
    /// form of a config parses back to it.
    #[test]
    fn depthwise_configs_round_trip_through_their_text() {
        let info = crate::vulkan::device::lavapipe_like();
        let dw = spec(8, 8, 8, Layout::ChannelsLast, 1);
        let tiles = <TileConfig as TunableShader>::space(&info, &dw);
        let rotations = <RotateConfig as TunableShader>::space(&info, &dw);
        let cl = <RotateClConfig as TunableShader>::space(&info, &dw);
        assert!(!tiles.is_empty() && !rotations.is_empty() && !cl.is_empty());
        for c in &tiles {
            assert_eq!(c.to_string().parse::<TileConfig>().unwrap(), *c);
            assert_eq!(TileConfig::from_config(&c.to_config()).unwrap(), *c);
        }
        for c in &rotations {
            assert_eq!(c.to_string().parse::<RotateConfig>().unwrap(), *c);
        }
        for c in &cl {
            assert_eq!(c.to_string().parse::<RotateClConfig>().unwrap(), *c);
        }
        for bad in [
            "tile:workgroup=48,out_w=1,rows=2",
            "tile:workgroup=64,out_w=1",
            "depth_rotate:workgroup=64,out_w=7,rows=2",
            "depth_rotate:workgroup=224,out_w=4,rows=2",
            "depth_rotate:workgroup=64,out_w=4,rows=7",
            "depth_rotate:workgroup=64,out_w=4,out_h=5,rows=4,direct=0",
            "depth_rotate_cl:workgroup=64,out_w=16,out_h=1,cv=1,wrow=0",
            "depth_rotate_cl:workgroup=64,out_w=4,out_h=3,cv=1,wrow=0",
            "depth_rotate_cl:workgroup=64,out_w=4,out_h=1,cv=3,wrow=0",
            "depth_rotate_cl:workgroup=64,out_w=4,out_h=1,cv=1,wrow=2",
            "depth_rotate_cl:workgroup=64,out_w=4,out_h=1",
        ] {
            let tile = bad.parse::<TileConfig>().is_err();
            let rot = bad.parse::<RotateConfig>().is_err();
            let rcl = bad.parse::<RotateClConfig>().is_err();
            assert!(tile && rot && rcl, "{bad}");
        }
        // Not depthwise: no configs, and the default is refused with the reason.
        let dense = spec(8, 8, 1, Layout::ChannelsLast, 1);
        assert!(<RotateConfig as TunableShader>::space(&info, &dense).is_empty());
        let e = <TileConfig as TunableShader>::default_for(&info, &dense)
            .unwrap_err()
            .to_string();
        assert!(e.contains("depthwise"), "{e}");
    }
}
