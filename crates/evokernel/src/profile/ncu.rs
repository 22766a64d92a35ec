//! Nsight Compute: finds `ncu`, runs a command under it with a kernel filter, and reads
//! the counters we diagnose with from its raw CSV page.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The metrics `evokernel profile` asks for, by base name and the rollup it reads.
/// Stall reasons are added from what the installed `ncu` knows (they vary by version).
const METRICS: &[&str] = &[
    "gpu__time_duration.sum",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "l1tex__throughput.avg.pct_of_peak_sustained_active",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sector_hit_rate.pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
];

const STALL_PREFIX: &str = "smsp__average_warps_issue_stalled_";
const STALL_SUFFIX: &str = "_per_issue_active.ratio";

/// One reason warps were not issuing, in warps per issued instruction.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stall {
    pub reason: String,
    pub per_issue: f64,
}

/// What Nsight Compute measured for one kernel launch. Percentages are of the unit's
/// sustained peak; a metric this `ncu` does not offer is None.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Counters {
    pub kernel: String,
    /// Under ncu, which locks the clocks to base: longer than our event timings.
    pub duration_ms: Option<f64>,
    pub dram_pct: Option<f64>,
    pub dram_bytes: Option<f64>,
    pub sm_pct: Option<f64>,
    pub l1_pct: Option<f64>,
    pub l2_pct: Option<f64>,
    pub l2_hit_pct: Option<f64>,
    pub achieved_occupancy_pct: Option<f64>,
    pub theoretical_occupancy_pct: Option<f64>,
    pub fma_pct: Option<f64>,
    pub alu_pct: Option<f64>,
    pub tensor_pct: Option<f64>,
    pub lsu_pct: Option<f64>,
    pub issue_pct: Option<f64>,
    pub shared_wavefronts: Option<f64>,
    pub shared_bank_conflicts: Option<f64>,
    /// Largest first; `selected` (the warp was issuing) is left out.
    pub stalls: Vec<Stall>,
}

impl Counters {
    fn from_metrics(kernel: String, m: &BTreeMap<String, f64>) -> Self {
        let get = |k: &str| m.get(k).copied();
        let sum = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        let mut stalls: Vec<Stall> = m
            .iter()
            .filter_map(|(k, &v)| {
                let reason = k.strip_prefix(STALL_PREFIX)?.strip_suffix(STALL_SUFFIX)?;
                (reason != "selected").then(|| Stall {
                    reason: reason.to_string(),
                    per_issue: v,
                })
            })
            .collect();
        stalls.sort_by(|a, b| b.per_issue.total_cmp(&a.per_issue));
        Counters {
            kernel,
            duration_ms: get("gpu__time_duration.sum").map(|ns| ns * 1e-6),
            dram_pct: get("dram__throughput.avg.pct_of_peak_sustained_elapsed"),
            dram_bytes: sum(get("dram__bytes_read.sum"), get("dram__bytes_write.sum")),
            sm_pct: get("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
            l1_pct: get("l1tex__throughput.avg.pct_of_peak_sustained_active"),
            l2_pct: get("lts__throughput.avg.pct_of_peak_sustained_elapsed"),
            l2_hit_pct: get("lts__t_sector_hit_rate.pct"),
            achieved_occupancy_pct: get("sm__warps_active.avg.pct_of_peak_sustained_active"),
            theoretical_occupancy_pct: get("sm__maximum_warps_per_active_cycle_pct"),
            fma_pct: get("sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"),
            alu_pct: get("sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active"),
            // Every tensor pipe (Hopper's wgmma too); the mma.sync-only (hmma) metric where
            // this ncu has no aggregate.
            tensor_pct: get("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active").or(
                get("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"),
            ),
            lsu_pct: get("sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active"),
            issue_pct: get("smsp__issue_active.avg.pct_of_peak_sustained_active"),
            shared_wavefronts: get("l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"),
            shared_bank_conflicts: sum(
                get("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"),
                get("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"),
            ),
            stalls,
        }
    }

    /// Bank conflicts as a share of all shared-memory wavefronts, in percent.
    pub fn bank_conflict_pct(&self) -> Option<f64> {
        match (self.shared_bank_conflicts, self.shared_wavefronts) {
            (Some(c), Some(w)) if w > 0.0 => Some(100.0 * c / w),
            _ => None,
        }
    }
}

/// Reads `ncu --csv --page raw` output: a header of metric names, a row of units, then
/// one row per profiled launch. `==PROF==` lines and non-numeric values are skipped;
/// numbers may carry thousands separators.
pub fn parse_raw_csv(text: &str) -> Result<Vec<Counters>> {
    let body: String = text
        .lines()
        .filter(|l| !l.starts_with("==") && !l.trim().is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    let bad = |message: String| Error::Profiler { message };
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .from_reader(body.as_bytes());
    let header: Vec<String> = reader
        .headers()
        .map_err(|e| bad(format!("ncu CSV has no header: {e}")))?
        .iter()
        .map(str::to_string)
        .collect();
    let kernel_col = header
        .iter()
        .position(|h| h == "Kernel Name")
        .ok_or_else(|| {
            bad("ncu CSV has no 'Kernel Name' column: was it written with --page raw?".into())
        })?;
    let mut out = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let record = record.map_err(|e| bad(format!("ncu CSV row {}: {e}", i + 2)))?;
        let kernel = record.get(kernel_col).unwrap_or_default();
        // The units row has an empty kernel name.
        if kernel.is_empty() {
            continue;
        }
        let metrics = header
            .iter()
            .zip(record.iter())
            .filter_map(|(h, v)| Some((h.clone(), v.replace(',', "").parse::<f64>().ok()?)))
            .collect();
        out.push(Counters::from_metrics(kernel.to_string(), &metrics));
    }
    if out.is_empty() {
        return Err(bad(
            "ncu profiled no kernel: the kernel filter matched no launch".into(),
        ));
    }
    Ok(out)
}

/// An installed Nsight Compute command line.
#[derive(Clone, Debug)]
pub struct Ncu {
    pub path: PathBuf,
}

impl Ncu {
    /// `$EVOKERNEL_NCU`, then `ncu` on PATH, then the CUDA toolkit's usual places.
    pub fn locate() -> Result<Ncu> {
        Self::locate_in(std::env::var_os("EVOKERNEL_NCU"), std::env::var_os("PATH"))
    }

