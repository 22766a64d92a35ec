//! Winograd F(2x2, 3x3) on workgroup-scope cooperative matrices: three dispatches, timed
//! as one. The input transform (kernels/vulkan/winograd_transforms.comp) writes each 4 x
//! 4 input patch's `B^T d B` as 16 f16 matrices V[p] of tiles x Cin; `dense_coopmat2`'s
//! GEMM (with `B_BLOCK_ROWS`: a batch of 16 GEMMs, each against its own block of B)
//! multiplies them by the host-transformed weights U[p] = (G g G^T)[p] (Cin x Cout, f16)
//! into f16 products M[p]; the output transform adds them into the 2 x 2 outputs (`A^T M
//! A`). 16 multiply-adds per 2 x 2 outputs and input channel where the direct GEMM takes
//! 36 (ResNet-50's 7 x 7 layer, whose 2 x 2 tiles cover 8 x 8: 1.72x fewer), for the
//! intermediates' traffic (V and M, 16 x tiles x C halves each).
//!
//! Takes what both take: dense f16 NHWC / NDHWC, channels multiples of 8, 3 x 3 kernels (1
//! x 3 x 3 in 3-D), stride and dilation 1 in H and W, on a device with the workgroup-scope
//! matrices. Its config is the GEMM's ([`Coopmat2Config`]'s fields under this name), whose
//! rows are the tiles, rounded up to the config's `bm` a point (so no tile of the GEMM
//! spans two points).
//!
//! Precision: V, U and M are rounded to f16 (a simulation with random normal data, Cin
//! 256: rel-L2 5e-4 against the f64 oracle, the f16 gate 1e-3); the direct form rounds only
//! its outputs. Non-finite inputs: a NaN reaches the outputs of every tile whose patch holds
//! it (a neighbouring tile's too, where the direct form leaves it out); an infinity can
//! come out as NaN (the transforms subtract it from itself).

use super::dense_coopmat2::{Coopmat2Config, GemmStage};
use super::device::VulkanDevice;
use super::{ChainBuffer, ChainStage, VulkanDeviceInfo, VulkanRun};
use crate::dense::DenseConvSpec;
use crate::error::{Error, Result};
use crate::spec::{ConvParams, DType, Layout};
use crate::tensor::{HostTensor, TensorData};

pub const TRANSFORMS: &str = include_str!("../../kernels/vulkan/winograd_transforms.comp");

/// Both shaders' text: what a tuned config was tuned with (the tune cache's staleness).
pub const SOURCES: &str = concat!(
    include_str!("../../kernels/vulkan/winograd_transforms.comp"),
    include_str!("../../kernels/vulkan/dense_coopmat2.comp")
);

/// Points of the transformed 4 x 4 tile: GEMMs a launch.
const POINTS: usize = 16;

/// Invocations a workgroup of the transforms (one tile's 8 channels each).
const TRANSFORM_THREADS: u32 = 128;

/// One config: the GEMM's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct WinogradCoopmat2Config(pub Coopmat2Config);

