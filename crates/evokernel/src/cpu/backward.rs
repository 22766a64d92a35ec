//! The CPU backend's backward passes: grad-input (dgrad) and grad-weight (wgrad), the
//! reference CI checks the GPU's against. Deterministic: every result element is summed
//! by one thread in a fixed order.

use rayon::prelude::*;

use super::{conv_cpu, fma, Isa};
use crate::error::Result;
use crate::reference::coords;
use crate::spec::{ConvSpec, Layout};
use crate::tensor::{Element, HostTensor, TensorData};

/// grad-input of `spec`'s forward: `grad_input[n, c, i]` sums `w[c, k] * gy[n, c, o]` over
/// the outputs o and taps k with o * stride + k * dilation - pad_before = i. With unit
/// strides this is the forward convolution of gy with the flipped kernel and mirrored
/// padding (the fast CPU path); otherwise a direct gather.
pub fn dgrad_cpu(
    spec: &ConvSpec,
    grad_output: &HostTensor,
    weight: &HostTensor,
    grad_input: &mut HostTensor,
) -> Result<()> {
    grad_output.expect("grad_output", spec.dtype(), spec.output_len())?;
    weight.expect("weight", spec.dtype(), spec.weight_len())?;
    grad_input.expect("grad_input", spec.dtype(), spec.input_len())?;
    if let Some(twin) = spec.dgrad_twin() {
        let flipped = flip_kernel(spec, weight)?;
        return conv_cpu(&twin, grad_output, &flipped, grad_input);
    }
    let gy = widen(grad_output);
    let w = widen(weight);
    let [kd, kh, kw] = spec.kernel3();
    let values: Vec<f32> = (0..spec.input_len())
        .into_par_iter()
        .map(|i| {
            let (n, c, pos) = coords(spec.layout(), spec.c(), spec.input3(), i);
            let at = |j: usize, k: usize| spec.tap_output(j, pos[j], k);
            let mut sum = 0.0f32;
            for a in 0..kd {
                let Some(od) = at(0, a) else { continue };
                for b in 0..kh {
                    let Some(oh) = at(1, b) else { continue };
                    for e in 0..kw {
                        let Some(ow) = at(2, e) else { continue };
                        sum += w[spec.weight_index(c, a, b, e)]
                            * gy[spec.output_index(n, c, od, oh, ow)];
                    }
                }
            }
            sum
        })
        .collect();
    store(grad_input, &values);
    Ok(())
}

/// grad-weight: `grad_w[c, k]` sums `x[n, c, o * stride + k * dilation - pad] * gy[n, c, o]`
/// over the batch and the outputs whose tap k lands in the input; both layouts read in
/// place. Channels-first: a task per channel (`wgrad_tasks`; per kernel depth too where
/// channels are few) multiplies each grad_output row with the input rows of its KH tap rows
/// shifted by each kw into `L` f32 lanes a tap; channels-last: a task per 16 channels and
/// kernel depth (`wgrad_cl_tasks`), lanes over channels. Lanes are added into f64 totals
/// every `FOLD` output rows (every row, channels-last). The order is fixed: the same bits
/// every run on a machine, whatever its thread count (FMA or not follows the detected ISA,
/// as the forward). (One task per weight element took 825 ms on the seed's shape with 64
/// channels; a dot product per row and tap on operands widened up front, 132-140 ms; this
/// form 40 ms.)
pub fn wgrad_cpu(
    spec: &ConvSpec,
    input: &HostTensor,
    grad_output: &HostTensor,
    grad_weight: &mut HostTensor,
) -> Result<()> {
    wgrad_cpu_with(Isa::detect(), spec, input, grad_output, grad_weight)
}

