//! The dense convolution as an implicit GEMM on cooperative matrices
//! (kernels/vulkan/dense_coopmat.comp; `VK_KHR_cooperative_matrix`, 16 x 16 x 16 f16
//! products accumulated in f32 by a subgroup). NHWC / NDHWC f16, groups = 1, input and
//! output channels multiples of 8; any kernel, stride, dilation and padding. The weights
//! are packed once on the host as the GEMM's B ([tap][Cin_pad][Cout_pad8], f16, zeros in
//! the padding), outside the timing. Its config ([`CoopmatConfig`]): subgroups along M and
//! N a workgroup and 16 x 16 accumulator tiles a subgroup along M and N, as
//! specialization constants; the workgroup's size is the subgroups times the device's
//! subgroup size (read, not chosen).

use super::device::VulkanDevice;
use super::VulkanDeviceInfo;
use super::VulkanRun;
use crate::dense::DenseConvSpec;
use crate::error::{Error, Result};
use crate::spec::{DType, Layout};
use crate::tensor::{HostTensor, TensorData};

pub const SOURCE: &str = include_str!("../../kernels/vulkan/dense_coopmat.comp");

/// The cooperative-matrix shape the shader multiplies with (`VulkanDeviceInfo`'s form).
pub const SHAPE: &str = "16x16x16 f16*f16+f32=f32 subgroup";

/// One config of the cooperative-matrix shader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct CoopmatConfig {
    /// Subgroups along M (output pixels) a workgroup.
    pub sg_m: u32,
    /// Subgroups along N (output channels) a workgroup.
    pub sg_n: u32,
    /// 16-row accumulator tiles a subgroup.
    pub tm: u32,
    /// 16-column accumulator tiles a subgroup.
    pub tn: u32,
    /// K a step (input channels of one tap; Cin is padded to a multiple): 32 or 64.
    pub bk: u32,
    /// Steps loaded ahead of the one multiplied: 1, or 2 (a second register set, so each
    /// load has two steps' multiplies to arrive in). Tune caches written before the field
    /// read as 1 (what the shader then did).
    #[serde(default = "one")]
    pub ahead: u32,
}

const SG: [u32; 3] = [1, 2, 4];
const TILES: [u32; 3] = [1, 2, 4];
const BKS: [u32; 2] = [32, 64];
const AHEADS: [u32; 2] = [1, 2];

fn one() -> u32 {
    1
}

