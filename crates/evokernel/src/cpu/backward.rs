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
/// over the batch and the outputs whose tap k lands in the input. One task per weight
/// element; rows summed in f32, rows added in f64 (the order is fixed).
pub fn wgrad_cpu(
    spec: &ConvSpec,
    input: &HostTensor,
    grad_output: &HostTensor,
    grad_weight: &mut HostTensor,
) -> Result<()> {
    input.expect("input", spec.dtype(), spec.input_len())?;
    grad_output.expect("grad_output", spec.dtype(), spec.output_len())?;
    grad_weight.expect("grad_weight", spec.dtype(), spec.weight_len())?;
    let x = widen(input);
    let gy = widen(grad_output);
    let (stride, dil, pad, inp) = (
        spec.stride3(),
        spec.dilation3(),
        spec.pad_before3(),
        spec.input3(),
    );
    let [_, kh, kw] = spec.kernel3();
    let [od, oh, ow] = spec.output3();
    let values: Vec<f32> = (0..spec.weight_len())
        .into_par_iter()
        .map(|i| {
            let (c, tap) = (i / spec.taps(), i % spec.taps());
            let k = [tap / (kh * kw), (tap / kw) % kh, tap % kw];
            // Outputs along each dim whose tap k lands inside the input.
            let range = |j: usize, o: usize| -> (usize, usize) {
                // o * s + k * d - p in [0, inp): o from ceil((p - k d) / s) on.
                let first = (pad[j] as i64 - (k[j] * dil[j]) as i64).max(0) as usize;
                let lo = first.div_ceil(stride[j]);
                let last = inp[j] as i64 - 1 + pad[j] as i64 - (k[j] * dil[j]) as i64;
                let hi = if last < 0 {
                    0
                } else {
                    (last as usize / stride[j] + 1).min(o)
                };
                (lo.min(hi), hi)
            };
            let ((d0, d1), (h0, h1), (w0, w1)) = (range(0, od), range(1, oh), range(2, ow));
            let mut total = 0.0f64;
            for n in 0..spec.n() {
                for d in d0..d1 {
                    let zd = d * stride[0] + k[0] * dil[0] - pad[0];
                    for h in h0..h1 {
                        let zh = h * stride[1] + k[1] * dil[1] - pad[1];
                        let mut row = 0.0f32;
                        for w in w0..w1 {
                            let zw = w * stride[2] + k[2] * dil[2] - pad[2];
                            row += x[spec.input_index(n, c, zd, zh, zw)]
                                * gy[spec.output_index(n, c, d, h, w)];
                        }
                        total += row as f64;
                    }
                }
            }
            total as f32
        })
        .collect();
    store(grad_weight, &values);
    Ok(())
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

fn widen(t: &HostTensor) -> Vec<f32> {
    (0..t.len()).map(|i| t.get_f64(i) as f32).collect()
}

fn store(t: &mut HostTensor, values: &[f32]) {
    match t.data_mut() {
        TensorData::F32(v) => f32::store_f32_slice(values, v),
        TensorData::Bf16(v) => half::bf16::store_f32_slice(values, v),
        TensorData::F16(v) => half::f16::store_f32_slice(values, v),
    }
}
