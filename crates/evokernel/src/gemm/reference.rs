//! The scaled GEMM's f64 oracle (on the dequantized inputs, for clarity), the CPU
//! backend's GEMM (f32 accumulation, rayon over rows), and the accuracy gate.

use rayon::prelude::*;

use super::fp8::E4m3;
use super::spec::{ScaledMmSpec, SCALE_BLOCK};
use crate::error::{Error, Result};
use crate::tensor::HostTensor;

/// One problem's operands: A [M, K] and B [K, N] row-major e4m3, the f32 scales of the
/// spec's scaling, and the bias [N] when the spec has one.
#[derive(Clone, Debug)]
pub struct ScaledMmData {
    pub a: Vec<E4m3>,
    pub b: Vec<E4m3>,
    pub scale_a: Vec<f32>,
    pub scale_b: Vec<f32>,
    pub bias: Option<Vec<f32>>,
}

impl ScaledMmData {
    /// A standard normal like activations, B normal with variance 1/K like a layer's
    /// initialised weights (so D is O(1), as in a network, and the gate's max abs of 1.0
    /// measures the kernel rather than bf16's rounding of a D of size sqrt(K)), both
    /// quantized the way a caller would: scaled so the largest magnitude of each scaling
    /// group maps near 448 (the scale is the inverse).
    pub fn random(spec: &ScaledMmSpec, seed: u64) -> Self {
        let normal = |len: usize, seed: u64| {
            let t = HostTensor::random_normal(crate::DType::F32, &[len], seed);
            (0..len)
                .into_par_iter()
                .map(|i| t.get_f64(i) as f32)
                .collect::<Vec<f32>>()
        };
        let (m, n, k) = (spec.m(), spec.n(), spec.k());
        let a = normal(m * k, seed);
        let std_b = 1.0 / (k as f32).sqrt();
        let b: Vec<f32> = normal(k * n, seed ^ 0xb0b)
            .into_par_iter()
            .map(|v| v * std_b)
            .collect();
        let (sa, sb) = spec.scale_shapes();
        let (len_a, len_b): (usize, usize) = (sa.iter().product(), sb.iter().product());
        // Largest magnitude of each scaling group: partial maxima of row blocks in
        // parallel, combined by max (order-free, so the same on every run).
        let amax = |len: usize,
                    rows: usize,
                    cols: usize,
                    v: &[f32],
                    index: &(dyn Fn(usize, usize) -> usize + Sync)| {
            (0..rows.div_ceil(SCALE_BLOCK))
                .into_par_iter()
                .map(|blk| {
                    let mut part = vec![0f32; len];
                    for r in blk * SCALE_BLOCK..((blk + 1) * SCALE_BLOCK).min(rows) {
                        for c in 0..cols {
                            let s = &mut part[index(r, c)];
                            *s = s.max(v[r * cols + c].abs());
                        }
                    }
                    part
                })
                .reduce(
                    || vec![0f32; len],
                    |x, y| x.iter().zip(&y).map(|(p, q)| p.max(*q)).collect(),
                )
        };
        let amax_a = amax(len_a, m, k, &a, &|i, kk| spec.scale_index_a(i, kk));
        let amax_b = amax(len_b, k, n, &b, &|kk, j| spec.scale_index_b(kk, j));
        let scale = |amax: f32| if amax > 0.0 { amax / 448.0 } else { 1.0 };
        let scale_a: Vec<f32> = amax_a.into_iter().map(scale).collect();
        let scale_b: Vec<f32> = amax_b.into_iter().map(scale).collect();
        let qa = (0..m * k)
            .into_par_iter()
            .map(|i| E4m3::from_f32(a[i] / scale_a[spec.scale_index_a(i / k, i % k)]))
            .collect();
        let qb = (0..k * n)
            .into_par_iter()
            .map(|i| E4m3::from_f32(b[i] / scale_b[spec.scale_index_b(i / n, i % n)]))
            .collect();
        let bias = spec.has_bias().then(|| normal(n, seed ^ 0xb1a5));
        ScaledMmData {
            a: qa,
            b: qb,
            scale_a,
            scale_b,
            bias,
        }
    }