impl WinogradCoopmat2Config {
    /// The variant name configs are forced, tuned and cached under.
    pub const NAME: &'static str = "dense_winograd_coopmat2";
    /// The fields, in `values` order (the GEMM's).
    pub const NAMES: [&'static str; 10] = Coopmat2Config::NAMES;

    pub fn values(&self) -> [u32; 10] {
        self.0.values()
    }

    /// Why the variant cannot run `spec` on a device with `info`, whatever the config.
    pub fn applies(
        info: &VulkanDeviceInfo,
        spec: &DenseConvSpec,
    ) -> std::result::Result<(), String> {
        super::dense_winograd::WinogradConfig::applies(spec)?;
        Coopmat2Config::applies(info, spec)
    }

    /// The batch of GEMMs as the 1 x 1 convolution `dense_coopmat2` runs: 16 x `rows`
    /// pixels of Cin channels in one row (each point's `rows`, its tiles rounded up to
    /// `bm`), Cout outputs.
    fn gemm_spec(spec: &DenseConvSpec, bm: u32) -> Result<DenseConvSpec> {
        let rows = tiles(spec).next_multiple_of(bm.max(1) as usize);
        let p = ConvParams {
            n: 1,
            c: spec.in_channels() as i64,
            input: vec![(POINTS * rows) as i64, 1],
            kernel: vec![1, 1],
            stride: vec![1, 1],
            dilation: vec![1, 1],
            padding: vec![[0, 0], [0, 0]],
            layout: Layout::ChannelsLast,
            dtype: DType::F16,
        };
        DenseConvSpec::from_params(&p, spec.out_channels() as i64, 1)
    }

    /// Why this config cannot run `spec` on a device with `info`, if it cannot.
    pub fn fits(
        &self,
        info: &VulkanDeviceInfo,
        spec: &DenseConvSpec,
    ) -> std::result::Result<(), String> {
        Self::applies(info, spec)?;
        let gemm = Self::gemm_spec(spec, self.0.bm).map_err(|e| e.to_string())?;
        self.0.fits(info, &gemm)
    }

    /// Every config of the family (the GEMM's).
    pub fn family() -> Vec<WinogradCoopmat2Config> {
        Coopmat2Config::family().into_iter().map(Self).collect()
    }

    /// Every config that fits `spec` on the device.
    pub fn space(info: &VulkanDeviceInfo, spec: &DenseConvSpec) -> Vec<WinogradCoopmat2Config> {
        if Self::applies(info, spec).is_err() {
            return Vec::new();
        }
        Self::family()
            .into_iter()
            .filter(|c| c.fits(info, spec).is_ok())
            .collect()
    }

    /// The default: `dense_coopmat2`'s default for the batch of GEMMs at the tile height
    /// it picks (the rows rounded up to 32 first, then to its pick's height, and its
    /// default there where that keeps the height).
    pub fn default_for(
        info: &VulkanDeviceInfo,
        spec: &DenseConvSpec,
    ) -> Result<WinogradCoopmat2Config> {
        Self::applies(info, spec).map_err(|reason| Error::NotApplicable {
            variant: Self::NAME.into(),
            spec: spec.to_string(),
            reason,
        })?;
        let first = Coopmat2Config::default_for(info, &Self::gemm_spec(spec, 32)?)?;
        let again = Coopmat2Config::default_for(info, &Self::gemm_spec(spec, first.bm)?)?;
        let pick = if again.bm == first.bm { again } else { first };
        Ok(WinogradCoopmat2Config(pick))
    }
}

config_text!(
    WinogradCoopmat2Config,
    "a dense_winograd_coopmat2 config",
    "the fields and values of a dense_coopmat2 config (the GEMM's)",
    |v: [u32; 10]| Some(Coopmat2Config::from_values(v))
        .filter(|c| Coopmat2Config::family().contains(c))
        .map(WinogradCoopmat2Config)
);

/// The 2 x 2 output tiles of `spec`: n x output depth x ceil(oh / 2) x ceil(ow / 2).
fn tiles(spec: &DenseConvSpec) -> usize {
    let [od, oh, ow] = spec.geometry().output3();
    spec.n() * od * oh.div_ceil(2) * ow.div_ceil(2)
}

/// The transformed weights as the GEMM's B: point p's block `[Cin_pad][Cout_pad8]` f16
/// (`dense_coopmat`'s packing of a 1 x 1 kernel), the 16 blocks one after another.
fn pack_transformed(spec: &DenseConvSpec, w: &HostTensor, bk: usize) -> Result<HostTensor> {
    let u = super::dense_winograd::transform_weights(spec, w)?;
    let (cin, cout) = (spec.in_channels(), spec.out_channels());
    let (cin_pad, cout_pad) = (cin.next_multiple_of(bk), cout.next_multiple_of(8));
    let block = cin_pad * cout_pad;
    let mut b = vec![half::f16::ZERO; POINTS * block];
    for co in 0..cout {
        for ci in 0..cin {
            let at = (co * cin + ci) * POINTS;
            for (p, &v) in u[at..at + POINTS].iter().enumerate() {
                b[p * block + ci * cout_pad + co] = half::f16::from_f32(v);
            }
        }
    }
    HostTensor::from_data(&[b.len()], TensorData::F16(b))
}

/// The transforms' push constants (the shader's order): channels / 8, the input's and
/// output's D H W, depth stride and padding before (D H W), tiles along H and W, the
/// tiles, the GEMM's rows a point.
fn transform_push(spec: &DenseConvSpec, channels: usize, rows: usize) -> Result<Vec<u8>> {
    let g = spec.geometry();
    let [_, oh, ow] = g.output3();
    let mut v = vec![channels / 8];
    v.extend(g.input3());
    v.extend(g.output3());
    v.push(g.stride3()[0]);
    v.extend(g.pad_before3());
    v.extend([oh.div_ceil(2), ow.div_ceil(2), tiles(spec), rows]);
    let ints = v
        .into_iter()
        .map(|x| super::i32_of(WinogradCoopmat2Config::NAME, "a size", x))
        .collect::<Result<Vec<i32>>>()?;
    Ok(super::push_bytes(&ints))
}

/// Which of the two transforms a stage runs.
#[derive(Clone, Copy)]
enum Transform {
    /// The input's patches to V (Cin channels, every row of the GEMM's).
    Input,
    /// M to the outputs (Cout channels, the tiles).
    Output,
}

/// The transform's stage on `spec` with the GEMM's `rows` a point: one invocation a row's
/// (or tile's) 8 channels, bound to `bindings` (what it reads, what it writes).
fn transform_stage(
    info: &VulkanDeviceInfo,
    spec: &DenseConvSpec,
    which: Transform,
    rows: usize,
    bindings: [ChainBuffer; 2],
) -> Result<ChainStage<'static>> {
    let threads = TRANSFORM_THREADS.min(info.max_workgroup_invocations) as usize;
    let (name, source, channels, items) = match which {
        Transform::Input => {
            let cin = spec.in_channels();
            (
                "winograd_input_transform",
                TRANSFORMS.to_string(),
                cin,
                rows * cin / 8,
            )
        }
        Transform::Output => {
            let cout = spec.out_channels();
            (
                "winograd_output_transform",
                super::shader::with_defines(TRANSFORMS, &[("OUTPUT_TRANSFORM", 1)]),
                cout,
                tiles(spec) * cout / 8,
            )
        }
    };
    Ok(ChainStage {
        name,
        source,
        constants: super::spec_constants(&[threads]),
        push: transform_push(spec, channels, rows)?,
        grid: super::grid_for(info, items.div_ceil(threads))?,
        bindings: bindings.to_vec(),
    })
}

