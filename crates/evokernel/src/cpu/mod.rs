//! The CPU backend: f32-accumulating depthwise convolution, parallel with rayon and
//! vectorized for the widest SIMD the CPU has (AVX-512, AVX2+FMA, else portable).
//!
//! Channels-first: each (n, c) plane is widened once into a zero-padded f32 buffer, so
//! the hot loop has no bounds logic; a block of up to 8 SIMD vectors of outputs along W
//! stays in registers while every tap adds `w * shifted input row` to it.
//! Channels-last: for each output position, blocks of channels accumulate over the
//! in-bounds taps, reading the input in its own dtype (widening is a shift or a select).

use rayon::prelude::*;

mod backward;
pub use backward::{bias_grad_cpu, dgrad_cpu, flip_kernel, wgrad_cpu, wgrad_cpu_with};

use crate::bench::Ceilings;
use crate::epilogue::{Activation, Epilogue};
use crate::error::{Error, Result};
use crate::spec::{ConvSpec, DType, Layout};
use crate::tensor::{Element, HostTensor, TensorData};

/// The instruction set the hot loops were compiled for on this call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    Avx512,
    Avx2,
    Portable,
}

impl Isa {
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Portable => "portable",
        }
    }

    /// Whether this CPU can run code compiled for `self`.
    pub fn supported(self) -> bool {
        matches!(
            (self, Isa::detect()),
            (Isa::Portable, _) | (Isa::Avx2, Isa::Avx2 | Isa::Avx512) | (Isa::Avx512, Isa::Avx512)
        )
    }

    /// `Err` naming the ISA to use instead where this CPU cannot run `self`'s code.
    pub fn check(self) -> Result<()> {
        if self.supported() {
            return Ok(());
        }
        Err(Error::BackendUnavailable {
            backend: format!("cpu-{}", self.name()),
            reason: format!(
                "this CPU lacks {}; use cpu-{}",
                self.name(),
                Isa::detect().name()
            ),
        })
    }

    /// f32 lanes per SIMD register.
    fn lanes(self) -> usize {
        match self {
            Isa::Avx512 => 16,
            Isa::Avx2 | Isa::Portable => 8,
        }
    }
}

/// Runs the depthwise convolution of `spec` on the CPU, writing every element of `output`.
pub fn conv_cpu(
    spec: &ConvSpec,
    input: &HostTensor,
    weight: &HostTensor,
    output: &mut HostTensor,
) -> Result<()> {
    conv_cpu_with(
        Isa::detect(),
        spec,
        &FusedEpilogue::none(),
        input,
        weight,
        output,
    )
}

/// As [`conv_cpu`], with a fused epilogue (bias, activation, residual) applied to each
/// output row in f32 before it is rounded.
pub fn conv_cpu_fused(
    spec: &ConvSpec,
    epilogue: &FusedEpilogue,
    input: &HostTensor,
    weight: &HostTensor,
    output: &mut HostTensor,
) -> Result<()> {
    conv_cpu_with(Isa::detect(), spec, epilogue, input, weight, output)
}

/// An epilogue with its operands, widened to f32 once for the CPU's row loops.
#[derive(Clone, Debug, Default)]
pub struct FusedEpilogue {
    activation: Activation,
    bias: Option<Vec<f32>>,
    residual: Option<Vec<f32>>,
}

impl FusedEpilogue {
    pub fn none() -> Self {
        FusedEpilogue::default()
    }

    /// Checks the operands against what `epilogue` needs for `spec` and widens them.
    pub fn new(
        spec: &ConvSpec,
        epilogue: &Epilogue,
        bias: Option<&HostTensor>,
        residual: Option<&HostTensor>,
    ) -> Result<Self> {
        let bias =
            crate::epilogue::check_operand("bias", epilogue.bias, bias, spec.dtype(), spec.c())?;
        let residual = crate::epilogue::check_operand(
            "residual",
            epilogue.residual,
            residual,
            spec.dtype(),
            spec.output_len(),
        )?;
        let widen = |t: &HostTensor| (0..t.len()).map(|i| t.get_f64(i) as f32).collect();
        Ok(FusedEpilogue {
            activation: epilogue.activation,
            bias: bias.map(widen),
            residual: residual.map(widen),
        })
    }

    fn is_none(&self) -> bool {
        self.activation == Activation::None && self.bias.is_none() && self.residual.is_none()
    }

    /// A channels-first row: every output of channel `c`, the first at flat index `at`.
    fn apply_row(&self, row: &mut [f32], c: usize, at: usize) {
        if self.is_none() {
            return;
        }
        let b = self.bias.as_ref().map_or(0.0, |b| b[c]);
        let act = self.activation;
        match &self.residual {
            Some(r) => {
                let n = row.len();
                for (v, r) in row.iter_mut().zip(&r[at..at + n]) {
                    *v = act.apply_f32(*v + b) + r;
                }
            }
            None => row.iter_mut().for_each(|v| *v = act.apply_f32(*v + b)),
        }
    }

    /// A channels-last pixel: channels 0.. of one position, the first at flat index `at`.
    fn apply_pixel(&self, px: &mut [f32], at: usize) {
        if self.is_none() {
            return;
        }
        let act = self.activation;
        for (ch, v) in px.iter_mut().enumerate() {
            let b = self.bias.as_ref().map_or(0.0, |b| b[ch]);
            let r = self.residual.as_ref().map_or(0.0, |r| r[at + ch]);
            *v = act.apply_f32(*v + b) + r;
        }
    }
}

/// As [`conv_cpu`], with the hot loops of a chosen instruction set (for tests and
/// comparisons); an instruction set this CPU lacks is an error.
pub fn conv_cpu_with(
    isa: Isa,
    spec: &ConvSpec,
    epi: &FusedEpilogue,
    input: &HostTensor,
    weight: &HostTensor,
    output: &mut HostTensor,
) -> Result<()> {
    isa.check()?;
    input.expect("input", spec.dtype(), spec.input_len())?;
    weight.expect("weight", spec.dtype(), spec.weight_len())?;
    output.expect("output", spec.dtype(), spec.output_len())?;
    let w: Vec<f32> = (0..weight.len())
        .map(|i| weight.get_f64(i) as f32)
        .collect();
    match (input.data(), output.data_mut()) {
        (TensorData::Bf16(x), TensorData::Bf16(y)) => run(spec, isa, epi, x, &w, y),
        (TensorData::F16(x), TensorData::F16(y)) => run(spec, isa, epi, x, &w, y),
        (TensorData::F32(x), TensorData::F32(y)) => run(spec, isa, epi, x, &w, y),
        _ => unreachable!("dtypes were checked against the spec above"),
    }
    Ok(())
}

fn run<T: Element>(
    spec: &ConvSpec,
    isa: Isa,
    epi: &FusedEpilogue,
    x: &[T],
    w: &[f32],
    y: &mut [T],
) {
    match spec.layout() {
        Layout::ChannelsFirst => channels_first(spec, isa, epi, x, w, y),
        Layout::ChannelsLast => channels_last::<T, true>(spec, isa, epi, x, w, y),
    }
}

