//! Dense and grouped convolution on the CPU: the reference for CI and the backend of a
//! machine with no GPU. The input is widened to f32 channels-last once (a transpose where
//! the spec is channels-first) and the weights to `[group][block of COB output
//! channels][tap][ci][COB]` (output channels padded to whole blocks), so the inner loop
//! multiplies one input value into a contiguous block of output channels and a block's
//! weights are one contiguous stream; rows of output pixels run in parallel (rayon), each
//! accumulated in f32 and rounded once.
//!
//! `PIX` neighbouring pixels of a row are computed together with `COB` output channels in
//! registers (a GEMM micro-kernel: each weight vector loaded once for `PIX` pixels; the
//! earlier pixel-at-a-time form loaded every weight once a pixel and ran at 0.75 GFLOP/s
//! on a 1 x 1 layer). A pixel's taps that fall in the padding are skipped, not multiplied
//! by 0 (a padded 0 times a non-finite weight would be NaN where the oracle has none),
//! and each output's terms are added in the pixel-at-a-time order (taps, then input
//! channels): the same bits (a test keeps that form as its reference).

use rayon::prelude::*;

use super::spec::DenseConvSpec;
use crate::cpu::Isa;
use crate::error::Result;
use crate::spec::Layout;
use crate::tensor::{Element, HostTensor, TensorData};