/// [`wgrad_cpu`] with the vector width and FMA of `isa` (tests compare them).
pub fn wgrad_cpu_with(
    isa: Isa,
    spec: &ConvSpec,
    input: &HostTensor,
    grad_output: &HostTensor,
    grad_weight: &mut HostTensor,
) -> Result<()> {
    input.expect("input", spec.dtype(), spec.input_len())?;
    grad_output.expect("grad_output", spec.dtype(), spec.output_len())?;
    grad_weight.expect("grad_weight", spec.dtype(), spec.weight_len())?;
    isa.check()?;
    // Both layouts are read in place, widened where a task uses them (widening both
    // tensors up front cost ~40% of the pass in allocation, page faults and conversion).
    let channels_last = spec.layout() == Layout::ChannelsLast;
    let values = match (input.data(), grad_output.data()) {
        (TensorData::Bf16(x), TensorData::Bf16(g)) => wgrad_layout(isa, spec, channels_last, x, g),
        (TensorData::F16(x), TensorData::F16(g)) => wgrad_layout(isa, spec, channels_last, x, g),
        (TensorData::F32(x), TensorData::F32(g)) => wgrad_layout(isa, spec, channels_last, x, g),
        _ => unreachable!("`expect` checked both dtypes"),
    };
    store(grad_weight, &values);
    Ok(())
}

/// grad-weight in weight order from `x` and `gy` of either layout.
fn wgrad_layout<T: Element>(
    isa: Isa,
    spec: &ConvSpec,
    channels_last: bool,
    x: &[T],
    gy: &[T],
) -> Vec<f32> {
    if channels_last {
        return wgrad_cl_tasks(isa, spec, x, gy);
    }
    wgrad_tasks(isa, spec, x, gy)
        .into_iter()
        .flatten()
        .collect()
}

/// Channels a channels-last grad-weight task takes: its lanes.
const CL_LANES: usize = 16;

/// grad-weight of channels-last `x` and `gy`, in weight order: a task per block of 16
/// channels and kernel depth, its lanes over channels (a pixel's channels are
/// contiguous), one f32 accumulator vector a tap, folded into f64 every output row.
fn wgrad_cl_tasks<T: Element>(isa: Isa, spec: &ConvSpec, x: &[T], gy: &[T]) -> Vec<f32> {
    let [kd, kh, kw] = spec.kernel3();
    let blocks = spec.c().div_ceil(CL_LANES);
    let tasks: Vec<Vec<[f64; CL_LANES]>> = (0..blocks * kd)
        .into_par_iter()
        .map(|task| {
            let (cb, a) = (task / kd, task % kd);
            // SAFETY: each wrapper is called only when `isa.check` found its features.
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 | Isa::Avx2 => unsafe { wgrad_cl_task_fma(spec, x, gy, cb, a) },
                _ => wgrad_cl_task::<T, false>(spec, x, gy, cb, a),
            }
        })
        .collect();
    let taps = kh * kw;
    let mut values = vec![0f32; spec.weight_len()];
    for (task, sums) in tasks.iter().enumerate() {
        let (cb, a) = (task / kd, task % kd);
        for (t, lanes) in sums.iter().enumerate() {
            for (i, &v) in lanes.iter().enumerate() {
                let c = cb * CL_LANES + i;
                if c < spec.c() {
                    values[(c * kd + a) * taps + t] = v as f32;
                }
            }
        }
    }
    values
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn wgrad_cl_task_fma<T: Element>(
    spec: &ConvSpec,
    x: &[T],
    gy: &[T],
    cb: usize,
    a: usize,
) -> Vec<[f64; CL_LANES]> {
    wgrad_cl_task::<T, true>(spec, x, gy, cb, a)
}