    fn locate_in(
        forced: Option<std::ffi::OsString>,
        path_var: Option<std::ffi::OsString>,
    ) -> Result<Ncu> {
        if let Some(p) = forced {
            let path = PathBuf::from(p);
            return if path.is_file() {
                Ok(Ncu { path })
            } else {
                Err(Error::Profiler {
                    message: format!(
                        "EVOKERNEL_NCU={} is not a file; point it at Nsight Compute's ncu",
                        path.display()
                    ),
                })
            };
        }
        let on_path: Vec<PathBuf> = path_var
            .map(|p| std::env::split_paths(&p).map(|d| d.join("ncu")).collect())
            .unwrap_or_default();
        on_path
            .into_iter()
            .chain([
                "/usr/local/cuda/bin/ncu".into(),
                "/opt/nvidia/nsight-compute/ncu".into(),
            ])
            .find(|p: &PathBuf| p.is_file())
            .map(|path| Ncu { path })
            .ok_or_else(|| Error::Profiler {
                message: "Nsight Compute (ncu) is not installed or not on PATH; install it, \
                          or set EVOKERNEL_NCU=/path/to/ncu (--no-counters prints the \
                          resource report without it)"
                    .into(),
            })
    }

    fn run(&self, args: &[String]) -> Result<std::process::Output> {
        Command::new(&self.path)
            .args(args)
            .output()
            .map_err(|e| Error::Profiler {
                message: format!("cannot start {}: {e}", self.path.display()),
            })
    }

    /// Our metric list, less what this `ncu` does not know, plus its stall reasons.
    pub fn metrics(&self) -> Result<Vec<String>> {
        let out = self.run(&["--query-metrics".into()])?;
        if !out.status.success() {
            return Err(Error::Profiler {
                message: format!(
                    "ncu --query-metrics failed: {}",
                    tail(&String::from_utf8_lossy(&out.stderr))
                ),
            });
        }
        Ok(select_metrics(&String::from_utf8_lossy(&out.stdout)))
    }

