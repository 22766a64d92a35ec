//! Human-readable tables of run reports and device lists.

use comfy_table::{presets::UTF8_FULL_CONDENSED, Cell, CellAlignment, Table};
use evokernel::cuda::GpuInfo;
use evokernel::dispatch::Choice;
use evokernel::profile::KernelProfile;
use evokernel::session::{CaseReport, RowReport, RunReport, TuneReport};

fn num(x: Option<f64>, digits: usize) -> String {
    x.map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

fn sci(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else {
        format!("{x:.2e}")
    }
}

fn right(s: String) -> Cell {
    Cell::new(s).set_alignment(CellAlignment::Right)
}

/// One row per (case, implementation); timing columns only when something was timed,
/// GPU columns only on the GPU. No timing is shown for a row that failed its check.
pub fn render(report: &RunReport) -> String {
    let rows = || report.cases.iter().flat_map(|c| c.rows.iter());
    let timed = rows().any(|r| r.timing.is_some());
    let gpu = rows().any(|r| r.resources.is_some());
    let baseline = rows().any(|r| r.speedup_vs_baseline.is_some());
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    let mut header = vec!["case", "impl", "check", "rel L2", "max err"];
    if timed {
        header.extend([
            "median ms",
            "min ms",
            "max ms",
            "GFLOP/s",
            "GB/s",
            "% floor",
        ]);
    }
    if baseline {
        header.push("x cuDNN");
    }
    if gpu {
        header.extend(["regs", "smem B", "note"]);
    }
    t.set_header(header);
    for case in &report.cases {
        for (i, row) in case.rows.iter().enumerate() {
            let v = &row.verdict;
            let status = if v.passed {
                "PASS".to_string()
            } else if v.comparison.non_finite > 0 {
                format!("FAIL ({} non-finite)", v.comparison.non_finite)
            } else {
                format!("FAIL (gate {:.0e})", v.gate)
            };
            let label = if i == 0 {
                format!("{}\n{}", case.name, case.spec)
            } else {
                String::new()
            };
            let mut name = row.config.clone().unwrap_or_else(|| row.name.clone());
            if chosen(case).is_some_and(|c| row.config.as_deref() == Some(c.config.as_str())) {
                name.push_str("  <- auto");
            }
            let mut cells = vec![
                Cell::new(label),
                Cell::new(name),
                Cell::new(status),
                right(sci(v.comparison.rel_l2)),
                right(sci(v.comparison.max_abs_rel)),
            ];
            if timed {
                let (tm, tp) = (row.timing, row.throughput);
                cells.extend([
                    right(num(tm.map(|x| x.median_ms), 3)),
                    right(num(tm.map(|x| x.min_ms), 3)),
                    right(num(tm.map(|x| x.max_ms), 3)),
                    right(num(tp.map(|x| x.gflops), 0)),
                    right(num(tp.map(|x| x.gbps), 0)),
                    right(num(tp.map(|x| x.pct_of_floor), 1)),
                ]);
            }
            if baseline {
                cells.push(right(num(row.speedup_vs_baseline, 2)));
            }
            if gpu {
                let r = row.resources;
                cells.push(right(
                    r.map(|r| r.registers.to_string()).unwrap_or_default(),
                ));
                cells.push(right(
                    r.map(|r| (r.static_shared_bytes as u32 + r.dynamic_shared_bytes).to_string())
                        .unwrap_or_default(),
                ));
                cells.push(Cell::new(row.note.clone().unwrap_or_default()));
            }
            t.add_row(cells);
        }
    }
    let mut out = t.to_string();
    for case in &report.cases {
        if let Some(f) = case.floor_ms {
            out.push_str(&format!(
                "\n{}: floor {:.3} ms (max of {:.0} MB / copy bandwidth and {:.2} GFLOP / fastest compute)",
                case.name,
                f,
                case.min_bytes as f64 / 1e6,
                case.flops as f64 / 1e9
            ));
        }
        for r in &case.references {
            out.push_str(&format!(
                "\n{}: {} {:.3} ms (--reference)",
                case.name, r.name, r.median_ms
            ));
        }
        for (name, why) in &case.skipped {
            out.push_str(&format!("\n{}: {name} not run: {why}", case.name));
        }
        if let Some(c) = &case.dispatch {
            out.push_str(&format!(
                "\n{}: auto picks {} ({})",
                case.name, c.config, c.reason
            ));
        }
        if let Some(e) = &case.dispatch_error {
            out.push_str(&format!("\n{}: no GPU kernel takes it: {e}", case.name));
        }
    }
    let mut sources: Vec<&str> = report
        .cases
        .iter()
        .flat_map(|c| c.references.iter().map(|r| r.source.as_str()))
        .collect();
    sources.sort_unstable();
    sources.dedup();
    for s in sources {
        out.push_str(&format!("\nreference times measured by: {s}"));
    }
    if report.cases.len() > 1 {
        if let Some(summary) = dispatch_summary(report) {
            out.push_str("\n\n");
            out.push_str(&summary);
        }
    }
    out
}

fn chosen(case: &CaseReport) -> Option<&Choice> {
    case.dispatch.as_ref()
}

/// One row per case: what dispatch picks, its time against the floor, cuDNN's best
/// engine and the best reference of all (cuDNN's rows and the outside times of
/// `--reference`), and the fastest implementation measured when that is another one;
/// then per pass the geometric mean over the best reference, the cases slower than it,
/// and how many cases whose floor is >= 20 us reach 50% and 60% of it.
pub fn dispatch_summary(report: &RunReport) -> Option<String> {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "case",
        "pass",
        "auto picks",
        "ms",
        "floor ms",
        "% floor",
        "cuDNN ms",
        "best reference",
        "x best",
        "fastest measured, if another",
    ]);
    #[derive(Default)]
    struct PassStats {
        logs: Vec<f64>,
        slower: Vec<String>,
        big: usize,
        half: usize,
        sixty: usize,
        rows: usize,
    }
    let mut stats: Vec<(evokernel::Pass, PassStats)> = Vec::new();
    for case in &report.cases {
        if !stats.iter().any(|s| s.0 == case.pass) {
            stats.push((case.pass, PassStats::default()));
        }
        let Some((_, s)) = stats.iter_mut().find(|s| s.0 == case.pass) else {
            continue;
        };
        let Some(choice) = chosen(case) else { continue };
        let ms = |r: &RowReport| r.timing.map(|t| t.median_ms);
        let row = case
            .rows
            .iter()
            .find(|r| r.config.as_deref() == Some(choice.config.as_str()));
        let cudnn = case.rows.iter().find(|r| r.name == "cudnn").and_then(ms);
        let best = case.best_reference();
        let time = row.and_then(ms);
        let pct = time.zip(case.floor_ms).map(|(t, f)| 100.0 * f / t);
        let ratio = time.zip(best.as_ref()).map(|(t, b)| b.1 / t);
        if let Some(r) = ratio {
            s.logs.push(r.ln());
            if r < 1.0 {
                s.slower.push(case.name.clone());
            }
        }
        if case.floor_ms.is_some_and(|f| f >= 0.02) {
            s.big += 1;
            s.half += usize::from(pct.is_some_and(|p| p >= 50.0));
            s.sixty += usize::from(pct.is_some_and(|p| p >= 60.0));
        }
        let fastest = case
            .rows
            .iter()
            .filter(|r| r.config.is_some())
            .filter_map(|r| Some((r, ms(r)?)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let other = match (fastest, time) {
            (Some((r, f)), Some(t)) if f < t * 0.97 => {
                format!("{} {f:.3} ms", r.config.as_deref().unwrap_or(&r.name))
            }
            _ => String::new(),
        };
        s.rows += 1;
        t.add_row(vec![
            Cell::new(&case.name),
            Cell::new(case.pass.name()),
            Cell::new(&choice.config),
            right(num(time, 3)),
            right(num(case.floor_ms, 3)),
            right(num(pct, 0)),
            right(num(cudnn, 3)),
            Cell::new(
                best.map(|(n, b)| format!("{n} {b:.3} ms"))
                    .unwrap_or_else(|| "-".into()),
            ),
            right(num(ratio, 2)),
            Cell::new(other),
        ]);
    }
    let rows: usize = stats.iter().map(|s| s.1.rows).sum();
    let any_ratio = stats.iter().any(|s| !s.1.logs.is_empty());
    if rows == 0 || !any_ratio && report.cases.iter().all(|c| c.floor_ms.is_none()) {
        return None;
    }
    let mut text = t.to_string();
    for (pass, s) in &stats {
        let vs = if s.logs.is_empty() {
            "no reference measured".to_string()
        } else {
            let geomean = (s.logs.iter().sum::<f64>() / s.logs.len() as f64).exp();
            format!(
                "auto vs the best reference: geometric mean {geomean:.2}x over {} cases, \
                 slower on {}",
                s.logs.len(),
                if s.slower.is_empty() {
                    "none".to_string()
                } else {
                    s.slower.join(", ")
                }
            )
        };
        text.push_str(&format!(
            "\n{pass}: {vs}; of {} cases with a floor >= 20 us, {} at >= 50% and {} at >= 60% \
             of it ({} cases in all)",
            s.big, s.half, s.sixty, s.rows
        ));
    }
    if !report.cases.iter().any(|c| !c.references.is_empty()) {
        text.push_str(
            "\n(best reference: cuDNN in process only; scripts/torch_reference.py and \
             --reference add PyTorch's times measured in the same GPU call)",
        );
    }
    Some(text)
}

pub fn devices(list: &[GpuInfo]) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "#",
        "name",
        "arch",
        "SMs",
        "memory GiB",
        "L2 MiB",
        "smem/block KiB",
        "SM MHz",
        "driver",
        "NVRTC",
        "cuDNN",
    ]);
    for d in list {
        t.add_row(vec![
            d.ordinal.to_string(),
            d.name.clone(),
            d.arch(),
            d.sms.to_string(),
            format!("{:.1}", d.memory_bytes as f64 / (1u64 << 30) as f64),
            format!("{:.0}", d.l2_bytes as f64 / (1u64 << 20) as f64),
            (d.max_shared_per_block_optin / 1024).to_string(),
            d.sm_clock_mhz.to_string(),
            d.driver_version.clone(),
            d.nvrtc_version
                .clone()
                .unwrap_or_else(|| "not found".into()),
            d.cudnn_version
                .clone()
                .unwrap_or_else(|| "not found".into()),
        ]);
    }
    t.to_string()
}

