//! The bottleneck verdict: which unit is the limit, the numbers that decided it, and
//! the next thing to try. The decision tree follows Nsight Compute's speed-of-light
//! reasoning: a unit above [`BUSY`] % of its peak is the limit; when none is, the
//! kernel waits on latency, and occupancy or the top stall reason says why.

use serde::{Deserialize, Serialize};

use super::ncu::Counters;
use super::occupancy::Occupancy;

/// A unit this busy (percent of its sustained peak) is what bounds the kernel.
pub const BUSY: f64 = 60.0;
/// Bank conflicts above this share of shared-memory wavefronts are worth fixing first.
const CONFLICTS: f64 = 10.0;
/// Below this theoretical occupancy (percent) too few warps may hide latency.
const LOW_OCCUPANCY: f64 = 50.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Bound {
    /// HBM bandwidth.
    Dram,
    L2,
    /// The L1/TEX unit, shared memory included.
    L1Shared,
    /// FP32 FMA pipe.
    Fma,
    /// Integer / logic / conversion pipe.
    Alu,
    Tensor,
    /// Load/store instruction issue.
    Lsu,
    /// Instruction issue itself (one instruction per cycle per scheduler).
    Issue,
    /// Too few resident warps to hide latency.
    Occupancy,
    /// Nothing busy and warps stalled: dependencies, memory latency, barriers.
    Latency,
}

impl Bound {
    pub fn class(self) -> &'static str {
        match self {
            Bound::Dram | Bound::L2 | Bound::L1Shared => "memory-bound",
            Bound::Fma | Bound::Alu | Bound::Tensor | Bound::Lsu | Bound::Issue => "compute-bound",
            Bound::Occupancy => "occupancy-limited",
            Bound::Latency => "latency-bound",
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            Bound::Dram => "DRAM",
            Bound::L2 => "L2",
            Bound::L1Shared => "L1/shared",
            Bound::Fma => "FMA pipe",
            Bound::Alu => "ALU pipe",
            Bound::Tensor => "tensor pipe",
            Bound::Lsu => "LSU pipe",
            Bound::Issue => "instruction issue",
            Bound::Occupancy => "resident warps",
            Bound::Latency => "stalls",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Diagnosis {
    pub bound: Bound,
    /// E.g. "memory-bound (L1/shared)".
    pub verdict: String,
    /// The numbers that decided it.
    pub because: String,
    pub next: String,
}

fn pct(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.0}%"))
}

fn stall_advice(reason: &str) -> &'static str {
    match reason {
        "long_scoreboard" => {
            "warps wait on global memory: put more bytes in flight (cp.async / TMA \
             prefetch of the next tile, more independent loads per thread)"
        }
        "short_scoreboard" | "mio_throttle" => {
            "warps wait on shared memory / MIO: fewer shared accesses per output (keep \
             reused values in registers, 16-byte or ldmatrix accesses, no bank conflicts)"
        }
        "barrier" => {
            "warps wait at __syncthreads: split the block's work so fewer barriers are \
             needed (double-buffer, warp-specialized producers)"
        }
        "wait" | "math_pipe_throttle" | "dispatch_stall" => {
            "warps wait on fixed-latency dependencies: more independent work per thread \
             (unroll, several accumulators) to raise ILP"
        }
        "lg_throttle" => "the global load queue is full: fewer, wider loads (16-byte vectors, TMA)",
        "tex_throttle" => "the texture/L1 queue is full: fewer, wider loads",
        "branch_resolving" => "divergent branches: make the hot loop branch-free",
        "no_instruction" | "imc_miss" => {
            "instruction cache misses: a smaller unrolled body or fewer specializations"
        }
        "membar" => "memory fences: drop or weaken them",
        _ => "look at the source-level stall counters (ncu --set full) for this reason",
    }
}

