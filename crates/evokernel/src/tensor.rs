//! Host tensors in the three dtypes, seeded random fills, NaN poison and the
//! comparison metrics of MEASURE.md.

use half::{bf16, f16};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::spec::DType;

/// A scalar type a tensor can hold; converts through f32 (the accumulation type).
/// `to_f32` is branch-free for every type so that loops reading elements vectorize.
pub trait Element: Copy + Send + Sync + 'static {
    const DTYPE: DType;
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
    /// Converts a run of f32 results into this type (SIMD where the CPU has it).
    fn store_f32_slice(src: &[f32], dst: &mut [Self]) {
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = Self::from_f32(s);
        }
    }
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Element for bf16 {
    const DTYPE: DType = DType::Bf16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        // Round to nearest even, NaN kept quiet; branch-free so conversions vectorize.
        let b = x.to_bits();
        let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1))) >> 16;
        let nan = (b & 0x7fff_ffff) > 0x7f80_0000;
        bf16::from_bits(if nan {
            ((b >> 16) | 0x40) as u16
        } else {
            rounded as u16
        })
    }
}

impl Element for f16 {
    const DTYPE: DType = DType::F16;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        // Exponent rebias with selects instead of branches (after F. Giesen's
        // half_to_float_fast); exact for every f16 including subnormals, Inf and NaN.
        let h = self.to_bits() as u32;
        let exp_mask = 0x7c00u32 << 13;
        let o = (h & 0x7fff) << 13;
        let exp = o & exp_mask;
        let normal = o + ((127 - 15) << 23);
        let infnan = normal + ((128 - 16) << 23);
        let sub = f32::from_bits(normal + (1 << 23)) - f32::from_bits(113 << 23);
        let mag = if exp == exp_mask {
            f32::from_bits(infnan)
        } else if exp == 0 {
            sub
        } else {
            f32::from_bits(normal)
        };
        f32::from_bits(mag.to_bits() | ((h & 0x8000) << 16))
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn store_f32_slice(src: &[f32], dst: &mut [Self]) {
        use half::slice::HalfFloatSliceExt;
        let n = src.len().min(dst.len());
        dst[..n].convert_from_f32_slice(&src[..n]);
    }
}

/// The elements of a tensor, in one of the three dtypes.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    Bf16(Vec<bf16>),
    F16(Vec<f16>),
    F32(Vec<f32>),
}

/// A dense host tensor; `shape` is in memory order.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    shape: Vec<usize>,
    data: TensorData,
}

/// Calls `$body` with `$v` bound to the typed element vector of a `TensorData`.
#[macro_export]
#[doc(hidden)]
macro_rules! with_elements {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::tensor::TensorData::Bf16($v) => $body,
            $crate::tensor::TensorData::F16($v) => $body,
            $crate::tensor::TensorData::F32($v) => $body,
        }
    };
}

const FILL_CHUNK: usize = 1 << 16;

