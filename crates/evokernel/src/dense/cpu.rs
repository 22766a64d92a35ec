//! Dense and grouped convolution on the CPU: the reference for CI and the backend of a
//! machine with no GPU. The input is widened to f32 channels-last once (a transpose where
//! the spec is channels-first) and the weights to `[group][tap][ci][co]`, so the inner
//! loop is a multiply-add of one input value into a contiguous row of output channels
//! (which the compiler vectorizes); rows of output pixels run in parallel (rayon), each
//! accumulated in f32 and rounded once.

use rayon::prelude::*;

use super::spec::DenseConvSpec;
use crate::error::Result;
use crate::spec::Layout;
use crate::tensor::{Element, HostTensor, TensorData};

/// The convolution of `spec` on the CPU, writing every element of `output`.
pub fn conv_dense_cpu(
    spec: &DenseConvSpec,
    input: &HostTensor,
    weight: &HostTensor,
    output: &mut HostTensor,
) -> Result<()> {
    input.expect("input", spec.dtype(), spec.input_len())?;
    weight.expect("weight", spec.dtype(), spec.weight_len())?;
    output.expect("output", spec.dtype(), spec.output_len())?;
    let g = spec.geometry();
    let (cin, cout) = (spec.in_channels(), spec.out_channels());
    let (cpi, cpo) = (spec.in_per_group(), spec.out_per_group());
    let [id, ih, iw] = g.input3();
    let [od, oh, ow] = g.output3();
    let [kd, kh, kw] = g.kernel3();
    let taps = kd * kh * kw;

    // The input as f32, channels-last.
    let mut x = vec![0f32; spec.input_len()];
    let pixels = id * ih * iw;
    for n in 0..spec.n() {
        for c in 0..cin {
            for p in 0..pixels {
                let (d, h, w) = (p / (ih * iw), (p / iw) % ih, p % iw);
                x[(n * pixels + p) * cin + c] =
                    input.get_f64(spec.input_index(n, c, d, h, w)) as f32;
            }
        }
    }
    // The weights as [group][tap][ci][co within the group].
    let mut wt = vec![0f32; spec.weight_len()];
    for co in 0..cout {
        let (grp, col) = (co / cpo, co % cpo);
        for ci in 0..cpi {
            for t in 0..taps {
                let (a, b, e) = (t / (kh * kw), (t / kw) % kh, t % kw);
                wt[((grp * taps + t) * cpi + ci) * cpo + col] =
                    weight.get_f64(spec.weight_index(co, ci, a, b, e)) as f32;
            }
        }
    }

    // Each chunk: one output row (n, d, h) of ow pixels x cout channels, channels-last.
    let mut y = vec![0f32; spec.output_len()];
    y.par_chunks_mut(ow * cout)
        .enumerate()
        .for_each(|(row, out)| {
            let (n, d, h) = (row / (od * oh), (row / oh) % od, row % oh);
            let mut acc = vec![0f32; cpo];
            for (w, pixel) in out.chunks_mut(cout).enumerate() {
                for grp in 0..spec.groups() {
                    acc.iter_mut().for_each(|v| *v = 0.0);
                    for a in 0..kd {
                        let Some(zi) = g.tap_input(0, d, a) else {
                            continue;
                        };
                        for b in 0..kh {
                            let Some(yi) = g.tap_input(1, h, b) else {
                                continue;
                            };
                            for e in 0..kw {
                                let Some(xi) = g.tap_input(2, w, e) else {
                                    continue;
                                };
                                let t = (a * kh + b) * kw + e;
                                let at = (((n * id + zi) * ih + yi) * iw + xi) * cin + grp * cpi;
                                let xs = &x[at..at + cpi];
                                let ws = &wt[(grp * taps + t) * cpi * cpo..][..cpi * cpo];
                                for (ci, &xv) in xs.iter().enumerate() {
                                    let wrow = &ws[ci * cpo..(ci + 1) * cpo];
                                    for (o, &wv) in acc.iter_mut().zip(wrow) {
                                        *o = xv.mul_add(wv, *o);
                                    }
                                }
                            }
                        }
                    }
                    pixel[grp * cpo..(grp + 1) * cpo].copy_from_slice(&acc);
                }
            }
        });

    // Rounded once into the output, permuted back where the spec is channels-first.
    let store = |dst: &mut TensorData| match dst {
        TensorData::F32(v) => place(spec, &y, v),
        TensorData::F16(v) => place(spec, &y, v),
        TensorData::Bf16(v) => place(spec, &y, v),
    };
    store(output.data_mut());
    Ok(())
}

/// `y` (channels-last f32) into `dst` in the spec's layout and element type.
fn place<T: Element>(spec: &DenseConvSpec, y: &[f32], dst: &mut [T]) {
    match spec.layout() {
        Layout::ChannelsLast => T::store_f32_slice(y, dst),
        Layout::ChannelsFirst => {
            let cout = spec.out_channels();
            let pixels: usize = spec.geometry().output3().iter().product();
            dst.par_chunks_mut(pixels)
                .enumerate()
                .for_each(|(nc, plane)| {
                    let (n, c) = (nc / cout, nc % cout);
                    for (p, v) in plane.iter_mut().enumerate() {
                        *v = T::from_f32(y[(n * pixels + p) * cout + c]);
                    }
                });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dense::reference::dense_reference;
    use crate::spec::{ConvParams, DType};
    use crate::tensor::compare;

    fn run(spec: &DenseConvSpec, seed: u64) {
        let x = HostTensor::random_normal(spec.dtype(), &spec.input_shape(), seed);
        let w = HostTensor::random_normal(spec.dtype(), &spec.weight_shape(), seed + 1);
        let mut y = HostTensor::nan(spec.dtype(), &spec.output_shape());
        conv_dense_cpu(spec, &x, &w, &mut y).unwrap();
        let want = dense_reference(spec, &x, &w).unwrap();
        let c = compare(&y, &want).unwrap();
        assert!(c.passes(spec.dtype()), "{spec}: {c:?}");
    }

    #[test]
    fn dense_grouped_and_depthwise_in_both_layouts_and_every_dtype() {
        for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
            for dtype in DType::ALL {
                for (ci, co, groups) in [(6, 4, 1), (8, 12, 4), (5, 5, 5), (4, 8, 1)] {
                    let p = ConvParams {
                        n: 2,
                        c: ci,
                        input: vec![3, 7, 6],
                        kernel: vec![2, 3, 3],
                        stride: vec![1, 2, 1],
                        dilation: vec![1, 1, 2],
                        padding: vec![[1, 0], [1, 1], [2, 1]],
                        layout,
                        dtype,
                    };
                    run(&DenseConvSpec::from_params(&p, co, groups).unwrap(), 7);
                }
            }
        }
    }

    #[test]
    fn a_wrong_output_length_is_an_error() {
        let p = ConvParams {
            n: 1,
            c: 4,
            input: vec![8],
            kernel: vec![3],
            stride: vec![],
            dilation: vec![],
            padding: vec![],
            layout: Layout::ChannelsLast,
            dtype: DType::F32,
        };
        let s = DenseConvSpec::from_params(&p, 2, 1).unwrap();
        let x = HostTensor::zeros(DType::F32, &s.input_shape());
        let w = HostTensor::zeros(DType::F32, &s.weight_shape());
        let mut y = HostTensor::zeros(DType::F32, &[1, 6, 3]);
        assert!(conv_dense_cpu(&s, &x, &w, &mut y).is_err());
    }
}