// ---------------------------------------------------------------------------------------
// Channels-first

/// Geometry of one zero-padded f32 plane and the offsets of every tap in it.
struct PaddedPlane {
    /// Allocated sizes of the padded plane: depth, rows, row stride.
    dp: usize,
    hp: usize,
    ws: usize,
    /// Offset of tap (kd, kh, kw) from an output row's base, in tap order.
    taps: Vec<usize>,
}

impl PaddedPlane {
    fn new(spec: &ConvSpec, lanes: usize) -> Self {
        let [d, h, w] = spec.input3();
        let [kd, kh, kw] = spec.kernel3();
        let [dd, dh, dw] = spec.dilation3();
        let (pb, pa) = (spec.pad_before3(), spec.pad_after3());
        let ow = spec.output3()[2];
        let sw = spec.stride3()[2];
        // Output blocks are whole vectors, so the last block reads past the last output;
        // the row stride leaves room for that overshoot inside the (zero) padding.
        // With a stride the last block's extra lanes repeat its last output (block_strided).
        let ow_blocks = if sw == 1 {
            ow.div_ceil(lanes) * lanes
        } else {
            ow
        };
        let ws = (w + pb[2] + pa[2]).max((ow_blocks - 1) * sw + (kw - 1) * dw + 1);
        let (dp, hp) = (d + pb[0] + pa[0], h + pb[1] + pa[1]);
        let mut taps = Vec::with_capacity(spec.taps());
        for a in 0..kd {
            for b in 0..kh {
                for e in 0..kw {
                    taps.push((a * dd * hp + b * dh) * ws + e * dw);
                }
            }
        }
        PaddedPlane { dp, hp, ws, taps }
    }

    fn len(&self) -> usize {
        self.dp * self.hp * self.ws
    }

    /// The largest tap offset: the last, as offsets ascend in tap order (a row's taps
    /// span less than the row stride, a plane's rows less than a plane).
    fn last_tap(&self) -> usize {
        self.taps.last().copied().unwrap_or(0)
    }

    /// Widens one input plane into `buf`, writing zeros only where padding lies.
    fn fill<T: Element>(&self, spec: &ConvSpec, plane: &[T], buf: &mut Vec<f32>) {
        let [d, h, w] = spec.input3();
        let pb = spec.pad_before3();
        buf.resize(self.len(), 0.0);
        for (r, row) in buf.chunks_exact_mut(self.ws).enumerate() {
            let (pd, ph) = (r / self.hp, r % self.hp);
            let inside = pd >= pb[0] && pd - pb[0] < d && ph >= pb[1] && ph - pb[1] < h;
            if !inside {
                row.fill(0.0);
                continue;
            }
            let src = &plane[((pd - pb[0]) * h + (ph - pb[1])) * w..][..w];
            row[..pb[2]].fill(0.0);
            for (o, s) in row[pb[2]..pb[2] + w].iter_mut().zip(src) {
                *o = s.to_f32();
            }
            row[pb[2] + w..].fill(0.0);
        }
    }
}

fn channels_first<T: Element>(
    spec: &ConvSpec,
    isa: Isa,
    epi: &FusedEpilogue,
    x: &[T],
    w: &[f32],
    y: &mut [T],
) {
    let plane_in = spec.input3().iter().product::<usize>();
    let [od, oh, ow] = spec.output3();
    let plane_out = od * oh * ow;
    let planes = spec.n() * spec.c();
    let geo = PaddedPlane::new(spec, isa.lanes());
    let taps = spec.taps();
    // Few planes (one big volume): split each plane's output depths across threads too.
    let split_rows = planes < 4 * rayon::current_num_threads() && od > 1;
    y.par_chunks_mut(plane_out).enumerate().for_each_init(
        || (Vec::<f32>::new(), Vec::<f32>::new()),
        |(buf, row), (p, out)| {
            let c = p % spec.c();
            geo.fill(spec, &x[p * plane_in..][..plane_in], buf);
            let wc = &w[c * taps..][..taps];
            let rows = |d: usize, o: &mut [T], row: &mut Vec<f32>| {
                let at = OutRows {
                    epi,
                    c,
                    at: p * plane_out + d * oh * ow,
                };
                cf_rows(isa, spec, &geo, buf, wc, d, o, row, at)
            };
            if split_rows {
                out.par_chunks_mut(oh * ow)
                    .enumerate()
                    .for_each_init(Vec::new, |row, (d, o)| rows(d, o, row));
            } else {
                for (d, o) in out.chunks_mut(oh * ow).enumerate() {
                    rows(d, o, row);
                }
            }
        },
    );
}

/// Where a channels-first output depth's rows go through the epilogue: channel `c`,
/// its first output at flat index `at`.
#[derive(Clone, Copy)]
struct OutRows<'a> {
    epi: &'a FusedEpilogue,
    c: usize,
    at: usize,
}

