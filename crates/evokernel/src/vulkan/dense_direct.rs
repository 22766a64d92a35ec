//! The direct dense/grouped convolution on Vulkan (kernels/vulkan/dense_direct.comp):
//! output tiles a workgroup, the input patch and weights of CI_T input channels at a
//! time in shared memory, several outputs and KO output channels an invocation. Its
//! config ([`DirectConfig`]) is the RDNA plan's struct
//! `{threads_x, threads_y, ko_tile, outputs_x/y, ci_tile, lds_pad}` as specialization
//! constants; the wave size is the device's subgroup size (read, not chosen), and loop
//! unrolling is left to the driver's compiler (every bound is a specialization
//! constant). The space is pruned by the device's real limits (shared memory,
//! invocations a workgroup) and by the spec (no tile wider than the output, no channel
//! tile past the group's channels).

use super::device::VulkanDevice;
use super::VulkanDeviceInfo;
use super::VulkanRun;
use crate::dense::DenseConvSpec;
use crate::error::{Error, Result};
use crate::tensor::HostTensor;

pub const SOURCE: &str = include_str!("../../kernels/vulkan/dense_direct.comp");

/// One config of the direct shader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct DirectConfig {
    /// Invocations along W (and output columns a pass of them covers).
    pub threads_x: u32,
    /// Invocations along H.
    pub threads_y: u32,
    /// Output columns an invocation computes (strided by threads_x).
    pub outputs_x: u32,
    /// Output rows an invocation computes (strided by threads_y).
    pub outputs_y: u32,
    /// Output channels a workgroup computes (each invocation all of them).
    pub ko_tile: u32,
    /// Input channels staged in shared memory a step.
    pub ci_tile: u32,
    /// Floats padding each shared row (bank conflicts of strided reads).
    pub lds_pad: u32,
}

const THREADS_X: [u32; 4] = [4, 8, 16, 32];
const THREADS_Y: [u32; 4] = [1, 2, 4, 8];
const OUTPUTS_X: [u32; 3] = [1, 2, 4];
const OUTPUTS_Y: [u32; 2] = [1, 2];
const KO_TILES: [u32; 4] = [4, 8, 16, 32];
const CI_TILES: [u32; 3] = [4, 8, 16];
const LDS_PADS: [u32; 2] = [0, 1];

impl DirectConfig {
    /// The variant name configs are forced, tuned and cached under.
    pub const NAME: &'static str = "dense_direct";
    /// The fields, in `values` order.
    pub const NAMES: [&'static str; 7] = [
        "threads_x",
        "threads_y",
        "outputs_x",
        "outputs_y",
        "ko_tile",
        "ci_tile",
        "lds_pad",
    ];

    pub fn values(&self) -> [u32; 7] {
        [
            self.threads_x,
            self.threads_y,
            self.outputs_x,
            self.outputs_y,
            self.ko_tile,
            self.ci_tile,
            self.lds_pad,
        ]
    }

    /// The config of `values` (in `NAMES` order; unchecked: `fits` and `family` judge it).
    fn from_values(
        [threads_x, threads_y, outputs_x, outputs_y, ko_tile, ci_tile, lds_pad]: [u32; 7],
    ) -> Self {
        DirectConfig {
            threads_x,
            threads_y,
            outputs_x,
            outputs_y,
            ko_tile,
            ci_tile,
            lds_pad,
        }
    }

    pub fn invocations(&self) -> u32 {
        self.threads_x * self.threads_y
    }

    /// Rows and columns of output a workgroup covers.
    pub fn block(&self) -> (usize, usize) {
        (
            (self.threads_y * self.outputs_y) as usize,
            (self.threads_x * self.outputs_x) as usize,
        )
    }

    /// The shared patch's rows a slice and floats a row (mirrors HS and WS).
    pub fn patch(&self, spec: &DenseConvSpec) -> (usize, usize) {
        let g = spec.geometry();
        let [_, kh, kw] = g.kernel3();
        let [_, sh, sw] = g.stride3();
        let [_, dh, dw] = g.dilation3();
        let (bh, bw) = self.block();
        (
            (bh - 1) * sh + (kh - 1) * dh + 1,
            (bw - 1) * sw + (kw - 1) * dw + 1,
        )
    }

    /// Shared memory a workgroup of this config needs on `spec` (f32 patch and weights).
    pub fn shared_bytes(&self, spec: &DenseConvSpec) -> usize {
        let (hs, ws) = self.patch(spec);
        let g = spec.geometry();
        let ci = self.ci_tile as usize;
        4 * (ci * g.kernel3()[0] * hs * (ws + self.lds_pad as usize)
            + ci * g.taps() * self.ko_tile as usize)
    }