/// The three dispatches with `config` (None: the device's default) prepared on
/// device-local copies of `x` and the transformed, packed `w` (host work, outside every
/// launch), with V and M as intermediate buffers.
pub fn prepare_dense_winograd_coopmat2<'d>(
    dev: &'d VulkanDevice,
    spec: &DenseConvSpec,
    x: &HostTensor,
    w: &HostTensor,
    config: Option<WinogradCoopmat2Config>,
) -> Result<VulkanRun<'d>> {
    let info = dev.info();
    x.expect("input", spec.dtype(), spec.input_len())?;
    let config = super::resolve_config(
        WinogradCoopmat2Config::NAME,
        spec,
        config,
        || WinogradCoopmat2Config::default_for(info, spec),
        |c| c.fits(info, spec),
    )?;
    let c = config.0;
    let rows = tiles(spec).next_multiple_of(c.bm as usize);
    let gemm_spec = WinogradCoopmat2Config::gemm_spec(spec, c.bm)?;
    let gemm = GemmStage::new(info, &gemm_spec, &c, &[("B_BLOCK_ROWS", rows)])?;
    let packed = pack_transformed(spec, w, c.bk as usize)?;
    super::i32_of(
        WinogradCoopmat2Config::NAME,
        "packed weight length",
        packed.len(),
    )?;
    let (cin, cout) = (spec.in_channels(), spec.out_channels());
    let input = transform_stage(
        info,
        spec,
        Transform::Input,
        rows,
        [ChainBuffer::Input, ChainBuffer::Intermediate(0)],
    )?;
    let output = transform_stage(
        info,
        spec,
        Transform::Output,
        rows,
        [ChainBuffer::Intermediate(1), ChainBuffer::Output],
    )?;
    let stages = vec![
        input,
        ChainStage {
            name: "dense_coopmat2",
            source: gemm.source,
            constants: gemm.constants,
            push: gemm.push,
            grid: gemm.grid,
            bindings: vec![
                ChainBuffer::Intermediate(0),
                ChainBuffer::Weight,
                ChainBuffer::Intermediate(1),
                ChainBuffer::Intermediate(2),
            ],
        },
        output,
    ];
    let intermediates = [
        2 * POINTS * rows * cin,
        2 * POINTS * rows * cout,
        c.scratch_bytes(&gemm_spec),
    ];
    let y = HostTensor::zeros(spec.dtype(), &spec.output_shape());
    VulkanRun::chain(dev, x, &packed, y, &intermediates, stages).map(|r| r.with_config(&config))
}

