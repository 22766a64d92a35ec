//! The FMA depth rotation on channels-last data (kernels/vulkan/depth_rotate_cl.comp):
//! lanes over channels, so loads are coalesced with no shared memory; each invocation
//! walks down the depth for 1, 2 or 4 consecutive channels (one load a pixel) and a run
//! of outputs over one or more rows, every input row segment read once into registers
//! and accumulated into the KD output depths it feeds. Depthwise specs with depth
//! stride and dilation 1, channels-last. Its config ([`RotateClConfig`]: invocations
//! over channels, outputs, output rows and channels an invocation) goes to the shader as
//! specialization constants (the channel vector's width as a `#define`: it is a type),
//! pruned by the device and the spec.

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
    /// Consecutive channels an invocation computes: a pixel's are one load (4-16 bytes)
    /// and every FMA a vector one. The channel count must be a multiple.
    pub cv: u32,
    /// 1: each kernel row's weights are read where they are used (from L1) instead of
    /// held in registers for the whole walk: a layer of one depth slice uses each weight
    /// once a run, so registers bought it nothing and capped the rest.
    pub wrow: u32,
}

const WORKGROUPS: [u32; 4] = [32, 64, 128, 256];
const OUT_WS: [u32; 4] = [1, 2, 4, 8];
const OUT_HS: [u32; 3] = [1, 2, 4];
const CVS: [u32; 3] = [1, 2, 4];
const WROWS: [u32; 2] = [0, 1];
/// Weights an invocation keeps in registers (the seed's 3x5x5 at one channel). More
/// channels an invocation are refused past it: a form with the weights in shared memory
/// ran 3-8x slower (H100 run 271: one warp a workgroup, its weights 12-38 KB).
const MAX_REGISTER_WEIGHTS: usize = 80;