    /// Why this config cannot run `spec` on a device with `info`'s limits, if it cannot.
    pub fn fits(
        &self,
        info: &VulkanDeviceInfo,
        spec: &DenseConvSpec,
    ) -> std::result::Result<(), String> {
        let inv = self.invocations();
        if inv > info.max_workgroup_invocations || !(16..=256).contains(&inv) {
            return Err(format!(
                "{inv} invocations a workgroup: the family takes 16 to 256, and the device {}",
                info.max_workgroup_invocations
            ));
        }
        let bytes = self.shared_bytes(spec);
        if bytes > info.max_shared_bytes as usize {
            return Err(format!(
                "{bytes} bytes of shared memory, more than the device's {}",
                info.max_shared_bytes
            ));
        }
        // Registers: OPY x OPX x KO accumulators an invocation.
        if self.outputs_x * self.outputs_y * self.ko_tile > 64 {
            return Err(format!(
                "{} accumulators an invocation (at most 64)",
                self.outputs_x * self.outputs_y * self.ko_tile
            ));
        }
        let [_, oh, ow] = spec.geometry().output3();
        let (bh, bw) = self.block();
        let waste = |tile: usize, out: usize, step: usize| tile > out.next_power_of_two().max(step);
        if waste(bw, ow, self.threads_x as usize) || waste(bh, oh, self.threads_y as usize) {
            return Err(format!("a {bh} x {bw} tile for {oh} x {ow} outputs"));
        }
        if self.ko_tile as usize > spec.out_per_group().next_power_of_two().max(4) {
            return Err(format!(
                "{} output channels a tile, the group has {}",
                self.ko_tile,
                spec.out_per_group()
            ));
        }
        if self.ci_tile as usize > spec.in_per_group().next_power_of_two().max(4) {
            return Err(format!(
                "{} input channels a step, the group has {}",
                self.ci_tile,
                spec.in_per_group()
            ));
        }
        Ok(())
    }

    /// Every config of the family.
    pub fn family() -> Vec<DirectConfig> {
        let choices = [
            &THREADS_X[..],
            &THREADS_Y,
            &OUTPUTS_X,
            &OUTPUTS_Y,
            &KO_TILES,
            &CI_TILES,
            &LDS_PADS,
        ];
        super::combinations(choices)
            .into_iter()
            .map(Self::from_values)
            .collect()
    }

    /// Every config that fits `spec` on the device.
    pub fn space(info: &VulkanDeviceInfo, spec: &DenseConvSpec) -> Vec<DirectConfig> {
        Self::family()
            .into_iter()
            .filter(|c| c.fits(info, spec).is_ok())
            .collect()
    }

    /// The default: 64 invocations (16 x 4, or the shape the output allows), two columns
    /// an invocation, 16 output channels (fewer where the group has fewer), 8 input
    /// channels a step, padded rows; the first fitting config nearest to that otherwise.
    pub fn default_for(info: &VulkanDeviceInfo, spec: &DenseConvSpec) -> Result<DirectConfig> {
        let space = Self::space(info, spec);
        let want = DirectConfig {
            threads_x: 16,
            threads_y: 4,
            outputs_x: 2,
            outputs_y: 1,
            ko_tile: 16,
            ci_tile: 8,
            lds_pad: 1,
        };
        // Distance in log2 steps, each field weighted alike (the pad, 0 or 1, one step
        // apart).
        let dist = |c: &DirectConfig| {
            super::log2_distance(&c.values()[..6], &want.values()[..6])
                + (c.lds_pad != want.lds_pad) as i32
        };
        space
            .into_iter()
            .min_by_key(|c| (dist(c), std::cmp::Reverse(c.invocations())))
            .ok_or_else(|| Error::NotApplicable {
                variant: "vulkan dense_direct".into(),
                spec: spec.to_string(),
                reason: format!(
                    "no config of the family fits the device's {} bytes of shared memory and \
                     {} invocations a workgroup",
                    info.max_shared_bytes, info.max_workgroup_invocations
                ),
            })
    }
}

config_text!(
    DirectConfig,
    "a dense_direct config",
    format!(
        "a config of the family: threads_x {THREADS_X:?}, threads_y {THREADS_Y:?}, \
         outputs_x {OUTPUTS_X:?}, outputs_y {OUTPUTS_Y:?}, ko_tile {KO_TILES:?}, \
         ci_tile {CI_TILES:?}, lds_pad {LDS_PADS:?}"
    ),
    |v: [u32; 7]| Some(DirectConfig::from_values(v)).filter(|c| DirectConfig::family().contains(c))
);

fn i32_of(what: &str, v: usize) -> Result<i32> {
    super::i32_of("dense_direct", what, v)
}