/// The KH x KW taps of kernel depth `a` for channels `cb * 16..`: for every output, its
/// grad_output vector times the input vector each in-bounds tap reads (padded taps are
/// skipped, never multiplied by 0: a non-finite grad_output must not reach them).
#[inline(always)]
fn wgrad_cl_task<T: Element, const FMA: bool>(
    spec: &ConvSpec,
    x: &[T],
    gy: &[T],
    cb: usize,
    a: usize,
) -> Vec<[f64; CL_LANES]> {
    let c = spec.c();
    let (c0, width) = (cb * CL_LANES, (c - cb * CL_LANES).min(CL_LANES));
    let [id_, ih_, iw_] = spec.input3();
    let [od_, oh_, ow_] = spec.output3();
    let [_, kh, kw] = spec.kernel3();
    let mut total = vec![[0f64; CL_LANES]; kh * kw];
    let mut acc = vec![[0f32; CL_LANES]; kh * kw];
    // A row's pixels' channels widened once: [positions][lanes] (zeros past C).
    let widen_row = |t: &[T], at: usize, out: &mut [[f32; CL_LANES]]| {
        for (p, v) in out.iter_mut().enumerate() {
            for (o, &e) in v.iter_mut().zip(&t[(at + p) * c + c0..][..width]) {
                *o = e.to_f32();
            }
        }
    };
    let mut grow = vec![[0f32; CL_LANES]; ow_];
    let mut xrows = vec![[0f32; CL_LANES]; kh * iw_];
    let mut live = vec![false; kh];
    for n in 0..spec.n() {
        for d in 0..od_ {
            let Some(zd) = spec.tap_input(0, d, a) else {
                continue;
            };
            for h in 0..oh_ {
                widen_row(gy, ((n * od_ + d) * oh_ + h) * ow_, &mut grow);
                for (b, (row, ok)) in xrows.chunks_exact_mut(iw_).zip(live.iter_mut()).enumerate() {
                    *ok = false;
                    if let Some(zh) = spec.tap_input(1, h, b) {
                        widen_row(x, ((n * id_ + zd) * ih_ + zh) * iw_, row);
                        *ok = true;
                    }
                }
                // Output by output, every tap: KH x KW independent accumulators.
                for (w, &g) in grow.iter().enumerate() {
                    for b in 0..kh {
                        if !live[b] {
                            continue;
                        }
                        for e in 0..kw {
                            let Some(zw) = spec.tap_input(2, w, e) else {
                                continue;
                            };
                            let xv = xrows[b * iw_ + zw];
                            let s = &mut acc[b * kw + e];
                            for i in 0..CL_LANES {
                                s[i] = fma::<FMA>(g[i], xv[i], s[i]);
                            }
                        }
                    }
                }
                for (t, s) in total.iter_mut().zip(acc.iter_mut()) {
                    for i in 0..CL_LANES {
                        t[i] += s[i] as f64;
                    }
                    *s = [0.0; CL_LANES];
                }
            }
        }
    }
    total
}

/// Every task's weights, in weight order, from channels-first `x` and `gy`.
fn wgrad_tasks<T: Element>(isa: Isa, spec: &ConvSpec, x: &[T], gy: &[T]) -> Vec<Vec<f32>> {
    let [kd, kh, _] = spec.kernel3();
    let threads = rayon::current_num_threads();
    // A task per channel where there are tasks enough for the threads (each grad_output and
    // input plane then widened once for every kernel depth, not once a depth: x3d's
    // grad-weight 73.0 -> 67.8 ms by the medians of four alternating rounds, the seed's
    // 408-434 -> 390-406 ms; build machine, 2026-11-28), else per channel and kernel depth,
    // and where even those are too few, per channel, kernel depth and tap row. The sums of
    // each weight are the same in every split (each kernel depth's in (image, depth, row)
    // order).
    let (depth_tasks, groups) = if spec.c() >= 4 * threads {
        (1, 1)
    } else if spec.c() * kd >= 4 * threads {
        (kd, 1)
    } else {
        (kd, kh)
    };
    (0..spec.c() * depth_tasks * groups)
        .into_par_iter()
        .map(|task| {
            let c = task / (depth_tasks * groups);
            let depths = if depth_tasks == 1 {
                0..kd
            } else {
                let a = (task / groups) % kd;
                a..a + 1
            };
            let q = task % groups;
            let taps = q * kh / groups..(q + 1) * kh / groups;
            // SAFETY: each wrapper is called only when `isa.check` found its features.
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => unsafe { wgrad_task_avx512(spec, x, gy, c, depths, taps) },
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => depths
                    .flat_map(|a| unsafe { wgrad_task_avx2(spec, x, gy, c, a, taps.clone()) })
                    .collect(),
                _ => depths
                    .flat_map(|a| wgrad_task::<T, 8, false>(spec, x, gy, c, a, taps.clone()))
                    .collect(),
            }
        })
        .collect()
}