#[allow(clippy::too_many_arguments)]
fn cf_rows<T: Element>(
    isa: Isa,
    spec: &ConvSpec,
    geo: &PaddedPlane,
    src: &[f32],
    w: &[f32],
    od: usize,
    out: &mut [T],
    row: &mut Vec<f32>,
    at: OutRows,
) {
    // SAFETY: each wrapper is called only when `Isa::detect` found its features.
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { cf_rows_avx512(spec, geo, src, w, od, out, row, at) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { cf_rows_avx2(spec, geo, src, w, od, out, row, at) },
        _ => cf_rows_body::<T, 8, false>(spec, geo, src, w, od, out, row, at),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn cf_rows_avx512<T: Element>(
    spec: &ConvSpec,
    geo: &PaddedPlane,
    src: &[f32],
    w: &[f32],
    od: usize,
    out: &mut [T],
    row: &mut Vec<f32>,
    at: OutRows,
) {
    cf_rows_body::<T, 16, true>(spec, geo, src, w, od, out, row, at)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn cf_rows_avx2<T: Element>(
    spec: &ConvSpec,
    geo: &PaddedPlane,
    src: &[f32],
    w: &[f32],
    od: usize,
    out: &mut [T],
    row: &mut Vec<f32>,
    at: OutRows,
) {
    cf_rows_body::<T, 8, true>(spec, geo, src, w, od, out, row, at)
}

/// Output rows a unit-stride block computes together: more independent accumulators
/// (rows x vectors, at most 16 of the 32 vector registers) for the two FMA pipes, and
/// each tap's broadcast weight shared by them. (One row of x3d's 56 outputs is only 4
/// AVX-512 vectors. The groups alone gained 6%; with the accumulators in registers,
/// block_unit_avx512, 1.27x: docs/perf.md, "CPU backend forward".)
fn rows_together(vectors: usize) -> usize {
    match vectors {
        0..=4 => 4,
        _ => 2,
    }
}

/// All output rows of output depth `od` of one plane.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn cf_rows_body<T: Element, const L: usize, const FMA: bool>(
    spec: &ConvSpec,
    geo: &PaddedPlane,
    src: &[f32],
    w: &[f32],
    od: usize,
    out: &mut [T],
    row: &mut Vec<f32>,
    at: OutRows,
) {
    let [_, oh, ow] = spec.output3();
    let [sd, sh, sw] = spec.stride3();
    let kh = spec.kernel3()[1];
    let dh = spec.dilation3()[1];
    // Rows sharing their input rows in registers (shared_rows_avx512) where it applies.
    let shared = cfg!(target_arch = "x86_64")
        && L == 16
        && FMA
        && sw == 1
        && sh == 1
        && dh == 1
        && matches!(kh, 3 | 5 | 7);
    // Each row's outputs padded to whole vectors, `group` rows of them.
    let padded = ow.div_ceil(L) * L;
    let group = if shared {
        SHARED_ROWS
    } else if sw == 1 {
        rows_together(ow.div_ceil(L).min(8))
    } else {
        1
    };
    row.resize(group * padded, 0.0);
    let row_step = sh * geo.ws;
    let mut h = 0;
    while h < oh {
        // A whole group, else the rows left one at a time.
        let rows = if oh - h >= group { group } else { 1 };
        let base = (od * sd * geo.hp + h * sh) * geo.ws;
        let mut b = 0;
        #[cfg(target_arch = "x86_64")]
        if shared && rows == SHARED_ROWS {
            let [kd, _, kw] = spec.kernel3();
            let [dd, _, dw] = spec.dilation3();
            let at = SharedRowsAt {
                plane_step: dd * geo.hp * geo.ws,
                ws: geo.ws,
                kd,
                kw,
                dw,
            };
            // At most 24 accumulators beside the kernel rows' weights and one input vector.
            let most = if kh == 7 { 5 } else { 6 };
            while b < ow {
                let vectors = (ow - b).div_ceil(L).min(most);
                let r = &mut row[b..];
                macro_rules! block {
                    ($(($k:literal, $span:literal)),*) => {
                        match (kh, vectors) {
                            $(($k, 1) => shared_rows::<1, $k, $span>(src, base + b, at, w, r, padded),
                              ($k, 2) => shared_rows::<2, $k, $span>(src, base + b, at, w, r, padded),
                              ($k, 3) => shared_rows::<3, $k, $span>(src, base + b, at, w, r, padded),
                              ($k, 4) => shared_rows::<4, $k, $span>(src, base + b, at, w, r, padded),
                              ($k, 5) => shared_rows::<5, $k, $span>(src, base + b, at, w, r, padded),
                              ($k, 6) => shared_rows::<6, $k, $span>(src, base + b, at, w, r, padded),)*
                            _ => unreachable!(),
                        }
                    };
                }
                block!((3, 6), (5, 8), (7, 10));
                b += vectors * L;
            }
        }
        while b < ow {
            let vectors = (ow - b).div_ceil(L).min(8);
            let r = &mut row[b..];
            let unit_at = base + b;
            macro_rules! block {
                ($($nv:literal)*) => {
                    match (vectors, rows) {
                        $(($nv, 1) => {
                            if sw == 1 {
                                unit_block::<L, $nv, 1, FMA>(src, unit_at, row_step, geo, w, r, padded)
                            } else {
                                block_strided::<L, $nv, FMA>(src, base + b * sw, sw, ow - b, &geo.taps, w, r)
                            }
                        })*
                        $(($nv, 2) => unit_block::<L, $nv, 2, FMA>(src, unit_at, row_step, geo, w, r, padded),)*
                        $(($nv, 4) => unit_block::<L, $nv, 4, FMA>(src, unit_at, row_step, geo, w, r, padded),)*
                        _ => unreachable!(),
                    }
                };
            }
            block!(1 2 3 4 5 6 7 8);
            b += vectors * L;
        }
        for (i, r) in row.chunks_exact_mut(padded).take(rows).enumerate() {
            let oh_i = h + i;
            at.epi.apply_row(&mut r[..ow], at.c, at.at + oh_i * ow);
            T::store_f32_slice(&r[..ow], &mut out[oh_i * ow..][..ow]);
        }
        h += rows;
    }
}

#[inline(always)]
pub(super) fn fma<const FMA: bool>(a: f32, b: f32, acc: f32) -> f32 {
    if FMA {
        a.mul_add(b, acc)
    } else {
        acc + a * b
    }
}

/// One block of stride-1 outputs: AVX-512's intrinsics where this is the AVX-512
/// instantiation (L = 16 with FMA is only cf_rows_avx512's), else the portable form.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn unit_block<const L: usize, const NV: usize, const R: usize, const FMA: bool>(
    src: &[f32],
    at: usize,
    row_step: usize,
    geo: &PaddedPlane,
    w: &[f32],
    out: &mut [f32],
    out_stride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if L == 16 && FMA {
        // SAFETY: only cf_rows_avx512 instantiates L = 16, and it is called only where
        // `Isa::detect` found AVX-512.
        unsafe { block_unit_avx512::<NV, R>(src, at, row_step, geo, w, out, out_stride) };
        return;
    }
    block_unit::<L, NV, R, FMA>(src, at, row_step, &geo.taps, w, out, out_stride)
}

/// `NV` vectors of `L` outputs of stride 1 along W on each of `R` output rows
/// (`row_step` apart in the padded plane; written `out_stride` apart in `out`),
/// accumulated in registers over all taps.
#[inline(always)]
fn block_unit<const L: usize, const NV: usize, const R: usize, const FMA: bool>(
    src: &[f32],
    base: usize,
    row_step: usize,
    taps: &[usize],
    w: &[f32],
    out: &mut [f32],
    out_stride: usize,
) {
    let mut acc = [[[0.0f32; L]; NV]; R];
    for (&off, &wt) in taps.iter().zip(w) {
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let s = &src[base + r * row_step + off..][..L * NV];
            for (v, a) in acc_r.iter_mut().enumerate() {
                for i in 0..L {
                    a[i] = fma::<FMA>(s[v * L + i], wt, a[i]);
                }
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (o, a) in out[r * out_stride..].chunks_exact_mut(L).zip(acc_r) {
            o.copy_from_slice(a);
        }
    }
}

/// `block_unit` in AVX-512 intrinsics: the R x NV accumulators are vector registers
/// (the portable form kept them in arrays that LLVM stored to the stack every tap).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn block_unit_avx512<const NV: usize, const R: usize>(
    src: &[f32],
    base: usize,
    row_step: usize,
    geo: &PaddedPlane,
    w: &[f32],
    out: &mut [f32],
    out_stride: usize,
) {
    use std::arch::x86_64::*;
    // Every load and store below stays inside its slice, checked once here: the padded
    // plane holds each row's taps and whole vectors (PaddedPlane::new).
    assert!(base + (R - 1) * row_step + geo.last_tap() + NV * 16 <= src.len());
    assert!((R - 1) * out_stride + NV * 16 <= out.len());
    let p = src.as_ptr();
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    for (&off, &wt) in geo.taps.iter().zip(w) {
        let wv = _mm512_set1_ps(wt);
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let s = p.add(base + r * row_step + off);
            for (v, a) in acc_r.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_loadu_ps(s.add(v * 16)), wv, *a);
            }
        }
    }
    let o = out.as_mut_ptr();
    for (r, acc_r) in acc.iter().enumerate() {
        for (v, a) in acc_r.iter().enumerate() {
            _mm512_storeu_ps(o.add(r * out_stride + v * 16), *a);
        }
    }
}

