//! Winograd F(2x2, 3x3) on Vulkan (kernels/vulkan/dense_winograd.comp) for dense and
//! grouped convolution with 3 x 3 kernels (1 x 3 x 3 in 3-D), stride 1 and dilation 1 in
//! H and W: 16 multiply-adds per 2 x 2 outputs and input channel where the direct form
//! takes 36. The weights are transformed once on the host (`U = G g G^T`, f32). Its
//! config ([`WinogradConfig`]: output tiles a workgroup along W and H, output and input
//! channels a step) goes to the shader as specialization constants, pruned by the
//! device's shared memory and invocations.
//!
//! Non-finite inputs: a NaN reaches exactly the outputs whose window covers it, as in the
//! direct form; an infinity can come out as NaN where the direct form gives an infinity
//! (the transforms add and subtract it).

use super::device::VulkanDevice;
use super::{VulkanDeviceInfo, VulkanRun};
use crate::dense::DenseConvSpec;
use crate::error::{Error, Result};
use crate::tensor::{HostTensor, TensorData};

pub const SOURCE: &str = include_str!("../../kernels/vulkan/dense_winograd.comp");

/// One config of the Winograd shader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct WinogradConfig {
    /// 2 x 2 output tiles a workgroup along W (one an invocation).
    pub tiles_x: u32,
    /// Tiles along H.
    pub tiles_y: u32,
    /// Output channels a workgroup (16 accumulators each an invocation).
    pub ko_tile: u32,
    /// Input channels staged in shared memory a step.
    pub ci_tile: u32,
}

const TILES_X: [u32; 3] = [4, 8, 16];
const TILES_Y: [u32; 3] = [2, 4, 8];
const KO_TILES: [u32; 3] = [2, 4, 8];
const CI_TILES: [u32; 3] = [4, 8, 16];