    /// Runs `program args` under ncu, profiling the first launch of a kernel whose
    /// function name matches `kernel_regex`.
    pub fn profile(
        &self,
        kernel_regex: &str,
        metrics: &[String],
        program: &Path,
        args: &[String],
    ) -> Result<Counters> {
        let log = std::env::temp_dir().join(format!(
            "evokernel-ncu-{}-{}.csv",
            std::process::id(),
            crate::cache::stable_hash(&[kernel_regex.as_bytes(), args.join(" ").as_bytes()])
        ));
        let mut ncu_args: Vec<String> = [
            "--csv",
            "--page",
            "raw",
            "--launch-count",
            "1",
            "--kernel-name",
        ]
        .map(String::from)
        .to_vec();
        ncu_args.push(format!("regex:{kernel_regex}"));
        ncu_args.extend(["--log-file".into(), log.display().to_string()]);
        ncu_args.extend(["--metrics".into(), metrics.join(",")]);
        ncu_args.push(program.display().to_string());
        ncu_args.extend(args.iter().cloned());
        let out = self.run(&ncu_args)?;
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        if !out.status.success() || text.contains("==ERROR==") {
            let errors: String = text
                .lines()
                .chain(String::from_utf8_lossy(&out.stderr).lines())
                .filter(|l| l.contains("ERROR") || l.starts_with("error"))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(Error::Profiler {
                message: format!(
                    "ncu failed on kernel /{kernel_regex}/ (exit {}): {}",
                    out.status,
                    if errors.is_empty() {
                        tail(&String::from_utf8_lossy(&out.stderr))
                    } else {
                        errors
                    }
                ),
            });
        }
        // Never empty: parse_raw_csv fails when no launch was profiled.
        Ok(parse_raw_csv(&text)?.swap_remove(0))
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().rev().take(3).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join("; ")
}

/// The metrics of [`METRICS`] whose base name appears in `ncu --query-metrics` output,
/// plus every stall reason it lists.
pub fn select_metrics(query_output: &str) -> Vec<String> {
    let known: std::collections::HashSet<&str> = query_output
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let mut out: Vec<String> = METRICS
        .iter()
        .filter(|m| known.contains(m.split('.').next().unwrap_or(m)))
        .map(|m| m.to_string())
        .collect();
    out.extend(
        known
            .iter()
            .filter(|k| {
                k.starts_with(STALL_PREFIX) && k.ends_with("_per_issue_active") && !k.contains('.')
            })
            .map(|k| format!("{k}.ratio")),
    );
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hopper's wgmma runs on the tensor pipe the hmma metric does not see: the aggregate
    /// wins where ncu has it.
    #[test]
    fn tensor_use_counts_every_tensor_pipe() {
        let hmma = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active";
        let all = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active";
        let m: BTreeMap<String, f64> = [(hmma.to_string(), 0.0), (all.to_string(), 71.0)].into();
        assert_eq!(
            Counters::from_metrics("k".into(), &m).tensor_pct,
            Some(71.0)
        );
        let m: BTreeMap<String, f64> = [(hmma.to_string(), 40.0)].into();
        assert_eq!(
            Counters::from_metrics("k".into(), &m).tensor_pct,
            Some(40.0)
        );
    }

    const SMEM_TILE: &str = include_str!("../../tests/data/ncu-raw-smem_tile-h100.csv");
    const NAIVE: &str = include_str!("../../tests/data/ncu-raw-naive-h100.csv");

    #[test]
    fn reads_a_recorded_h100_csv() {
        let all = parse_raw_csv(SMEM_TILE).unwrap();
        assert_eq!(all.len(), 1);
        let c = &all[0];
        assert_eq!(
            c.kernel,
            "void smem_tile_dwconv<__nv_bfloat16, 3, 5, 5, 8>(ConvArgs)"
        );
        assert!((c.duration_ms.unwrap() - 1.458432).abs() < 1e-9);
        assert_eq!(c.dram_pct, Some(8.79));
        assert_eq!(c.dram_bytes, Some(224_986_624.0 + 204_940_800.0));
        assert_eq!(c.l1_pct, Some(82.26));
        assert_eq!(c.l2_hit_pct, Some(81.40));
        assert_eq!(c.achieved_occupancy_pct, Some(48.58));
        assert_eq!(c.theoretical_occupancy_pct, Some(50.0));
        assert_eq!(c.fma_pct, Some(28.65));
        assert_eq!(c.shared_bank_conflicts, Some(62_628_089.0 + 45_253_573.0));
        let conflicts = c.bank_conflict_pct().unwrap();
        assert!((conflicts - 51.08).abs() < 0.01, "{conflicts}");
        assert_eq!(c.stalls[0].reason, "not_selected");
        assert_eq!(c.stalls[1].reason, "short_scoreboard");
        assert!(c.stalls.iter().all(|s| s.reason != "selected"));
        assert!(c
            .stalls
            .windows(2)
            .all(|w| w[0].per_issue >= w[1].per_issue));
    }

    #[test]
    fn reads_another_kernel_and_skips_prof_lines() {
        let c = &parse_raw_csv(NAIVE).unwrap()[0];
        assert!(c.kernel.contains("naive_dwconv"));
        assert_eq!(c.dram_pct, Some(1.97));
        assert_eq!(c.theoretical_occupancy_pct, Some(100.0));
    }

    #[test]
    fn empty_or_foreign_text_is_an_error() {
        assert!(parse_raw_csv("==PROF== Disconnected from process 1\n").is_err());
        assert!(parse_raw_csv("a,b\n1,2\n").is_err());
        let header_only = SMEM_TILE.lines().take(4).collect::<Vec<_>>().join("\n");
        assert!(parse_raw_csv(&header_only).is_err());
    }

    #[test]
    fn a_missing_ncu_is_a_clear_error() {
        let err = Ncu::locate_in(Some("/nonexistent/ncu".into()), None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("EVOKERNEL_NCU=/nonexistent/ncu is not a file"),
            "{err}"
        );
        if !std::path::Path::new("/usr/local/cuda/bin/ncu").exists()
            && !std::path::Path::new("/opt/nvidia/nsight-compute/ncu").exists()
        {
            let err = Ncu::locate_in(None, Some("/nonexistent".into()))
                .unwrap_err()
                .to_string();
            assert!(err.contains("--no-counters"), "{err}");
        }
    }

    #[test]
    fn metric_selection_follows_what_ncu_knows() {
        let query = "Device NVIDIA H100\n----\nMetric Name  Metric Type\n\
            dram__throughput  Throughput  %  DRAM throughput\n\
            gpu__time_duration  Counter  ns  duration\n\
            smsp__average_warps_issue_stalled_barrier_per_issue_active  Ratio  inst  x\n\
            smsp__average_warps_issue_stalled_wait_per_issue_active  Ratio  inst  x\n";
        assert_eq!(
            select_metrics(query),
            vec![
                "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                "gpu__time_duration.sum",
                "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
                "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
            ]
        );
    }
}
