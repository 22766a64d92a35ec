//! The FMA depth rotation on channels-last data (kernels/vulkan/depth_rotate_cl.comp):
//! lanes over channels, so loads are coalesced with no shared memory; each invocation
//! walks down the depth for one channel and a run of outputs, every input row segment
//! read once into registers and accumulated into the KD output depths it feeds.
//! Depthwise specs with depth stride and dilation 1, channels-last. Its config
//! ([`RotateClConfig`]: invocations over channels, outputs and output rows an
//! invocation) goes to the shader as specialization constants, pruned by the device and
//! the spec.

use super::device::VulkanDevice;
use super::{VulkanDeviceInfo, VulkanRun};
use crate::error::{Error, Result};
use crate::spec::{ConvSpec, Layout};
use crate::tensor::HostTensor;

pub const SOURCE: &str = include_str!("../../kernels/vulkan/depth_rotate_cl.comp");

/// One config of the channels-last rotation shader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct RotateClConfig {
    /// Invocations a workgroup: consecutive channels.
    pub workgroup: u32,
    /// Consecutive outputs of a row an invocation computes.
    pub out_w: u32,
    /// Consecutive output rows an invocation computes (each input row segment it reads
    /// feeds all of them that reach it).
    pub out_h: u32,
}

const WORKGROUPS: [u32; 4] = [32, 64, 128, 256];
const OUT_WS: [u32; 4] = [1, 2, 4, 8];
const OUT_HS: [u32; 3] = [1, 2, 4];

