//! The f64 oracle: the plainest correct depthwise convolution, used only as the truth.
//! Every output element is computed on its own from its coordinates; nothing is tiled,
//! reordered or cached.

use rayon::prelude::*;

use crate::error::Result;
use crate::spec::{ConvSpec, Layout};
use crate::tensor::HostTensor;

/// `y[n,c,o] = sum_k w[c,k] * x[n, c, o*stride + k*dilation - pad_before]`, taps that
/// fall in the padding contribute nothing. Output is in the spec's layout.
pub fn conv_reference(
    spec: &ConvSpec,
    input: &HostTensor,
    weight: &HostTensor,
) -> Result<Vec<f64>> {
    input.expect("input", spec.dtype(), spec.input_len())?;
    weight.expect("weight", spec.dtype(), spec.weight_len())?;
    let x = input.to_f64_vec();
    let w = weight.to_f64_vec();
    let mut y = vec![0.0f64; spec.output_len()];
    y.par_iter_mut().enumerate().for_each(|(i, out)| {
        *out = output_element(spec, &x, &w, i);
    });
    Ok(y)
}

fn output_element(spec: &ConvSpec, x: &[f64], w: &[f64], i: usize) -> f64 {
    let (n, c, [d, h, wi]) = coords(spec.layout(), spec.c(), spec.output3(), i);
    let out = [d, h, wi];
    let [kd, kh, kw] = spec.kernel3();
    // Input coordinate of tap k along dim j, or None if it lands in the padding.
    let at = |j: usize, k: usize| spec.tap_input(j, out[j], k);
    let mut sum = 0.0;
    for a in 0..kd {
        let Some(id) = at(0, a) else { continue };
        for b in 0..kh {
            let Some(ih) = at(1, b) else { continue };
            for e in 0..kw {
                let Some(iw) = at(2, e) else { continue };
                sum += w[spec.weight_index(c, a, b, e)] * x[spec.input_index(n, c, id, ih, iw)];
            }
        }
    }
    sum
}

/// (n, c, d, h, w) of flat index `i` of a tensor of spatial sizes `dims` in `layout`.
pub(crate) fn coords(
    layout: Layout,
    channels: usize,
    dims: [usize; 3],
    i: usize,
) -> (usize, usize, [usize; 3]) {
    let [dd, hh, ww] = dims;
    match layout {
        Layout::ChannelsFirst => {
            let w = i % ww;
            let h = (i / ww) % hh;
            let d = (i / (ww * hh)) % dd;
            let c = (i / (ww * hh * dd)) % channels;
            (i / (ww * hh * dd * channels), c, [d, h, w])
        }
        Layout::ChannelsLast => {
            let c = i % channels;
            let w = (i / channels) % ww;
            let h = (i / (channels * ww)) % hh;
            let d = (i / (channels * ww * hh)) % dd;
            (i / (channels * ww * hh * dd), c, [d, h, w])
        }
    }
}

/// The gradient of the forward with respect to its input (grad-input, "dgrad"): input
/// element x[n, c, i] receives w[c, k] * gy[n, c, o] from every output o and tap k with
/// o * stride + k * dilation - pad_before = i. Input-shaped, in the spec's layout.
pub fn dgrad_reference(
    spec: &ConvSpec,
    grad_output: &HostTensor,
    weight: &HostTensor,
) -> Result<Vec<f64>> {
    grad_output.expect("grad_output", spec.dtype(), spec.output_len())?;
    weight.expect("weight", spec.dtype(), spec.weight_len())?;
    let gy = grad_output.to_f64_vec();
    let w = weight.to_f64_vec();
    let [kd, kh, kw] = spec.kernel3();
    let mut gx = vec![0.0f64; spec.input_len()];
    gx.par_iter_mut().enumerate().for_each(|(i, g)| {
        let (n, c, pos) = coords(spec.layout(), spec.c(), spec.input3(), i);
        // Output coordinate along dim j that tap k of reaches input position pos[j].
        let at = |j: usize, k: usize| spec.tap_output(j, pos[j], k);
        let mut sum = 0.0;
        for a in 0..kd {
            let Some(od) = at(0, a) else { continue };
            for b in 0..kh {
                let Some(oh) = at(1, b) else { continue };
                for e in 0..kw {
                    let Some(ow) = at(2, e) else { continue };
                    sum +=
                        w[spec.weight_index(c, a, b, e)] * gy[spec.output_index(n, c, od, oh, ow)];
                }
            }
        }
        *g = sum;
    });
    Ok(gx)
}