/// Default vs tuned config per (case, variant).
pub fn tuning(reports: &[TuneReport]) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "case",
        "variant",
        "search",
        "timed / space",
        "default ms",
        "tuned config",
        "tuned ms",
        "gain",
        "seconds",
    ]);
    for r in reports {
        for (i, row) in r.rows.iter().enumerate() {
            let label = if i == 0 {
                format!("{}\n{}", r.name, r.spec)
            } else {
                String::new()
            };
            let gain = match (row.default_ms, row.best_ms) {
                (Some(d), Some(b)) => format!("{:.2}x", d / b),
                _ => "-".into(),
            };
            let timed = if row.from_cache {
                "0 (cache)".to_string()
            } else if row.failed > 0 {
                format!("{} / {} ({} failed)", row.timed, row.space_size, row.failed)
            } else {
                format!("{} / {}", row.timed, row.space_size)
            };
            t.add_row(vec![
                Cell::new(label),
                Cell::new(&row.variant),
                Cell::new(&row.strategy),
                right(timed),
                right(num(row.default_ms, 3)),
                Cell::new(
                    row.best_config
                        .clone()
                        .unwrap_or_else(|| "none passed".into()),
                ),
                right(num(row.best_ms, 3)),
                right(gain),
                right(format!("{:.1}", row.seconds)),
            ]);
        }
    }
    let mut out = t.to_string();
    // The leaders re-timed side by side (their search time, then their median there).
    for r in reports {
        for row in r.rows.iter().filter(|row| !row.confirmed.is_empty()) {
            let finalists: Vec<String> = row
                .confirmed
                .iter()
                .map(|k| {
                    let again = k.median_ms().map_or("failed".into(), |m| format!("{m:.4}"));
                    format!("{} {:.4} -> {again}", k.config, k.search_ms)
                })
                .collect();
            out.push_str(&format!(
                "\n{} {}: leaders re-timed side by side (ms): {}",
                r.name,
                row.variant,
                finalists.join("; ")
            ));
        }
    }
    if let Some(r) = reports.first() {
        out.push_str(&format!("\ncache: {}", r.cache));
    }
    out
}