/// The weights of channel `c`, kernel depths `depths` and tap rows `taps`, in weight order.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn wgrad_task_avx512<T: Element>(
    spec: &ConvSpec,
    x: &[T],
    gy: &[T],
    c: usize,
    depths: std::ops::Range<usize>,
    taps: std::ops::Range<usize>,
) -> Vec<f32> {
    let ([_, ih, iw], [_, oh, ow]) = (spec.input3(), spec.output3());
    if spec.stride3()[2] == 1 && oh >= 8 && oh * ow + ih * iw <= ROWS_IN_REGISTERS_MAX_FLOATS {
        if let Some(t) = wgrad_task_rows_avx512(spec, x, gy, c, depths.clone(), taps.clone()) {
            return t;
        }
    }
    // (A loop, not a closure: a closure would not inherit this function's target
    // features, and the inlined task would lose AVX-512.)
    let mut values = Vec::with_capacity(depths.len() * taps.len() * spec.kernel3()[2]);
    for a in depths {
        values.extend(wgrad_task::<T, 16, true>(spec, x, gy, c, a, taps.clone()));
    }
    values
}

/// Taps of a kernel row whose sums stay in registers together (of AVX-512's 32).
#[cfg(target_arch = "x86_64")]
const ROW_TAPS: usize = 8;

/// [`wgrad_task_rows_avx512`] is taken where a depth's grad-output and input planes
/// together fit this many floats (32 KiB: L1, which it reads each plane from once per
/// kernel row) and there are 8 output rows or more to keep sums in registers across.
/// Measured on this project's build machine (2 vCPUs of an AVX-512 Xeon, 2026-11-27),
/// against the dot-product form: x3d (56 x 56 planes) 0.85x the time, convnext-7x7 0.92x,
/// odd-dilated 0.70x; video-vae-causal's 128 x 128 planes (128 KiB) 1.39x slower, and
/// causal-conv1d's one 2048-wide row 1.14x slower: there the other form's loop, L1-sized
/// rows and unmasked two-chain FMAs win.
#[cfg(target_arch = "x86_64")]
const ROWS_IN_REGISTERS_MAX_FLOATS: usize = 8192;