    /// A's e4m3 bytes, row-major, as a device takes them.
    pub fn a_bytes(&self) -> Vec<u8> {
        self.a.iter().map(|e| e.0).collect()
    }

    /// `Err` names the operand whose length does not match `spec`.
    pub fn check(&self, spec: &ScaledMmSpec) -> Result<()> {
        let (sa, sb) = spec.scale_shapes();
        let want = [
            ("A", spec.m() * spec.k(), self.a.len()),
            ("B", spec.k() * spec.n(), self.b.len()),
            ("scale_a", sa.iter().product(), self.scale_a.len()),
            ("scale_b", sb.iter().product(), self.scale_b.len()),
            (
                "bias",
                if spec.has_bias() { spec.n() } else { 0 },
                self.bias.as_ref().map_or(0, |b| b.len()),
            ),
        ];
        for (what, expected, got) in want {
            if expected != got {
                return Err(Error::TensorMismatch {
                    what,
                    expected: format!("{expected} elements for {spec}"),
                    got: format!("{got}"),
                });
            }
        }
        Ok(())
    }
}

/// f32 values as little-endian bytes (scales and bias for a device buffer).
pub(crate) fn f32_bytes(v: impl IntoIterator<Item = f32>) -> Vec<u8> {
    v.into_iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// D in f64: sum over k of (a * scale_a) * (b * scale_b), plus the bias.
pub fn scaled_mm_reference(spec: &ScaledMmSpec, data: &ScaledMmData) -> Result<Vec<f64>> {
    let (m, n) = (spec.m(), spec.n());
    let all: Vec<(usize, usize)> = (0..m * n).map(|idx| (idx / n, idx % n)).collect();
    scaled_mm_reference_at(spec, data, &all)
}

/// The CPU backend's GEMM: products in f32, each scaling group's partial sum scaled once
/// (as the GPU kernels promote), rounded to the spec's output dtype.
pub fn scaled_mm_cpu(spec: &ScaledMmSpec, data: &ScaledMmData) -> Result<HostTensor> {
    data.check(spec)?;
    let (m, n, k) = (spec.m(), spec.n(), spec.k());
    let a: Vec<f32> = data.a.iter().map(|v| v.to_f32()).collect();
    // B transposed once, so each output's K loop reads both operands in order.
    let mut bt = vec![0f32; n * k];
    for kk in 0..k {
        for j in 0..n {
            bt[j * k + kk] = data.b[kk * n + j].to_f32();
        }
    }
    let group = match spec.scaling() {
        super::spec::Scaling::BlockWise => super::spec::SCALE_BLOCK,
        _ => k,
    };
    let values: Vec<f32> = (0..m * n)
        .into_par_iter()
        .map(|idx| {
            let (i, j) = (idx / n, idx % n);
            let (ar, br) = (&a[i * k..(i + 1) * k], &bt[j * k..(j + 1) * k]);
            let mut total = 0f32;
            for k0 in (0..k).step_by(group) {
                let k1 = (k0 + group).min(k);
                let part: f32 = ar[k0..k1].iter().zip(&br[k0..k1]).map(|(x, y)| x * y).sum();
                total += part
                    * data.scale_a[spec.scale_index_a(i, k0)]
                    * data.scale_b[spec.scale_index_b(k0, j)];
            }
            total + data.bias.as_ref().map_or(0.0, |b| b[j])
        })
        .collect();
    let mut d = HostTensor::zeros(spec.out_dtype(), &[m, n]);
    for (i, v) in values.into_iter().enumerate() {
        d.set_f64(i, v as f64);
    }
    Ok(d)
}

/// The GEMM's gate: relative L2 error <= 0.01 and largest absolute error <= 1.0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmVerdict {
    pub rel_l2: f64,
    pub max_abs: f64,
    pub passed: bool,
}

pub fn gemm_gate(d: &HostTensor, reference: &[f64]) -> Result<GemmVerdict> {
    if d.len() != reference.len() {
        return Err(Error::TensorMismatch {
            what: "D",
            expected: format!("{} elements", reference.len()),
            got: format!("{}", d.len()),
        });
    }
    Ok(verdict(
        (0..reference.len()).map(|i| (d.get_f64(i), reference[i])),
    ))
}