/// Output rows `shared_rows` computes together.
const SHARED_ROWS: usize = 4;

/// Where `shared_rows` reads: a kernel depth's step in the padded plane, the row stride,
/// the kernel's depth and width, the W dilation.
#[derive(Clone, Copy)]
struct SharedRowsAt {
    plane_step: usize,
    ws: usize,
    kd: usize,
    kw: usize,
    dw: usize,
}

/// `NV` vectors of stride-1 outputs on each of SHARED_ROWS output rows (H stride and
/// dilation 1, KH kernel rows; SPAN = SHARED_ROWS + KH - 1 input rows): each input
/// vector is loaded once a (kernel depth, kernel column) and feeds every output row it
/// reaches, with that column's KH weights in registers. block_unit loaded one input
/// vector a multiply-add, most of them across 64-byte lines (docs/perf.md, "CPU backend
/// forward"); here SHARED_ROWS x KH / SPAN multiply-adds share a load.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn shared_rows<const NV: usize, const KH: usize, const SPAN: usize>(
    src: &[f32],
    base: usize,
    at: SharedRowsAt,
    w: &[f32],
    out: &mut [f32],
    out_stride: usize,
) {
    use std::arch::x86_64::*;
    const { assert!(SPAN == SHARED_ROWS + KH - 1) };
    let SharedRowsAt {
        plane_step,
        ws,
        kd,
        kw,
        dw,
    } = at;
    // Every load and store below stays inside its slice, checked once here.
    assert!(kd >= 1 && kw >= 1 && w.len() >= kd * KH * kw);
    assert!(base + (kd - 1) * plane_step + (SPAN - 1) * ws + (kw - 1) * dw + NV * 16 <= src.len());
    assert!((SHARED_ROWS - 1) * out_stride + NV * 16 <= out.len());
    // SAFETY: only cf_rows_avx512 reaches here (L = 16 with FMA), called where
    // `Isa::detect` found AVX-512; the pointers stay inside the slices checked above.
    unsafe {
        let p = src.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); NV]; SHARED_ROWS];
        for a in 0..kd {
            for e in 0..kw {
                let mut wv = [_mm512_setzero_ps(); KH];
                for (b, v) in wv.iter_mut().enumerate() {
                    *v = _mm512_set1_ps(*w.get_unchecked((a * KH + b) * kw + e));
                }
                let pe = p.add(base + a * plane_step + e * dw);
                for i in 0..SPAN {
                    for v in 0..NV {
                        let x = _mm512_loadu_ps(pe.add(i * ws + v * 16));
                        for (r, acc_r) in acc.iter_mut().enumerate() {
                            if i >= r && i - r < KH {
                                acc_r[v] = _mm512_fmadd_ps(x, wv[i - r], acc_r[v]);
                            }
                        }
                    }
                }
            }
        }
        let o = out.as_mut_ptr();
        for (r, acc_r) in acc.iter().enumerate() {
            for (v, a) in acc_r.iter().enumerate() {
                _mm512_storeu_ps(o.add(r * out_stride + v * 16), *a);
            }
        }
    }
}

/// As `block_unit` with a stride along W (a gather; strided convs are the rarer case).
#[inline(always)]
fn block_strided<const L: usize, const NV: usize, const FMA: bool>(
    src: &[f32],
    base: usize,
    stride: usize,
    valid: usize,
    taps: &[usize],
    w: &[f32],
    out: &mut [f32],
) {
    // Lanes past the row's `valid` outputs repeat the last one: the padded row then
    // needs no room for a whole vector's overshoot, which grows with the stride (a
    // stride of 2^31 asked for 128 GB).
    let last = valid.min(L * NV) - 1;
    let mut acc = [[0.0f32; L]; NV];
    for (&off, &wt) in taps.iter().zip(w) {
        let s = &src[base + off..base + off + last * stride + 1];
        for (v, a) in acc.iter_mut().enumerate() {
            for i in 0..L {
                a[i] = fma::<FMA>(s[(v * L + i).min(last) * stride], wt, a[i]);
            }
        }
    }
    for (o, a) in out.chunks_exact_mut(L).zip(&acc) {
        o.copy_from_slice(a);
    }
}

// ---------------------------------------------------------------------------------------
// Channels-last

/// Range of taps `k` whose input coordinate `o*stride + k*dil - pad` lies in `[0, size)`.
fn valid_taps(
    o: usize,
    stride: usize,
    dil: usize,
    pad: usize,
    size: usize,
    k: usize,
) -> (usize, usize) {
    let start = o * stride;
    // smallest k with start + k*dil >= pad
    let lo = if start >= pad {
        0
    } else {
        (pad - start).div_ceil(dil)
    };
    // largest k with start + k*dil - pad < size, exclusive
    let hi = if start >= pad + size {
        0
    } else if start + (k - 1) * dil < pad + size {
        k
    } else {
        (pad + size - start).div_ceil(dil).min(k)
    };
    (lo.min(hi), hi)
}

/// SPAN: the AVX-512 rows' span runs where they apply (false: the run form alone, the
/// reference the tests hold them to, bit for bit).
fn channels_last<T: Element, const SPAN: bool>(
    spec: &ConvSpec,
    isa: Isa,
    epi: &FusedEpilogue,
    x: &[T],
    w: &[f32],
    y: &mut [T],
) {
    let c = spec.c();
    let taps = spec.taps();
    // Weights tap-major so a block of channels reads one contiguous run per tap.
    let mut wt = vec![0.0f32; w.len()];
    for ch in 0..c {
        for t in 0..taps {
            wt[t * c + ch] = w[ch * taps + t];
        }
    }
    let [od, oh, ow] = spec.output3();
    y.par_chunks_mut(ow * c)
        .enumerate()
        .for_each_init(Vec::new, |acc, (r, out)| {
            let (n, d, h) = (r / (od * oh), (r / oh) % od, r % oh);
            let epi_at = (epi, r * ow * c);
            // (CL_OUTPUTS pixels: the AVX-512 row's runs.)
            acc.resize(CL_OUTPUTS * c, 0.0);
            // SAFETY: each wrapper is called only when `Isa::detect` found its features.
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => unsafe {
                    cl_row_avx512::<T, SPAN>(spec, x, &wt, (n, d, h), out, acc, epi_at)
                },
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => unsafe { cl_row_avx2(spec, x, &wt, (n, d, h), out, acc, epi_at) },
                _ => cl_row_body::<T, false>(spec, x, &wt, (n, d, h), out, acc, epi_at),
            }
        });
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn cl_row_avx2<T: Element>(
    spec: &ConvSpec,
    x: &[T],
    wt: &[f32],
    ndh: (usize, usize, usize),
    out: &mut [T],
    acc: &mut [f32],
    epi_at: (&FusedEpilogue, usize),
) {
    cl_row_body::<T, true>(spec, x, wt, ndh, out, acc, epi_at)
}

