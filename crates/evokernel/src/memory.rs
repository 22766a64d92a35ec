//! Memory budgets: what a plan or a measuring run needs on the host and on the device,
//! counted before anything is allocated, and refused with the numbers when it does not
//! fit (a runaway allocation would take down the process evokernel runs in).

use crate::engine::ConvProblem;
use crate::error::{Error, Result};
use crate::spec::Layout;

/// Memory still to be had on this host: the smaller of the kernel's MemAvailable, what a
/// cgroup limit leaves, and `EVOKERNEL_MEMORY_LIMIT` (bytes; a cap for shared machines);
/// `None` where none can be read.
pub fn host_available() -> Option<u64> {
    let env = std::env::var("EVOKERNEL_MEMORY_LIMIT")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok());
    match (system_available(), env) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn system_available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("MemAvailable:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    let cgroup = match (
        read("/sys/fs/cgroup/memory.max"),
        read("/sys/fs/cgroup/memory.current"),
    ) {
        (Some(max), Some(cur)) => Some(max.saturating_sub(cur)),
        _ => None,
    };
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Bytes of the tensors a call of `problem` reads and writes: input, weight, output, and
/// the bias and residual when its epilogue has them.
pub fn tensor_bytes(problem: &ConvProblem) -> u64 {
    let s = &problem.spec;
    let e = s.dtype().size_bytes() as u64;
    let mut elems = s.input_len() as u64 + s.weight_len() as u64 + s.output_len() as u64;
    if problem.epilogue.bias {
        elems += s.c() as u64;
    }
    if problem.epilogue.residual {
        elems += s.output_len() as u64;
    }
    elems * e
}

/// Scratch the CPU backend allocates for one call: widened f32 weights, and per worker
/// thread a zero-padded f32 input plane (channels-first) or a channel row (last).
pub fn cpu_scratch_bytes(problem: &ConvProblem, threads: usize) -> u64 {
    let s = &problem.spec;
    let threads = threads.max(1) as u64;
    let weights = s.weight_len() as u64 * 4 * 2;
    let per_thread = match s.layout() {
        Layout::ChannelsFirst => {
            let [d, h, w] = s.input3();
            let (b, a) = (s.pad_before3(), s.pad_after3());
            let padded = |i: usize| ([d, h, w][i] + b[i] + a[i]) as u64;
            // The row overshoot of the last vector block is at most 16 lanes x 8 vectors.
            padded(0) * padded(1) * (padded(2) + 128) * 4 + (s.output3()[2] as u64 + 128) * 4
        }
        Layout::ChannelsLast => s.c() as u64 * 4 * 2,
    };
    weights + per_thread * threads
}

/// Host bytes of a measuring run of `problem` with `sets` input sets: the inputs and
/// outputs of every set, the f64 oracle (input, weight and output widened), and on the
/// CPU backend its scratch.
pub fn measuring_host_bytes(problem: &ConvProblem, sets: usize, cpu: bool) -> u64 {
    let s = &problem.spec;
    let e = s.dtype().size_bytes() as u64;
    let sets = sets.max(1) as u64;
    let per_set = s.input_len() as u64
        + s.output_len() as u64 * if cpu { 2 } else { 1 }
        + if problem.epilogue.residual {
            s.output_len() as u64
        } else {
            0
        };
    let oracle = (s.input_len() + s.weight_len() + 2 * s.output_len()) as u64 * 8;
    let scratch = if cpu {
        cpu_scratch_bytes(problem, rayon::current_num_threads())
    } else {
        0
    };
    per_set * e * sets + s.weight_len() as u64 * e + oracle + scratch
}

/// Device bytes of a measuring run: every set's input (and residual) and two outputs
/// (a kernel's and the baseline's), the weight and bias.
pub fn measuring_device_bytes(problem: &ConvProblem, sets: usize) -> u64 {
    let s = &problem.spec;
    let e = s.dtype().size_bytes() as u64;
    let residual = if problem.epilogue.residual { 1 } else { 0 };
    let per_set = s.input_len() as u64 + (2 + residual) * s.output_len() as u64;
    (per_set * sets.max(1) as u64 + s.weight_len() as u64 + s.c() as u64) * e
}

/// `Ok` when `needed` bytes fit in `available` (unknown: allowed), else an error that
/// names what needed them and both numbers.
pub fn check(what: &str, place: &'static str, needed: u64, available: Option<u64>) -> Result<()> {
    match available {
        Some(avail) if needed > avail => Err(Error::OutOfMemory {
            what: what.to_string(),
            place,
            needed,
            available: avail,
        }),
        _ => Ok(()),
    }
}

/// A byte count for people: `1.5 GiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::ConvParams;

    #[test]
    fn counts_and_refusals() {
        let seed = ConvProblem::new(ConvParams::seed().validate().unwrap());
        assert_eq!(tensor_bytes(&seed), seed.spec.min_bytes());
        assert!(measuring_host_bytes(&seed, 1, true) > tensor_bytes(&seed));
        assert!(check("x", "host", 10, Some(9))
            .unwrap_err()
            .to_string()
            .contains("10 B"));
        assert!(check("x", "host", 10, None).is_ok());
        assert_eq!(human(1536), "1.5 KiB");
        assert!(host_available().is_some_and(|b| b > 0));
    }

    /// Scratch grows with the output and the padded input, never with the stride.
    #[test]
    fn cpu_scratch_does_not_grow_with_stride() {
        let mut p = ConvParams::seed();
        p.c = 1;
        p.input = vec![8];
        p.kernel = vec![1];
        p.padding = vec![];
        p.stride = vec![i32::MAX as i64];
        p.dilation = vec![];
        let huge_stride = ConvProblem::new(p.validate().unwrap());
        assert!(cpu_scratch_bytes(&huge_stride, 2) < 1 << 20);
    }
}
