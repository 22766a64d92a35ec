//! The FMA depth rotation on Vulkan (kernels/vulkan/depth_rotate.comp): depth_reuse_fma's
//! method in portable GLSL for depthwise specs with depth stride and dilation 1. A
//! workgroup walks down the depth of a band of output rows, loading each input slice's
//! band into shared memory once and accumulating the KD output depths it feeds in
//! registers, so the input is read once where the tiled shader reads it KD times. Its
//! config ([`RotateConfig`]: invocations, outputs an invocation along W, band rows) goes
//! to the shader as specialization constants; the runs an invocation owns follow from it
//! (at most 4, so that their sums stay in registers), and the space is pruned by the
//! device's shared memory and invocations. f32, and f16 where the device has 16-bit
//! storage.

use super::device::VulkanDevice;
use super::tile::{tile_shape, TileConfig};
use super::{VulkanDeviceInfo, VulkanRun};
use crate::error::{Error, Result};
use crate::spec::{ConvSpec, Layout};
use crate::tensor::HostTensor;

pub const SOURCE: &str = include_str!("../../kernels/vulkan/depth_rotate.comp");

/// One config of the rotation shader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct RotateConfig {
    /// Invocations a workgroup.
    pub workgroup: u32,
    /// Consecutive outputs of a row an invocation computes.
    pub out_w: u32,
    /// Output rows a workgroup's band holds.
    pub rows: u32,
}

// The tiled shader's family (a band of rows, runs of outputs, workgroup sizes).
use super::tile::{OUT_WS, ROWS, WORKGROUPS};
/// Runs of outputs an invocation may own (their KD x OUT_W sums each in registers).
const MAX_ITEMS: usize = 4;

