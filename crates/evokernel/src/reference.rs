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
    let [od, oh, ow] = spec.output3();
    let c_count = spec.c();
    let (n, c, d, h, wi) = match spec.layout() {
        Layout::ChannelsFirst => {
            let wi = i % ow;
            let h = (i / ow) % oh;
            let d = (i / (ow * oh)) % od;
            let c = (i / (ow * oh * od)) % c_count;
            let n = i / (ow * oh * od * c_count);
            (n, c, d, h, wi)
        }
        Layout::ChannelsLast => {
            let c = i % c_count;
            let wi = (i / c_count) % ow;
            let h = (i / (c_count * ow)) % oh;
            let d = (i / (c_count * ow * oh)) % od;
            let n = i / (c_count * ow * oh * od);
            (n, c, d, h, wi)
        }
    };
    let out = [d, h, wi];
    let [kd, kh, kw] = spec.kernel3();
    let (stride, dil, pad, inp) = (
        spec.stride3(),
        spec.dilation3(),
        spec.pad_before3(),
        spec.input3(),
    );
    // Input coordinate of tap k along dim j, or None if it lands in the padding.
    let at = |j: usize, k: usize| -> Option<usize> {
        let pos = (out[j] * stride[j] + k * dil[j]) as i64 - pad[j] as i64;
        (pos >= 0 && (pos as usize) < inp[j]).then_some(pos as usize)
    };
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
