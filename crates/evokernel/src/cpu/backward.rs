//! The CPU backend's backward passes: grad-input (dgrad) and grad-weight (wgrad), the
//! reference CI checks the GPU's against. Deterministic: every result element is summed
//! by one thread in a fixed order.

use rayon::prelude::*;

use super::conv_cpu;
use crate::error::Result;
use crate::reference::coords;
use crate::spec::ConvSpec;
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
/// over the batch and the outputs whose tap k lands in the input. One task per channel
/// and tap row (kd, kh): for each output row it takes the dot products of the
/// grad_output row with the input row shifted by each kw (contiguous slices with unit W
/// stride, summed in 8 f32 lanes so they vectorize), rows summed in f32 and added in f64.
/// The order is fixed: the same bits every run. (The first version, one task per weight
/// element with per-element index arithmetic, took 825 ms where the forward takes 24.)
pub fn wgrad_cpu(
    spec: &ConvSpec,
    input: &HostTensor,
    grad_output: &HostTensor,
    grad_weight: &mut HostTensor,
) -> Result<()> {
    input.expect("input", spec.dtype(), spec.input_len())?;
    grad_output.expect("grad_output", spec.dtype(), spec.output_len())?;
    grad_weight.expect("grad_weight", spec.dtype(), spec.weight_len())?;
    // Both operands channels-first in f32, so every row is a contiguous slice.
    let x = channels_first_f32(spec, input, spec.input3());
    let gy = channels_first_f32(spec, grad_output, spec.output3());
    let (stride, dil, pad) = (spec.stride3(), spec.dilation3(), spec.pad_before3());
    let [id_, ih_, iw_] = spec.input3();
    let [od_, oh_, ow_] = spec.output3();
    let [kd, kh, kw] = spec.kernel3();
    let (ispatial, ospatial) = (id_ * ih_ * iw_, od_ * oh_ * ow_);
    let rows: Vec<Vec<f32>> = (0..spec.c() * kd * kh)
        .into_par_iter()
        .map(|task| {
            let (c, a, b) = (task / (kd * kh), (task / kh) % kd, task % kh);
            let mut total = vec![0f64; kw];
            let mut row_sum = vec![0f32; kw];
            for n in 0..spec.n() {
                let xb = &x[(n * spec.c() + c) * ispatial..][..ispatial];
                let gb = &gy[(n * spec.c() + c) * ospatial..][..ospatial];
                for d in 0..od_ {
                    let Some(zd) = spec.tap_input(0, d, a) else {
                        continue;
                    };
                    for h in 0..oh_ {
                        let Some(zh) = spec.tap_input(1, h, b) else {
                            continue;
                        };
                        let g = &gb[(d * oh_ + h) * ow_..][..ow_];
                        let xr = &xb[(zd * ih_ + zh) * iw_..][..iw_];
                        row_sum.iter_mut().for_each(|v| *v = 0.0);
                        for (e, acc) in row_sum.iter_mut().enumerate() {
                            // Outputs w whose tap e lands inside the row.
                            let off = (e * dil[2]) as i64 - pad[2] as i64;
                            let lo = if off >= 0 {
                                0
                            } else {
                                ((-off) as usize).div_ceil(stride[2])
                            };
                            let last = iw_ as i64 - 1 - off;
                            if last < 0 {
                                continue;
                            }
                            let hi = (last as usize / stride[2] + 1).min(ow_);
                            if lo >= hi {
                                continue;
                            }
                            let start = (lo * stride[2]) as i64 + off;
                            *acc = if stride[2] == 1 {
                                dot(&g[lo..hi], &xr[start as usize..start as usize + hi - lo])
                            } else {
                                (lo..hi)
                                    .map(|w| g[w] * xr[((w * stride[2]) as i64 + off) as usize])
                                    .sum()
                            };
                        }
                        for (t, r) in total.iter_mut().zip(&row_sum) {
                            *t += *r as f64;
                        }
                    }
                }
            }
            total.into_iter().map(|t| t as f32).collect()
        })
        .collect();
    let values: Vec<f32> = rows.into_iter().flatten().collect();
    store(grad_weight, &values);
    Ok(())
}

/// A dot product in 8 f32 lanes (a fixed order, so it vectorizes and repeats exactly).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for ((lane, p), q) in lanes.iter_mut().zip(x).zip(y) {
            *lane += p * q;
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    lanes.iter().sum::<f32>() + tail
}

/// A tensor of `spec`'s layout with spatial sizes `dims` as f32 in [N, C, D, H, W] order.
fn channels_first_f32(spec: &ConvSpec, t: &HostTensor, dims: [usize; 3]) -> Vec<f32> {
    let v = widen(t);
    if spec.layout() == crate::spec::Layout::ChannelsFirst {
        return v;
    }
    // A task per 16 channels of one sample: each reads a 64-byte run of channels per
    // position (every cache line of the input once) and writes 16 output rows.
    const GROUP: usize = 16;
    let (c, spatial) = (spec.c(), dims[0] * dims[1] * dims[2]);
    let mut out = vec![0f32; v.len()];
    out.par_chunks_mut(spatial * c)
        .enumerate()
        .for_each(|(n, sample)| {
            sample
                .par_chunks_mut(GROUP * spatial)
                .enumerate()
                .for_each(|(g, rows)| {
                    let c0 = g * GROUP;
                    let width = (c - c0).min(GROUP);
                    for p in 0..spatial {
                        let src = &v[(n * spatial + p) * c + c0..][..width];
                        for (k, &x) in src.iter().enumerate() {
                            rows[k * spatial + p] = x;
                        }
                    }
                });
        });
    out
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
