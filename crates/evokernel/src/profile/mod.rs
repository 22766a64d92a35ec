//! Why a kernel runs at the speed it does: occupancy and its limiter from the driver's
//! resource report, Nsight Compute's counters, and a verdict naming the bottleneck and
//! the next thing to try.

pub mod diagnosis;
pub mod ncu;
pub mod occupancy;

pub use crate::cuda::SmLimits;
pub use diagnosis::{diagnose, Bound, Diagnosis};
pub use ncu::{Counters, Ncu};
pub use occupancy::{occupancy, Limiter, Occupancy};

use serde::{Deserialize, Serialize};

use crate::cuda::KernelResources;
use crate::error::Result;
use crate::gemm::{GemmCandidate, GemmCase};
use crate::session::{CaseReport, RowReport, RunReport};

/// Everything known about one kernel of a run: resources, occupancy, counters, verdict.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KernelProfile {
    pub case: String,
    pub implementation: String,
    pub config: Option<String>,
    /// Our event timing (clocks unlocked), from the run.
    pub median_ms: Option<f64>,
    pub resources: KernelResources,
    pub occupancy: Occupancy,
    pub counters: Option<Counters>,
    /// Why there are no counters (ncu missing or failed, or not asked for).
    pub counters_error: Option<String>,
    pub diagnosis: Option<Diagnosis>,
}

impl KernelProfile {
    /// One kernel's profile: `name` is (case, implementation, config); occupancy of its
    /// `resources` on the SM `limits`; `counters` None when not wanted; the verdict
    /// against the case's memory floor `min_bytes`.
    fn new(
        name: (String, String, Option<String>),
        median_ms: Option<f64>,
        (limits, resources): (&SmLimits, KernelResources),
        counters: Option<Result<Counters>>,
        min_bytes: f64,
    ) -> KernelProfile {
        let occupancy = occupancy::occupancy(limits, &resources);
        let (counters, counters_error) = match counters {
            None => (None, Some("not measured (--no-counters)".to_string())),
            Some(Ok(c)) => (Some(c), None),
            Some(Err(e)) => (None, Some(e.to_string())),
        };
        let diagnosis = counters
            .as_ref()
            .map(|c| diagnose(c, Some(&occupancy), Some(min_bytes)));
        KernelProfile {
            case: name.0,
            implementation: name.1,
            config: name.2,
            median_ms,
            resources,
            occupancy,
            counters,
            counters_error,
            diagnosis,
        }
    }
}

/// A run report with a profile of each kernel in it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProfileReport {
    pub run: RunReport,
    pub kernels: Vec<KernelProfile>,
}

/// Profiles every kernel row of `run` (rows with a resource report: our variants, not
/// cuDNN). `counters` measures one row, or returns None when counters are not wanted.
pub fn profile_run(
    run: RunReport,
    mut counters: impl FnMut(&CaseReport, &RowReport) -> Option<Result<Counters>>,
) -> ProfileReport {
    let limits = run
        .device
        .gpu
        .as_ref()
        .and_then(|g| g.sm_limits)
        .unwrap_or(SmLimits::HOPPER);
    let mut kernels = Vec::new();
    for case in &run.cases {
        for row in &case.rows {
            let Some(resources) = row.resources else {
                continue;
            };
            kernels.push(KernelProfile::new(
                (case.name.clone(), row.name.clone(), row.config.clone()),
                row.timing.as_ref().map(|t| t.median_ms),
                (&limits, resources),
                counters(case, row),
                case.min_bytes as f64,
            ));
        }
    }
    ProfileReport { run, kernels }
}

/// Profiles each fp8 GEMM candidate of `cases` that ran (passed the gate and has a
/// resource report): occupancy on `limits`, counters from `counters` (None: not wanted),
/// the verdict against the case's memory floor.
pub fn profile_gemm(
    cases: &[GemmCase],
    limits: &SmLimits,
    mut counters: impl FnMut(&GemmCase, &GemmCandidate) -> Option<Result<Counters>>,
) -> Vec<KernelProfile> {
    let mut kernels = Vec::new();
    for case in cases {
        for cand in &case.candidates {
            let (Some(resources), true) = (cand.resources, cand.passed) else {
                continue;
            };
            kernels.push(KernelProfile::new(
                (
                    case.name.clone(),
                    cand.variant.to_string(),
                    Some(cand.config.clone()),
                ),
                cand.timing.as_ref().map(|t| t.median_ms),
                (limits, resources),
                counters(case, cand),
                case.min_bytes as f64,
            ));
        }
    }
    kernels
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(config: &str, passed: bool, resources: Option<KernelResources>) -> GemmCandidate {
        GemmCandidate {
            variant: "scaled_mm_wgmma",
            config: config.into(),
            rel_l2: 1e-3,
            max_abs: 1e-2,
            passed,
            timing: None,
            tflops: None,
            vs_cublaslt: None,
            pack_ms: 0.0,
            skipped: None,
            tuned: false,
            resources,
        }
    }

    /// The kernels that ran are profiled (occupancy from their resources, the verdict
    /// from counters); a candidate that failed the gate or did not fit is left out.
    #[test]
    fn gemm_candidates_that_ran_are_profiled() {
        let wgmma = KernelResources {
            registers: 168,
            static_shared_bytes: 0,
            dynamic_shared_bytes: 216_000,
            local_bytes: 0,
            max_threads_per_block: 384,
            blocks_per_sm: 1,
            threads_per_block: 384,
        };
        let case = GemmCase {
            name: "square-8192".into(),
            spec: "scaled-mm 8192x8192x8192".into(),
            key: "k".into(),
            m: 8192,
            n: 8192,
            k: 8192,
            checked: 1280,
            min_bytes: 2 * 8192 * 8192 + 2 * 8192 * 8192,
            candidates: vec![
                candidate("scaled_mm_wgmma:bn=256", true, Some(wgmma)),
                candidate("scaled_mm_wgmma:bn=128", false, Some(wgmma)),
                candidate("scaled_mm_wgmma:bn=512", false, None),
            ],
            best: Some(0),
            cublaslt: None,
            cublaslt_missing: None,
        };
        let busy = Counters {
            kernel: "scaled_mm_wgmma".into(),
            duration_ms: Some(1.0),
            tensor_pct: Some(92.0),
            dram_pct: Some(20.0),
            issue_pct: Some(15.0),
            ..Counters::default()
        };
        let mut asked = Vec::new();
        let kernels = profile_gemm(std::slice::from_ref(&case), &SmLimits::HOPPER, |_, c| {
            asked.push(c.config.clone());
            Some(Ok(busy.clone()))
        });
        assert_eq!(asked, ["scaled_mm_wgmma:bn=256"]);
        assert_eq!(kernels.len(), 1);
        let k = &kernels[0];
        assert_eq!(k.implementation, "scaled_mm_wgmma");
        assert_eq!(k.occupancy.blocks_per_sm, 1);
        assert_eq!(k.diagnosis.as_ref().unwrap().bound, Bound::Tensor);
        // A wgmma kernel is not told to move to wgmma.
        assert!(!k.diagnosis.as_ref().unwrap().next.contains("(wgmma)"));
        // Without counters: resources and occupancy, and why there are no counters.
        let plain = profile_gemm(&[case], &SmLimits::HOPPER, |_, _| None);
        assert!(plain[0].diagnosis.is_none());
        assert!(plain[0]
            .counters_error
            .as_deref()
            .unwrap()
            .contains("--no-counters"));
    }
}