/// [`wgrad_task`] for unit W stride in AVX-512, with each kernel row's sums in registers
/// across the output rows: per image the channel's input volume, and per output depth its
/// grad-output plane, are widened once for every kernel depth of the task; then for each
/// tap row and group of up to [`ROW_TAPS`] taps, each 16-wide piece of an output row's
/// grad-output is loaded once and met by every tap's shifted input piece, masked to the
/// outputs whose input that tap reads (the masks are the same on every row). The
/// dot-product form loaded both operands for every FMA and stored its sums after every row.
/// Sums are folded into f64 every `FOLD` output rows, as there. None where a tap reads no
/// input at all.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
unsafe fn wgrad_task_rows_avx512<T: Element>(
    spec: &ConvSpec,
    x: &[T],
    gy: &[T],
    c: usize,
    depths: std::ops::Range<usize>,
    taps: std::ops::Range<usize>,
) -> Option<Vec<f32>> {
    let (dil, pad) = (spec.dilation3(), spec.pad_before3());
    let [id_, ih_, iw_] = spec.input3();
    let [od_, oh_, ow_] = spec.output3();
    let kw = spec.kernel3()[2];
    let (ispatial, ospatial) = (id_ * ih_ * iw_, od_ * oh_ * ow_);
    // Tap e reads input column w + off[e] for outputs w in [lo, hi).
    let off: Vec<isize> = (0..kw)
        .map(|e| (e * dil[2]) as isize - pad[2] as isize)
        .collect();
    let pieces = ow_.div_ceil(16);
    // masks[v * kw + e]: the lanes of piece v that tap e reads.
    let mut masks = vec![0u16; pieces * kw];
    for (e, range) in tap_column_ranges(spec).into_iter().enumerate() {
        let (lo, hi, _) = range?;
        // Piece v holds outputs 16v..16v + 16: lanes [lo - 16v, hi - 16v) clamped to 0..16.
        for v in lo / 16..hi.div_ceil(16) {
            let (a, b) = (lo.saturating_sub(16 * v), (hi - 16 * v).min(16));
            masks[v * kw + e] = (((1u32 << b) - 1) & !((1u32 << a) - 1)) as u16;
        }
    }
    let rows = taps.len();
    let mut total = vec![0f64; depths.len() * rows * kw];
    // The image's input volume of the channel widened once (each plane serves every kernel
    // depth that reads it), a grad-output plane once a depth.
    let (mut gplane, mut xvolume) = (vec![0f32; oh_ * ow_], vec![0f32; ispatial]);
    for n in 0..spec.n() {
        let xb = &x[(n * spec.c() + c) * ispatial..][..ispatial];
        let gb = &gy[(n * spec.c() + c) * ospatial..][..ospatial];
        widen_row(xb, &mut xvolume);
        for d in 0..od_ {
            widen_row(&gb[d * oh_ * ow_..][..oh_ * ow_], &mut gplane);
            for (ai, a) in depths.clone().enumerate() {
                let Some(zd) = spec.tap_input(0, d, a) else {
                    continue;
                };
                let planes = RowPlanes {
                    spec,
                    g: &gplane,
                    x: &xvolume[zd * ih_ * iw_..][..ih_ * iw_],
                    off: &off,
                    masks: &masks,
                };
                for (bi, b) in taps.clone().enumerate() {
                    for e0 in (0..kw).step_by(ROW_TAPS) {
                        let at = (ai * rows + bi) * kw;
                        let sums = &mut total[at + e0..at + kw];
                        match (kw - e0).min(ROW_TAPS) {
                            1 => planes.tap_row::<1>(b, e0, sums),
                            2 => planes.tap_row::<2>(b, e0, sums),
                            3 => planes.tap_row::<3>(b, e0, sums),
                            4 => planes.tap_row::<4>(b, e0, sums),
                            5 => planes.tap_row::<5>(b, e0, sums),
                            6 => planes.tap_row::<6>(b, e0, sums),
                            7 => planes.tap_row::<7>(b, e0, sums),
                            _ => planes.tap_row::<8>(b, e0, sums),
                        }
                    }
                }
            }
        }
    }
    Some(total.into_iter().map(|t| t as f32).collect())
}

/// One (image, output depth)'s widened planes and the taps' shifts and masks.
#[cfg(target_arch = "x86_64")]
struct RowPlanes<'a> {
    spec: &'a ConvSpec,
    g: &'a [f32],
    x: &'a [f32],
    off: &'a [isize],
    masks: &'a [u16],
}