impl RotateConfig {
    pub const NAME: &'static str = "depth_rotate";
    /// The fields, in `values` order.
    pub const NAMES: [&'static str; 3] = ["workgroup", "out_w", "rows"];

    pub fn values(&self) -> [u32; 3] {
        [self.workgroup, self.out_w, self.rows]
    }

    fn as_tile(&self) -> TileConfig {
        TileConfig {
            workgroup: self.workgroup,
            out_w: self.out_w,
            rows: self.rows,
        }
    }

    /// The shared band's rows and floats a row (one slice).
    pub fn band(&self, spec: &ConvSpec) -> (usize, usize) {
        tile_shape(spec, &self.as_tile())
    }

    /// Shared memory a workgroup needs (one f32 slice band).
    pub fn shared_bytes(&self, spec: &ConvSpec) -> usize {
        let (hs, ws) = self.band(spec);
        4 * hs * ws
    }

    /// Runs of OUT_W outputs each invocation owns: the band's runs over the invocations.
    pub fn items(&self, spec: &ConvSpec) -> usize {
        let ow = spec.output3()[2];
        let runs = self.rows as usize * ow.div_ceil(self.out_w as usize);
        runs.div_ceil(self.workgroup as usize)
    }

    /// Why the rotation does not apply to `spec`, if it does not.
    pub fn applies(spec: &ConvSpec) -> std::result::Result<(), String> {
        if spec.stride3()[0] != 1 || spec.dilation3()[0] != 1 {
            return Err(format!(
                "the depth rotation takes depth stride and dilation 1 (this spec: {} and {})",
                spec.stride3()[0],
                spec.dilation3()[0]
            ));
        }
        Ok(())
    }

    /// Why this config cannot run `spec` on a device with `info`'s limits, if it cannot.
    pub fn fits(
        &self,
        info: &VulkanDeviceInfo,
        spec: &ConvSpec,
    ) -> std::result::Result<(), String> {
        Self::applies(spec)?;
        if self.workgroup > info.max_workgroup_invocations {
            return Err(format!(
                "{} invocations a workgroup, more than the device's {}",
                self.workgroup, info.max_workgroup_invocations
            ));
        }
        let bytes = self.shared_bytes(spec);
        if bytes > info.max_shared_bytes as usize {
            return Err(format!(
                "a band of {bytes} bytes, more than the device's {} of shared memory",
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
        let items = self.items(spec);
        if items > MAX_ITEMS || items * spec.kernel3()[0] * self.out_w as usize > 64 {
            return Err(format!(
                "{items} runs of {} outputs an invocation over {} depths: more sums than \
                 registers hold (at most {MAX_ITEMS} runs, 64 sums)",
                self.out_w,
                spec.kernel3()[0]
            ));
        }
        Ok(())
    }

    /// Every config that fits `spec` on the device.
    pub fn space(info: &VulkanDeviceInfo, spec: &ConvSpec) -> Vec<RotateConfig> {
        let mut v = Vec::new();
        for &workgroup in &WORKGROUPS {
            for &out_w in &OUT_WS {
                for &rows in &ROWS {
                    let c = RotateConfig {
                        workgroup,
                        out_w,
                        rows,
                    };
                    if c.fits(info, spec).is_ok() {
                        v.push(c);
                    }
                }
            }
        }
        v
    }

    /// The default: 128 invocations (or the device's most), 4 outputs an invocation on
    /// rows of 16 or more, the tallest band whose runs take at most two an invocation.
    pub fn default_for(info: &VulkanDeviceInfo, spec: &ConvSpec) -> Result<RotateConfig> {
        let refused = |reason: String| Error::NotApplicable {
            variant: Self::NAME.into(),
            spec: spec.to_string(),
            reason,
        };
        Self::applies(spec).map_err(refused)?;
        let space = Self::space(info, spec);
        let wg = WORKGROUPS
            .iter()
            .copied()
            .filter(|&w| w <= 128 && w <= info.max_workgroup_invocations)
            .max()
            .unwrap_or(32);
        let out_w = if spec.output3()[2] >= 16 { 4 } else { 1 };
        space
            .iter()
            .copied()
            .filter(|c| c.workgroup == wg && c.out_w == out_w && c.items(spec) <= 2)
            .max_by_key(|c| c.rows)
            .or_else(|| space.first().copied())
            .ok_or_else(|| {
                refused(format!(
                    "no config fits: even one output row's band exceeds the device's {} bytes \
                     of shared memory, or its runs the registers",
                    info.max_shared_bytes
                ))
            })
    }
}

config_text!(
    RotateConfig,
    "a depth_rotate config",
    super::tile::BAND_HINT,
    |[workgroup, out_w, rows]: [u32; 3]| {
        super::tile::in_band_family(workgroup, out_w, rows).then_some(RotateConfig {
            workgroup,
            out_w,
            rows,
        })
    }
);

fn i32_of(what: &str, v: usize) -> Result<i32> {
    super::i32_of("depth_rotate", what, v)
}

/// The shader with `config` (None: the device's default) prepared on device-local
/// copies of `x` and `w`, to launch and time.
pub fn prepare_depth_rotate<'d>(
    dev: &'d VulkanDevice,
    spec: &ConvSpec,
    x: &HostTensor,
    w: &HostTensor,
    config: Option<RotateConfig>,
) -> Result<VulkanRun<'d>> {
    let info = dev.info();
    let source = super::source_for("depth_rotate", SOURCE, spec.dtype(), info)?;
    x.expect("input", spec.dtype(), spec.input_len())?;
    w.expect("weight", spec.dtype(), spec.weight_len())?;
    let config = super::resolve_config(
        RotateConfig::NAME,
        spec,
        config,
        || RotateConfig::default_for(info, spec),
        |c| c.fits(info, spec),
    )?;
    i32_of("input length", spec.input_len())?;
    i32_of("output length", spec.output_len())?;
    let [id, ih, iw] = spec.input3();
    let [od, oh, ow] = spec.output3();
    let bands = oh.div_ceil(config.rows as usize);
    let groups = bands * spec.n() * spec.c();
    let grid = super::grid_for(info, groups)?;
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
        st[1],
        dl[1],
        pb[0],
        pb[1],
        pb[2],
        usize::from(spec.layout() == Layout::ChannelsLast),
        groups,
    ]
    .into_iter()
    .map(|v| i32_of("a size", v))
    .collect::<Result<Vec<i32>>>()?;
    let (hs, ws) = config.band(spec);
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
        config.items(spec),
    ]);
    let y = HostTensor::zeros(spec.dtype(), &spec.output_shape());
    VulkanRun::new(
        dev,
        "depth_rotate",
        &source,
        &constants,
        &super::push_bytes(&ints),
        grid,
        x,
        w,
        y,
    )
    .map(|r| r.with_config(&config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::ConvParams;

    #[test]
    fn the_space_covers_every_output_and_is_pruned() {
        let info = crate::vulkan::device::lavapipe_like();
        let seed = ConvParams::seed().validate().unwrap();
        let space = RotateConfig::space(&info, &seed);
        assert!(!space.is_empty());
        for c in &space {
            assert!(c.shared_bytes(&seed) <= 32 * 1024);
            // Every run of the band has an owner.
            assert!(
                c.items(&seed) * c.workgroup as usize * c.out_w as usize >= c.rows as usize * 80
            );
        }
        let d = RotateConfig::default_for(&info, &seed).unwrap();
        assert!(d.fits(&info, &seed).is_ok() && d.items(&seed) <= 2, "{d}");
        let mut strided = ConvParams::seed();
        strided.stride = vec![2, 1, 1];
        let strided = strided.validate().unwrap();
        assert!(RotateConfig::space(&info, &strided).is_empty());
        assert!(RotateConfig::default_for(&info, &strided).is_err());
    }
}
