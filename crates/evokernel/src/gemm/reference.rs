//! The scaled GEMM's f64 oracle (on the dequantized inputs, for clarity), the CPU
//! backend's GEMM (f32 accumulation, rayon over rows), and the accuracy gate.

use rayon::prelude::*;

use super::fp8::E4m3;
use super::spec::ScaledMmSpec;
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
    /// Standard-normal A and B quantized the way a caller would: scaled so the largest
    /// magnitude of each scaling group maps near 448 (the scale is the inverse).
    pub fn random(spec: &ScaledMmSpec, seed: u64) -> Self {
        let normal = |len: usize, seed: u64| {
            let t = HostTensor::random_normal(crate::DType::F32, &[len], seed);
            (0..len).map(|i| t.get_f64(i) as f32).collect::<Vec<f32>>()
        };
        let (m, n, k) = (spec.m(), spec.n(), spec.k());
        let a = normal(m * k, seed);
        let b = normal(k * n, seed ^ 0xb0b);
        let (sa, sb) = spec.scale_shapes();
        let mut amax_a = vec![0f32; sa.iter().product()];
        let mut amax_b = vec![0f32; sb.iter().product()];
        for i in 0..m {
            for kk in 0..k {
                let s = &mut amax_a[spec.scale_index_a(i, kk)];
                *s = s.max(a[i * k + kk].abs());
            }
        }
        for kk in 0..k {
            for j in 0..n {
                let s = &mut amax_b[spec.scale_index_b(kk, j)];
                *s = s.max(b[kk * n + j].abs());
            }
        }
        let scale = |amax: f32| if amax > 0.0 { amax / 448.0 } else { 1.0 };
        let scale_a: Vec<f32> = amax_a.into_iter().map(scale).collect();
        let scale_b: Vec<f32> = amax_b.into_iter().map(scale).collect();
        let qa = (0..m * k)
            .map(|i| E4m3::from_f32(a[i] / scale_a[spec.scale_index_a(i / k, i % k)]))
            .collect();
        let qb = (0..k * n)
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

/// D in f64: sum over k of (a * scale_a) * (b * scale_b), plus the bias.
pub fn scaled_mm_reference(spec: &ScaledMmSpec, data: &ScaledMmData) -> Result<Vec<f64>> {
    data.check(spec)?;
    let (m, n, k) = (spec.m(), spec.n(), spec.k());
    Ok((0..m * n)
        .into_par_iter()
        .map(|idx| {
            let (i, j) = (idx / n, idx % n);
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
    let (mut err2, mut ref2, mut max_abs) = (0f64, 0f64, 0f64);
    for (i, &r) in reference.iter().enumerate() {
        let e = d.get_f64(i) - r;
        err2 += e * e;
        ref2 += r * r;
        max_abs = max_abs.max(if e.is_nan() { f64::INFINITY } else { e.abs() });
    }
    let rel_l2 = (err2 / ref2.max(f64::MIN_POSITIVE)).sqrt();
    Ok(GemmVerdict {
        rel_l2,
        max_abs,
        passed: rel_l2 <= 0.01 && max_abs <= 1.0,
    })
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
        let (a, b) = (orig(m * k, 5), orig(k * n, 5 ^ 0xb0b));
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
}