#[cfg(target_arch = "x86_64")]
impl RowPlanes<'_> {
    /// Taps e0..e0 + N of kernel row `b` over every output row, their sums (N registers)
    /// added into `total[0..N]` every `FOLD` rows.
    #[inline(always)]
    unsafe fn tap_row<const N: usize>(&self, b: usize, e0: usize, total: &mut [f64]) {
        use std::arch::x86_64::*;
        let [_, _, iw_] = self.spec.input3();
        let [_, oh_, ow_] = self.spec.output3();
        let kw = self.spec.kernel3()[2];
        let mut acc = [_mm512_setzero_ps(); N];
        let fold = |acc: &mut [__m512; N], total: &mut [f64]| {
            for (t, a) in total.iter_mut().zip(acc.iter_mut()) {
                let mut lanes = [0f32; 16];
                _mm512_storeu_ps(lanes.as_mut_ptr(), *a);
                *t += lanes.iter().map(|&v| v as f64).sum::<f64>();
                *a = _mm512_setzero_ps();
            }
        };
        let mut pending = 0;
        for h in 0..oh_ {
            let Some(zh) = self.spec.tap_input(1, h, b) else {
                continue;
            };
            let g = self.g.as_ptr().add(h * ow_);
            let xr = self.x.as_ptr().add(zh * iw_);
            // Tap e's input, shifted so that its element w pairs with output w (read only
            // where the tap's mask has w).
            let xs: [*const f32; N] = std::array::from_fn(|e| xr.wrapping_offset(self.off[e0 + e]));
            for v in 0..ow_.div_ceil(16) {
                let w = 16 * v;
                let rest = ow_ - w;
                let gm: __mmask16 = if rest >= 16 {
                    0xFFFF
                } else {
                    ((1u32 << rest) - 1) as u16
                };
                let gv = _mm512_maskz_loadu_ps(gm, g.add(w));
                let m = &self.masks[v * kw + e0..];
                for e in 0..N {
                    let xv = _mm512_maskz_loadu_ps(m[e], xs[e].wrapping_add(w));
                    acc[e] = _mm512_mask3_fmadd_ps(gv, xv, acc[e], m[e]);
                }
            }
            pending += 1;
            if pending == FOLD {
                fold(&mut acc, total);
                pending = 0;
            }
        }
        fold(&mut acc, total);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn wgrad_task_avx2<T: Element>(
    spec: &ConvSpec,
    x: &[T],
    gy: &[T],
    c: usize,
    a: usize,
    taps: std::ops::Range<usize>,
) -> Vec<f32> {
    wgrad_task::<T, 8, true>(spec, x, gy, c, a, taps)
}

/// `acc` plus the products of `g` and `x` (at least `L` long) in `L` lanes: whole vectors,
/// then the last `L` products with the lanes already summed masked off (a scalar tail
/// loop, or a zero-padded copy, was half the time: most taps' ranges are OW - 1 or 2).
#[inline(always)]
fn row_taps<const L: usize, const FMA: bool>(acc: &mut [f32; L], g: &[f32], x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if L == 16 && FMA {
        // SAFETY: L == 16 with FMA is only built inside wgrad_task_avx512 (avx512f).
        unsafe { row_taps_avx512(acc.as_mut_ptr(), g, x) };
        return;
    }
    let len = g.len();
    for (gv, xv) in g.chunks_exact(L).zip(x.chunks_exact(L)) {
        for i in 0..L {
            acc[i] = fma::<FMA>(gv[i], xv[i], acc[i]);
        }
    }
    for j in len - len % L..len {
        acc[j % L] = fma::<FMA>(g[j], x[j], acc[j % L]);
    }
}

/// [`row_taps`] in 16 AVX-512 lanes; the tail as one masked load and FMA (no scalar loop).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn row_taps_avx512(acc: *mut f32, g: &[f32], x: &[f32]) {
    use std::arch::x86_64::*;
    let len = g.len().min(x.len());
    // Two chains: one FMA chain waits 4 cycles a vector on rows of ~5 vectors.
    let mut a = _mm512_loadu_ps(acc);
    let mut b = _mm512_setzero_ps();
    let mut j = 0;
    while j + 32 <= len {
        a = _mm512_fmadd_ps(
            _mm512_loadu_ps(g.as_ptr().add(j)),
            _mm512_loadu_ps(x.as_ptr().add(j)),
            a,
        );
        b = _mm512_fmadd_ps(
            _mm512_loadu_ps(g.as_ptr().add(j + 16)),
            _mm512_loadu_ps(x.as_ptr().add(j + 16)),
            b,
        );
        j += 32;
    }
    if j + 16 <= len {
        a = _mm512_fmadd_ps(
            _mm512_loadu_ps(g.as_ptr().add(j)),
            _mm512_loadu_ps(x.as_ptr().add(j)),
            a,
        );
        j += 16;
    }
    a = _mm512_add_ps(a, b);
    if j < len {
        let m: __mmask16 = (1u32 << (len - j)) as u16 - 1;
        let gv = _mm512_maskz_loadu_ps(m, g.as_ptr().add(j));
        let xv = _mm512_maskz_loadu_ps(m, x.as_ptr().add(j));
        a = _mm512_mask3_fmadd_ps(gv, xv, a, m);
    }
    _mm512_storeu_ps(acc, a);
}