impl CoopmatConfig {
    /// The variant name configs are forced, tuned and cached under.
    pub const NAME: &'static str = "dense_coopmat";
    /// The fields, in `values` order.
    pub const NAMES: [&'static str; 6] = ["sg_m", "sg_n", "tm", "tn", "bk", "ahead"];

    pub fn values(&self) -> [u32; 6] {
        [self.sg_m, self.sg_n, self.tm, self.tn, self.bk, self.ahead]
    }

    /// The config of `values` (in `NAMES` order; unchecked: `fits` and `family` judge it).
    fn from_values([sg_m, sg_n, tm, tn, bk, ahead]: [u32; 6]) -> Self {
        CoopmatConfig {
            sg_m,
            sg_n,
            tm,
            tn,
            bk,
            ahead,
        }
    }

    /// Output pixels and channels a workgroup computes.
    pub fn block(&self) -> (usize, usize) {
        (
            (self.sg_m * self.tm * 16) as usize,
            (self.sg_n * self.tn * 16) as usize,
        )
    }

    /// Invocations a workgroup on a device with `subgroup` invocations a subgroup.
    pub fn invocations(&self, subgroup: u32) -> u32 {
        self.sg_m * self.sg_n * subgroup
    }

    /// Shared memory a workgroup needs (the shader's SMEM of 16-byte pieces): two stages
    /// of A and B tiles, or the epilogue's staging where that is larger.
    pub fn shared_bytes(&self) -> usize {
        let (bm, bn) = self.block();
        let bk = self.bk as usize;
        let stage = bm * (bk / 8 + 1) + bk * (bn / 8 + 1);
        16 * (2 * stage).max(bm * (bn / 8 + 1))
    }

    /// Why the shader cannot run `spec` on a device with `info`, whatever the config.
    pub fn applies(
        info: &VulkanDeviceInfo,
        spec: &DenseConvSpec,
    ) -> std::result::Result<(), String> {
        if !info.coopmat_f16 {
            return Err(format!(
                "{} has no {SHAPE} cooperative matrix with the features the shader needs \
                 (cooperativeMatrix, vulkanMemoryModel, shaderFloat16)",
                info.name
            ));
        }
        gemm_applies(spec)
    }

    /// Why this config cannot run `spec` on a device with `info`, if it cannot.
    pub fn fits(
        &self,
        info: &VulkanDeviceInfo,
        spec: &DenseConvSpec,
    ) -> std::result::Result<(), String> {
        Self::applies(info, spec)?;
        let threads = self.invocations(info.subgroup_size) as usize;
        if threads > info.max_workgroup_invocations as usize || threads > 256 {
            return Err(format!(
                "{threads} invocations a workgroup (at most 256 and the device's {})",
                info.max_workgroup_invocations
            ));
        }
        let (bm, bn) = self.block();
        let bk = self.bk as usize;
        if !BKS.contains(&self.bk) {
            return Err(format!("bk {bk} (32 or 64)"));
        }
        if !AHEADS.contains(&self.ahead) {
            return Err(format!("ahead {} (1 or 2)", self.ahead));
        }
        // Every invocation loads whole pieces of both tiles a step.
        if !(bm * bk / 8).is_multiple_of(threads) || !(bk * bn / 8).is_multiple_of(threads) {
            return Err(format!(
                "{threads} invocations do not split a {bm} x {bk} and a {bk} x {bn} tile \
                 into whole 16-byte pieces each"
            ));
        }
        if self.tm * self.tn > 8 {
            return Err(format!(
                "{} accumulator tiles a subgroup (at most 8: registers)",
                self.tm * self.tn
            ));
        }
        let bytes = self.shared_bytes();
        if bytes > info.max_shared_bytes as usize {
            return Err(format!(
                "{bytes} bytes of shared memory, more than the device's {}",
                info.max_shared_bytes
            ));
        }
        if bn > spec.out_channels().next_power_of_two().max(16) {
            return Err(format!(
                "{bn} output channels a tile, the spec has {}",
                spec.out_channels()
            ));
        }
        Ok(())
    }

    /// Every config of the family.
    pub fn family() -> Vec<CoopmatConfig> {
        super::combinations([&SG, &SG, &TILES, &TILES, &BKS, &AHEADS])
            .into_iter()
            .map(Self::from_values)
            .collect()
    }

    /// Every config that fits `spec` on the device.
    pub fn space(info: &VulkanDeviceInfo, spec: &DenseConvSpec) -> Vec<CoopmatConfig> {
        Self::family()
            .into_iter()
            .filter(|c| c.fits(info, spec).is_ok())
            .collect()
    }

    /// The default: 2 x 2 subgroups of 2 x 2 tiles, K steps of 32, one step ahead (64 x
    /// 64 outputs a workgroup of 128 invocations on a subgroup of 32), or the fitting
    /// config nearest to it. By run 150's searches (one timing a config) on ResNet-50's
    /// five 3x3 layers: the best config on 56 x 56, within 1% of it on 28 x 28, 2% on
    /// 7 x 7, 7-9% on 14 x 14 and the strided layer, and 4-14% faster than the earlier
    /// default (2 x 4 subgroups of 2 x 1 tiles) on each.
    pub fn default_for(info: &VulkanDeviceInfo, spec: &DenseConvSpec) -> Result<CoopmatConfig> {
        Self::applies(info, spec).map_err(|reason| Error::NotApplicable {
            variant: "vulkan dense_coopmat".into(),
            spec: spec.to_string(),
            reason,
        })?;
        let want = CoopmatConfig {
            sg_m: 2,
            sg_n: 2,
            tm: 2,
            tn: 2,
            bk: 32,
            ahead: 1,
        };
        Self::space(info, spec)
            .into_iter()
            .min_by_key(|c| super::log2_distance(&c.values(), &want.values()))
            .ok_or_else(|| Error::NotApplicable {
                variant: "vulkan dense_coopmat".into(),
                spec: spec.to_string(),
                reason: format!(
                    "no config fits the device's {} bytes of shared memory and {} invocations",
                    info.max_shared_bytes, info.max_workgroup_invocations
                ),
            })
    }
}

config_text!(
    CoopmatConfig,
    "a dense_coopmat config",
    "sg_m, sg_n, tm, tn each 1, 2 or 4; bk 32 or 64; ahead 1 or 2",
    |v: [u32; 6]| Some(CoopmatConfig::from_values(v))
        .filter(|c| CoopmatConfig::family().contains(c))
);

/// The weights `[Cout][Cin][kd][kh][kw]` as the GEMM's B: `[tap][Cin_pad][Cout_pad8]` f16
/// (Cin_pad = Cin rounded up to the K step `bk`, Cout_pad8 to 8), zeros in the padding.
pub fn pack_weights(spec: &DenseConvSpec, w: &HostTensor, bk: usize) -> Result<HostTensor> {
    w.expect("weight", spec.dtype(), spec.weight_len())?;
    let [kd, kh, kw] = spec.geometry().kernel3();
    let (cin, cout) = (spec.in_channels(), spec.out_channels());
    let (cin_pad, cout_pad) = (cin.next_multiple_of(bk), cout.next_multiple_of(8));
    let mut b = vec![half::f16::ZERO; kd * kh * kw * cin_pad * cout_pad];
    for (tap, chunk) in b.chunks_mut(cin_pad * cout_pad).enumerate() {
        let (d, h, x) = (tap / (kh * kw), (tap / kw) % kh, tap % kw);
        for ci in 0..cin {
            for co in 0..cout {
                chunk[ci * cout_pad + co] =
                    half::f16::from_f64(w.get_f64(spec.weight_index(co, ci, d, h, x)));
            }
        }
    }
    HostTensor::from_data(&[b.len()], TensorData::F16(b))
}

/// Why the implicit GEMM of the cooperative-matrix shaders (`dense_coopmat`,
/// `dense_coopmat2`) cannot take `spec`, whatever the device: dense, f16 channels-last,
/// channels multiples of 8 (16-byte rows).
pub(crate) fn gemm_applies(spec: &DenseConvSpec) -> std::result::Result<(), String> {
    if spec.groups() != 1 {
        return Err(format!(
            "dense convolution only (groups = 1; this spec has {})",
            spec.groups()
        ));
    }
    if spec.dtype() != DType::F16 || spec.layout() != Layout::ChannelsLast {
        return Err(format!(
            "f16 channels-last only (this spec is {} {:?})",
            spec.dtype(),
            spec.layout()
        ));
    }
    if !spec.in_channels().is_multiple_of(8) || !spec.out_channels().is_multiple_of(8) {
        return Err(format!(
            "input and output channels multiples of 8 (16-byte rows; {} and {})",
            spec.in_channels(),
            spec.out_channels()
        ));
    }
    Ok(())
}

/// What the cooperative-matrix shaders' implicit GEMM takes on `spec` at K steps of `bk`
/// with `tiles_n` tiles along N and `groups` workgroups: the packed weights (B) and the
/// push constants (`gemm_push`).
pub(crate) fn gemm_operands(
    shader: &str,
    spec: &DenseConvSpec,
    w: &HostTensor,
    bk: usize,
    tiles_n: usize,
    groups: usize,
) -> Result<(HostTensor, Vec<u8>)> {
    let packed = pack_weights(spec, w, bk)?;
    super::i32_of(shader, "packed weight length", packed.len())?;
    Ok((packed, gemm_push(shader, spec, bk, tiles_n, groups)?))
}

/// The implicit GEMM's push constants on `spec` at K steps of `bk` with `tiles_n` tiles
/// along N and `groups` workgroups: `dense_push_fields`, then M, the N tiles, K steps a
/// tap, the workgroups and B's row length, each size checked to fit the shaders' 32-bit
/// ints.
pub(crate) fn gemm_push(
    shader: &str,
    spec: &DenseConvSpec,
    bk: usize,
    tiles_n: usize,
    groups: usize,
) -> Result<Vec<u8>> {
    let i32_of = |what: &str, v: usize| super::i32_of(shader, what, v);
    i32_of("input length", spec.input_len())?;
    i32_of("output length", spec.output_len())?;
    let m_total = spec.n() * spec.geometry().output3().iter().product::<usize>();
    let mut ints = super::dense_push_fields(shader, spec)?;
    for v in [
        m_total,
        tiles_n,
        spec.in_channels().div_ceil(bk),
        groups,
        spec.out_channels().next_multiple_of(8),
    ] {
        ints.push(i32_of("a size", v)?);
    }
    Ok(super::push_bytes(&ints))
}

/// The shader with `config` (None: the device's default) prepared on device-local
/// copies of `x` and the packed `w`, to launch and time.
pub fn prepare_dense_coopmat<'d>(
    dev: &'d VulkanDevice,
    spec: &DenseConvSpec,
    x: &HostTensor,
    w: &HostTensor,
    config: Option<CoopmatConfig>,
) -> Result<VulkanRun<'d>> {
    let info = dev.info();
    x.expect("input", spec.dtype(), spec.input_len())?;
    let config = super::resolve_config(
        "vulkan dense_coopmat",
        spec,
        config,
        || CoopmatConfig::default_for(info, spec),
        |c| c.fits(info, spec),
    )?;
    let bk = config.bk as usize;
    let g = spec.geometry();
    let m_total = spec.n() * g.output3().iter().product::<usize>();
    let (bm, bn) = config.block();
    let tiles_n = spec.out_channels().div_ceil(bn);
    let groups = m_total.div_ceil(bm) * tiles_n;
    let grid = super::grid_for(info, groups)?;
    let (packed, push) = gemm_operands("dense_coopmat", spec, w, bk, tiles_n, groups)?;
    let [kd, kh, kw] = g.kernel3();
    let constants = super::spec_constants(&[
        config.invocations(info.subgroup_size) as usize,
        config.sg_m as usize,
        config.sg_n as usize,
        config.tm as usize,
        config.tn as usize,
        config.invocations(info.subgroup_size) as usize,
        kd,
        kh,
        kw,
        g.stride3()[1],
        g.stride3()[2],
        g.dilation3()[1],
        g.dilation3()[2],
        config.shared_bytes() / 16,
        bk,
        config.ahead as usize,
    ]);
    let y = HostTensor::zeros(spec.dtype(), &spec.output_shape());
    VulkanRun::new(
        dev,
        "dense_coopmat",
        SOURCE,
        &constants,
        &push,
        grid,
        x,
        &packed,
        y,
        None,
    )
    .map(|r| r.with_config(&config))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::spec::ConvParams;

    fn h100_like() -> VulkanDeviceInfo {
        let mut i = crate::vulkan::device::lavapipe_like();
        i.subgroup_size = 32;
        i.max_shared_bytes = 48 * 1024;
        i.coopmat_f16 = true;
        i.cooperative_matrix = vec![SHAPE.into()];
        i
    }

    /// A 2 x 9 x 9 3x3 channels-last spec with `c` -> `cout` channels in `groups`.
    pub(crate) fn spec(c: i64, cout: i64, groups: i64, dtype: DType) -> DenseConvSpec {
        let p = ConvParams {
            n: 2,
            c,
            input: vec![9, 9],
            kernel: vec![3, 3],
            stride: vec![1, 1],
            dilation: vec![1, 1],
            padding: vec![[1, 1], [1, 1]],
            layout: Layout::ChannelsLast,
            dtype,
        };
        DenseConvSpec::from_params(&p, cout, groups).unwrap()
    }

    #[test]
    fn the_shader_compiles_to_spirv() {
        let words = super::super::shader::compile_compute("dense_coopmat", SOURCE).unwrap();
        assert_eq!(words[0], super::super::shader::SPIRV_MAGIC);
    }

    #[test]
    fn the_space_is_pruned_by_the_device_and_the_spec() {
        let info = h100_like();
        let s = spec(64, 64, 1, DType::F16);
        let space = CoopmatConfig::space(&info, &s);
        assert!(space.len() >= 8, "{space:?}");
        assert!(space
            .iter()
            .all(|c| c.shared_bytes() <= 48 * 1024 && c.block().1 <= 64));
        // K steps of 64 where two stages still fit 48 KiB: 64 x 64 tiles yes, 128 x 64 no.
        assert!(space.iter().any(|c| c.bk == 64 && c.block() == (64, 64)));
        assert!(!space.iter().any(|c| c.bk == 64 && c.block() == (128, 64)));
        let d = CoopmatConfig::default_for(&info, &s).unwrap();
        assert_eq!((d.block(), d.bk), ((64, 64), 32));
        assert_eq!(d.to_string().parse::<CoopmatConfig>().unwrap(), d);
        for bad in [
            "dense_coopmat:sg_m=2",
            "dense_coopmat:sg_m=3,sg_n=2,tm=4,tn=2,bk=32,ahead=1",
            "dense_coopmat:sg_m=2,sg_n=2,tm=4,tn=2,bk=48,ahead=1",
            "dense_coopmat:sg_m=2,sg_n=2,tm=4,tn=2,bk=32,ahead=3",
            "dense_coopmat:sg_m=2,sg_n=2,tm=4,tn=2,bk=32",
            "dense_direct:sg_m=2,sg_n=2,tm=4,tn=2,bk=32",
        ] {
            assert!(bad.parse::<CoopmatConfig>().is_err(), "{bad}");
        }
        // Refusals say why: lavapipe has no cooperative matrices; grouped, f32, odd
        // channel counts are not this shader's.
        let lavapipe = crate::vulkan::device::lavapipe_like();
        let e = CoopmatConfig::default_for(&lavapipe, &s)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cooperative matrix"), "{e}");
        for (s, says) in [
            (spec(64, 64, 2, DType::F16), "groups = 1"),
            (spec(64, 64, 1, DType::F32), "f16"),
            (spec(12, 64, 1, DType::F16), "multiples of 8"),
        ] {
            let e = CoopmatConfig::applies(&info, &s).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }

    #[test]
    fn packed_weights_are_the_gemm_b_with_zero_padding() {
        let s = spec(8, 24, 1, DType::F16);
        let w = HostTensor::random_normal(DType::F16, &[s.weight_len()], 3);
        for bk in [32, 64] {
            check_packed(&s, &w, bk);
        }
    }

    fn check_packed(s: &DenseConvSpec, w: &HostTensor, bk: usize) {
        let b = pack_weights(s, w, bk).unwrap();
        let (cin_pad, cout_pad) = (bk, 24);
        assert_eq!(b.len(), 9 * cin_pad * cout_pad);
        for tap in 0..9 {
            for ci in 0..cin_pad {
                for co in 0..cout_pad {
                    let got = b.get_f64((tap * cin_pad + ci) * cout_pad + co);
                    let want = if ci < 8 {
                        w.get_f64(s.weight_index(co, ci, 0, tap / 3, tap % 3))
                    } else {
                        0.0
                    };
                    assert_eq!(got, want, "tap {tap} ci {ci} co {co}");
                }
            }
        }
    }
}
