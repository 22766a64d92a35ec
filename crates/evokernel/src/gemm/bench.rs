//! The scaled GEMM measured the way MEASURE.md measures a convolution: each candidate
//! config checked against the f64 oracle (at sampled positions on large problems) before
//! it is timed, then timed A B A B against cuBLASLt's fastest algorithm in the same call.
//! cuBLASLt's output passes the same gate, so the ratio compares two right answers.

use serde::Serialize;

use super::kernel::GemmKernel;
use super::reference::{gemm_gate_at, sample_positions, scaled_mm_reference_at};
use super::run::ScaledMmRun;
use super::tune::target_of;
use super::{ScaledMmData, ScaledMmSpec};
use crate::bench::{time_launches, time_pair_launches, Protocol, Timing};
use crate::cuda::cublaslt::CublasLtScaledMm;
use crate::cuda::{CudaDevice, KernelResources};
use crate::error::Result;
use crate::tune::TuneCache;

/// Random output positions the oracle checks (plus corners and edges).
const SAMPLES: usize = 1024;

/// One candidate config on one case.
#[derive(Clone, Debug, Serialize)]
pub struct GemmCandidate {
    /// The kernel's function (`GemmKernel::variant`): what a profiler filters on.
    pub variant: &'static str,
    pub config: String,
    pub rel_l2: f64,
    pub max_abs: f64,
    pub passed: bool,
    /// Absent when the candidate failed the gate (it is not timed).
    pub timing: Option<Timing>,
    pub tflops: Option<f64>,
    /// cuBLASLt's median time over its median time, from the same pairs (> 1: faster).
    pub vs_cublaslt: Option<f64>,
    /// Host milliseconds packing B for this config (once, outside every launch).
    pub pack_ms: f64,
    /// Why the config was not run (it does not fit the case); nothing else is set then.
    pub skipped: Option<String>,
    /// The config came from the tune cache (`evokernel tune --op scaled-mm`).
    pub tuned: bool,
    /// The main kernel's registers and shared memory (absent when skipped).
    pub resources: Option<KernelResources>,
}

/// cuBLASLt on one case: its fastest algorithm, its gate, its co-measured time.
#[derive(Clone, Debug, Serialize)]
pub struct GemmReference {
    pub algorithms_timed: usize,
    pub rel_l2: f64,
    pub max_abs: f64,
    pub passed: bool,
    /// Median over the pairs with the best candidate.
    pub median_ms: f64,
    pub tflops: f64,
}

/// One case of a GEMM bench.
#[derive(Clone, Debug, Serialize)]
pub struct GemmCase {
    pub name: String,
    pub spec: String,
    pub key: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Positions of D the oracle checked (all of D when it is small).
    pub checked: usize,
    /// Bytes a launch must move at least (A, B, D, scales, bias once): the memory floor.
    pub min_bytes: u64,
    pub candidates: Vec<GemmCandidate>,
    /// The fastest candidate that passed, by index into `candidates`.
    pub best: Option<usize>,
    pub cublaslt: Option<GemmReference>,
    /// Why there is no cuBLASLt row (library missing, mode unsupported).
    pub cublaslt_missing: Option<String>,
}

impl GemmCase {
    /// Whether every candidate and the reference passed the gate.
    pub fn passed(&self) -> bool {
        self.candidates
            .iter()
            .all(|c| c.passed || c.skipped.is_some())
            && self.cublaslt.as_ref().is_none_or(|r| r.passed)
    }
}

pub(crate) fn positions_for(spec: &ScaledMmSpec, seed: u64) -> Vec<(usize, usize)> {
    let (m, n) = (spec.m(), spec.n());
    if m * n <= 4 * SAMPLES {
        (0..m * n).map(|i| (i / n, i % n)).collect()
    } else {
        sample_positions(spec, SAMPLES, seed)
    }
}