/// Output rows whose products a tap's f32 lanes hold before they are added into its f64
/// total (at most FOLD * ceil(OW / L) terms a lane).
const FOLD: usize = 16;

/// Each kernel-column tap's outputs along W whose input lands inside the row: [lo, hi)
/// and that range's first input column; None where the tap reads no input.
fn tap_column_ranges(spec: &ConvSpec) -> Vec<Option<(usize, usize, usize)>> {
    let (stride, dil, pad) = (
        spec.stride3()[2],
        spec.dilation3()[2],
        spec.pad_before3()[2],
    );
    let (iw, ow) = (spec.input3()[2], spec.output3()[2]);
    (0..spec.kernel3()[2])
        .map(|e| {
            let off = (e * dil) as i64 - pad as i64;
            let lo = if off >= 0 {
                0
            } else {
                ((-off) as usize).div_ceil(stride)
            };
            let last = iw as i64 - 1 - off;
            if last < 0 {
                return None;
            }
            let hi = (last as usize / stride + 1).min(ow);
            (lo < hi).then(|| (lo, hi, ((lo * stride) as i64 + off) as usize))
        })
        .collect()
}

/// The weights of channel `c`, kernel depth `a` and tap rows `taps` (kh), KW a row: `L`
/// lanes a tap (product i of a row goes to lane i % L), folded into f64 every `FOLD`
/// output rows and at the end.
#[inline(always)]
fn wgrad_task<T: Element, const L: usize, const FMA: bool>(
    spec: &ConvSpec,
    x: &[T],
    gy: &[T],
    c: usize,
    a: usize,
    taps: std::ops::Range<usize>,
) -> Vec<f32> {
    let stride = spec.stride3();
    let [id_, ih_, iw_] = spec.input3();
    let [od_, oh_, ow_] = spec.output3();
    let kw = spec.kernel3()[2];
    let (ispatial, ospatial) = (id_ * ih_ * iw_, od_ * oh_ * ow_);
    let ranges = tap_column_ranges(spec);
    let rows = taps.len();
    let mut total = vec![0f64; rows * kw];
    let mut lanes = vec![[0f32; L]; rows * kw];
    let mut pending = 0;
    let (mut g, mut xr) = (vec![0f32; ow_], vec![0f32; iw_]);
    let fold = |total: &mut [f64], lanes: &mut [[f32; L]]| {
        for (t, l) in total.iter_mut().zip(lanes.iter_mut()) {
            *t += l.iter().map(|&v| v as f64).sum::<f64>();
            *l = [0.0; L];
        }
    };
    for n in 0..spec.n() {
        let xb = &x[(n * spec.c() + c) * ispatial..][..ispatial];
        let gb = &gy[(n * spec.c() + c) * ospatial..][..ospatial];
        for d in 0..od_ {
            let Some(zd) = spec.tap_input(0, d, a) else {
                continue;
            };
            for h in 0..oh_ {
                widen_row(&gb[(d * oh_ + h) * ow_..][..ow_], &mut g);
                for (b, row_lanes) in taps.clone().zip(lanes.chunks_exact_mut(kw)) {
                    let Some(zh) = spec.tap_input(1, h, b) else {
                        continue;
                    };
                    widen_row(&xb[(zd * ih_ + zh) * iw_..][..iw_], &mut xr);
                    for (acc, range) in row_lanes.iter_mut().zip(&ranges) {
                        let Some((lo, hi, start)) = *range else {
                            continue;
                        };
                        if stride[2] == 1 {
                            row_taps::<L, FMA>(acc, &g[lo..hi], &xr[start..start + hi - lo]);
                        } else {
                            for (i, w) in (lo..hi).enumerate() {
                                let v = xr[start + i * stride[2]];
                                acc[i % L] = fma::<FMA>(g[w], v, acc[i % L]);
                            }
                        }
                    }
                }
                pending += 1;
                if pending == FOLD {
                    fold(&mut total, &mut lanes);
                    pending = 0;
                }
            }
        }
    }
    fold(&mut total, &mut lanes);
    total.into_iter().map(|t| t as f32).collect()
}