/// Channel block held in registers: 64 f32 (4 AVX-512 or 8 AVX2 vectors).
const CL_BLOCK: usize = 64;

/// One output row (all W positions, all channels) of a channels-last spec.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn cl_row_body<T: Element, const FMA: bool>(
    spec: &ConvSpec,
    x: &[T],
    wt: &[f32],
    ndh: (usize, usize, usize),
    out: &mut [T],
    acc: &mut [f32],
    (epi, at): (&FusedEpilogue, usize),
) {
    let c = spec.c();
    let windows = cl_row_windows(spec, ndh);
    for o in 0..spec.output3()[2] {
        cl_pixel::<T, FMA>(spec, x, wt, &windows, o, 0, &mut acc[..c]);
        epi.apply_pixel(&mut acc[..c], at + o * c);
        T::store_f32_slice(&acc[..c], &mut out[o * c..][..c]);
    }
}

/// The kernel depths and rows of output row (n, d, h) that land inside the input: each
/// one's input row (its first pixel) and weight row (its first tap).
fn cl_row_windows(spec: &ConvSpec, (n, d, h): (usize, usize, usize)) -> Vec<(usize, usize)> {
    let ([id, ih, iw], [kd, kh, kw]) = (spec.input3(), spec.kernel3());
    let ([sd, sh, _], [dd, dh, _]) = (spec.stride3(), spec.dilation3());
    let pb = spec.pad_before3();
    let (d0, d1) = valid_taps(d, sd, dd, pb[0], id, kd);
    let (h0, h1) = valid_taps(h, sh, dh, pb[1], ih, kh);
    let mut windows = Vec::with_capacity((d1 - d0) * (h1 - h0));
    for a_ in d0..d1 {
        let zd = d * sd + a_ * dd - pb[0];
        for b_ in h0..h1 {
            let zh = h * sh + b_ * dh - pb[1];
            windows.push((((n * id + zd) * ih + zh) * iw, (a_ * kh + b_) * kw));
        }
    }
    windows
}

/// Channels `from..` of output `o` of a row (its `windows`) into `px[from..]` (`px` one
/// pixel's channels), the W taps checked against the row's edges.
#[inline(always)]
fn cl_pixel<T: Element, const FMA: bool>(
    spec: &ConvSpec,
    x: &[T],
    wt: &[f32],
    windows: &[(usize, usize)],
    o: usize,
    from: usize,
    px: &mut [f32],
) {
    let c = spec.c();
    let (iw, kw) = (spec.input3()[2], spec.kernel3()[2]);
    let (sw, dw, pw) = (
        spec.stride3()[2],
        spec.dilation3()[2],
        spec.pad_before3()[2],
    );
    let (w0, w1) = valid_taps(o, sw, dw, pw, iw, kw);
    let mut cb = from;
    while cb < c {
        let len = (c - cb).min(CL_BLOCK);
        let mut a = [0.0f32; CL_BLOCK];
        for &(row, tap0) in windows {
            for e in w0..w1 {
                let zw = o * sw + e * dw - pw;
                let xs = &x[(row + zw) * c + cb..][..len];
                let ws = &wt[(tap0 + e) * c + cb..][..len];
                if len == CL_BLOCK {
                    for i in 0..CL_BLOCK {
                        a[i] = fma::<FMA>(xs[i].to_f32(), ws[i], a[i]);
                    }
                } else {
                    for i in 0..len {
                        a[i] = fma::<FMA>(xs[i].to_f32(), ws[i], a[i]);
                    }
                }
            }
        }
        px[cb..cb + len].copy_from_slice(&a[..len]);
        cb += len;
    }
}

/// Outputs along W that `cl_row_avx512` computes together.
const CL_OUTPUTS: usize = 4;

/// One output row of a channels-last spec in AVX-512 intrinsics: runs of CL_OUTPUTS
/// outputs whose W taps are all inside the row, 64 (then 16) channels at a time, their
/// sums in vector registers and each tap's weight vectors loaded once for the run's
/// outputs (the portable body loads an input and a weight vector a multiply-add, its
/// 64-float array not kept in registers: the NDHWC seed 4.5x the NCDHW one, docs/perf.md).
/// Edge outputs, the row's last outputs short of a run and channels past the last
/// 16 take `cl_pixel`. With SPAN, rows of 5 or 7 taps at W stride and dilation 1
/// take `cl_span_avx512` (each input vector loaded once for every tap that reads it; the
/// same sums in the same order, so the same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn cl_row_avx512<T: Element, const SPAN: bool>(
    spec: &ConvSpec,
    x: &[T],
    wt: &[f32],
    ndh: (usize, usize, usize),
    out: &mut [T],
    acc: &mut [f32],
    (epi, at): (&FusedEpilogue, usize),
) {
    let (c, iw, kw, ow) = (
        spec.c(),
        spec.input3()[2],
        spec.kernel3()[2],
        spec.output3()[2],
    );
    let (sw, dw, pw) = (
        spec.stride3()[2],
        spec.dilation3()[2],
        spec.pad_before3()[2],
    );
    let windows = cl_row_windows(spec, ndh);
    // The row's taps: (input element offset from output 0's window at column -pw, weight
    // offset); an output o adds (o * sw) * c.
    let taps: Vec<(usize, usize)> = windows
        .iter()
        .flat_map(|&(row, tap0)| (0..kw).map(move |e| ((row + e * dw) * c, (tap0 + e) * c)))
        .collect();
    // Rows of 5 or 7 taps (this machine, three rounds: convnext-nhwc's 7 x 7 1.15x, the
    // NDHWC seed's 5 x 5 level or better; x3d-ndhwc's 3 x 3 1.1x slower: too few taps a
    // window to pay for its loop).
    let span = SPAN && sw == 1 && dw == 1 && matches!(kw, 5 | 7);
    // Outputs whose W taps all lie inside the row: o * sw >= pw and
    // o * sw + (kw - 1) * dw - pw < iw.
    let o_lo = pw.div_ceil(sw);
    let o_hi = if iw + pw > (kw - 1) * dw {
        ((iw + pw - (kw - 1) * dw - 1) / sw + 1).min(ow)
    } else {
        0
    };
    let c16 = c / 16 * 16;
    // Every load below stays inside x and wt: a run's last output's farthest tap plus the
    // vectors, checked once a row (the last run) and once a run.
    let last_tap = taps.iter().map(|t| t.0).max().unwrap_or(0);
    assert!(taps.iter().all(|t| t.1 + c16 <= wt.len()));
    let mut o = 0;
    while o < ow {
        if o >= o_lo && o + CL_OUTPUTS <= o_hi && c16 > 0 {
            let first = (o * sw - pw) * c;
            assert!(first + last_tap + (CL_OUTPUTS - 1) * sw * c + c16 <= x.len());
            let mut cb = 0;
            if span {
                while cb + 32 <= c16 {
                    match kw {
                        5 => cl_span_avx512::<T, 5>(x, first, &taps, wt, cb, c, acc),
                        _ => cl_span_avx512::<T, 7>(x, first, &taps, wt, cb, c, acc),
                    }
                    cb += 32;
                }
            }
            while cb + 64 <= c16 {
                cl_run_avx512::<T, 4>(x, first, &taps, wt, sw * c, cb, c, acc);
                cb += 64;
            }
            while cb < c16 {
                cl_run_avx512::<T, 1>(x, first, &taps, wt, sw * c, cb, c, acc);
                cb += 16;
            }
            for r in 0..CL_OUTPUTS {
                let px = &mut acc[r * c..][..c];
                if c16 < c {
                    cl_pixel::<T, true>(spec, x, wt, &windows, o + r, c16, px);
                }
                epi.apply_pixel(px, at + (o + r) * c);
                T::store_f32_slice(px, &mut out[(o + r) * c..][..c]);
            }
            o += CL_OUTPUTS;
        } else {
            let px = &mut acc[..c];
            cl_pixel::<T, true>(spec, x, wt, &windows, o, 0, px);
            epi.apply_pixel(px, at + o * c);
            T::store_f32_slice(px, &mut out[o * c..][..c]);
            o += 1;
        }
    }
}