/// SplitMix64: small, fast, and good enough to seed and draw test inputs.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1].
    pub fn next_f64(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// Standard normal by Box-Muller (one of the pair; simplicity over speed).
    pub fn next_normal(&mut self) -> f64 {
        let u1 = self.next_f64();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

fn fill_normal<T: Element>(v: &mut [T], seed: u64) {
    v.par_chunks_mut(FILL_CHUNK)
        .enumerate()
        .for_each(|(i, chunk)| {
            let mut rng = SplitMix64::new(seed ^ (i as u64).wrapping_mul(0xd1b5_4a32_d192_ed03));
            for x in chunk {
                *x = T::from_f32(rng.next_normal() as f32);
            }
        });
}

impl HostTensor {
    pub fn zeros(dtype: DType, shape: &[usize]) -> Self {
        let n = shape.iter().product();
        let data = match dtype {
            DType::Bf16 => TensorData::Bf16(vec![bf16::ZERO; n]),
            DType::F16 => TensorData::F16(vec![f16::ZERO; n]),
            DType::F32 => TensorData::F32(vec![0.0; n]),
        };
        HostTensor {
            shape: shape.to_vec(),
            data,
        }
    }

    /// Standard-normal values, quantized to the dtype; the same seed gives the same tensor
    /// whatever the thread count.
    pub fn random_normal(dtype: DType, shape: &[usize], seed: u64) -> Self {
        let mut t = Self::zeros(dtype, shape);
        with_elements!(&mut t.data, v => fill_normal(v, seed));
        t
    }

    /// A tensor full of NaN: the poison every output buffer gets before a run.
    pub fn nan(dtype: DType, shape: &[usize]) -> Self {
        let mut t = Self::zeros(dtype, shape);
        t.poison();
        t
    }

    pub fn poison(&mut self) {
        with_elements!(&mut self.data, v => v.par_iter_mut().for_each(|x| *x = Element::from_f32(f32::NAN)));
    }

    pub fn from_data(shape: &[usize], data: TensorData) -> Result<Self> {
        let t = HostTensor {
            shape: shape.to_vec(),
            data,
        };
        if t.len() != shape.iter().product::<usize>() {
            return Err(Error::TensorMismatch {
                what: "element count",
                expected: format!("{} for shape {:?}", shape.iter().product::<usize>(), shape),
                got: t.len().to_string(),
            });
        }
        Ok(t)
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn data(&self) -> &TensorData {
        &self.data
    }
    pub fn data_mut(&mut self) -> &mut TensorData {
        &mut self.data
    }
    pub fn dtype(&self) -> DType {
        match self.data {
            TensorData::Bf16(_) => DType::Bf16,
            TensorData::F16(_) => DType::F16,
            TensorData::F32(_) => DType::F32,
        }
    }
    pub fn len(&self) -> usize {
        with_elements!(&self.data, v => v.len())
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size_bytes()
    }

    /// Raw little-endian bytes, for copies to a device.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: bf16, f16 and f32 are plain old data with no padding.
        with_elements!(&self.data, v => unsafe {
            std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v.as_slice()))
        })
    }
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; every bit pattern is a valid value of these types.
        with_elements!(&mut self.data, v => unsafe {
            std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v.as_slice()))
        })
    }

    pub fn get_f64(&self, i: usize) -> f64 {
        with_elements!(&self.data, v => v[i].to_f32() as f64)
    }

    /// Sets element `i`, rounded to the tensor's dtype (NaN and infinities kept).
    pub fn set_f64(&mut self, i: usize, x: f64) {
        with_elements!(&mut self.data, v => v[i] = Element::from_f32(x as f32))
    }

    pub fn to_f64_vec(&self) -> Vec<f64> {
        with_elements!(&self.data, v => v.par_iter().map(|x| x.to_f32() as f64).collect())
    }

    /// Checks that this tensor has a spec's expected element count and dtype.
    pub fn expect(&self, what: &'static str, dtype: DType, len: usize) -> Result<()> {
        if self.dtype() != dtype || self.len() != len {
            return Err(Error::TensorMismatch {
                what,
                expected: format!("{len} elements of {dtype}"),
                got: format!("{} elements of {}", self.len(), self.dtype()),
            });
        }
        Ok(())
    }
}

/// How far an output is from the oracle (MEASURE.md's gates).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Comparison {
    /// `||y - ref|| / ||ref||`
    pub rel_l2: f64,
    /// `max |y - ref| / max |ref|`
    pub max_abs_rel: f64,
    /// Elements where the output is NaN/Inf and the oracle is finite, or the reverse.
    pub non_finite: usize,
    pub elements: usize,
}

impl Comparison {
    pub fn passes(&self, dtype: DType) -> bool {
        self.non_finite == 0 && self.rel_l2.is_finite() && self.rel_l2 <= dtype.rel_l2_gate()
    }
}

