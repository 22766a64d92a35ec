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
            let occupancy = occupancy::occupancy(&limits, &resources);
            let (counters, counters_error) = match counters(case, row) {
                None => (None, Some("not measured (--no-counters)".to_string())),
                Some(Ok(c)) => (Some(c), None),
                Some(Err(e)) => (None, Some(e.to_string())),
            };
            let diagnosis = counters
                .as_ref()
                .map(|c| diagnose(c, Some(&occupancy), Some(case.min_bytes as f64)));
            kernels.push(KernelProfile {
                case: case.name.clone(),
                implementation: row.name.clone(),
                config: row.config.clone(),
                median_ms: row.timing.as_ref().map(|t| t.median_ms),
                resources,
                occupancy,
                counters,
                counters_error,
                diagnosis,
            });
        }
    }
    ProfileReport { run, kernels }
}