/// Pixels of a row the blocked form computes together.
const PIX: usize = 8;
/// Output channels it keeps in registers: one AVX-512 vector, two AVX2 ones.
const COB: usize = 16;

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
    let [id, ih, iw] = g.input3();
    let [od, oh, ow] = g.output3();

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
    let wt = pack_weights(spec, weight);
    let isa = Isa::detect();

    // Each chunk: one output row (n, d, h) of ow pixels x cout channels, channels-last.
    let mut y = vec![0f32; spec.output_len()];
    y.par_chunks_mut(ow * cout)
        .enumerate()
        .for_each(|(row, out)| {
            let (n, d, h) = (row / (od * oh), (row / oh) % od, row % oh);
            let r = Row {
                spec,
                x: &x,
                wt: &wt,
                n,
                d,
                h,
            };
            for w0 in (0..ow).step_by(PIX) {
                r.pixels_blocked(isa, w0, out);
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

/// Offset of output channel block `block`'s COB weights of tap `t` and input channel
/// `ci` of group `grp` in the packed weights ([`pack_weights`]).
fn weight_at(spec: &DenseConvSpec, grp: usize, block: usize, t: usize, ci: usize) -> usize {
    let taps = spec.geometry().kernel3().iter().product::<usize>();
    let blocks = spec.out_per_group().div_ceil(COB);
    (((grp * blocks + block) * taps + t) * spec.in_per_group() + ci) * COB
}

/// The weights as f32 `[group][block of COB output channels][tap][ci][COB]`, the
/// channels past a group's last padded with zeros: a block's weights are one contiguous
/// stream over its taps and input channels (laid out `[tap][ci][co]`, a block's loads
/// were `cpo` floats apart: 4 KB on a 1024-channel layer, a new page every load).
fn pack_weights(spec: &DenseConvSpec, weight: &HostTensor) -> Vec<f32> {
    let [_, kh, kw] = spec.geometry().kernel3();
    let taps = spec.geometry().kernel3().iter().product::<usize>();
    let (cpi, cpo) = (spec.in_per_group(), spec.out_per_group());
    let blocks = cpo.div_ceil(COB);
    // Written in order: the packed index is the loop count (`weight_at`'s layout).
    let mut wt = Vec::with_capacity(spec.groups() * blocks * taps * cpi * COB);
    for grp in 0..spec.groups() {
        for block in 0..blocks {
            for t in 0..taps {
                let (a, b, e) = (t / (kh * kw), (t / kw) % kh, t % kw);
                for ci in 0..cpi {
                    wt.extend((block * COB..(block + 1) * COB).map(|col| {
                        if col < cpo {
                            let co = grp * cpo + col;
                            weight.get_f64(spec.weight_index(co, ci, a, b, e)) as f32
                        } else {
                            0.0
                        }
                    }));
                }
            }
        }
    }
    wt
}

/// One output row (n, d, h) of the convolution: the widened input and weights.
struct Row<'a> {
    spec: &'a DenseConvSpec,
    x: &'a [f32],
    wt: &'a [f32],
    n: usize,
    d: usize,
    h: usize,
}

impl Row<'_> {
    /// Input element offset of input position (zi, yi, xi)'s channel 0 of group `grp`.
    fn at(&self, zi: usize, yi: usize, xi: usize, grp: usize) -> usize {
        let [id, ih, iw] = self.spec.geometry().input3();
        let cin = self.spec.in_channels();
        (((self.n * id + zi) * ih + yi) * iw + xi) * cin + grp * self.spec.in_per_group()
    }

    /// Output pixel w (its `cout` channels), one pixel at a time: taps outside the input
    /// (padding) are skipped. The blocked form's reference in the tests.
    #[cfg(test)]
    fn pixel(&self, w: usize, pixel: &mut [f32], acc: &mut [f32]) {
        let g = self.spec.geometry();
        let [kd, kh, kw] = g.kernel3();
        let (cpi, cpo) = (self.spec.in_per_group(), self.spec.out_per_group());
        for grp in 0..self.spec.groups() {
            acc.iter_mut().for_each(|v| *v = 0.0);
            for a in 0..kd {
                let Some(zi) = g.tap_input(0, self.d, a) else {
                    continue;
                };
                for b in 0..kh {
                    let Some(yi) = g.tap_input(1, self.h, b) else {
                        continue;
                    };
                    for e in 0..kw {
                        let Some(xi) = g.tap_input(2, w, e) else {
                            continue;
                        };
                        let t = (a * kh + b) * kw + e;
                        let xs = &self.x[self.at(zi, yi, xi, grp)..][..cpi];
                        for (ci, &xv) in xs.iter().enumerate() {
                            for (o, a) in acc.iter_mut().enumerate() {
                                let wv =
                                    self.wt[weight_at(self.spec, grp, o / COB, t, ci) + o % COB];
                                *a = xv.mul_add(wv, *a);
                            }
                        }
                    }
                }
            }
            pixel[grp * cpo..(grp + 1) * cpo].copy_from_slice(acc);
        }
    }

    /// Output pixels w0..w0 + PIX of the row (those before its end), every group and
    /// output channel, into `out` (the row, channels-last): on the widest vectors the CPU
    /// has.
    fn pixels_blocked(&self, isa: Isa, w0: usize, out: &mut [f32]) {
        match isa {
            // SAFETY: `isa` was detected on this CPU (`Isa::detect`).
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { self.pixels_blocked_avx512(w0, out) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { self.pixels_blocked_avx2(w0, out) },
            _ => self.pixels_blocked_body::<[f32; COB]>(w0, out),
        }
    }

    /// The blocked form with each block of output channels one AVX-512 vector (the
    /// generic lanes were left scalar by the compiler: 10 GFLOP/s on ResNet-50's 28 x 28
    /// layer on two cores).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
    unsafe fn pixels_blocked_avx512(&self, w0: usize, out: &mut [f32]) {
        self.pixels_blocked_body::<Avx512Block>(w0, out)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn pixels_blocked_avx2(&self, w0: usize, out: &mut [f32]) {
        self.pixels_blocked_body::<[f32; COB]>(w0, out)
    }

    /// PIX pixels x COB output channels in registers a block of channels: each weight
    /// vector loaded once for the PIX pixels, each input value broadcast once a block.
    /// Terms in the pixel-at-a-time order (taps, then input channels); a pixel past the
    /// row's end, or whose tap reads padding, skips that tap. Plain loops: a closure would
    /// not inherit the caller's target features.
    #[inline(always)]
    fn pixels_blocked_body<B: ChannelBlock>(&self, w0: usize, out: &mut [f32]) {
        let g = self.spec.geometry();
        let [kd, kh, kw] = g.kernel3();
        let ow = g.output3()[2];
        let (cpi, cpo, cout) = (
            self.spec.in_per_group(),
            self.spec.out_per_group(),
            self.spec.out_channels(),
        );
        let pixels = PIX.min(ow - w0);
        for grp in 0..self.spec.groups() {
            for cb in (0..cpo).step_by(COB) {
                // SAFETY (every block method here): B's instructions are this CPU's (the
                // callers pick B by `Isa::detect`).
                let mut acc = [unsafe { B::zero() }; PIX];
                for a in 0..kd {
                    let Some(zi) = g.tap_input(0, self.d, a) else {
                        continue;
                    };
                    for b in 0..kh {
                        let Some(yi) = g.tap_input(1, self.h, b) else {
                            continue;
                        };
                        for e in 0..kw {
                            let t = (a * kh + b) * kw + e;
                            let ws = &self.wt[weight_at(self.spec, grp, cb / COB, t, 0)..];
                            assert!(cpi * COB <= ws.len());
                            // Pixel p's first input channel for this tap, where it has one.
                            let mut xoff = [usize::MAX; PIX];
                            for (p, xo) in xoff.iter_mut().enumerate().take(pixels) {
                                if let Some(xi) = g.tap_input(2, w0 + p, e) {
                                    *xo = self.at(zi, yi, xi, grp);
                                    assert!(*xo + cpi <= self.x.len());
                                }
                            }
                            let (wp, xp) = (ws.as_ptr(), self.x.as_ptr());
                            // Most blocks read on every pixel: a loop without the check.
                            if xoff.iter().all(|&o| o != usize::MAX) {
                                for ci in 0..cpi {
                                    // SAFETY: ci < cpi and the bounds asserted above.
                                    let wv = unsafe { B::load(wp.add(ci * COB)) };
                                    for (ap, &o) in acc.iter_mut().zip(&xoff) {
                                        // SAFETY: as above.
                                        *ap = unsafe { ap.fma(*xp.add(o + ci), wv) };
                                    }
                                }
                            } else {
                                for ci in 0..cpi {
                                    // SAFETY: as above.
                                    let wv = unsafe { B::load(wp.add(ci * COB)) };
                                    for (ap, &o) in acc.iter_mut().zip(&xoff) {
                                        if o != usize::MAX {
                                            // SAFETY: as above, for the pixels that read.
                                            *ap = unsafe { ap.fma(*xp.add(o + ci), wv) };
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
                let lanes = COB.min(cpo - cb);
                for (p, ap) in acc.iter().enumerate().take(pixels) {
                    let at = (w0 + p) * cout + grp * cpo + cb;
                    out[at..at + lanes].copy_from_slice(&unsafe { ap.lanes() }[..lanes]);
                }
            }
        }
    }
}

/// The accumulators of COB output channels of one pixel: portable lanes, or one AVX-512
/// vector. `fma` rounds as `x.mul_add(w, acc)` lane by lane in both: the same bits.
/// Unsafe throughout: the AVX-512 block's methods need the CPU to have AVX-512 (they are
/// compiled for it, so they inline into the AVX-512 body; plain methods calling the
/// intrinsics stayed calls and ran 1.5-3x slower).
trait ChannelBlock: Copy {
    /// SAFETY: the CPU has the block's instructions.
    unsafe fn zero() -> Self;
    /// COB weights. SAFETY: as `zero`, and `w` points at COB readable floats.
    unsafe fn load(w: *const f32) -> Self;
    /// self + x * w. SAFETY: as `zero`.
    unsafe fn fma(self, x: f32, w: Self) -> Self;
    /// SAFETY: as `zero`.
    unsafe fn lanes(self) -> [f32; COB];
}

impl ChannelBlock for [f32; COB] {
    #[inline(always)]
    unsafe fn zero() -> Self {
        [0.0; COB]
    }
    #[inline(always)]
    unsafe fn load(w: *const f32) -> Self {
        // SAFETY: the caller's promise.
        unsafe { *(w as *const [f32; COB]) }
    }
    #[inline(always)]
    unsafe fn fma(mut self, x: f32, w: Self) -> Self {
        for (o, &wl) in self.iter_mut().zip(&w) {
            *o = x.mul_add(wl, *o);
        }
        self
    }
    #[inline(always)]
    unsafe fn lanes(self) -> [f32; COB] {
        self
    }
}

/// One AVX-512 vector of COB = 16 channels. Only `pixels_blocked_avx512` (AVX-512
/// enabled, on a CPU that has it) instantiates the body with it.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Avx512Block(std::arch::x86_64::__m512);

#[cfg(target_arch = "x86_64")]
impl ChannelBlock for Avx512Block {
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn zero() -> Self {
        const { assert!(COB == 16, "one AVX-512 vector a block") };
        Avx512Block(std::arch::x86_64::_mm512_setzero_ps())
    }
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn load(w: *const f32) -> Self {
        Avx512Block(std::arch::x86_64::_mm512_loadu_ps(w))
    }
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn fma(self, x: f32, w: Self) -> Self {
        use std::arch::x86_64::{_mm512_fmadd_ps, _mm512_set1_ps};
        Avx512Block(_mm512_fmadd_ps(_mm512_set1_ps(x), w.0, self.0))
    }
    #[inline]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn lanes(self) -> [f32; COB] {
        let mut v = [0f32; COB];
        std::arch::x86_64::_mm512_storeu_ps(v.as_mut_ptr(), self.0);
        v
    }
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

    /// Rows wide enough for the blocked form (interior blocks, border and tail pixels),
    /// groups whose output channels are not whole blocks, stride and dilation along W:
    /// the oracle passes, and every output has the bits of the pixel-at-a-time form
    /// (the same terms in the same order).
    #[test]
    fn blocked_pixels_match_the_pixel_at_a_time_form_bit_for_bit() {
        for (ci, co, groups, input, stride, dilation, pad) in [
            (24, 40, 1, 29, 1, 1, 1),
            (12, 18, 3, 40, 2, 1, 2),
            (16, 20, 2, 37, 1, 2, 3),
            (8, 8, 1, 12, 1, 1, 0),
        ] {
            let p = ConvParams {
                n: 2,
                c: ci,
                input: vec![5, input],
                kernel: vec![3, 3],
                stride: vec![1, stride],
                dilation: vec![1, dilation],
                padding: vec![[1, 1], [pad, pad]],
                layout: Layout::ChannelsLast,
                dtype: DType::F32,
            };
            let spec = DenseConvSpec::from_params(&p, co, groups).unwrap();
            run(&spec, 11);
            let x = HostTensor::random_normal(DType::F32, &spec.input_shape(), 3);
            let w = HostTensor::random_normal(DType::F32, &spec.weight_shape(), 4);
            let mut y = HostTensor::zeros(DType::F32, &spec.output_shape());
            conv_dense_cpu(&spec, &x, &w, &mut y).unwrap();
            // The pixel-at-a-time form on every pixel.
            let cpo = spec.out_per_group();
            let g = spec.geometry();
            let wt = pack_weights(&spec, &w);
            let xs: Vec<f32> = (0..x.len()).map(|i| x.get_f64(i) as f32).collect();
            let [_, oh, ow] = g.output3();
            let cout = co as usize;
            let mut acc = vec![0f32; cpo];
            let mut pixel = vec![0f32; cout];
            for n in 0..2 {
                for h in 0..oh {
                    let r = Row {
                        spec: &spec,
                        x: &xs,
                        wt: &wt,
                        n,
                        d: 0,
                        h,
                    };
                    // The portable body too (this CPU may have run AVX-512).
                    let mut row = vec![f32::NAN; ow * cout];
                    for w0 in (0..ow).step_by(PIX) {
                        r.pixels_blocked(Isa::Portable, w0, &mut row);
                    }
                    for wo in 0..ow {
                        r.pixel(wo, &mut pixel, &mut acc);
                        let portable = &row[wo * cout..(wo + 1) * cout];
                        for (c, (v, q)) in pixel.iter().zip(portable).enumerate() {
                            assert_eq!(q.to_bits(), v.to_bits(), "portable {spec} w{wo} c{c}");
                        }
                        for (c, v) in pixel.iter().enumerate() {
                            let got = y.get_f64(((n * oh + h) * ow + wo) * cout + c) as f32;
                            assert_eq!(got.to_bits(), v.to_bits(), "{spec} n{n} h{h} w{wo} c{c}");
                        }
                    }
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