fn pct(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.0}%")).unwrap_or_else(|| "-".into())
}

fn thousands(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Per kernel: resources, occupancy and its limiter, counters, stalls and the verdict;
/// then one summary row per kernel.
pub fn profile(kernels: &[KernelProfile]) -> String {
    let mut out = String::new();
    for k in kernels {
        let r = &k.resources;
        let o = &k.occupancy;
        let ncu_ms = k
            .counters
            .as_ref()
            .and_then(|c| c.duration_ms)
            .map(|m| format!(" (ncu, clocks locked: {m:.3} ms)"))
            .unwrap_or_default();
        out += &format!(
            "\n{} · {} · {} ms{ncu_ms}\n",
            k.case,
            k.config.as_deref().unwrap_or(&k.implementation),
            num(k.median_ms, 3)
        );
        out += &format!(
            "  resources  {} regs/thread · {} B static + {} B dynamic shared · {} B local{} · {} threads/block (at most {})\n",
            r.registers,
            thousands(r.static_shared_bytes.max(0) as u64),
            thousands(r.dynamic_shared_bytes as u64),
            r.local_bytes,
            if r.local_bytes > 0 { " (spills or a local array)" } else { "" },
            r.threads_per_block,
            r.max_threads_per_block
        );
        let mut whatif = Vec::new();
        if let Some(n) = o.registers_for_next_block {
            whatif.push(format!("<= {n} regs"));
        }
        if let Some(n) = o.shared_for_next_block {
            whatif.push(format!("<= {} B shared", thousands(n as u64)));
        }
        out += &format!(
            "  occupancy  {} blocks/SM = {:.1}% of warps, limited by {} (registers allow {}, shared {}, warps {}, blocks {}){}\n",
            o.blocks_per_sm,
            o.percent,
            o.limiters.iter().map(|l| l.to_string()).collect::<Vec<_>>().join(" and "),
            o.by_registers,
            o.by_shared,
            o.by_warps,
            o.by_blocks,
            if whatif.is_empty() {
                String::new()
            } else {
                format!("; one more block with {}", whatif.join(" or "))
            }
        );
        if r.blocks_per_sm > 0 && r.blocks_per_sm as u32 != o.blocks_per_sm {
            out += &format!(
                "  note       the driver's occupancy API says {} blocks/SM\n",
                r.blocks_per_sm
            );
        }
        match (&k.counters, &k.counters_error) {
            (Some(c), _) => {
                out += &format!(
                    "  counters   DRAM {} · L2 {} (hit {}) · L1/shared {} · SM {} · tensor {} · FMA {} · ALU {} · LSU {} · issue {} · achieved occupancy {} · bank conflicts {} of shared wavefronts\n",
                    pct(c.dram_pct),
                    pct(c.l2_pct),
                    pct(c.l2_hit_pct),
                    pct(c.l1_pct),
                    pct(c.sm_pct),
                    pct(c.tensor_pct),
                    pct(c.fma_pct),
                    pct(c.alu_pct),
                    pct(c.lsu_pct),
                    pct(c.issue_pct),
                    pct(c.achieved_occupancy_pct),
                    pct(c.bank_conflict_pct()),
                );
                let stalls: Vec<String> = c
                    .stalls
                    .iter()
                    .take(4)
                    .map(|s| format!("{} {:.2}", s.reason, s.per_issue))
                    .collect();
                out += &format!(
                    "  stalls     {} (warps per issued instruction)\n",
                    stalls.join(" · ")
                );
            }
            (None, Some(e)) => out += &format!("  counters   none: {e}\n"),
            (None, None) => {}
        }
        if let Some(d) = &k.diagnosis {
            out += &format!("  verdict    {}: {}\n", d.verdict, d.because);
            out += &format!("  next       {}\n", d.next);
        }
    }
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header([
        "case",
        "impl",
        "median ms",
        "occupancy",
        "limiter",
        "DRAM",
        "L1/shared",
        "tensor",
        "issue",
        "verdict",
    ]);
    for k in kernels {
        let c = k.counters.as_ref();
        t.add_row(vec![
            Cell::new(&k.case),
            Cell::new(&k.implementation),
            right(num(k.median_ms, 3)),
            right(format!("{:.1}%", k.occupancy.percent)),
            Cell::new(
                k.occupancy
                    .limiters
                    .iter()
                    .map(|l| l.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            right(pct(c.and_then(|c| c.dram_pct))),
            right(pct(c.and_then(|c| c.l1_pct))),
            right(pct(c.and_then(|c| c.tensor_pct))),
            right(pct(c.and_then(|c| c.issue_pct))),
            Cell::new(k.diagnosis.as_ref().map_or("-", |d| d.verdict.as_str())),
        ]);
    }
    out + "\n" + t.to_string().as_str()
}

/// One row per (GEMM case, candidate config), cuBLASLt's co-measured time beside it.
pub fn gemm(cases: &[evokernel::gemm::GemmCase]) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "case",
        "M x N x K",
        "config",
        "check (rel L2 / max abs)",
        "ms",
        "TFLOP/s",
        "cuBLASLt ms",
        "cuBLASLt TFLOP/s",
        "x cuBLASLt",
        "pack ms",
    ]);
    for c in cases {
        let reference = c.cublaslt.as_ref();
        for (i, cand) in c.candidates.iter().enumerate() {
            let best = c.best == Some(i);
            t.add_row(vec![
                Cell::new(if i == 0 {
                    c.name.clone()
                } else {
                    String::new()
                }),
                Cell::new(format!("{} x {} x {}", c.m, c.n, c.k)),
                Cell::new(format!(
                    "{}{}{}",
                    cand.config,
                    if cand.tuned { " (tuned)" } else { "" },
                    if best { " *" } else { "" }
                )),
                Cell::new(match &cand.skipped {
                    Some(why) => format!("skipped: {why}"),
                    None => format!(
                        "{} {} / {} ({} pos.)",
                        if cand.passed { "pass" } else { "FAIL" },
                        sci(cand.rel_l2),
                        sci(cand.max_abs),
                        c.checked
                    ),
                }),
                right(num(cand.timing.map(|t| t.median_ms), 4)),
                right(num(cand.tflops, 1)),
                right(num(reference.filter(|_| best).map(|r| r.median_ms), 4)),
                right(num(reference.filter(|_| best).map(|r| r.tflops), 1)),
                right(num(cand.vs_cublaslt, 2)),
                right(format!("{:.1}", cand.pack_ms)),
            ]);
        }
    }
    let mut out = t.to_string();
    for c in cases {
        match (&c.cublaslt, &c.cublaslt_missing) {
            (Some(r), _) if !r.passed => {
                out += &format!(
                    "\n{}: cuBLASLt FAILED the gate (rel L2 {} / max abs {})",
                    c.name,
                    sci(r.rel_l2),
                    sci(r.max_abs)
                )
            }
            (None, Some(why)) => out += &format!("\n{}: no cuBLASLt row: {why}", c.name),
            _ => {}
        }
    }
    out
}