/// CL_OUTPUTS outputs (`step` elements apart, the first's window at `first`) x NV
/// vectors of 16 channels from `cb`: sums over `taps` into `acc[r * c + cb..]`. The
/// caller has checked every load's bounds.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn cl_run_avx512<T: Element, const NV: usize>(
    x: &[T],
    first: usize,
    taps: &[(usize, usize)],
    wt: &[f32],
    step: usize,
    cb: usize,
    c: usize,
    acc: &mut [f32],
) {
    use std::arch::x86_64::*;
    let (xp, wp) = (x.as_ptr().add(first + cb), wt.as_ptr().add(cb));
    let mut a = [[_mm512_setzero_ps(); NV]; CL_OUTPUTS];
    for &(xo, wo) in taps {
        let mut wv = [_mm512_setzero_ps(); NV];
        for (v, w) in wv.iter_mut().enumerate() {
            *w = _mm512_loadu_ps(wp.add(wo + 16 * v));
        }
        for (r, a_r) in a.iter_mut().enumerate() {
            let s = xp.add(xo + r * step);
            for (v, a_rv) in a_r.iter_mut().enumerate() {
                *a_rv = _mm512_fmadd_ps(load16(s.add(16 * v)), wv[v], *a_rv);
            }
        }
    }
    assert!((CL_OUTPUTS - 1) * c + cb + 16 * NV <= acc.len());
    let o = acc.as_mut_ptr().add(cb);
    for (r, a_r) in a.iter().enumerate() {
        for (v, a_rv) in a_r.iter().enumerate() {
            _mm512_storeu_ps(o.add(r * c + 16 * v), *a_rv);
        }
    }
}

/// `cl_run_avx512` at W stride and dilation 1 for rows of KW taps (`taps` as there: KW a
/// window, so a window's first tap gives its input row and first weight), 32 channels
/// from `cb`: output r's tap e reads input r + e, so per window the CL_OUTPUTS + KW - 1 inputs are
/// loaded (and widened) once into registers and each feeds every output that reads it
/// (the run form loads one a multiply-add). Each sum takes its terms in the run form's
/// order (window, then tap), so the bits are the same. The caller has checked the loads'
/// bounds (the span ends where the run form's last tap of its last output does).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn cl_span_avx512<T: Element, const KW: usize>(
    x: &[T],
    first: usize,
    taps: &[(usize, usize)],
    wt: &[f32],
    cb: usize,
    c: usize,
    acc: &mut [f32],
) {
    use std::arch::x86_64::*;
    let (xp, wp) = (x.as_ptr().add(first + cb), wt.as_ptr().add(cb));
    let mut a = [[_mm512_setzero_ps(); 2]; CL_OUTPUTS];
    for &(xo, wo) in taps.iter().step_by(KW) {
        let s = xp.add(xo);
        // The window's inputs, two vectors each: CL_OUTPUTS + KW - 1 <= 10 (KW <= 7).
        let mut inp = [[_mm512_setzero_ps(); 2]; CL_OUTPUTS + 6];
        for (i, slot) in inp.iter_mut().enumerate().take(CL_OUTPUTS + KW - 1) {
            *slot = [load16(s.add(i * c)), load16(s.add(i * c + 16))];
        }
        for e in 0..KW {
            let w = [
                _mm512_loadu_ps(wp.add(wo + e * c)),
                _mm512_loadu_ps(wp.add(wo + e * c + 16)),
            ];
            // Eight independent sums a tap (the FMA pipes' latency covered).
            for (r, a_r) in a.iter_mut().enumerate() {
                a_r[0] = _mm512_fmadd_ps(inp[r + e][0], w[0], a_r[0]);
                a_r[1] = _mm512_fmadd_ps(inp[r + e][1], w[1], a_r[1]);
            }
        }
    }
    assert!((CL_OUTPUTS - 1) * c + cb + 32 <= acc.len());
    let o = acc.as_mut_ptr().add(cb);
    for (r, a_r) in a.iter().enumerate() {
        _mm512_storeu_ps(o.add(r * c), a_r[0]);
        _mm512_storeu_ps(o.add(r * c + 16), a_r[1]);
    }
}

/// 16 consecutive elements at `p` as f32 lanes, exactly (the match is on a constant:
/// one arm is left in each instantiation).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load16<T: Element>(p: *const T) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    match T::DTYPE {
        DType::F32 => _mm512_loadu_ps(p as *const f32),
        // bf16: the upper half of an f32.
        DType::Bf16 => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(
            _mm256_loadu_si256(p as *const __m256i),
        ))),
        DType::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)),
    }
}

// ---------------------------------------------------------------------------------------
// Calibration: the CPU's own ceilings, measured, for the floor of each case.