/// The gradient with respect to the weight (grad-weight, "wgrad"): w[c, k] receives
/// x[n, c, o * stride + k * dilation - pad] * gy[n, c, o] summed over the batch and every
/// output whose tap k lands inside the input. Weight-shaped `[C, 1, KD, KH, KW]`.
pub fn wgrad_reference(
    spec: &ConvSpec,
    input: &HostTensor,
    grad_output: &HostTensor,
) -> Result<Vec<f64>> {
    input.expect("input", spec.dtype(), spec.input_len())?;
    grad_output.expect("grad_output", spec.dtype(), spec.output_len())?;
    let x = input.to_f64_vec();
    let gy = grad_output.to_f64_vec();
    let [_, kh, kw] = spec.kernel3();
    let [od, oh, ow] = spec.output3();
    let mut gw = vec![0.0f64; spec.weight_len()];
    gw.par_iter_mut().enumerate().for_each(|(i, g)| {
        let (c, tap) = (i / spec.taps(), i % spec.taps());
        let k = [tap / (kh * kw), (tap / kw) % kh, tap % kw];
        let at = |j: usize, o: usize| spec.tap_input(j, o, k[j]);
        let mut sum = 0.0;
        for n in 0..spec.n() {
            for d in 0..od {
                let Some(zd) = at(0, d) else { continue };
                for h in 0..oh {
                    let Some(zh) = at(1, h) else { continue };
                    for w in 0..ow {
                        let Some(zw) = at(2, w) else { continue };
                        sum += x[spec.input_index(n, c, zd, zh, zw)]
                            * gy[spec.output_index(n, c, d, h, w)];
                    }
                }
            }
        }
        *g = sum;
    });
    Ok(gw)
}