/// The gate on the sampled positions of a large D ([rows, n] row-major), `reference`
/// holding the oracle at the same positions.
pub fn gemm_gate_at(
    d: &HostTensor,
    n: usize,
    positions: &[(usize, usize)],
    reference: &[f64],
) -> Result<GemmVerdict> {
    if positions.len() != reference.len()
        || positions
            .iter()
            .any(|&(i, j)| j >= n || i * n + j >= d.len())
    {
        return Err(Error::TensorMismatch {
            what: "D",
            expected: format!("{} sampled positions inside it", reference.len()),
            got: format!("{} positions, D of {} elements", positions.len(), d.len()),
        });
    }
    Ok(verdict(
        positions
            .iter()
            .zip(reference)
            .map(|(&(i, j), &r)| (d.get_f64(i * n + j), r)),
    ))
}

fn verdict(pairs: impl Iterator<Item = (f64, f64)>) -> GemmVerdict {
    let (mut err2, mut ref2, mut max_abs) = (0f64, 0f64, 0f64);
    for (got, r) in pairs {
        let e = got - r;
        err2 += e * e;
        ref2 += r * r;
        max_abs = max_abs.max(if e.is_nan() { f64::INFINITY } else { e.abs() });
    }
    let rel_l2 = (err2 / ref2.max(f64::MIN_POSITIVE)).sqrt();
    GemmVerdict {
        rel_l2,
        max_abs,
        passed: rel_l2 <= 0.01 && max_abs <= 1.0,
    }
}

/// Output positions the oracle checks on a problem too large to check whole: the four
/// corners, the last row and column at random places (the tiles' ragged edges), and
/// `count` random positions. Deterministic for a seed.
pub fn sample_positions(spec: &ScaledMmSpec, count: usize, seed: u64) -> Vec<(usize, usize)> {
    let (m, n) = (spec.m(), spec.n());
    let mut state = seed ^ 0x9e37_79b9_7f4a_7c15;
    let mut next = |bound: usize| {
        // splitmix64: enough spread for picking positions.
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % bound as u64) as usize
    };
    let mut p = vec![(0, 0), (0, n - 1), (m - 1, 0), (m - 1, n - 1)];
    for _ in 0..count / 8 {
        p.push((m - 1, next(n)));
        p.push((next(m), n - 1));
    }
    while p.len() < count.max(4) + 2 * (count / 8) {
        p.push((next(m), next(n)));
    }
    p
}