/// One line a GEMM case (its fastest passing candidate against cuBLASLt), and the
/// geometric mean of the ratios.
pub fn gemm_summary(cases: &[evokernel::gemm::GemmCase]) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "case",
        "best",
        "ms",
        "TFLOP/s",
        "cuBLASLt TFLOP/s",
        "x cuBLASLt",
    ]);
    let mut logs = Vec::new();
    for c in cases {
        let best = c.best.map(|i| &c.candidates[i]);
        if let Some(x) = best.and_then(|b| b.vs_cublaslt) {
            logs.push(x.ln());
        }
        t.add_row(vec![
            Cell::new(c.name.clone()),
            Cell::new(best.map_or("-".into(), |b| b.config.clone())),
            right(num(best.and_then(|b| b.timing.map(|t| t.median_ms)), 4)),
            right(num(best.and_then(|b| b.tflops), 1)),
            right(num(c.cublaslt.as_ref().map(|r| r.tflops), 1)),
            right(num(best.and_then(|b| b.vs_cublaslt), 2)),
        ]);
    }
    let mut out = t.to_string();
    if !logs.is_empty() {
        let g = (logs.iter().sum::<f64>() / logs.len() as f64).exp();
        out += &format!(
            "\ngeometric mean x cuBLASLt over {} cases: {g:.2}",
            logs.len()
        );
    }
    out
}

