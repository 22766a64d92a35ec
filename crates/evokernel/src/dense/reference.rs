//! The f64 oracle of dense and grouped convolution: each output element on its own from
//! its coordinates, written for clarity, never for speed.

use rayon::prelude::*;

use super::spec::DenseConvSpec;
use crate::error::Result;
use crate::reference::coords;
use crate::tensor::HostTensor;

/// `y[n, co, o] = sum_{ci, k} w[co, ci, k] * x[n, g*cpg + ci, o*stride + k*dilation - pad]`
/// where `g` is `co`'s group and `ci` runs over the group's input channels; padding taps
/// contribute nothing. Output in the spec's layout.
pub fn dense_reference(
    spec: &DenseConvSpec,
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

/// The oracle at flat output positions only (a large case's sample), reading the
/// tensors in place.
pub fn dense_reference_at(
    spec: &DenseConvSpec,
    input: &HostTensor,
    weight: &HostTensor,
    positions: &[usize],
) -> Result<Vec<f64>> {
    input.expect("input", spec.dtype(), spec.input_len())?;
    weight.expect("weight", spec.dtype(), spec.weight_len())?;
    if let Some(&p) = positions.iter().find(|&&p| p >= spec.output_len()) {
        return Err(crate::error::Error::TensorMismatch {
            what: "oracle position",
            expected: format!("below the output's {} elements", spec.output_len()),
            got: p.to_string(),
        });
    }
    Ok(positions
        .par_iter()
        .map(|&i| element(spec, &|j| input.get_f64(j), &|j| weight.get_f64(j), i))
        .collect())
}

fn output_element(spec: &DenseConvSpec, x: &[f64], w: &[f64], i: usize) -> f64 {
    element(spec, &|j| x[j], &|j| w[j], i)
}

fn element(
    spec: &DenseConvSpec,
    x: &(dyn Fn(usize) -> f64 + Sync),
    w: &(dyn Fn(usize) -> f64 + Sync),
    i: usize,
) -> f64 {
    let g = spec.geometry();
    let (n, co, out) = coords(spec.layout(), spec.out_channels(), g.output3(), i);
    let [kd, kh, kw] = g.kernel3();
    let c0 = co / spec.out_per_group() * spec.in_per_group();
    let mut sum = 0.0;
    for ci in 0..spec.in_per_group() {
        for a in 0..kd {
            let Some(id) = g.tap_input(0, out[0], a) else {
                continue;
            };
            for b in 0..kh {
                let Some(ih) = g.tap_input(1, out[1], b) else {
                    continue;
                };
                for e in 0..kw {
                    let Some(iw) = g.tap_input(2, out[2], e) else {
                        continue;
                    };
                    sum += w(spec.weight_index(co, ci, a, b, e))
                        * x(spec.input_index(n, c0 + ci, id, ih, iw));
                }
            }
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::conv_reference;
    use crate::spec::{ConvParams, DType, Layout};

    #[test]
    fn a_hand_computed_dense_case() {
        // 1-D, 2 input channels, 1 output, kernel 2, no padding: y[o] = sum_c w[c,0] x[c,o] + w[c,1] x[c,o+1].
        let p = ConvParams {
            n: 1,
            c: 2,
            input: vec![3],
            kernel: vec![2],
            stride: vec![],
            dilation: vec![],
            padding: vec![],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        };
        let s = DenseConvSpec::from_params(&p, 1, 1).unwrap();
        let x = HostTensor::from_data(
            &[1, 2, 3],
            crate::tensor::TensorData::F32(vec![1., 2., 3., 10., 20., 30.]),
        )
        .unwrap();
        let w = HostTensor::from_data(
            &[1, 2, 2],
            crate::tensor::TensorData::F32(vec![1., -1., 0.5, 2.]),
        )
        .unwrap();
        let y = dense_reference(&s, &x, &w).unwrap();
        // o=0: 1*1 - 1*2 + 0.5*10 + 2*20 = 44; o=1: 2 - 3 + 10 + 60 = 69.
        assert_eq!(y, vec![44.0, 69.0]);
    }

    #[test]
    fn groups_equal_to_channels_is_the_depthwise_oracle() {
        for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
            let p = ConvParams {
                n: 2,
                c: 5,
                input: vec![4, 6, 7],
                kernel: vec![2, 3, 3],
                stride: vec![1, 2, 1],
                dilation: vec![1, 1, 2],
                padding: vec![[1, 0], [1, 1], [2, 1]],
                layout,
                dtype: DType::F32,
            };
            let dw = p.validate().unwrap();
            let s = DenseConvSpec::new(dw.clone(), 5, 5).unwrap();
            let x = HostTensor::random_normal(DType::F32, &dw.input_shape(), 1);
            let w = HostTensor::random_normal(DType::F32, &dw.weight_shape(), 2);
            assert_eq!(
                dense_reference(&s, &x, &w).unwrap(),
                conv_reference(&dw, &x, &w).unwrap()
            );
        }
    }
}