impl RotateClConfig {
    pub const NAME: &'static str = "depth_rotate_cl";
    /// The fields, in `values` order.
    pub const NAMES: [&'static str; 5] = ["workgroup", "out_w", "out_h", "cv", "wrow"];

    pub fn values(&self) -> [u32; 5] {
        [self.workgroup, self.out_w, self.out_h, self.cv, self.wrow]
    }

    /// The config of `values` (in `NAMES` order), family or not.
    fn from_values([workgroup, out_w, out_h, cv, wrow]: [u32; 5]) -> Self {
        RotateClConfig {
            workgroup,
            out_w,
            out_h,
            cv,
            wrow,
        }
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
        if !spec.c().is_multiple_of(self.cv as usize) {
            return Err(format!(
                "{} channels an invocation for {} channels (not a multiple)",
                self.cv,
                spec.c()
            ));
        }
        // No workgroup wider than the channel vectors (beyond the smallest size).
        let vectors = spec.c() / self.cv as usize;
        if self.workgroup as usize > vectors.next_power_of_two().max(32) {
            return Err(format!(
                "{} lanes for {} channels in vectors of {}",
                self.workgroup,
                spec.c(),
                self.cv
            ));
        }
        let weights = spec.kernel3().iter().product::<usize>() * self.cv as usize;
        if self.wrow == 0 && weights > MAX_REGISTER_WEIGHTS {
            return Err(format!(
                "{weights} weights an invocation (at most {MAX_REGISTER_WEIGHTS}): fewer channels an invocation"
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
        // Registers: KD x OUT_H x OUT_W x CV sums, the weights (up to 80), a row segment.
        let sums = spec.kernel3()[0] * self.out_w as usize * self.out_h as usize * self.cv as usize;
        if sums > 64 {
            return Err(format!("{sums} sums an invocation (at most 64)"));
        }
        Ok(())
    }

    /// Every config that fits `spec` on the device.
    pub fn space(info: &VulkanDeviceInfo, spec: &ConvSpec) -> Vec<RotateClConfig> {
        super::combinations([&WORKGROUPS, &OUT_WS, &OUT_HS, &CVS, &WROWS])
            .into_iter()
            .map(Self::from_values)
            .filter(|c| c.fits(info, spec).is_ok())
            .collect()
    }

    /// The default (H100 run 271, six channels-last layers): 4 outputs a run (fewer on
    /// short rows); two output rows where the kernel has at most 5 rows (0.70-0.90x the
    /// time of one on the 3-D layers and mobilenet; a 7x7 took 1.14x); channels in
    /// vectors of 4 for kernels of at most 4 taps (causal-conv1d 0.67x), of 2 for at most
    /// 9 (mobilenet 0.63x), else one (x3d's 27 taps ran 1.13x slower on two); the
    /// workgroup up to 128 whose last one the channel vectors fill best, nearest 64 on a
    /// tie (x3d 64 0.95x of 128). On a layer of one depth slice with more than 9 taps
    /// (run 277, the three 2-D 5x5 and 7x7 layers of the suites): weights read where used,
    /// two channels and two rows an invocation, runs of 8 where they span <= 14 inputs
    /// (else 4), a workgroup of 64 or 128 (the better fill, 128 on a tie). Past 64 taps
    /// (run 286, the seed's 3x5x5): weights read where used, two channels, one row of 8.
    pub fn default_for(info: &VulkanDeviceInfo, spec: &ConvSpec) -> Result<RotateClConfig> {
        let refused = |reason: String| Error::NotApplicable {
            variant: Self::NAME.into(),
            spec: spec.to_string(),
            reason,
        };
        Self::applies(spec).map_err(refused)?;
        let space = Self::space(info, spec);
        let [kd, kh, kw] = spec.kernel3();
        let taps = kd * kh * kw;
        // One depth slice an invocation and many taps: weights read where used (2.1x on
        // convnext-nhwc, H100 run 277), which frees the registers for two channels and
        // two rows an invocation, and runs of 8 where their row segment spans <= 14
        // inputs (a 7-wide row at stride 1; 5-wide at stride 2 takes 4).
        let plane = super::one_slice_planes_of_many_taps(spec);
        // Past 64 taps (the seed's 75) the weights crowd out the rest on any slice walk:
        // read where used too, two channels, one row of 8 (seed-f16-ndhwc 1.047 -> 0.946
        // ms, run 286; x3d's and video-vae's 27 taps measured no gain, 1.0-1.3x slower).
        let heavy = taps > 64;
        let wrow = plane || heavy;
        let wide = spec.output3()[2] >= 16;
        let span =
            |out_w: usize| (out_w - 1) * spec.stride3()[2] + (kw - 1) * spec.dilation3()[2] + 1;
        let out_w = match (wide, wrow) {
            (false, _) => 1,
            (true, true) if span(8) <= 14 => 8,
            (true, _) => 4,
        };
        let out_h = if plane || (!heavy && kh <= 5) { 2 } else { 1 };
        let cv = match (wrow, taps) {
            (true, _) => 2,
            (false, 0..=4) => 4,
            (false, 5..=9) => 2,
            (false, _) => 1,
        };
        // Filled share of the last workgroup's lanes (per mille), then nearness to 64
        // (reading weights where used: 64 or 128, the larger on a tie: convnext-t-nhwc's
        // 96 vectors 0.067 ms at 128, 0.083 at 64; efficientnet-k5s2's 72 0.058 / 0.073).
        let rank = |c: &RotateClConfig| {
            let vectors = spec.c() / c.cv as usize;
            let lanes = vectors.div_ceil(c.workgroup as usize) * c.workgroup as usize;
            let distance = (c.workgroup as i64 - 64).abs();
            let tie = if plane { c.workgroup as i64 } else { -distance };
            (vectors * 1000 / lanes, tie)
        };
        let wrow = u32::from(wrow);
        let smallest = if plane { 64 } else { 0 };
        // The rule's config, else with fewer channels or rows an invocation where the
        // spec refuses it (an odd channel count, one output row).
        [(cv, out_h), (1, out_h), (cv, 1), (1, 1)]
            .into_iter()
            .find_map(|(cv, out_h)| {
                space
                    .iter()
                    .copied()
                    .filter(|c| {
                        c.out_w == out_w
                            && c.out_h == out_h
                            && c.cv == cv
                            && c.wrow == wrow
                            && (smallest..=128).contains(&c.workgroup)
                    })
                    .max_by_key(rank)
            })
            .or_else(|| space.first().copied())
            .ok_or_else(|| refused("no config fits the device and the spec".into()))
    }
}

config_text!(
    RotateClConfig,
    "a depth_rotate_cl config",
    "workgroup 32-256, out_w 1-8, out_h 1-4, cv 1-4, powers of two; wrow 0 or 1",
    |v: [u32; 5]| {
        let [workgroup, out_w, out_h, cv, wrow] = v;
        (WORKGROUPS.contains(&workgroup)
            && OUT_WS.contains(&out_w)
            && OUT_HS.contains(&out_h)
            && CVS.contains(&cv)
            && WROWS.contains(&wrow))
        .then(|| RotateClConfig::from_values(v))
    }
);

fn i32_of(what: &str, v: usize) -> Result<i32> {
    super::i32_of("depth_rotate_cl", what, v)
}

/// A [C][taps] weight as [taps][C] (the shader's layout: lanes on consecutive channels
/// read consecutive elements), bit for bit.
fn tap_major(w: &HostTensor, c: usize) -> HostTensor {
    let taps = w.len() / c;
    let size = w.size_bytes() / w.len();
    let mut t = HostTensor::zeros(w.dtype(), &[taps, c]);
    let (from, to) = (w.as_bytes(), t.as_bytes_mut());
    for ch in 0..c {
        for tap in 0..taps {
            let (a, b) = ((ch * taps + tap) * size, (tap * c + ch) * size);
            to[b..b + size].copy_from_slice(&from[a..a + size]);
        }
    }
    t
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
    x.expect("input", spec.dtype(), spec.input_len())?;
    w.expect("weight", spec.dtype(), spec.weight_len())?;
    let config = super::resolve_config(
        RotateClConfig::NAME,
        spec,
        config,
        || RotateClConfig::default_for(info, spec),
        |c| c.fits(info, spec),
    )?;
    // The define goes ahead of the element prelude, which reads CV.
    let source = super::shader::with_defines(
        &super::source_for("depth_rotate_cl", SOURCE, spec.dtype(), info)?,
        &[("CV", config.cv as usize)],
    );
    i32_of("input length", spec.input_len())?;
    i32_of("output length", spec.output_len())?;
    let [id, ih, iw] = spec.input3();
    let [od, oh, ow] = spec.output3();
    let runs_w = ow.div_ceil(config.out_w as usize);
    let runs_h = oh.div_ceil(config.out_h as usize);
    let vectors = spec.c() / config.cv as usize;
    let c_blocks = vectors.div_ceil(config.workgroup as usize);
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
        vectors,
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
        config.wrow as usize,
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
        &tap_major(w, spec.c()),
        y,
        None,
    )
    .map(|r| r.with_config(&config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ConvParams, DType};

    #[test]
    fn applies_to_channels_last_depth_stride_1_and_is_pruned() {
        let info = crate::vulkan::device::lavapipe_like();
        let mut p = ConvParams::seed();
        p.layout = Layout::ChannelsLast;
        let seed = p.validate().unwrap();
        let space = RotateClConfig::space(&info, &seed);
        // Weights in registers, one channel an invocation: 4 workgroups x 4 run widths x 3
        // run heights, less 8 x 4 runs over the seed's 3 depths (96 sums). Two would be
        // 150 weights (past 80); read where used they are not held, and two or four are in.
        let held: Vec<_> = space.iter().filter(|c| c.wrow == 0).collect();
        assert_eq!(held.len(), 4 * 4 * 3 - 4);
        assert!(held.iter().all(|c| c.cv == 1));
        assert!([2, 4]
            .iter()
            .all(|&v| space.iter().any(|c| c.wrow == 1 && c.cv == v)));
        // The seed's 75 taps: weights read where used, two channels (256 vectors fill
        // every workgroup: the nearest 64), one row of 8.
        let d = RotateClConfig::default_for(&info, &seed).unwrap();
        assert_eq!(
            (d.workgroup, d.out_w, d.out_h, d.cv, d.wrow),
            (64, 8, 1, 2, 1)
        );
        // A 3x3 2-D layer (mobilenet's): two channels an invocation, 72 vectors fill
        // three workgroups of 32 best (75%).
        let mut m = ConvParams {
            n: 32,
            c: 144,
            input: vec![56, 56],
            kernel: vec![3, 3],
            stride: vec![1, 1],
            dilation: vec![1, 1],
            padding: vec![[1, 1], [1, 1]],
            layout: Layout::ChannelsLast,
            dtype: DType::F16,
        };
        let d = RotateClConfig::default_for(&info, &m.validate().unwrap()).unwrap();
        assert_eq!(
            (d.workgroup, d.out_w, d.out_h, d.cv, d.wrow),
            (32, 4, 2, 2, 0)
        );
        // A 7x7 2-D layer (ConvNeXt's): one slice an invocation, 49 taps: read where used,
        // two channels and rows, runs of 8 (a 14-input segment); 72 vectors fill 64 and
        // 128 alike: the larger.
        let mut k7 = m.clone();
        (k7.kernel, k7.padding) = (vec![7, 7], vec![[3, 3], [3, 3]]);
        let d = RotateClConfig::default_for(&info, &k7.validate().unwrap()).unwrap();
        assert_eq!(
            (d.workgroup, d.out_w, d.out_h, d.cv, d.wrow),
            (128, 8, 2, 2, 1)
        );
        // 5x5 at stride 2 (EfficientNet's): runs of 4 (8 would span 19 inputs).
        let mut k5 = k7.clone();
        (k5.kernel, k5.padding, k5.stride) = (vec![5, 5], vec![[2, 2], [2, 2]], vec![2, 2]);
        let d = RotateClConfig::default_for(&info, &k5.validate().unwrap()).unwrap();
        assert_eq!((d.out_w, d.out_h, d.cv, d.wrow), (4, 2, 2, 1));
        // Channel vectors only of a width that divides the channels.
        m.c = 6 * 7;
        let space = RotateClConfig::space(&info, &m.validate().unwrap());
        assert!(space.iter().any(|c| c.cv == 2) && space.iter().all(|c| c.cv <= 2));
        m.c = 45;
        let odd = m.validate().unwrap();
        assert!(RotateClConfig::space(&info, &odd).iter().all(|c| c.cv == 1));
        assert_eq!(RotateClConfig::default_for(&info, &odd).unwrap().cv, 1);
        // A 4-tap 1-D kernel: vectors of 4.
        m.c = 64;
        m.input = vec![300];
        m.kernel = vec![4];
        m.padding = vec![[3, 0]];
        m.stride = vec![1];
        m.dilation = vec![1];
        let d = RotateClConfig::default_for(&info, &m.validate().unwrap()).unwrap();
        assert_eq!((d.out_h, d.cv), (1, 4));
        let first = ConvParams::seed().validate().unwrap();
        assert!(RotateClConfig::default_for(&info, &first).is_err());
        p.c = 8;
        let narrow = p.validate().unwrap();
        assert!(RotateClConfig::space(&info, &narrow)
            .iter()
            .all(|c| c.workgroup == 32));
    }
}