/// grad-bias of the fused epilogue: `grad_b[c]` sums `gy[n, c, o]` over the batch and
/// the outputs (in f64, one task per channel, fixed order).
pub fn bias_grad_cpu(
    spec: &ConvSpec,
    grad_output: &HostTensor,
    grad_bias: &mut HostTensor,
) -> Result<()> {
    grad_output.expect("grad_output", spec.dtype(), spec.output_len())?;
    grad_bias.expect("grad_bias", spec.dtype(), spec.c())?;
    let [od, oh, ow] = spec.output3();
    let values: Vec<f32> = (0..spec.c())
        .into_par_iter()
        .map(|c| {
            let mut total = 0.0f64;
            for n in 0..spec.n() {
                for d in 0..od {
                    for h in 0..oh {
                        for w in 0..ow {
                            total += grad_output.get_f64(spec.output_index(n, c, d, h, w));
                        }
                    }
                }
            }
            total as f32
        })
        .collect();
    store(grad_bias, &values);
    Ok(())
}

/// The weight with every kernel dim reversed (w[c, K - 1 - k]).
pub fn flip_kernel(spec: &ConvSpec, weight: &HostTensor) -> Result<HostTensor> {
    let mut flipped = weight.clone();
    let [kd, kh, kw] = spec.kernel3();
    for c in 0..spec.c() {
        for a in 0..kd {
            for b in 0..kh {
                for e in 0..kw {
                    let v =
                        weight.get_f64(spec.weight_index(c, kd - 1 - a, kh - 1 - b, kw - 1 - e));
                    flipped.set_f64(spec.weight_index(c, a, b, e), v);
                }
            }
        }
    }
    Ok(flipped)
}

/// The tensor's elements as f32 (one match on the dtype, then a slice conversion: an
/// element-wise `get_f64` made widening most of the CPU grad-weight's time).
/// `src` as f32 into `dst` (as long).
#[inline(always)]
fn widen_row<T: Element>(src: &[T], dst: &mut [f32]) {
    for (d, &v) in dst.iter_mut().zip(src) {
        *d = v.to_f32();
    }
}

fn widen(t: &HostTensor) -> Vec<f32> {
    use half::slice::HalfFloatSliceExt;
    match t.data() {
        TensorData::F32(v) => v.clone(),
        TensorData::Bf16(v) => v.to_f32_vec(),
        TensorData::F16(v) => v.to_f32_vec(),
    }
}

fn store(t: &mut HostTensor, values: &[f32]) {
    match t.data_mut() {
        TensorData::F32(v) => f32::store_f32_slice(values, v),
        TensorData::Bf16(v) => half::bf16::store_f32_slice(values, v),
        TensorData::F16(v) => half::f16::store_f32_slice(values, v),
    }
}
