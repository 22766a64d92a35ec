//! What a measuring session reports: the run, its cases and their rows (the `--json`
//! schema, documented field by field in docs/report.md).

use serde::{Deserialize, Serialize};

use super::Options;
use crate::bench::{Ceilings, Throughput, Timing};
use crate::cuda::{GpuInfo, KernelResources};
use crate::dispatch::Choice;
use crate::epilogue::Epilogue;
use crate::verify::Verdict;

/// What a report says about the machine it ran on.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub backend: String,
    pub name: String,
    pub detail: String,
    /// The GPU's properties, on the CUDA backend.
    pub gpu: Option<GpuInfo>,
}

/// One implementation's line in a case report. Timings exist only for passing checks.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RowReport {
    pub name: String,
    /// The config a kernel variant ran with (`variant:k=v,...`).
    pub config: Option<String>,
    /// The kernel instance's canonical name (variant, dtype, layout, every parameter).
    #[serde(default)]
    pub instance: Option<String>,
    pub verdict: Verdict,
    pub timing: Option<Timing>,
    pub throughput: Option<Throughput>,
    /// Median over A B pairs of baseline time / this time, when a baseline ran.
    pub speedup_vs_baseline: Option<f64>,
    pub resources: Option<KernelResources>,
    /// E.g. the algorithm cuDNN chose, or the JIT time.
    pub note: Option<String>,
}

impl RowReport {
    pub(crate) fn new(name: String, verdict: Verdict) -> Self {
        RowReport {
            name,
            config: None,
            instance: None,
            verdict,
            timing: None,
            throughput: None,
            speedup_vs_baseline: None,
            resources: None,
            note: None,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CaseReport {
    pub name: String,
    pub spec: String,
    pub key: String,
    pub flops: u64,
    pub min_bytes: u64,
    pub floor_ms: Option<f64>,
    pub seed: u64,
    pub input_sets: usize,
    pub rows: Vec<RowReport>,
    /// Implementations that do not apply to this case, and why.
    pub skipped: Vec<(String, String)>,
    /// What cuDNN's algorithm search measured, when the baseline ran.
    pub baseline_search: Vec<crate::cuda::cudnn::AlgoTime>,
    /// The fused epilogue the case ran with (`none`, or e.g. `bias+silu+res`).
    #[serde(default)]
    pub epilogue: Epilogue,
    /// The kernel the engine picks for this problem on this device (GPU only).
    #[serde(default, deserialize_with = "dispatch_of_any_version")]
    pub dispatch: Option<Choice>,
    /// Why no GPU kernel can take the problem, when none can.
    #[serde(default)]
    pub dispatch_error: Option<String>,
    /// The pass the case measured (forward, dgrad, wgrad).
    #[serde(default)]
    pub pass: crate::pass::Pass,
    /// Outside implementations' times on this case (`--reference`), e.g. PyTorch's.
    #[serde(default)]
    pub references: Vec<crate::external::ReferenceTime>,
}

/// Whether a row is one of cuDNN's reference rows rather than one of our plans.
pub fn is_reference_row(name: &str) -> bool {
    name == "cudnn" || name == "cudnn-legacy"
}

impl CaseReport {
    /// Whether every evokernel implementation passed its gate. A reference row that fails
    /// (cuDNN's f16 grad-weight engine misses the f16 gate on efficientnet-k5s2, run 101)
    /// is shown as failed and left out of the best reference, but fails no run.
    pub fn passed(&self) -> bool {
        self.rows
            .iter()
            .filter(|r| !is_reference_row(&r.name))
            .all(|r| r.verdict.passed)
    }

    /// The fastest reference on this case: the in-process cuDNN rows that passed and
    /// were timed, and the outside times; `(name, median ms)`.
    pub fn best_reference(&self) -> Option<(String, f64)> {
        let cudnn = self
            .rows
            .iter()
            .filter(|r| is_reference_row(&r.name) && r.verdict.passed)
            .filter_map(|r| Some((r.name.clone(), r.timing?.median_ms)));
        let outside = self
            .references
            .iter()
            .map(|r| (r.name.clone(), r.median_ms));
        cudnn.chain(outside).min_by(|a, b| a.1.total_cmp(&b.1))
    }
}

/// Reports before schema version 2 wrote the pick as `{"Ok": choice}` or `{"Err": why}`.
fn dispatch_of_any_version<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<Choice>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Any {
        Choice(Choice),
        Ok {
            #[serde(rename = "Ok")]
            ok: Choice,
        },
        Err {
            #[serde(rename = "Err")]
            _err: String,
        },
    }
    Ok(match Option::<Any>::deserialize(d)? {
        Some(Any::Choice(c)) | Some(Any::Ok { ok: c }) => Some(c),
        Some(Any::Err { .. }) | None => None,
    })
}

/// The version of the report format below; docs/report.md documents every field.
pub const REPORT_SCHEMA_VERSION: u32 = 2;

/// Everything one command measured, as written by `--json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunReport {
    /// `REPORT_SCHEMA_VERSION` of the evokernel that wrote it (absent before version 2).
    #[serde(default)]
    pub schema_version: u32,
    pub evokernel_version: String,
    pub commit: String,
    pub date_utc: String,
    pub device: DeviceInfo,
    pub ceilings: Option<Ceilings>,
    pub options: Options,
    pub cases: Vec<CaseReport>,
    /// What went wrong without stopping the run (e.g. a corrupt tune cache, ignored).
    #[serde(default)]
    pub warnings: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_reference_row_fails_no_run_and_is_no_best_reference() {
        let report: RunReport = serde_json::from_str(include_str!(
            "../../../../docs/results/h100-suite-run29.json"
        ))
        .unwrap();
        let mut case = report.cases[0].clone();
        assert!(case.passed());
        assert_eq!(case.best_reference().unwrap().0, "cudnn");
        for r in case.rows.iter_mut().filter(|r| is_reference_row(&r.name)) {
            r.verdict.passed = false;
        }
        assert!(case.passed());
        assert!(case.best_reference().is_none());
        case.references.push(crate::external::ReferenceTime {
            name: "pytorch-native".into(),
            median_ms: 7.0,
            source: "test".into(),
        });
        assert_eq!(case.best_reference(), Some(("pytorch-native".into(), 7.0)));
        let ours = case
            .rows
            .iter_mut()
            .find(|r| !is_reference_row(&r.name))
            .unwrap();
        ours.verdict.passed = false;
        assert!(!case.passed());
    }
}