/// Verifies and times `kernels` (the ladder's defaults when empty) on one case against
/// cuBLASLt. The candidates are timed one pair-run each against the same cuBLASLt run;
/// the reference's reported time is from the pairs of the best candidate.
pub fn bench_scaled_mm(
    dev: &CudaDevice,
    name: &str,
    spec: &ScaledMmSpec,
    kernels: &[GemmKernel],
    protocol: &Protocol,
    seed: u64,
) -> Result<GemmCase> {
    let data = ScaledMmData::random(spec, seed);
    let positions = positions_for(spec, seed);
    let want = scaled_mm_reference_at(spec, &data, &positions)?;
    let gflop = spec.flops() as f64 / 1e9;

    let (mut reference, cublaslt_missing) = match CublasLtScaledMm::new(dev, spec, &data) {
        Ok(r) => (Some(r), None),
        Err(e) if !matches!(e, crate::Error::Cuda { .. }) => (None, Some(e.to_string())),
        Err(e) => return Err(e),
    };
    let mut reference_verdict = None;
    if let Some(r) = reference.as_mut() {
        r.launch()?;
        reference_verdict = Some(gemm_gate_at(&r.output()?, spec.n(), &positions, &want)?);
    }

    // The ladder's defaults, the wgmma rung's tuned config where the cache has one.
    let tuned = if kernels.is_empty() {
        super::tune::tuned_config(&TuneCache::open_default(), &target_of(dev), spec)
    } else {
        None
    };
    let kernels: Vec<GemmKernel> = if kernels.is_empty() {
        GemmKernel::ladder(spec)
            .into_iter()
            .map(|k| match (k, tuned) {
                (GemmKernel::Wgmma(_), Some(t)) => GemmKernel::Wgmma(t),
                (k, _) => k,
            })
            .collect()
    } else {
        kernels.to_vec()
    };
    let mut candidates = Vec::new();
    let mut best: Option<(usize, f64)> = None;
    let mut reference_ms = f64::NAN;
    for cfg in kernels {
        if let Err(reason) = cfg.fits(spec) {
            candidates.push(GemmCandidate {
                variant: cfg.variant(),
                config: cfg.to_string(),
                rel_l2: f64::NAN,
                max_abs: f64::NAN,
                passed: false,
                timing: None,
                tflops: None,
                vs_cublaslt: None,
                pack_ms: 0.0,
                skipped: Some(reason),
                tuned: false,
                resources: None,
            });
            continue;
        }
        let mut run = ScaledMmRun::new(dev, spec, &data, cfg)?;
        run.launch()?;
        let v = gemm_gate_at(&run.output()?, spec.n(), &positions, &want)?;
        let mut c = GemmCandidate {
            variant: cfg.variant(),
            config: cfg.to_string(),
            rel_l2: v.rel_l2,
            max_abs: v.max_abs,
            passed: v.passed,
            timing: None,
            tflops: None,
            vs_cublaslt: None,
            pack_ms: run.pack_ms(),
            skipped: None,
            tuned: tuned.is_some_and(|t| GemmKernel::Wgmma(t) == cfg),
            resources: Some(run.resources()),
        };
        if v.passed {
            let (timing, against) = match reference.as_mut() {
                Some(r) => {
                    let p = time_pair_launches(protocol, |_| run.launch(), |_| r.launch(), 1)?;
                    (p.candidate, Some((p.baseline.median_ms, p.speedup)))
                }
                None => (time_launches(protocol, |_| run.launch(), 1)?, None),
            };
            c.tflops = Some(gflop / timing.median_ms);
            c.vs_cublaslt = against.map(|a| a.1);
            if best.is_none_or(|b| timing.median_ms < b.1) {
                best = Some((candidates.len(), timing.median_ms));
                reference_ms = against.map_or(f64::NAN, |a| a.0);
            }
            c.timing = Some(timing);
        }
        candidates.push(c);
    }
    if let (Some(r), true) = (reference.as_mut(), reference_ms.is_nan()) {
        // No candidate passed: the reference is timed alone.
        reference_ms = time_launches(protocol, |_| r.launch(), 1)?.median_ms;
    }
    let cublaslt = reference
        .zip(reference_verdict)
        .map(|(r, v)| GemmReference {
            algorithms_timed: r.search.1,
            rel_l2: v.rel_l2,
            max_abs: v.max_abs,
            passed: v.passed,
            median_ms: reference_ms,
            tflops: gflop / reference_ms,
        });
    Ok(GemmCase {
        name: name.to_string(),
        spec: spec.to_string(),
        key: spec.key(),
        m: spec.m(),
        n: spec.n(),
        k: spec.k(),
        checked: positions.len(),
        min_bytes: spec.min_bytes(),
        candidates,
        best: best.map(|b| b.0),
        cublaslt,
        cublaslt_missing,
    })
}