/// One row per (dense case, kernel): the oracle's check, the time, TFLOP/s, GB/s of the
/// memory floor, and the ratio to the case's fastest kernel.
pub fn dense(cases: &[evokernel::dense::bench::DenseCaseReport]) -> String {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(vec![
        "case",
        "spec",
        "kernel",
        "check (rel L2)",
        "ms",
        "TFLOP/s",
        "GB/s",
        "x best",
        "x ref",
    ]);
    for c in cases {
        let best_ms = c
            .best
            .and_then(|i| c.candidates[i].timing.as_ref())
            .map(|t| t.median_ms);
        for (i, k) in c.candidates.iter().enumerate() {
            let ms = k.timing.as_ref().map(|t| t.median_ms);
            t.add_row(vec![
                Cell::new(if i == 0 {
                    c.name.clone()
                } else {
                    String::new()
                }),
                Cell::new(if i == 0 {
                    c.spec.clone()
                } else {
                    String::new()
                }),
                Cell::new(format!(
                    "{}{}",
                    k.kernel,
                    if c.best == Some(i) { " *" } else { "" }
                )),
                Cell::new(match (&k.check, &k.error) {
                    (Some(chk), _) => format!(
                        "{} {} ({} pos.)",
                        if k.passed { "pass" } else { "FAIL" },
                        sci(chk.rel_l2),
                        c.checked
                    ),
                    (None, Some(e)) => format!("not run: {e}"),
                    (None, None) => "-".into(),
                }),
                right(num(ms, 4)),
                right(num(k.tflops, 2)),
                right(num(k.gbps, 1)),
                right(num(ms.zip(best_ms).map(|(m, b)| b / m), 2)),
                right(num(k.vs_reference, 2)),
            ]);
        }
    }
    let mut out = t.to_string();
    for c in cases {
        for r in &c.references {
            out += &format!(
                "\n{}: {} {:.4} ms ({})",
                c.name, r.name, r.median_ms, r.source
            );
        }
        // The driver's resource report of each shader, where the device gives one.
        for k in c.candidates.iter().filter(|k| !k.resources.is_empty()) {
            out += &format!("\n{}: {}: {}", c.name, k.kernel, k.resources.join(", "));
        }
        // Where a kernel of several dispatches spends its time.
        for k in c.candidates.iter().filter(|k| !k.stages.is_empty()) {
            let stages: Vec<String> = k
                .stages
                .iter()
                .map(|(name, ms)| format!("{name} {ms:.4} ms"))
                .collect();
            out += &format!("\n{}: {}: stages {}", c.name, k.kernel, stages.join(", "));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recorded `evokernel profile` of the seed ladder on the H100 renders a block
    /// with resources, occupancy, counters, stalls and a verdict for every kernel.
    #[test]
    fn profile_of_the_recorded_h100_ladder() {
        let report: evokernel::profile::ProfileReport = serde_json::from_str(include_str!(
            "../../../docs/results/h100-profile-faf7d51.json"
        ))
        .unwrap();
        let text = profile(&report.kernels);
        for v in [
            "naive",
            "smem_tile",
            "tensor_core",
            "streaming",
            "channels_last",
        ] {
            assert!(text.contains(&format!("· {v}:")), "{v}: {text}");
        }
        for line in [
            "resources",
            "occupancy",
            "counters",
            "stalls",
            "verdict",
            "next",
        ] {
            assert_eq!(
                text.matches(&format!("  {line} ")).count(),
                6,
                "{line}: {text}"
            );
        }
        assert!(text.contains("limited by shared memory"), "{text}");
        assert!(text.contains("memory-bound (L1/shared)"), "{text}");
    }

    /// The recorded H100 suite run (default configs) with the dispatch decisions it
    /// recorded: the summary's arithmetic on real numbers. (Which variant today's
    /// ranking picks per case is dispatch.rs's test; re-deciding here would tie this
    /// test to every default config.)
    #[test]
    fn dispatch_summary_of_the_recorded_h100_suite() {
        let report: RunReport =
            serde_json::from_str(include_str!("../../../docs/results/h100-suite-run29.json"))
                .unwrap();
        assert!(report.cases.iter().all(|c| c.dispatch.is_some()));
        let text = dispatch_summary(&report).unwrap();
        // Picked per case / cuDNN (the legacy API's row then, the only reference that
        // run had): 93.9, 71.7, 91.4, 5.6, 10.4, 9.1, 58.2, 11.3, 7.1, 8.0.
        assert!(
            text.contains("geometric mean 20.37x over 10 cases, slower on none"),
            "{text}"
        );
        assert!(
            text.contains("of 9 cases with a floor >= 20 us, 1 at >= 50% and 1 at >= 60%"),
            "{text}"
        );
        assert!(text.contains("cuDNN in process only"), "{text}");
        // Dispatch picked the fastest everywhere: no case names a faster one.
        let data = text.lines().filter(|l| l.starts_with('│')).skip(1);
        assert!(data.clone().count() == 10, "{text}");
        assert!(
            data.into_iter()
                .all(|l| l.rsplit('┆').next().unwrap().trim() == "│"),
            "{text}"
        );
        // An outside time faster than the pick names the case as slower.
        let mut with_torch = report.clone();
        let odd = with_torch
            .cases
            .iter_mut()
            .find(|c| c.name == "odd-dilated")
            .unwrap();
        odd.references.push(evokernel::external::ReferenceTime {
            name: "pytorch-native".into(),
            median_ms: 0.050,
            source: "test".into(),
        });
        let text = dispatch_summary(&with_torch).unwrap();
        assert!(text.contains("pytorch-native 0.050 ms"), "{text}");
        assert!(text.contains("slower on odd-dilated;"), "{text}");
        assert!(!text.contains("cuDNN in process only"), "{text}");
        let full = render(&report);
        assert!(full.contains("<- auto"), "{full}");
        assert!(
            full.contains("causal-conv1d: auto picks smem_tile"),
            "{full}"
        );
    }
}
