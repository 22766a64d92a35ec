//! The tiled depthwise forward on Vulkan (kernels/vulkan/tile.comp): smem_tile's method
//! in portable GLSL, a workgroup per band of output rows of one plane, the band's input
//! slices in shared memory. Its config ([`TileConfig`]) goes to the shader as
//! specialization constants, and its space is pruned by the device's real limits
//! (shared memory, invocations a workgroup, workgroups a dispatch), never assumed. f32,
//! and f16 where the device has 16-bit storage (read and written as halves, computed in
//! f32 like the CUDA kernels).

use super::device::VulkanDevice;
use super::VulkanDeviceInfo;
use crate::error::{Error, Result};
use crate::spec::{ConvSpec, Layout};
use crate::tensor::HostTensor;

pub const SOURCE: &str = include_str!("../../kernels/vulkan/tile.comp");

/// One config of the tiled shader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TileConfig {
    /// Invocations a workgroup.
    pub workgroup: u32,
    /// Consecutive outputs of a row an invocation computes.
    pub out_w: u32,
    /// Output rows a workgroup's band holds.
    pub rows: u32,
}

config_text!(TileConfig, "a tile config", BAND_HINT, |v: [u32; 3]| {
    let [workgroup, out_w, rows] = v;
    in_band_family(workgroup, out_w, rows).then(|| TileConfig::from_values(v))
});

/// What the shaders that walk bands of output rows (tile, depth_rotate) take.
pub(crate) const BAND_HINT: &str = "workgroup 32-256, out_w 1, 2 or 4, rows 1-32, powers of two";

/// Whether the values are of the band shaders' family.
pub(crate) fn in_band_family(workgroup: u32, out_w: u32, rows: u32) -> bool {
    WORKGROUPS.contains(&workgroup) && OUT_WS.contains(&out_w) && ROWS.contains(&rows)
}

pub(crate) const WORKGROUPS: [u32; 4] = [32, 64, 128, 256];
pub(crate) const OUT_WS: [u32; 3] = [1, 2, 4];
pub(crate) const ROWS: [u32; 6] = [1, 2, 4, 8, 16, 32];

/// The shared tile's rows a slice and floats a row (mirrors tile.comp's HS and WS).
pub(crate) fn tile_shape(spec: &ConvSpec, c: &TileConfig) -> (usize, usize) {
    let [_, kh, kw] = spec.kernel3();
    let (sh, dh) = (spec.stride3()[1], spec.dilation3()[1]);
    let (sw, dw) = (spec.stride3()[2], spec.dilation3()[2]);
    let ow = spec.output3()[2];
    let out_w = c.out_w as usize;
    let hs = (c.rows as usize - 1) * sh + (kh - 1) * dh + 1;
    let cols = (ow.div_ceil(out_w) * out_w - 1) * sw + (kw - 1) * dw + 1;
    let ws = cols.max(spec.pad_before3()[2] + spec.input3()[2]);
    (hs, ws)
}