/// The two transforms on `dev` with the 16 GEMMs between them on the host (f32 sums of
/// the f16 products, M rounded to f16 as the GEMM's epilogue rounds it): the transforms'
/// indexing (padding, ragged tiles, depth slices) checked on any device, lavapipe in CI
/// included, where the variant itself needs the workgroup-scope matrices. Not a kernel of
/// the ladder: a check.
pub fn transforms_with_host_gemm(
    dev: &VulkanDevice,
    spec: &DenseConvSpec,
    x: &HostTensor,
    w: &HostTensor,
) -> Result<HostTensor> {
    let refused = |reason: String| Error::NotApplicable {
        variant: "winograd transforms".into(),
        spec: spec.to_string(),
        reason,
    };
    super::dense_winograd::WinogradConfig::applies(spec).map_err(refused)?;
    super::dense_coopmat::gemm_applies(spec).map_err(refused)?;
    x.expect("input", spec.dtype(), spec.input_len())?;
    let (cin, cout, tiles) = (spec.in_channels(), spec.out_channels(), tiles(spec));
    // Rows padded as a GEMM's tile height would pad them.
    let rows = tiles.next_multiple_of(32);
    let info = dev.info();
    let one_stage = |input: &HostTensor, out: HostTensor, which: Transform| {
        let bindings = [ChainBuffer::Input, ChainBuffer::Output];
        let stage = transform_stage(info, spec, which, rows, bindings)?;
        let unused = HostTensor::zeros(DType::F32, &[1]);
        let run = VulkanRun::chain(dev, input, &unused, out, &[], vec![stage])?;
        run.launch()?;
        run.output()
    };
    let v = HostTensor::zeros(DType::F16, &[POINTS * rows * cin]);
    let v = one_stage(x, v, Transform::Input)?;
    // The GEMM's B as the variant packs it (Cin a multiple of 8: no K padding at bk 8).
    let u = pack_transformed(spec, w, 8)?;
    let cout_pad = cout.next_multiple_of(8);
    let mut m = vec![half::f16::ZERO; POINTS * rows * cout];
    for p in 0..POINTS {
        for t in 0..tiles {
            for co in 0..cout {
                let mut acc = 0f32;
                for ci in 0..cin {
                    let a = v.get_f64((p * rows + t) * cin + ci) as f32;
                    let b = u.get_f64((p * cin + ci) * cout_pad + co) as f32;
                    acc += a * b;
                }
                m[(p * rows + t) * cout + co] = half::f16::from_f32(acc);
            }
        }
    }
    let m = HostTensor::from_data(&[m.len()], TensorData::F16(m))?;
    let y = HostTensor::zeros(spec.dtype(), &spec.output_shape());
    one_stage(&m, y, Transform::Output)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(n: i64, c: i64, hw: [i64; 2], kernel: [i64; 2], stride: i64) -> DenseConvSpec {
        let p = ConvParams {
            n,
            c,
            input: hw.to_vec(),
            kernel: kernel.to_vec(),
            stride: vec![stride; 2],
            dilation: vec![1, 1],
            padding: vec![[1, 1], [1, 0]],
            layout: Layout::ChannelsLast,
            dtype: DType::F16,
        };
        DenseConvSpec::from_params(&p, 64, 1).unwrap()
    }

    /// The batch of GEMMs: 16 points of the tiles rounded up to the tile height, Cin into
    /// Cout; the tiles cover odd outputs with a half tile.
    #[test]
    fn the_gemm_is_sixteen_points_of_the_tiles() {
        // 7 x 7 input, padding 1 both sides in H, 1 before in W: 7 x 6 outputs, 4 x 3 tiles.
        let s = spec(2, 32, [7, 7], [3, 3], 1);
        assert_eq!(tiles(&s), 2 * 4 * 3);
        let g = WinogradCoopmat2Config::gemm_spec(&s, 32).unwrap();
        assert_eq!(g.input_shape(), vec![1, 16 * 32, 1, 32]);
        assert_eq!(g.out_channels(), 64);
        assert_eq!(g.geometry().kernel3(), [1, 1, 1]);
    }

    /// Point p's block of B holds U[p] at [ci][co] (Cin padded to bk, Cout to 8).
    #[test]
    fn the_transformed_weights_are_packed_a_point_a_block() {
        let p = ConvParams {
            n: 1,
            c: 8,
            input: vec![4, 4],
            kernel: vec![3, 3],
            stride: vec![1, 1],
            dilation: vec![1, 1],
            padding: vec![[1, 1], [1, 1]],
            layout: Layout::ChannelsLast,
            dtype: DType::F16,
        };
        let s = DenseConvSpec::from_params(&p, 12, 1).unwrap();
        let w = HostTensor::random_normal(DType::F16, &s.weight_shape(), 3);
        let u = super::super::dense_winograd::transform_weights(&s, &w).unwrap();
        let b = pack_transformed(&s, &w, 16).unwrap();
        let (cin_pad, cout_pad) = (16, 16);
        assert_eq!(b.len(), 16 * cin_pad * cout_pad);
        for (co, ci, pt) in [(0, 0, 0), (11, 7, 15), (5, 3, 9)] {
            let got = b.get_f64(pt * cin_pad * cout_pad + ci * cout_pad + co);
            let want = half::f16::from_f32(u[(co * 8 + ci) * 16 + pt]).to_f64();
            assert_eq!(got, want, "co {co} ci {ci} point {pt}");
        }
        // Padding (ci 8.., co 12..) is zero.
        assert_eq!(b.get_f64(9 * cout_pad), 0.0);
        assert_eq!(b.get_f64(13), 0.0);
    }

    /// Both transforms and the batched GEMM compile (glslang, here: no device needed).
    #[test]
    fn its_shaders_compile() {
        use crate::vulkan::shader::{compile_compute, with_defines};
        compile_compute("input", TRANSFORMS).unwrap();
        compile_compute(
            "output",
            &with_defines(TRANSFORMS, &[("OUTPUT_TRANSFORM", 1)]),
        )
        .unwrap();
        let gemm = with_defines(
            crate::vulkan::dense_coopmat2::SOURCE,
            &[("B_BLOCK_ROWS", 512), ("FRAGS_AHEAD", 1), ("PERSISTENT", 1)],
        );
        compile_compute("gemm", &gemm).unwrap();
    }

    /// It takes what Winograd and the workgroup-scope GEMM both take, and says why not.
    #[test]
    fn it_applies_to_three_by_three_stride_one_with_the_matrices() {
        let lavapipe = crate::vulkan::device::lavapipe_like();
        let e = WinogradCoopmat2Config::applies(&lavapipe, &spec(1, 32, [8, 8], [3, 3], 1));
        assert!(e.unwrap_err().contains("cooperative"));
        let mut nv = lavapipe.clone();
        nv.workgroup_matrices = Some(crate::vulkan::WorkgroupMatrices {
            shapes: vec![crate::vulkan::WorkgroupShape {
                invocations: 256,
                m: 32,
                n: 32,
                k: 16,
            }],
            max_dimension: 1024,
            reserved_shared_bytes: 8192,
        });
        nv.max_shared_bytes = 48 * 1024;
        nv.compute_units = Some(132);
        let ok = spec(2, 32, [14, 14], [3, 3], 1);
        assert!(WinogradCoopmat2Config::applies(&nv, &ok).is_ok());
        let d = WinogradCoopmat2Config::default_for(&nv, &ok).unwrap();
        assert!(d.fits(&nv, &ok).is_ok(), "{d}");
        assert!(!WinogradCoopmat2Config::space(&nv, &ok).is_empty());
        for bad in [
            spec(1, 32, [8, 8], [3, 3], 2),
            spec(1, 32, [8, 8], [5, 5], 1),
        ] {
            assert!(WinogradCoopmat2Config::applies(&nv, &bad).is_err());
            assert!(WinogradCoopmat2Config::space(&nv, &bad).is_empty());
        }
        // The text is the GEMM's fields under this name, and parses back.
        let text = d.to_string();
        assert!(text.starts_with("dense_winograd_coopmat2:bm="), "{text}");
        assert_eq!(text.parse::<WinogradCoopmat2Config>().unwrap(), d);
        assert!("dense_coopmat2:bm=128"
            .parse::<WinogradCoopmat2Config>()
            .is_err());
    }
}