/// The verdict for one kernel's `counters`, with its theoretical `occupancy` and the
/// problem's compulsory DRAM bytes when known.
pub fn diagnose(
    counters: &Counters,
    occupancy: Option<&Occupancy>,
    compulsory_bytes: Option<f64>,
) -> Diagnosis {
    let c = counters;
    let units = [
        (Bound::Dram, c.dram_pct),
        (Bound::L2, c.l2_pct),
        (Bound::L1Shared, c.l1_pct),
        (Bound::Tensor, c.tensor_pct),
        (Bound::Fma, c.fma_pct),
        (Bound::Alu, c.alu_pct),
        (Bound::Lsu, c.lsu_pct),
        (Bound::Issue, c.issue_pct),
    ];
    let busiest = units
        .iter()
        .filter_map(|&(b, v)| Some((b, v?)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let speed_of_light = format!(
        "DRAM {}, L2 {}, L1/shared {}, tensor {}, FMA {}, ALU {}, issue {}",
        pct(c.dram_pct),
        pct(c.l2_pct),
        pct(c.l1_pct),
        pct(c.tensor_pct),
        pct(c.fma_pct),
        pct(c.alu_pct),
        pct(c.issue_pct)
    );
    let top_stall = c.stalls.iter().find(|s| s.reason != "not_selected");
    let stall_text = top_stall.map_or("no stall counters".into(), |s| {
        format!(
            "top stall {} ({:.2} warps per issue)",
            s.reason, s.per_issue
        )
    });

    let make = |bound: Bound, because: String, next: String| Diagnosis {
        bound,
        verdict: format!("{} ({})", bound.class(), bound.unit()),
        because,
        next,
    };

    if let Some((bound, busy)) = busiest.filter(|&(_, v)| v >= BUSY) {
        let because = format!(
            "{} at {busy:.0}% of peak >= {BUSY:.0}%; {speed_of_light}",
            bound.unit()
        );
        let next = match bound {
            Bound::Dram => match (c.dram_bytes, compulsory_bytes) {
                (Some(moved), Some(need)) if need > 0.0 && moved > 1.3 * need => format!(
                    "DRAM moves {:.1}x the compulsory bytes: improve reuse (tiles whose halos stay \
                     in shared memory or L2) before anything else",
                    moved / need
                ),
                _ => "at the bandwidth roof with near-compulsory traffic: only fewer bytes help \
                      (fusion, a narrower dtype)"
                    .into(),
            },
            Bound::L2 => "L2 traffic bounds it: keep reused data in shared memory or registers \
                          instead of re-reading it through L2"
                .into(),
            Bound::L1Shared => match c.bank_conflict_pct() {
                Some(p) if p >= CONFLICTS => format!(
                    "{p:.0}% of shared-memory wavefronts are bank conflicts: pad or swizzle the \
                     shared tiles"
                ),
                _ => "cut on-chip traffic per output: reuse loaded values from registers, \
                      16-byte accesses, ldmatrix/stmatrix, fewer staging round trips"
                    .into(),
            },
            // Hopper's warpgroup MMA is already the largest shape: then only wasted work
            // (padding, tails) or the clock is left.
            Bound::Tensor if c.kernel.contains("wgmma") => {
                "the tensor pipe is the roof: remove padded (wasted) MMA work; the rest is the \
                 clock (power-limited under fp8)"
                    .into()
            }
            Bound::Tensor => "the tensor pipe is the roof: remove padded (wasted) MMA work or \
                              move to a larger MMA shape (wgmma)"
                .into(),
            Bound::Fma => "FP32 FMAs are the roof: move the MACs to tensor cores, or to packed \
                           bf16x2/f16x2 math"
                .into(),
            Bound::Alu => "the ALU pipe (integer, conversion, compare) is the roof: hoist index \
                           math out of the loop, convert in pairs, fewer predicates"
                .into(),
            Bound::Lsu | Bound::Issue => "too many instructions per output: vector loads, packed \
                                          math, unrolled loops with index math hoisted"
                .into(),
            Bound::Occupancy | Bound::Latency => unreachable!("not a unit"),
        };
        return make(bound, because, next);
    }

    if let Some(o) = occupancy.filter(|o| o.percent < LOW_OCCUPANCY) {
        let limiters = o
            .limiters
            .iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join(" and ");
        let mut fixes = Vec::new();
        if let Some(r) = o.registers_for_next_block {
            fixes.push(format!("<= {r} registers per thread"));
        }
        if let Some(s) = o.shared_for_next_block {
            fixes.push(format!("<= {s} B shared per block"));
        }
        let next = if fixes.is_empty() {
            format!(
                "{limiters} cap it at {} blocks/SM: use larger blocks",
                o.blocks_per_sm
            )
        } else {
            format!(
                "fit one more block per SM with {} (or give each warp more independent work)",
                fixes.join(" and ")
            )
        };
        return make(
            Bound::Occupancy,
            format!(
                "no unit above {BUSY:.0}% ({speed_of_light}); theoretical occupancy {:.0}% \
                 ({} blocks/SM, limited by {limiters}), achieved {}; {stall_text}",
                o.percent,
                o.blocks_per_sm,
                pct(c.achieved_occupancy_pct)
            ),
            next,
        );
    }

    make(
        Bound::Latency,
        format!(
            "no unit above {BUSY:.0}% ({speed_of_light}); achieved occupancy {}; {stall_text}",
            pct(c.achieved_occupancy_pct)
        ),
        top_stall.map_or_else(
            || "profile with --set full to see the stall reasons".into(),
            |s| stall_advice(&s.reason).to_string(),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::ncu::{parse_raw_csv, Stall};
    use crate::profile::occupancy::Limiter;

    fn quiet() -> Counters {
        Counters {
            kernel: "k".into(),
            dram_pct: Some(20.0),
            l2_pct: Some(15.0),
            l1_pct: Some(30.0),
            tensor_pct: Some(5.0),
            fma_pct: Some(10.0),
            alu_pct: Some(12.0),
            lsu_pct: Some(8.0),
            issue_pct: Some(25.0),
            achieved_occupancy_pct: Some(28.0),
            stalls: vec![
                Stall {
                    reason: "not_selected".into(),
                    per_issue: 3.0,
                },
                Stall {
                    reason: "long_scoreboard".into(),
                    per_issue: 2.0,
                },
                Stall {
                    reason: "barrier".into(),
                    per_issue: 0.5,
                },
            ],
            ..Counters::default()
        }
    }

    fn occ(percent: f64) -> Occupancy {
        Occupancy {
            threads_per_block: 128,
            by_registers: 7,
            by_shared: 5,
            by_warps: 16,
            by_blocks: 32,
            blocks_per_sm: 5,
            limiters: vec![Limiter::SharedMemory],
            percent,
            registers_for_next_block: None,
            shared_for_next_block: Some(37_888),
        }
    }

    #[test]
    fn dram_at_peak_with_compulsory_traffic_is_memory_bound() {
        let c = Counters {
            dram_pct: Some(88.0),
            dram_bytes: Some(450e6),
            ..quiet()
        };
        let d = diagnose(&c, None, Some(442e6));
        assert_eq!(d.bound, Bound::Dram);
        assert_eq!(d.verdict, "memory-bound (DRAM)");
        assert!(d.next.contains("fewer bytes"), "{}", d.next);
        let d = diagnose(&c, None, Some(200e6));
        assert!(d.next.contains("2.2x the compulsory"), "{}", d.next);
    }

    #[test]
    fn busiest_unit_wins() {
        let c = Counters {
            dram_pct: Some(61.0),
            tensor_pct: Some(93.0),
            ..quiet()
        };
        let d = diagnose(&c, None, None);
        assert_eq!(d.bound, Bound::Tensor);
        assert_eq!(d.verdict, "compute-bound (tensor pipe)");
        let c = Counters {
            fma_pct: Some(70.0),
            ..quiet()
        };
        assert_eq!(diagnose(&c, None, None).bound, Bound::Fma);
    }

    #[test]
    fn low_occupancy_without_a_busy_unit_names_the_limiter_and_the_fix() {
        let d = diagnose(&quiet(), Some(&occ(31.25)), None);
        assert_eq!(d.bound, Bound::Occupancy);
        assert!(
            d.because.contains("limited by shared memory"),
            "{}",
            d.because
        );
        assert!(d.next.contains("<= 37888 B shared"), "{}", d.next);
    }

    #[test]
    fn otherwise_latency_bound_with_the_top_stall_reason() {
        let d = diagnose(&quiet(), Some(&occ(75.0)), None);
        assert_eq!(d.bound, Bound::Latency);
        assert!(
            d.because.contains("top stall long_scoreboard"),
            "{}",
            d.because
        );
        assert!(d.next.contains("global memory"), "{}", d.next);
        let d = diagnose(
            &Counters {
                stalls: vec![],
                ..quiet()
            },
            None,
            None,
        );
        assert_eq!(d.bound, Bound::Latency);
    }

    #[test]
    fn recorded_smem_tile_is_bound_by_shared_bank_conflicts() {
        let text = include_str!("../../tests/data/ncu-raw-smem_tile-h100.csv");
        let c = &parse_raw_csv(text).unwrap()[0];
        let d = diagnose(c, None, Some(442e6));
        assert_eq!(d.bound, Bound::L1Shared, "{d:?}");
        assert!(d.next.contains("bank conflicts"), "{}", d.next);
    }

    #[test]
    fn recorded_naive_is_issue_bound_and_channels_last_conflicts() {
        let text = include_str!("../../tests/data/ncu-raw-naive-h100.csv");
        let d = diagnose(&parse_raw_csv(text).unwrap()[0], None, Some(442e6));
        assert_eq!(d.bound, Bound::Issue, "{d:?}");
        let text = include_str!("../../tests/data/ncu-raw-channels_last-h100.csv");
        let d = diagnose(&parse_raw_csv(text).unwrap()[0], None, Some(442e6));
        assert_eq!(d.bound, Bound::L1Shared, "{d:?}");
        assert!(
            d.next.starts_with("50% of shared-memory wavefronts"),
            "{}",
            d.next
        );
    }
}