impl WinogradConfig {
    pub const NAME: &'static str = "dense_winograd";
    pub const NAMES: [&'static str; 4] = ["tiles_x", "tiles_y", "ko_tile", "ci_tile"];

    pub fn values(&self) -> [u32; 4] {
        [self.tiles_x, self.tiles_y, self.ko_tile, self.ci_tile]
    }

    /// The config of `values` (in `NAMES` order; unchecked: `fits` and `family` judge it).
    fn from_values([tiles_x, tiles_y, ko_tile, ci_tile]: [u32; 4]) -> Self {
        WinogradConfig {
            tiles_x,
            tiles_y,
            ko_tile,
            ci_tile,
        }
    }

    pub fn invocations(&self) -> u32 {
        self.tiles_x * self.tiles_y
    }

    /// Shared memory a workgroup needs: the f32 patch and the step's transformed weights.
    pub fn shared_bytes(&self) -> usize {
        let (ph, pw) = (2 * self.tiles_y as usize + 2, 2 * self.tiles_x as usize + 2);
        4 * self.ci_tile as usize * (ph * pw + 16 * self.ko_tile as usize)
    }

    /// Why `spec` is not a Winograd F(2x2, 3x3) problem, if it is not.
    pub fn applies(spec: &DenseConvSpec) -> std::result::Result<(), String> {
        let g = spec.geometry();
        let [_, sh, sw] = g.stride3();
        let [_, dh, dw] = g.dilation3();
        if g.kernel3() != [1, 3, 3] || [sh, sw, dh, dw] != [1, 1, 1, 1] {
            return Err(format!(
                "Winograd F(2x2, 3x3) takes 3 x 3 kernels (1 x 3 x 3 in 3-D) with stride and \
                 dilation 1 in H and W; this spec has kernel {:?}, stride {:?}, dilation {:?}",
                g.kernel_dims(),
                [sh, sw],
                [dh, dw]
            ));
        }
        Ok(())
    }

    /// Why this config cannot run `spec` on a device with `info`'s limits, if it cannot.
    pub fn fits(
        &self,
        info: &VulkanDeviceInfo,
        spec: &DenseConvSpec,
    ) -> std::result::Result<(), String> {
        Self::applies(spec)?;
        let inv = self.invocations();
        if inv > info.max_workgroup_invocations || !(8..=256).contains(&inv) {
            return Err(format!(
                "{inv} invocations a workgroup: the family takes 8 to 256, and the device {}",
                info.max_workgroup_invocations
            ));
        }
        let bytes = self.shared_bytes();
        if bytes > info.max_shared_bytes as usize {
            return Err(format!(
                "{bytes} bytes of shared memory, more than the device's {}",
                info.max_shared_bytes
            ));
        }
        let [_, oh, ow] = spec.geometry().output3();
        let tiles = |o: usize| o.div_ceil(2).next_power_of_two();
        if self.tiles_x as usize > tiles(ow).max(4) || self.tiles_y as usize > tiles(oh).max(2) {
            return Err(format!(
                "{} x {} tiles of 2 x 2 for {oh} x {ow} outputs",
                self.tiles_y, self.tiles_x
            ));
        }
        if self.ko_tile as usize > spec.out_per_group().next_power_of_two().max(2) {
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
    pub fn family() -> Vec<WinogradConfig> {
        super::combinations([&TILES_X, &TILES_Y, &KO_TILES, &CI_TILES])
            .into_iter()
            .map(Self::from_values)
            .collect()
    }

    /// Every config that fits `spec` on the device (none where Winograd does not apply).
    pub fn space(info: &VulkanDeviceInfo, spec: &DenseConvSpec) -> Vec<WinogradConfig> {
        Self::family()
            .into_iter()
            .filter(|c| c.fits(info, spec).is_ok())
            .collect()
    }

    /// The default: 8 x 4 tiles (32 invocations), 4 output and 8 input channels a step;
    /// the nearest fitting config otherwise.
    pub fn default_for(info: &VulkanDeviceInfo, spec: &DenseConvSpec) -> Result<WinogradConfig> {
        let refused = |reason: String| Error::NotApplicable {
            variant: Self::NAME.into(),
            spec: spec.to_string(),
            reason,
        };
        Self::applies(spec).map_err(refused)?;
        let want = [8u32, 4, 4, 8];
        Self::space(info, spec)
            .into_iter()
            .min_by_key(|c| {
                let d = super::log2_distance(&c.values(), &want);
                (d, std::cmp::Reverse(c.invocations()))
            })
            .ok_or_else(|| {
                refused(format!(
                    "no config fits the device's {} bytes of shared memory",
                    info.max_shared_bytes
                ))
            })
    }
}

config_text!(
    WinogradConfig,
    "a dense_winograd config",
    format!(
        "a config of the family: tiles_x {TILES_X:?}, tiles_y {TILES_Y:?}, \
         ko_tile {KO_TILES:?}, ci_tile {CI_TILES:?}"
    ),
    |v: [u32; 4]| Some(WinogradConfig::from_values(v))
        .filter(|c| WinogradConfig::family().contains(c))
);

/// `U = G g G^T` for every (output, input) channel pair: `[co][ci/g][16]`, f32.
#[allow(clippy::needless_range_loop)] // the indices are the matrices' own
pub fn transform_weights(spec: &DenseConvSpec, w: &HostTensor) -> Result<Vec<f32>> {
    w.expect("weight", spec.dtype(), spec.weight_len())?;
    const G: [[f64; 3]; 4] = [
        [1.0, 0.0, 0.0],
        [0.5, 0.5, 0.5],
        [0.5, -0.5, 0.5],
        [0.0, 0.0, 1.0],
    ];
    let pairs = spec.out_channels() * spec.in_per_group();
    let mut u = vec![0f32; pairs * 16];
    for (pair, out) in u.chunks_mut(16).enumerate() {
        let (co, ci) = (pair / spec.in_per_group(), pair % spec.in_per_group());
        let g = |r: usize, c: usize| w.get_f64(spec.weight_index(co, ci, 0, r, c));
        for i in 0..4 {
            for j in 0..4 {
                let mut s = 0.0;
                for r in 0..3 {
                    for c in 0..3 {
                        s += G[i][r] * g(r, c) * G[j][c];
                    }
                }
                out[i * 4 + j] = s as f32;
            }
        }
    }
    Ok(u)
}

fn i32_of(what: &str, v: usize) -> Result<i32> {
    super::i32_of("dense_winograd", what, v)
}

/// The shader with `config` prepared on device-local copies of `x` and the transformed
/// weights, to launch and time (the transform is host work, outside every launch).
pub fn prepare_dense_winograd<'d>(
    dev: &'d VulkanDevice,
    spec: &DenseConvSpec,
    x: &HostTensor,
    w: &HostTensor,
    config: Option<WinogradConfig>,
) -> Result<VulkanRun<'d>> {
    let info = dev.info();
    let source = super::source_for("dense_winograd", SOURCE, spec.dtype(), info)?;
    x.expect("input", spec.dtype(), spec.input_len())?;
    let config = super::resolve_config(
        WinogradConfig::NAME,
        spec,
        config,
        || WinogradConfig::default_for(info, spec),
        |c| c.fits(info, spec),
    )?;
    let u = transform_weights(spec, w)?;
    let u = HostTensor::from_data(&[u.len()], TensorData::F32(u))?;
    i32_of("input length", spec.input_len())?;
    i32_of("transformed weight length", u.len())?;
    i32_of("output length", spec.output_len())?;
    let g = spec.geometry();
    let [od, oh, ow] = g.output3();
    let tiles_w = ow.div_ceil(2 * config.tiles_x as usize);
    let tiles_h = oh.div_ceil(2 * config.tiles_y as usize);
    let co_tiles = spec.out_per_group().div_ceil(config.ko_tile as usize);
    let groups = tiles_w * tiles_h * spec.groups() * co_tiles * od * spec.n();
    let grid = super::grid_for(info, groups)?;
    let mut ints = super::dense_push_fields("dense_winograd", spec)?;
    for v in [tiles_w, tiles_h, co_tiles] {
        ints.push(i32_of("a size", v)?);
    }
    // Workgroups past the last tile of a full grid row return at once (the shader checks).
    i32_of("workgroups", groups)?;
    let constants = super::spec_constants(
        &[
            config.invocations(),
            config.tiles_x,
            config.tiles_y,
            config.ko_tile,
            config.ci_tile,
        ]
        .map(|v| v as usize),
    );
    let y = HostTensor::zeros(spec.dtype(), &spec.output_shape());
    VulkanRun::new(
        dev,
        "dense_winograd",
        &source,
        &constants,
        &super::push_bytes(&ints),
        grid,
        x,
        &u,
        y,
        None,
    )
    .map(|r| r.with_config(&config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ConvParams, DType, Layout};

    fn info() -> VulkanDeviceInfo {
        crate::vulkan::device::lavapipe_like()
    }

    fn spec(kernel: i64, stride: i64) -> DenseConvSpec {
        let p = ConvParams {
            n: 2,
            c: 64,
            input: vec![28, 28],
            kernel: vec![kernel, kernel],
            stride: vec![stride, stride],
            dilation: vec![1, 1],
            padding: vec![[1, 1], [1, 1]],
            layout: Layout::ChannelsLast,
            dtype: DType::F16,
        };
        DenseConvSpec::from_params(&p, 64, 1).unwrap()
    }

    #[test]
    fn applies_to_3x3_stride_1_only_and_prunes_by_the_device() {
        let i = info();
        let s = spec(3, 1);
        let space = WinogradConfig::space(&i, &s);
        assert!(space.len() > 20, "{}", space.len());
        assert!(space.iter().all(|c| c.shared_bytes() <= 32 * 1024));
        let d = WinogradConfig::default_for(&i, &s).unwrap();
        assert_eq!(d.values(), [8, 4, 4, 8]);
        assert_eq!(d.to_string().parse::<WinogradConfig>().unwrap(), d);
        assert!("dense_winograd:tiles_x=8"
            .parse::<WinogradConfig>()
            .is_err());
        for bad in [spec(3, 2), spec(5, 1)] {
            assert!(WinogradConfig::space(&i, &bad).is_empty());
            let e = WinogradConfig::default_for(&i, &bad)
                .unwrap_err()
                .to_string();
            assert!(e.contains("3 x 3"), "{e}");
        }
    }

    /// The transform of a kernel with one non-zero tap: U's rows and columns are G's
    /// columns (e.g. the centre tap gives G[:,1] G[:,1]^T).
    #[test]
    fn the_weight_transform_is_g_g_gt() {
        let p = ConvParams {
            n: 1,
            c: 1,
            input: vec![4, 4],
            kernel: vec![3, 3],
            stride: vec![],
            dilation: vec![],
            padding: vec![],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        };
        let s = DenseConvSpec::from_params(&p, 1, 1).unwrap();
        let mut w = HostTensor::zeros(DType::F32, &s.weight_shape());
        w.set_f64(4, 2.0); // the centre
        let u = transform_weights(&s, &w).unwrap();
        let col = [0.0, 0.5, -0.5, 0.0];
        for i in 0..4 {
            for j in 0..4 {
                assert_eq!(u[i * 4 + j] as f64, 2.0 * col[i] * col[j], "{i} {j}");
            }
        }
    }
}