/// The oracle (`scaled_mm_reference`) at the given output positions only.
pub fn scaled_mm_reference_at(
    spec: &ScaledMmSpec,
    data: &ScaledMmData,
    positions: &[(usize, usize)],
) -> Result<Vec<f64>> {
    data.check(spec)?;
    let (n, k) = (spec.n(), spec.k());
    Ok(positions
        .par_iter()
        .map(|&(i, j)| {
            let mut sum = 0f64;
            for kk in 0..k {
                let a = data.a[i * k + kk].to_f32() as f64
                    * data.scale_a[spec.scale_index_a(i, kk)] as f64;
                let b = data.b[kk * n + j].to_f32() as f64
                    * data.scale_b[spec.scale_index_b(kk, j)] as f64;
                sum += a * b;
            }
            sum + data.bias.as_ref().map_or(0.0, |b| b[j] as f64)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::spec::Scaling;
    use super::super::E4M3_MAX as E4M3_MAX_F32;
    use super::*;
    use crate::DType;

    #[test]
    fn the_cpu_gemm_passes_the_gate_in_every_scaling_mode() {
        for scaling in [Scaling::PerTensor, Scaling::RowWise, Scaling::BlockWise] {
            for (m, n, k, out, bias) in [
                (16, 24, 256, DType::Bf16, true),
                (3, 130, 272, DType::F16, false),
                (33, 8, 512, DType::F32, true),
            ] {
                let spec = ScaledMmSpec::new(m, n, k, scaling, out, bias).unwrap();
                let data = ScaledMmData::random(&spec, (m * n) as u64);
                let want = scaled_mm_reference(&spec, &data).unwrap();
                let d = scaled_mm_cpu(&spec, &data).unwrap();
                let v = gemm_gate(&d, &want).unwrap();
                assert!(v.passed, "{spec}: {v:?}");
                assert!(v.rel_l2 < 1e-2 && v.rel_l2 > 0.0, "{spec}: {v:?}");
            }
        }
    }

    /// The quantization is the scheme users run: the dequantized product stays within
    /// fp8's precision (3 mantissa bits, about 6% a value) of the product of the
    /// original normals, and every scaled element fits e4m3's range.
    #[test]
    fn quantized_operands_keep_the_product() {
        let (m, n, k) = (8usize, 8usize, 1024usize);
        let spec = ScaledMmSpec::new(
            m as i64,
            n as i64,
            k as i64,
            Scaling::BlockWise,
            DType::F32,
            false,
        )
        .unwrap();
        let data = ScaledMmData::random(&spec, 5);
        let want = scaled_mm_reference(&spec, &data).unwrap();
        let orig = |len: usize, seed: u64| {
            let t = HostTensor::random_normal(DType::F32, &[len], seed);
            (0..len).map(|i| t.get_f64(i)).collect::<Vec<f64>>()
        };
        let a = orig(m * k, 5);
        let b: Vec<f64> = orig(k * n, 5 ^ 0xb0b)
            .into_iter()
            .map(|v| v * (1.0 / (k as f32).sqrt()) as f64)
            .collect();
        let (mut err2, mut ref2) = (0f64, 0f64);
        for i in 0..m {
            for j in 0..n {
                let exact: f64 = (0..k).map(|kk| a[i * k + kk] * b[kk * n + j]).sum();
                err2 += (want[i * n + j] - exact).powi(2);
                ref2 += exact * exact;
            }
        }
        let rel = (err2 / ref2).sqrt();
        assert!(rel < 0.06, "{rel}");
        assert!(data
            .a
            .iter()
            .chain(&data.b)
            .all(|v| v.to_f32().abs() <= E4M3_MAX_F32));
    }

    #[test]
    fn mismatched_operands_and_gate_failures_are_reported() {
        let spec = ScaledMmSpec::new(4, 4, 16, Scaling::RowWise, DType::Bf16, false).unwrap();
        let mut data = ScaledMmData::random(&spec, 1);
        data.scale_a.pop();
        assert!(scaled_mm_reference(&spec, &data).is_err());
        let data = ScaledMmData::random(&spec, 1);
        let want = scaled_mm_reference(&spec, &data).unwrap();
        let mut d = scaled_mm_cpu(&spec, &data).unwrap();
        d.set_f64(0, f64::NAN);
        assert!(!gemm_gate(&d, &want).unwrap().passed);
    }

    #[test]
    fn the_sampled_gate_sees_what_the_full_gate_sees() {
        let spec = ScaledMmSpec::new(70, 150, 256, Scaling::RowWise, DType::Bf16, true).unwrap();
        let data = ScaledMmData::random(&spec, 9);
        let positions = sample_positions(&spec, 64, 3);
        assert_eq!(positions, sample_positions(&spec, 64, 3), "deterministic");
        assert!(positions.len() >= 64 + 4);
        for corner in [(0, 0), (0, 149), (69, 0), (69, 149)] {
            assert!(positions.contains(&corner));
        }
        assert!(positions.iter().all(|&(i, j)| i < 70 && j < 150));
        assert!(
            positions.iter().filter(|p| p.0 == 69).count() > 8,
            "the last row"
        );
        let full = scaled_mm_reference(&spec, &data).unwrap();
        let at = scaled_mm_reference_at(&spec, &data, &positions).unwrap();
        for (&(i, j), r) in positions.iter().zip(&at) {
            assert_eq!(*r, full[i * 150 + j]);
        }
        let mut d = scaled_mm_cpu(&spec, &data).unwrap();
        assert!(gemm_gate_at(&d, 150, &positions, &at).unwrap().passed);
        // A wrong value at a sampled position fails it; the position list must fit D.
        let (i, j) = positions[7];
        d.set_f64(i * 150 + j, 1e3);
        assert!(!gemm_gate_at(&d, 150, &positions, &at).unwrap().passed);
        assert!(gemm_gate_at(&d, 150, &positions[1..], &at).is_err());
        assert!(gemm_gate_at(&d, 149, &positions, &at).is_err());
    }
}