impl TileConfig {
    /// The variant name configs are forced, tuned and cached under.
    pub const NAME: &'static str = "tile";
    /// The fields, in `values` order.
    pub const NAMES: [&'static str; 3] = ["workgroup", "out_w", "rows"];

    pub fn values(&self) -> [u32; 3] {
        [self.workgroup, self.out_w, self.rows]
    }

    /// The config of `values` (in field order), family or not.
    fn from_values([workgroup, out_w, rows]: [u32; 3]) -> Self {
        TileConfig {
            workgroup,
            out_w,
            rows,
        }
    }

    /// Shared memory a workgroup of this config needs on `spec`.
    pub fn shared_bytes(&self, spec: &ConvSpec) -> usize {
        let (hs, ws) = tile_shape(spec, self);
        spec.kernel3()[0] * hs * ws * 4
    }

    /// Why this config cannot run `spec` on a device with `info`'s limits, if it cannot.
    pub fn fits(
        &self,
        info: &VulkanDeviceInfo,
        spec: &ConvSpec,
    ) -> std::result::Result<(), String> {
        if self.workgroup > info.max_workgroup_invocations {
            return Err(format!(
                "{} invocations a workgroup, more than the device's {}",
                self.workgroup, info.max_workgroup_invocations
            ));
        }
        let bytes = self.shared_bytes(spec);
        if bytes > info.max_shared_bytes as usize {
            return Err(format!(
                "a tile of {bytes} bytes, more than the device's {} of shared memory",
                info.max_shared_bytes
            ));
        }
        if self.rows as usize > spec.output3()[1].next_power_of_two() {
            return Err(format!(
                "{} rows a band for {} output rows",
                self.rows,
                spec.output3()[1]
            ));
        }
        Ok(())
    }

    /// Every config that fits `spec` on the device.
    pub fn space(info: &VulkanDeviceInfo, spec: &ConvSpec) -> Vec<TileConfig> {
        super::combinations([&WORKGROUPS, &OUT_WS, &ROWS])
            .into_iter()
            .map(Self::from_values)
            .filter(|c| c.fits(info, spec).is_ok())
            .collect()
    }

    /// The default: 4 outputs an invocation, 128 invocations (or the device's most),
    /// the tallest band that fits the shared memory and about one band's worth of work
    /// per invocation; an error when not even one row fits.
    pub fn default_for(info: &VulkanDeviceInfo, spec: &ConvSpec) -> Result<TileConfig> {
        let space = Self::space(info, spec);
        let wg = WORKGROUPS
            .iter()
            .copied()
            .filter(|&w| w <= 128 && w <= info.max_workgroup_invocations)
            .max()
            .unwrap_or(32);
        let ow = spec.output3()[2] as u32;
        let out_w = if ow >= 16 { 4 } else { 1 };
        let per_row = ow.div_ceil(out_w).max(1);
        space
            .iter()
            .copied()
            .filter(|c| c.workgroup == wg && c.out_w == out_w)
            .filter(|c| c.rows == 1 || c.rows * per_row <= 2 * wg)
            .max_by_key(|c| c.rows)
            .or_else(|| space.first().copied())
            .ok_or_else(|| Error::NotApplicable {
                variant: "vulkan tile".into(),
                spec: spec.to_string(),
                reason: format!(
                    "even one output row's slices exceed the device's {} bytes of shared memory",
                    info.max_shared_bytes
                ),
            })
    }
}

fn i32_of(what: &str, v: usize) -> Result<i32> {
    super::i32_of("tile", what, v)
}

/// The shader with `config` (None: the device's default) prepared on device-local
/// copies of `x` and `w`, to launch and time.
pub fn prepare_tile<'d>(
    dev: &'d VulkanDevice,
    spec: &ConvSpec,
    x: &HostTensor,
    w: &HostTensor,
    config: Option<TileConfig>,
) -> Result<super::VulkanRun<'d>> {
    let info = dev.info();
    let source = super::source_for("tiled", SOURCE, spec.dtype(), info)?;
    x.expect("input", spec.dtype(), spec.input_len())?;
    w.expect("weight", spec.dtype(), spec.weight_len())?;
    let config = super::resolve_config(
        "vulkan tile",
        spec,
        config,
        || TileConfig::default_for(info, spec),
        |c| c.fits(info, spec),
    )?;
    i32_of("input length", spec.input_len())?;
    i32_of("output length", spec.output_len())?;
    let [od, oh, ow] = spec.output3();
    let bands = oh.div_ceil(config.rows as usize);
    let groups = bands * spec.n() * spec.c() * od;
    let grid = super::grid_for(info, groups)?;
    let [id, ih, iw] = spec.input3();
    let (st, dl, pb) = (spec.stride3(), spec.dilation3(), spec.pad_before3());
    let ints = [
        spec.n(),
        spec.c(),
        id,
        ih,
        iw,
        od,
        oh,
        ow,
        st[0],
        st[1],
        dl[0],
        dl[1],
        pb[0],
        pb[1],
        pb[2],
        (spec.layout() == Layout::ChannelsLast) as usize,
        groups,
    ]
    .into_iter()
    .map(|v| i32_of("a size", v))
    .collect::<Result<Vec<i32>>>()?;
    let (hs, ws) = tile_shape(spec, &config);
    let [kd, kh, kw] = spec.kernel3();
    let constants = super::spec_constants(&[
        config.workgroup as usize,
        kd,
        kh,
        kw,
        config.out_w as usize,
        config.rows as usize,
        st[2],
        dl[2],
        hs,
        ws,
    ]);
    let y = HostTensor::zeros(spec.dtype(), &spec.output_shape());
    let push = super::push_bytes(&ints);
    super::VulkanRun::new(dev, "tile", &source, &constants, &push, grid, x, w, y, None)
        .map(|r| r.with_config(&config))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lavapipe_like() -> VulkanDeviceInfo {
        crate::vulkan::device::lavapipe_like()
    }

    #[test]
    fn the_space_is_pruned_by_the_devices_shared_memory() {
        let seed = crate::spec::ConvParams::seed().validate().unwrap();
        let info = lavapipe_like();
        let space = TileConfig::space(&info, &seed);
        assert!(!space.is_empty());
        assert!(space.iter().all(|c| c.shared_bytes(&seed) <= 32 * 1024));
        // The seed's 3 slices of 84 floats a row: 4 output rows need 8 input rows (8 KiB),
        // 32 need 36 (36 KiB, over lavapipe's 32).
        assert!(space.iter().any(|c| c.rows == 16));
        assert!(!space.iter().any(|c| c.rows == 32));
        let d = TileConfig::default_for(&info, &seed).unwrap();
        assert!(d.fits(&info, &seed).is_ok(), "{d:?}");
        let mut tiny = info.clone();
        tiny.max_shared_bytes = 1024;
        assert!(TileConfig::default_for(&tiny, &seed).is_err());
    }
}