/// Measures copy bandwidth (256 MiB, all threads) and the f32 FMA rate (all threads,
/// independent register accumulators), best of a few tries each.
pub fn calibrate() -> Ceilings {
    let n = 64 << 20; // f32 elements: 256 MiB each way
    let src = vec![1.0f32; n];
    let mut dst = vec![0.0f32; n];
    let chunk = n / (4 * rayon::current_num_threads()).max(1);
    let mut best_copy = f64::MAX;
    for _ in 0..3 {
        let t = std::time::Instant::now();
        dst.par_chunks_mut(chunk)
            .zip(src.par_chunks(chunk))
            .for_each(|(d, s)| d.copy_from_slice(s));
        best_copy = best_copy.min(t.elapsed().as_secs_f64());
    }
    std::hint::black_box(&dst);
    let isa = Isa::detect();
    let reps = 20_000_000usize;
    let mut best_fma = f64::MAX;
    for _ in 0..3 {
        let t = std::time::Instant::now();
        let threads = rayon::current_num_threads();
        (0..threads).into_par_iter().for_each(|i| {
            let x = std::hint::black_box(1.0 + i as f32 * 1e-9);
            // SAFETY: called only with the features `Isa::detect` found.
            let r = match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => unsafe { fma_loop_avx512(x, reps) },
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => unsafe { fma_loop_avx2(x, reps) },
                _ => fma_loop::<8, false>(x, reps),
            };
            std::hint::black_box(r);
        });
        best_fma = best_fma.min(t.elapsed().as_secs_f64());
    }
    let lanes = isa.lanes() as f64;
    let fmas = (rayon::current_num_threads() * reps) as f64 * FMA_CHAINS as f64 * lanes;
    Ceilings {
        copy_gbps: 2.0 * (n * 4) as f64 / best_copy / 1e9,
        fma_gflops: 2.0 * fmas / best_fma / 1e9,
        tensor_gflops: None,
    }
}

/// Independent accumulators: enough to cover FMA latency times issue width.
const FMA_CHAINS: usize = 12;

// Explicit intrinsics: the measured ceiling must not depend on what the vectorizer
// makes of a synthetic loop.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_loop_avx512(x: f32, reps: usize) -> f32 {
    use std::arch::x86_64::*;
    let m = _mm512_set1_ps(0.999_999);
    let b = _mm512_set1_ps(x);
    let mut acc = [_mm512_setzero_ps(); FMA_CHAINS];
    for _ in 0..reps {
        for a in acc.iter_mut() {
            *a = _mm512_fmadd_ps(*a, m, b);
        }
    }
    acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_loop_avx2(x: f32, reps: usize) -> f32 {
    use std::arch::x86_64::*;
    let m = _mm256_set1_ps(0.999_999);
    let b = _mm256_set1_ps(x);
    let mut acc = [_mm256_setzero_ps(); FMA_CHAINS];
    for _ in 0..reps {
        for a in acc.iter_mut() {
            *a = _mm256_fmadd_ps(*a, m, b);
        }
    }
    let mut out = [0.0f32; 8];
    let mut sum = 0.0;
    for a in acc {
        _mm256_storeu_ps(out.as_mut_ptr(), a);
        sum += out.iter().sum::<f32>();
    }
    sum
}