/// Compares an output with the oracle's f64 result, element by element.
pub fn compare(y: &HostTensor, reference: &[f64]) -> Result<Comparison> {
    if y.len() != reference.len() {
        return Err(Error::TensorMismatch {
            what: "output compared with the oracle",
            expected: format!("{} elements", reference.len()),
            got: format!("{} elements", y.len()),
        });
    }
    #[derive(Default, Clone, Copy)]
    struct Acc {
        err2: f64,
        ref2: f64,
        max_err: f64,
        max_ref: f64,
        bad: usize,
    }
    let fold = |mut a: Acc, (yv, r): (f64, f64)| {
        // Non-finite results must match in kind: NaN for NaN, the same infinity.
        let same_kind = if r.is_nan() { yv.is_nan() } else { yv == r };
        if yv.is_finite() != r.is_finite() || (!r.is_finite() && !same_kind) {
            a.bad += 1;
        } else if r.is_finite() {
            let e = yv - r;
            a.err2 += e * e;
            a.ref2 += r * r;
            a.max_err = a.max_err.max(e.abs());
            a.max_ref = a.max_ref.max(r.abs());
        }
        a
    };
    let merge = |a: Acc, b: Acc| Acc {
        err2: a.err2 + b.err2,
        ref2: a.ref2 + b.ref2,
        max_err: a.max_err.max(b.max_err),
        max_ref: a.max_ref.max(b.max_ref),
        bad: a.bad + b.bad,
    };
    let acc = with_elements!(y.data(), v => v
        .par_iter()
        .zip(reference.par_iter())
        .map(|(a, &r)| (a.to_f32() as f64, r))
        .fold(Acc::default, fold)
        .reduce(Acc::default, merge));
    let ratio = |num: f64, den: f64| {
        if den > 0.0 {
            num / den
        } else if num == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    };
    Ok(Comparison {
        rel_l2: ratio(acc.err2.sqrt(), acc.ref2.sqrt()),
        max_abs_rel: ratio(acc.max_err, acc.max_ref),
        non_finite: acc.bad,
        elements: y.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_half() {
        let mut rng = SplitMix64::new(7);
        for _ in 0..100_000 {
            let x = (rng.next_normal() * 1e3) as f32;
            assert_eq!(
                <bf16 as Element>::from_f32(x).to_bits(),
                bf16::from_f32(x).to_bits(),
                "{x}"
            );
        }
        for x in [
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            1e-40,
        ] {
            assert_eq!(
                <bf16 as Element>::from_f32(x).to_bits(),
                bf16::from_f32(x).to_bits()
            );
        }
        assert!(<bf16 as Element>::from_f32(f32::NAN).to_f32().is_nan());
    }

    #[test]
    fn f16_to_f32_is_exact_for_every_value() {
        for bits in 0..=u16::MAX {
            let h = f16::from_bits(bits);
            let (a, b) = (<f16 as Element>::to_f32(h), f16::to_f32(h));
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "{bits:#x}"
            );
        }
        let src = [1.0f32, -2.5, 65504.0, 1e-7, f32::NAN];
        let mut dst = [f16::ZERO; 5];
        <f16 as Element>::store_f32_slice(&src, &mut dst);
        assert_eq!(dst[..4], [1.0, -2.5, 65504.0, 1e-7].map(f16::from_f32));
        assert!(dst[4].is_nan());
    }

    #[test]
    fn random_fill_is_seeded_normal_and_nonzero() {
        let a = HostTensor::random_normal(DType::F32, &[300_000], 42);
        let b = HostTensor::random_normal(DType::F32, &[300_000], 42);
        let c = HostTensor::random_normal(DType::F32, &[300_000], 43);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let v = a.to_f64_vec();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.01, "var {var}");
        assert!(v.iter().filter(|&&x| x == 0.0).count() < 10);
    }

    #[test]
    fn poison_is_caught_by_compare() {
        let y = HostTensor::nan(DType::Bf16, &[4]);
        let c = compare(&y, &[1.0, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!(c.non_finite, 4);
        assert!(!c.passes(DType::Bf16));
    }

    #[test]
    fn compare_metrics_by_hand() {
        let y = HostTensor::from_data(&[2], TensorData::F32(vec![3.0, 4.5])).unwrap();
        let c = compare(&y, &[3.0, 4.0]).unwrap();
        assert!((c.rel_l2 - 0.5 / 5.0).abs() < 1e-12);
        assert!((c.max_abs_rel - 0.5 / 4.0).abs() < 1e-12);
        assert_eq!(c.non_finite, 0);
        assert!(!c.passes(DType::F32));
        let exact = compare(&y, &[3.0, 4.5]).unwrap();
        assert!(exact.passes(DType::F32));
        assert!(compare(&y, &[1.0]).is_err());
    }

    #[test]
    fn non_finite_values_must_match_in_kind() {
        for dtype in DType::ALL {
            let mut y = HostTensor::zeros(dtype, &[4]);
            for (i, v) in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1.0]
                .into_iter()
                .enumerate()
            {
                y.set_f64(i, v);
            }
            let same = compare(&y, &[f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1.0]).unwrap();
            assert_eq!(same.non_finite, 0, "{dtype}");
            assert!(same.passes(dtype));
            let swapped = compare(&y, &[f64::INFINITY, f64::NAN, f64::INFINITY, f64::NAN]).unwrap();
            assert_eq!(swapped.non_finite, 4, "{dtype}");
        }
    }
}