/// The shader with `config` (None: the device's default) prepared on device-local
/// copies of `x` and `w`, to launch and time.
pub fn prepare_dense_direct<'d>(
    dev: &'d VulkanDevice,
    spec: &DenseConvSpec,
    x: &HostTensor,
    w: &HostTensor,
    config: Option<DirectConfig>,
) -> Result<VulkanRun<'d>> {
    let info = dev.info();
    let source = super::source_for("dense_direct", SOURCE, spec.dtype(), info)?;
    x.expect("input", spec.dtype(), spec.input_len())?;
    w.expect("weight", spec.dtype(), spec.weight_len())?;
    let config = super::resolve_config(
        "vulkan dense_direct",
        spec,
        config,
        || DirectConfig::default_for(info, spec),
        |c| c.fits(info, spec),
    )?;
    i32_of("input length", spec.input_len())?;
    i32_of("weight length", spec.weight_len())?;
    i32_of("output length", spec.output_len())?;
    let g = spec.geometry();
    let [od, oh, ow] = g.output3();
    let (bh, bw) = config.block();
    let (tiles_h, tiles_w) = (oh.div_ceil(bh), ow.div_ceil(bw));
    let co_tiles = spec.out_per_group().div_ceil(config.ko_tile as usize);
    let groups = tiles_w * tiles_h * spec.groups() * co_tiles * od * spec.n();
    let grid = super::grid_for(info, groups)?;
    let mut ints = super::dense_push_fields("dense_direct", spec)?;
    for v in [tiles_w, tiles_h, co_tiles, groups, 0, 0, 0] {
        ints.push(i32_of("a size", v)?);
    }
    let (hs, ws) = config.patch(spec);
    let [kd, kh, kw] = g.kernel3();
    let constants = super::spec_constants(&[
        config.invocations() as usize,
        config.threads_x as usize,
        config.threads_y as usize,
        config.outputs_x as usize,
        config.outputs_y as usize,
        config.ko_tile as usize,
        config.ci_tile as usize,
        config.lds_pad as usize,
        kd,
        kh,
        kw,
        g.stride3()[1],
        g.stride3()[2],
        g.dilation3()[1],
        g.dilation3()[2],
        hs,
        ws,
    ]);
    let y = HostTensor::zeros(spec.dtype(), &spec.output_shape());
    VulkanRun::new(
        dev,
        "dense_direct",
        &source,
        &constants,
        &super::push_bytes(&ints),
        grid,
        x,
        w,
        y,
        None,
    )
    .map(|r| r.with_config(&config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ConvParams, DType, Layout};

    fn lavapipe_like() -> VulkanDeviceInfo {
        crate::vulkan::device::lavapipe_like()
    }

    fn resnet(c: i64, hw: i64, groups: i64) -> DenseConvSpec {
        let p = ConvParams {
            n: 32,
            c,
            input: vec![hw, hw],
            kernel: vec![3, 3],
            stride: vec![1, 1],
            dilation: vec![1, 1],
            padding: vec![[1, 1], [1, 1]],
            layout: Layout::ChannelsLast,
            dtype: DType::F16,
        };
        DenseConvSpec::from_params(&p, c, groups).unwrap()
    }

    #[test]
    fn the_space_is_pruned_by_the_device_and_the_spec() {
        let info = lavapipe_like();
        let s = resnet(64, 56, 1);
        let space = DirectConfig::space(&info, &s);
        assert!(space.len() > 100, "{}", space.len());
        assert!(space.len() < DirectConfig::family().len());
        assert!(space.iter().all(|c| c.shared_bytes(&s) <= 32 * 1024));
        let d = DirectConfig::default_for(&info, &s).unwrap();
        assert_eq!(
            (d.threads_x, d.threads_y, d.ko_tile, d.ci_tile),
            (16, 4, 16, 8)
        );
        // 48 KiB (the H100's Vulkan cap) admits configs lavapipe's 32 KiB refuses.
        let mut big = info.clone();
        big.max_shared_bytes = 48 * 1024;
        assert!(DirectConfig::space(&big, &s).len() > space.len());
        let mut tiny = info.clone();
        tiny.max_shared_bytes = 256;
        assert!(DirectConfig::default_for(&tiny, &s).is_err());
        // ResNeXt's 4 channels a group: no channel tile past 4.
        let g = resnet(128, 56, 32);
        let gs = DirectConfig::space(&info, &g);
        assert!(!gs.is_empty() && gs.iter().all(|c| c.ko_tile == 4 && c.ci_tile == 4));
        // A 7 x 7 output: no 32-column tiles.
        let text = d.to_string();
        assert_eq!(text.parse::<DirectConfig>().unwrap(), d);
        use crate::dense::tune::TunableShader;
        assert_eq!(DirectConfig::from_config(&d.to_config()).unwrap(), d);
        for bad in [
            "dense_direct:threads_x=16",
            "tile:threads_x=16",
            &text.replace("ko_tile=16", "ko_tile=12"),
            &text.replace("lds_pad=1", "lds_pad=x"),
        ] {
            assert!(bad.parse::<DirectConfig>().is_err(), "{bad}");
        }
        let small = resnet(512, 7, 1);
        assert!(DirectConfig::space(&info, &small)
            .iter()
            .all(|c| c.block().1 <= 8 || c.threads_x as usize == c.block().1));
    }
}