fn fma_loop<const L: usize, const FMA: bool>(x: f32, reps: usize) -> f32 {
    let mut acc = [[0.0f32; L]; FMA_CHAINS];
    for _ in 0..reps {
        for a in acc.iter_mut() {
            for v in a.iter_mut() {
                *v = fma::<FMA>(*v, 0.999_999, x);
            }
        }
    }
    acc.iter().flatten().sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::conv_reference;
    use crate::spec::{ConvParams, DType};
    use crate::tensor::compare;

    /// The CPU forward of `params` (f32) on every instruction set this CPU has, against
    /// the oracle.
    fn every_isa_matches_oracle_on(params: ConvParams) {
        let spec = params.validate().unwrap();
        let x = HostTensor::random_normal(DType::F32, &spec.input_shape(), 3);
        let w = HostTensor::random_normal(DType::F32, &spec.weight_shape(), 4);
        let r = conv_reference(&spec, &x, &w).unwrap();
        for isa in [Isa::Portable, Isa::Avx2, Isa::Avx512] {
            if !isa.supported() {
                continue;
            }
            let mut y = HostTensor::nan(DType::F32, &spec.output_shape());
            conv_cpu_with(isa, &spec, &FusedEpilogue::none(), &x, &w, &mut y).unwrap();
            let c = compare(&y, &r).unwrap();
            assert!(c.passes(DType::F32), "{isa:?} {spec}: {c:?}");
        }
    }

    /// Shapes that hit full blocks, partial blocks, several 8-vector chunks, strides and
    /// both layouts.
    #[test]
    fn every_isa_matches_oracle() {
        let shapes = [
            (
                vec![3, 5, 300],
                vec![2, 3, 5],
                vec![1, 1, 1],
                vec![[1, 0], [1, 1], [2, 2]],
            ),
            (vec![4, 37], vec![3, 3], vec![2, 3], vec![[1, 1], [0, 2]]),
            (vec![70], vec![4], vec![1], vec![[3, 0]]),
            (
                vec![4, 9, 21],
                vec![2, 5, 3],
                vec![1, 1, 1],
                vec![[0, 1], [1, 2], [1, 0]],
            ),
            (vec![11, 40], vec![3, 7], vec![1, 1], vec![[1, 1], [3, 3]]),
        ];
        for (input, kernel, stride, padding) in shapes {
            for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
                every_isa_matches_oracle_on(ConvParams {
                    n: 2,
                    c: 67,
                    input: input.clone(),
                    kernel: kernel.clone(),
                    stride: stride.clone(),
                    dilation: vec![],
                    padding: padding.clone(),
                    layout,
                    dtype: DType::F32,
                });
            }
        }
    }

    /// The AVX-512 channels-last row's runs (cl_row_avx512): every dtype's vector
    /// loads, 64- and 16-channel vectors with channels past them, W stride and dilation,
    /// asymmetric padding (edge outputs and the row's last outputs short of a run), a
    /// row too narrow for any run, and NaN / Inf in the input reaching the right outputs.
    #[test]
    fn channels_last_runs_match_oracle() {
        if !Isa::Avx512.supported() {
            return;
        }
        let shapes = [
            (
                vec![3, 6, 29],
                vec![3, 3, 5],
                vec![1, 1, 1],
                vec![1, 1, 1],
                vec![[1, 1], [2, 0], [2, 3]],
            ),
            (
                vec![7, 41],
                vec![3, 4],
                vec![1, 2],
                vec![1, 1],
                vec![[1, 1], [1, 2]],
            ),
            (
                vec![5, 37],
                vec![2, 3],
                vec![1, 1],
                vec![1, 2],
                vec![[0, 1], [2, 2]],
            ),
            (vec![50], vec![4], vec![1], vec![1], vec![[3, 0]]),
            (
                vec![3, 4],
                vec![3, 3],
                vec![1, 1],
                vec![1, 1],
                vec![[1, 1], [1, 1]],
            ),
        ];
        for (i, (input, kernel, stride, dilation, padding)) in shapes.into_iter().enumerate() {
            for (j, &c) in [16, 40, 96, 131].iter().enumerate() {
                let dtype = DType::ALL[(i + j) % 3];
                let spec = ConvParams {
                    n: 2,
                    c,
                    input: input.clone(),
                    kernel: kernel.clone(),
                    stride: stride.clone(),
                    dilation: dilation.clone(),
                    padding: padding.clone(),
                    layout: Layout::ChannelsLast,
                    dtype,
                }
                .validate()
                .unwrap();
                let mut x = HostTensor::random_normal(dtype, &spec.input_shape(), 5 + i as u64);
                if j == 1 {
                    crate::with_elements!(x.data_mut(), v => {
                        v[7] = Element::from_f32(f32::NAN);
                        v[c as usize * 11 + 3] = Element::from_f32(f32::INFINITY);
                    });
                }
                let w = HostTensor::random_normal(dtype, &spec.weight_shape(), 6);
                let r = conv_reference(&spec, &x, &w).unwrap();
                let mut y = HostTensor::nan(dtype, &spec.output_shape());
                conv_cpu_with(Isa::Avx512, &spec, &FusedEpilogue::none(), &x, &w, &mut y).unwrap();
                let cmp = compare(&y, &r).unwrap();
                assert!(cmp.passes(dtype), "{spec}: {cmp:?}");
            }
        }
    }

    /// The AVX-512 channels-last span runs (W stride and dilation 1, rows of 5 or 7 taps)
    /// give the run form's bits exactly, every dtype, 64-192 channels (the span takes
    /// blocks of 32, the run form the 16 after), NaN and Inf among the inputs; rows of 3
    /// and 4 taps take the run form on both sides.
    #[test]
    fn channels_last_spans_match_runs_bit_for_bit() {
        if !Isa::Avx512.supported() {
            return;
        }
        for (i, (input, kernel, padding)) in [
            (vec![3, 6, 29], vec![3, 3, 5], vec![[1, 1], [2, 0], [2, 3]]),
            (vec![9, 40], vec![7, 7], vec![[3, 3], [3, 3]]),
            (vec![5, 23], vec![2, 3], vec![[0, 1], [1, 1]]),
            (vec![61], vec![4], vec![[3, 0]]),
        ]
        .into_iter()
        .enumerate()
        {
            for (j, c) in [64usize, 80, 192].into_iter().enumerate() {
                let dtype = DType::ALL[(i + j) % 3];
                let dims = input.len();
                let spec = ConvParams {
                    n: 2,
                    c: c as i64,
                    input: input.clone(),
                    kernel: kernel.clone(),
                    stride: vec![1; dims],
                    dilation: vec![1; dims],
                    padding: padding.clone(),
                    layout: Layout::ChannelsLast,
                    dtype,
                }
                .validate()
                .unwrap();
                let mut x = HostTensor::random_normal(dtype, &spec.input_shape(), 9 + i as u64);
                crate::with_elements!(x.data_mut(), v => {
                    v[c * 5 + 1] = Element::from_f32(f32::NAN);
                    v[c * 13 + 70 % c] = Element::from_f32(f32::INFINITY);
                });
                let w = HostTensor::random_normal(dtype, &spec.weight_shape(), 10);
                let epi = FusedEpilogue::none();
                let wf: Vec<f32> = (0..w.len()).map(|i| w.get_f64(i) as f32).collect();
                let mut got = HostTensor::nan(dtype, &spec.output_shape());
                let mut want = HostTensor::nan(dtype, &spec.output_shape());
                for (out, span) in [(&mut got, true), (&mut want, false)] {
                    let a = Isa::Avx512;
                    match (x.data(), out.data_mut(), span) {
                        (TensorData::Bf16(x), TensorData::Bf16(y), true) => {
                            channels_last::<_, true>(&spec, a, &epi, x, &wf, y)
                        }
                        (TensorData::Bf16(x), TensorData::Bf16(y), false) => {
                            channels_last::<_, false>(&spec, a, &epi, x, &wf, y)
                        }
                        (TensorData::F16(x), TensorData::F16(y), true) => {
                            channels_last::<_, true>(&spec, a, &epi, x, &wf, y)
                        }
                        (TensorData::F16(x), TensorData::F16(y), false) => {
                            channels_last::<_, false>(&spec, a, &epi, x, &wf, y)
                        }
                        (TensorData::F32(x), TensorData::F32(y), true) => {
                            channels_last::<_, true>(&spec, a, &epi, x, &wf, y)
                        }
                        (TensorData::F32(x), TensorData::F32(y), false) => {
                            channels_last::<_, false>(&spec, a, &epi, x, &wf, y)
                        }
                        _ => unreachable!("one dtype"),
                    }
                }
                assert_eq!(got.as_bytes(), want.as_bytes(), "{spec}");
                let r = conv_reference(&spec, &x, &w).unwrap();
                let cmp = compare(&got, &r).unwrap();
                assert!(cmp.passes(dtype), "{spec}: {cmp:?}");
            }
        }
    }

    /// shared_rows' specs (H stride and dilation 1, 3, 5 or 7 kernel rows): groups of
    /// four rows and the rows left, 1 to 6 vectors a block and a partial one, dilations
    /// along D and W, padding on both sides.
    #[test]
    fn shared_rows_match_oracle() {
        let shapes = [
            (
                vec![5, 13, 45],
                vec![3, 7, 3],
                vec![2, 1, 2],
                vec![[2, 2], [3, 3], [2, 2]],
            ),
            (
                vec![3, 10, 100],
                vec![1, 5, 5],
                vec![1, 1, 3],
                vec![[0, 0], [2, 1], [6, 6]],
            ),
            (
                vec![4, 7, 17],
                vec![2, 3, 1],
                vec![3, 1, 1],
                vec![[1, 2], [0, 0], [0, 0]],
            ),
            (vec![9, 200], vec![7, 2], vec![1, 1], vec![[3, 3], [0, 1]]),
        ];
        for (input, kernel, dilation, padding) in shapes {
            every_isa_matches_oracle_on(ConvParams {
                n: 1,
                c: 3,
                input,
                kernel,
                stride: vec![],
                dilation,
                padding,
                layout: Layout::ChannelsFirst,
                dtype: DType::F32,
            });
        }
    }

    #[test]
    fn valid_tap_ranges() {
        // pad 2, size 5, kernel 5, stride 1, dil 1: output 0 sees taps 2..5
        assert_eq!(valid_taps(0, 1, 1, 2, 5, 5), (2, 5));
        assert_eq!(valid_taps(2, 1, 1, 2, 5, 5), (0, 5));
        assert_eq!(valid_taps(4, 1, 1, 2, 5, 5), (0, 3));
        // dilation 2, pad 3: o=0 -> positions -3,-1,1,3 -> taps 2..4 valid when size 4
        assert_eq!(valid_taps(0, 1, 2, 3, 4, 4), (2, 4));
        // everything in padding, before and after
        assert_eq!(valid_taps(0, 1, 1, 5, 2, 3), (3, 3));
        assert_eq!(valid_taps(9, 1, 1, 0, 2, 3), (0, 0));
    }
}