/// The gradient with respect to the bias: gy summed per channel over batch and space.
pub fn bias_grad_reference(spec: &ConvSpec, grad_output: &HostTensor) -> Result<Vec<f64>> {
    grad_output.expect("grad_output", spec.dtype(), spec.output_len())?;
    let mut gb = vec![0.0f64; spec.c()];
    for i in 0..grad_output.len() {
        let (_, c, _) = coords(spec.layout(), spec.c(), spec.output3(), i);
        gb[c] += grad_output.get_f64(i);
    }
    Ok(gb)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ConvParams, DType};
    use crate::tensor::TensorData;

    fn f32_tensor(shape: &[usize], v: Vec<f32>) -> HostTensor {
        HostTensor::from_data(shape, TensorData::F32(v)).unwrap()
    }

    #[test]
    fn conv1d_by_hand_with_asymmetric_padding() {
        // x = [1 2 3 4], w = [1 10 100], padding (2, 0): causal conv
        let spec = ConvParams {
            n: 1,
            c: 1,
            input: vec![4],
            kernel: vec![3],
            stride: vec![],
            dilation: vec![],
            padding: vec![[2, 0]],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        }
        .validate()
        .unwrap();
        let x = f32_tensor(&[1, 1, 4], vec![1.0, 2.0, 3.0, 4.0]);
        let w = f32_tensor(&[1, 1, 3], vec![1.0, 10.0, 100.0]);
        let y = conv_reference(&spec, &x, &w).unwrap();
        // y[0] = 100*1; y[1] = 10*1 + 100*2; y[2] = 1 + 20 + 300; y[3] = 2 + 30 + 400
        assert_eq!(y, vec![100.0, 210.0, 321.0, 432.0]);
    }

    #[test]
    fn conv1d_stride_and_dilation_by_hand() {
        let spec = ConvParams {
            n: 1,
            c: 2,
            input: vec![7],
            kernel: vec![2],
            stride: vec![2],
            dilation: vec![3],
            padding: vec![[1, 1]],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        }
        .validate()
        .unwrap();
        // padded length 9, span 4 -> outputs (9-4)/2+1 = 3
        assert_eq!(spec.output_dims(), &[3]);
        let x = f32_tensor(&[1, 2, 7], (1..=14).map(|v| v as f32).collect());
        let w = f32_tensor(&[2, 1, 2], vec![1.0, 2.0, -1.0, 1.0]);
        let y = conv_reference(&spec, &x, &w).unwrap();
        // channel 0: x = 1..7. out o uses input positions 2o-1 and 2o+2.
        // o0: pad, x[2]=3 -> 2*3 = 6; o1: x[1]=2, x[4]=5 -> 2 + 10 = 12; o2: x[3]=4, x[6]=7 -> 4 + 14 = 18
        // channel 1: x = 8..14: o0: x[2]=10 -> 10; o1: -9 + 12 = 3; o2: -11 + 14 = 3
        assert_eq!(y, vec![6.0, 12.0, 18.0, 10.0, 3.0, 3.0]);
    }

    #[test]
    fn conv2d_channels_last_matches_channels_first_by_hand() {
        // 3x3 input of one channel with a 2x2 box filter, no padding.
        let base = ConvParams {
            n: 1,
            c: 2,
            input: vec![3, 3],
            kernel: vec![2, 2],
            stride: vec![],
            dilation: vec![],
            padding: vec![],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        };
        let cf = base.validate().unwrap();
        let x_cf: Vec<f32> = (0..18).map(|v| v as f32).collect();
        let w = f32_tensor(&[2, 1, 2, 2], vec![1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, -1.0]);
        let y = conv_reference(&cf, &f32_tensor(&[1, 2, 3, 3], x_cf.clone()), &w).unwrap();
        // channel 0 box sums: [0+1+3+4, 1+2+4+5, 3+4+6+7, 4+5+7+8]
        // channel 1 (values 9..17): x[h][w] - x[h+1][w+1] = -4 everywhere
        assert_eq!(y, vec![8.0, 12.0, 20.0, 24.0, -4.0, -4.0, -4.0, -4.0]);

        let cl = ConvParams {
            layout: Layout::ChannelsLast,
            ..base
        }
        .validate()
        .unwrap();
        let mut x_cl = vec![0.0f32; 18];
        for c in 0..2 {
            for p in 0..9 {
                x_cl[p * 2 + c] = x_cf[c * 9 + p];
            }
        }
        let y = conv_reference(&cl, &f32_tensor(&[1, 3, 3, 2], x_cl), &w).unwrap();
        assert_eq!(y, vec![8.0, -4.0, 12.0, -4.0, 20.0, -4.0, 24.0, -4.0]);
    }

    #[test]
    fn conv3d_single_tap_is_scaled_copy() {
        let spec = ConvParams {
            n: 2,
            c: 3,
            input: vec![2, 3, 4],
            kernel: vec![1, 1, 1],
            stride: vec![],
            dilation: vec![],
            padding: vec![],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        }
        .validate()
        .unwrap();
        let x = HostTensor::random_normal(DType::F32, &spec.input_shape(), 1);
        let w = f32_tensor(&[3, 1, 1, 1, 1], vec![2.0, -1.0, 0.5]);
        let y = conv_reference(&spec, &x, &w).unwrap();
        for (i, &v) in y.iter().enumerate() {
            let c = (i / 24) % 3;
            assert_eq!(v, x.get_f64(i) * [2.0, -1.0, 0.5][c]);
        }
    }

    /// The backward oracles are the forward's adjoints: <conv(x, w), gy> = <x, dgrad(gy, w)>
    /// = <w, wgrad(x, gy)>, on specs with stride, dilation, asymmetric padding, batch and
    /// both layouts (f32 inputs, sums in f64: equal to rounding).
    #[test]
    fn backward_oracles_are_the_forwards_adjoints() {
        let specs = [
            (
                vec![9],
                vec![3],
                vec![2],
                vec![2],
                vec![[2, 1]],
                Layout::ChannelsFirst,
            ),
            (
                vec![7, 10],
                vec![3, 2],
                vec![1, 3],
                vec![2, 1],
                vec![[1, 2], [0, 1]],
                Layout::ChannelsLast,
            ),
            (
                vec![4, 6, 8],
                vec![3, 3, 5],
                vec![1, 2, 1],
                vec![1, 1, 2],
                vec![[0, 0], [1, 1], [2, 2]],
                Layout::ChannelsFirst,
            ),
            (
                vec![5, 5, 5],
                vec![2, 2, 2],
                vec![2, 2, 2],
                vec![1, 1, 1],
                vec![[1, 0], [0, 1], [1, 1]],
                Layout::ChannelsLast,
            ),
        ];
        for (i, (input, kernel, stride, dilation, padding, layout)) in specs.into_iter().enumerate()
        {
            let spec = ConvParams {
                n: 2,
                c: 3,
                input,
                kernel,
                stride,
                dilation,
                padding,
                layout,
                dtype: DType::F32,
            }
            .validate()
            .unwrap();
            let x = HostTensor::random_normal(DType::F32, &spec.input_shape(), i as u64);
            let w = HostTensor::random_normal(DType::F32, &spec.weight_shape(), 10 + i as u64);
            let gy = HostTensor::random_normal(DType::F32, &spec.output_shape(), 20 + i as u64);
            let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f64>();
            let forward = dot(&conv_reference(&spec, &x, &w).unwrap(), &gy.to_f64_vec());
            let via_dgrad = dot(&x.to_f64_vec(), &dgrad_reference(&spec, &gy, &w).unwrap());
            let via_wgrad = dot(&w.to_f64_vec(), &wgrad_reference(&spec, &x, &gy).unwrap());
            assert!(
                (forward - via_dgrad).abs() < 1e-9 * forward.abs().max(1.0),
                "{spec}: {forward} vs {via_dgrad}"
            );
            assert!(
                (forward - via_wgrad).abs() < 1e-9 * forward.abs().max(1.0),
                "{spec}: {forward} vs {via_wgrad}"
            );
            // The bias's gradient is gy summed per channel.
            let gb = bias_grad_reference(&spec, &gy).unwrap();
            let total: f64 = gy.to_f64_vec().iter().sum();
            assert!((gb.iter().sum::<f64>() - total).abs() < 1e-9 * total.abs().max(1.0));
        }
    }

    #[test]
    fn rejects_tensors_of_wrong_size() {
        let spec = ConvParams::seed()
            .validate()
            .unwrap()
            .with_dtype(DType::F32);
        let x = HostTensor::zeros(DType::F32, &[10]);
        let w = HostTensor::zeros(DType::F32, &[10]);
        assert!(conv_reference(&spec, &x, &w).is_err());
    }
}