impl RotateClConfig {
    pub const NAME: &'static str = "depth_rotate_cl";
    /// The fields, in `values` order.
    pub const NAMES: [&'static str; 3] = ["workgroup", "out_w", "out_h"];

    pub fn values(&self) -> [u32; 3] {
        [self.workgroup, self.out_w, self.out_h]
    }

    /// Why the shader does not apply to `spec`, if it does not.
    pub fn applies(spec: &ConvSpec) -> std::result::Result<(), String> {
        if spec.layout() != Layout::ChannelsLast {
            return Err("the channels-last rotation takes channels-last data".into());
        }
        super::depth_rotate::RotateConfig::applies(spec)
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
        // No workgroup wider than the channels (beyond the smallest size).
        if self.workgroup as usize > spec.c().next_power_of_two().max(32) {
            return Err(format!(
                "{} lanes for {} channels",
                self.workgroup,
                spec.c()
            ));
        }
        if self.out_w as usize > spec.output3()[2].next_power_of_two() {
            return Err(format!(
                "{} outputs a run for rows of {}",
                self.out_w,
                spec.output3()[2]
            ));
        }
        if self.out_h as usize > spec.output3()[1].next_power_of_two() {
            return Err(format!(
                "{} output rows a run for {} rows",
                self.out_h,
                spec.output3()[1]
            ));
        }
        // Registers: KD x OUT_H x OUT_W sums, the weights, a row segment.
        let sums = spec.kernel3()[0] * self.out_w as usize * self.out_h as usize;
        if sums > 64 {
            return Err(format!("{sums} sums an invocation (at most 64)"));
        }
        Ok(())
    }

    /// Every config that fits `spec` on the device.
    pub fn space(info: &VulkanDeviceInfo, spec: &ConvSpec) -> Vec<RotateClConfig> {
        let mut v = Vec::new();
        for &workgroup in &WORKGROUPS {
            for &out_w in &OUT_WS {
                for &out_h in &OUT_HS {
                    let c = RotateClConfig {
                        workgroup,
                        out_w,
                        out_h,
                    };
                    if c.fits(info, spec).is_ok() {
                        v.push(c);
                    }
                }
            }
        }
        v
    }

    /// The default: the widest workgroup up to 128 the channels fill, 4 outputs a run
    /// (fewer on short rows), one row (runs of several rows are in the tuner's space,
    /// not yet measured on a GPU).
    pub fn default_for(info: &VulkanDeviceInfo, spec: &ConvSpec) -> Result<RotateClConfig> {
        let refused = |reason: String| Error::NotApplicable {
            variant: Self::NAME.into(),
            spec: spec.to_string(),
            reason,
        };
        Self::applies(spec).map_err(refused)?;
        let space = Self::space(info, spec);
        let out_w = if spec.output3()[2] >= 16 { 4 } else { 1 };
        space
            .iter()
            .copied()
            .filter(|c| c.out_w == out_w && c.out_h == 1 && c.workgroup <= 128)
            .max_by_key(|c| c.workgroup)
            .or_else(|| space.first().copied())
            .ok_or_else(|| refused("no config fits the device and the spec".into()))
    }
}

config_text!(
    RotateClConfig,
    "a depth_rotate_cl config",
    "workgroup 32-256, out_w 1-8, out_h 1-4, powers of two",
    |[workgroup, out_w, out_h]: [u32; 3]| {
        (WORKGROUPS.contains(&workgroup) && OUT_WS.contains(&out_w) && OUT_HS.contains(&out_h))
            .then_some(RotateClConfig {
                workgroup,
                out_w,
                out_h,
            })
    }
);

fn i32_of(what: &str, v: usize) -> Result<i32> {
    super::i32_of("depth_rotate_cl", what, v)
}

/// The shader with `config` (None: the device's default) prepared on device-local
/// copies of `x` and `w`, to launch and time.
pub fn prepare_depth_rotate_cl<'d>(
    dev: &'d VulkanDevice,
    spec: &ConvSpec,
    x: &HostTensor,
    w: &HostTensor,
    config: Option<RotateClConfig>,
) -> Result<VulkanRun<'d>> {
    let info = dev.info();
    let source = super::source_for("depth_rotate_cl", SOURCE, spec.dtype(), info)?;
    x.expect("input", spec.dtype(), spec.input_len())?;
    w.expect("weight", spec.dtype(), spec.weight_len())?;
    let config = super::resolve_config(
        RotateClConfig::NAME,
        spec,
        config,
        || RotateClConfig::default_for(info, spec),
        |c| c.fits(info, spec),
    )?;
    i32_of("input length", spec.input_len())?;
    i32_of("output length", spec.output_len())?;
    let [id, ih, iw] = spec.input3();
    let [od, oh, ow] = spec.output3();
    let runs_w = ow.div_ceil(config.out_w as usize);
    let runs_h = oh.div_ceil(config.out_h as usize);
    let c_blocks = spec.c().div_ceil(config.workgroup as usize);
    let groups = c_blocks * runs_w * runs_h * spec.n();
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
        runs_w,
        c_blocks,
        groups,
        runs_h,
    ]
    .into_iter()
    .map(|v| i32_of("a size", v))
    .collect::<Result<Vec<i32>>>()?;
    let [kd, kh, kw] = spec.kernel3();
    let constants = super::spec_constants(&[
        config.workgroup as usize,
        kd,
        kh,
        kw,
        config.out_w as usize,
        st[2],
        dl[2],
        config.out_h as usize,
        st[1],
        dl[1],
    ]);
    let y = HostTensor::zeros(spec.dtype(), &spec.output_shape());
    VulkanRun::new(
        dev,
        "depth_rotate_cl",
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
    fn applies_to_channels_last_depth_stride_1_and_is_pruned() {
        let info = crate::vulkan::device::lavapipe_like();
        let mut p = ConvParams::seed();
        p.layout = Layout::ChannelsLast;
        let seed = p.validate().unwrap();
        let space = RotateClConfig::space(&info, &seed);
        // 4 workgroups x 4 run widths x 3 run heights, less 8 x 4 runs over the seed's 3
        // depths (96 sums).
        assert_eq!(space.len(), 4 * 4 * 3 - 4);
        let d = RotateClConfig::default_for(&info, &seed).unwrap();
        assert_eq!((d.workgroup, d.out_w, d.out_h), (128, 4, 1));
        let first = ConvParams::seed().validate().unwrap();
        assert!(RotateClConfig::default_for(&info, &first).is_err());
        p.c = 8;
        let narrow = p.validate().unwrap();
        assert!(RotateClConfig::space(&info, &narrow)
            .iter()
            .all(|c| c.workgroup == 32));
    }
}
