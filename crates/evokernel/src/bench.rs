//! The measurement protocol of MEASURE.md: warm-up, many timed launches, median /
//! min / max, input rotation, baselines co-measured A B A B, and calibrated ceilings
//! that give each case its floor.

use serde::{Deserialize, Serialize};

use crate::backend::ConvRun;
use crate::engine::ConvProblem;
use crate::error::Result;

/// How long to warm up and how much to time.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Protocol {
    pub warmup_launches: usize,
    pub warmup_ms: f64,
    pub launches: usize,
    pub min_ms: f64,
    /// GPU rows: read twice the L2 before every launch, outside its timing, so no row
    /// pays for the dirty lines of the launch before (kernels/l2_sweep.cu). Reports
    /// written before it existed read as without.
    #[serde(default)]
    pub sweep_l2: bool,
}

impl Default for Protocol {
    fn default() -> Self {
        Protocol {
            warmup_launches: 10,
            warmup_ms: 25.0,
            launches: 50,
            min_ms: 200.0,
            sweep_l2: false,
        }
    }
}

impl Protocol {
    /// At least `launches` timed launches (and still at least `min_ms` of them).
    pub fn with_launches(self, launches: usize) -> Self {
        Protocol {
            launches: launches.max(1),
            ..self
        }
    }

    /// The same protocol for samples of `reps` launches each, whose step returns the time
    /// a launch (the sample over `reps`): warm-up and minimum stay device time, the count
    /// of launches becomes samples (at least five, where the protocol asks that many).
    pub fn per_sample(&self, reps: usize) -> Protocol {
        let reps = reps.max(1);
        Protocol {
            warmup_launches: self.warmup_launches.div_ceil(reps),
            warmup_ms: self.warmup_ms / reps as f64,
            launches: self.launches.div_ceil(reps).max(self.launches.min(5)),
            min_ms: self.min_ms / reps as f64,
            sweep_l2: self.sweep_l2,
        }
    }
}

/// Summary of the timed launches of one implementation.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
pub struct Timing {
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub launches: usize,
}

impl Timing {
    pub fn from_samples(samples: &[f64]) -> Self {
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        Timing {
            median_ms: median_sorted(&s),
            min_ms: s.first().copied().unwrap_or(f64::NAN),
            max_ms: s.last().copied().unwrap_or(f64::NAN),
            launches: s.len(),
        }
    }
}

fn median_sorted(s: &[f64]) -> f64 {
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => 0.5 * (s[n / 2 - 1] + s[n / 2]),
    }
}

/// Runs `step` (which launches and returns its milliseconds) under the protocol:
/// warm-up first, then timed launches, rotating `sets` input sets.
fn drive(
    protocol: &Protocol,
    sets: usize,
    mut step: impl FnMut(usize) -> Result<Vec<f64>>,
) -> Result<Vec<Vec<f64>>> {
    let (mut i, mut spent) = (0usize, 0.0);
    while i < protocol.warmup_launches || spent < protocol.warmup_ms {
        spent += step(i % sets)?.iter().sum::<f64>();
        i += 1;
    }
    let mut samples: Vec<Vec<f64>> = Vec::new();
    let (mut i, mut spent) = (0usize, 0.0);
    while i < protocol.launches || spent < protocol.min_ms {
        let t = step(i % sets)?;
        spent += t.iter().sum::<f64>();
        samples.push(t);
        i += 1;
    }
    Ok(samples)
}

/// Times one implementation alone.
pub fn time_one(run: &mut dyn ConvRun, sets: usize, protocol: &Protocol) -> Result<Timing> {
    time_launches(protocol, |s| run.launch(s), sets)
}

/// Times one launch function alone (`launch(set)` returns its milliseconds).
pub fn time_launches(
    protocol: &Protocol,
    mut launch: impl FnMut(usize) -> Result<f64>,
    sets: usize,
) -> Result<Timing> {
    let samples = drive(protocol, sets, |s| Ok(vec![launch(s)?]))?;
    let v: Vec<f64> = samples.iter().map(|t| t[0]).collect();
    Ok(Timing::from_samples(&v))
}

/// An implementation and its baseline, timed in alternation (A B A B) so that clock
/// drift hits both alike.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct PairTiming {
    pub candidate: Timing,
    pub baseline: Timing,
    /// Median over pairs of baseline time / candidate time (the speedup).
    pub speedup: f64,
}

pub fn time_pair(
    candidate: &mut dyn ConvRun,
    baseline: &mut dyn ConvRun,
    sets: usize,
    protocol: &Protocol,
) -> Result<PairTiming> {
    time_pair_launches(
        protocol,
        |s| candidate.launch(s),
        |s| baseline.launch(s),
        sets,
    )
}

/// Two launch functions timed in alternation (A B A B), as `time_pair`.
pub fn time_pair_launches(
    protocol: &Protocol,
    mut candidate: impl FnMut(usize) -> Result<f64>,
    mut baseline: impl FnMut(usize) -> Result<f64>,
    sets: usize,
) -> Result<PairTiming> {
    let samples = drive(protocol, sets, |s| Ok(vec![candidate(s)?, baseline(s)?]))?;
    let a: Vec<f64> = samples.iter().map(|t| t[0]).collect();
    let b: Vec<f64> = samples.iter().map(|t| t[1]).collect();
    let mut ratios: Vec<f64> = samples.iter().map(|t| t[1] / t[0]).collect();
    ratios.sort_by(f64::total_cmp);
    Ok(PairTiming {
        candidate: Timing::from_samples(&a),
        baseline: Timing::from_samples(&b),
        speedup: median_sorted(&ratios),
    })
}

/// Measured ceilings of the device a run is on: what the floor of a case is made of.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Ceilings {
    /// Device-memory copy bandwidth, bytes read plus bytes written, in GB/s.
    pub copy_gbps: f64,
    /// f32 FMA rate, in GFLOP/s (2 per FMA).
    pub fma_gflops: f64,
    /// bf16 tensor-core rate in GFLOP/s, where the device has one.
    pub tensor_gflops: Option<f64>,
}

impl Ceilings {
    /// The floor of a case: max(bytes / copy bandwidth, flops / compute rate), in ms.
    /// Compute is counted at the fastest unit that can do it.
    pub fn floor_ms(&self, problem: &ConvProblem) -> f64 {
        let mem = problem.min_bytes() as f64 / (self.copy_gbps * 1e6);
        let rate = self.tensor_gflops.unwrap_or(0.0).max(self.fma_gflops);
        let compute = problem.flops() as f64 / (rate * 1e6);
        mem.max(compute)
    }
}

/// Throughput of a timed case.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Throughput {
    pub gflops: f64,
    pub gbps: f64,
    /// floor / time, in percent
    pub pct_of_floor: f64,
}

pub fn throughput(problem: &ConvProblem, ms: f64, floor_ms: f64) -> Throughput {
    Throughput {
        gflops: problem.flops() as f64 / (ms * 1e6),
        gbps: problem.min_bytes() as f64 / (ms * 1e6),
        pct_of_floor: 100.0 * floor_ms / ms,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_sample_of_launches_keeps_the_protocols_device_time() {
        let p = Protocol::default();
        assert_eq!(p.per_sample(1), p);
        let q = p.per_sample(8);
        // Each step returns a launch's time: reps x the minimum is the device time timed.
        assert!((q.min_ms * 8.0 - p.min_ms).abs() < 1e-9);
        assert!((q.warmup_ms * 8.0 - p.warmup_ms).abs() < 1e-9);
        assert_eq!(q.launches, 7);
        assert_eq!(p.per_sample(100).launches, 5);
        assert_eq!(p.with_launches(2).per_sample(100).launches, 2);
    }

    use super::*;
    use crate::tensor::HostTensor;

    struct Fake {
        ms: f64,
        launches: usize,
    }
    impl ConvRun for Fake {
        fn name(&self) -> String {
            "fake".into()
        }
        fn launch(&mut self, _set: usize) -> Result<f64> {
            self.launches += 1;
            Ok(self.ms)
        }
        fn poison(&mut self, _set: usize) -> Result<()> {
            Ok(())
        }
        fn output(&mut self, _set: usize) -> Result<HostTensor> {
            Ok(HostTensor::zeros(crate::DType::F32, &[1]))
        }
    }

    #[test]
    fn protocol_warms_up_and_times_enough() {
        let mut f = Fake {
            ms: 1.0,
            launches: 0,
        };
        let t = time_one(&mut f, 3, &Protocol::default()).unwrap();
        // warm-up: 25 launches for 25 ms; timed: 200 launches for 200 ms
        assert_eq!(t.launches, 200);
        assert_eq!(f.launches, 225);
        assert_eq!(t.median_ms, 1.0);
        let mut slow = Fake {
            ms: 100.0,
            launches: 0,
        };
        let t = time_one(&mut slow, 1, &Protocol::default()).unwrap();
        assert_eq!(t.launches, 50);
        assert_eq!(slow.launches, 60);
    }

    #[test]
    fn pair_reports_median_speedup() {
        let mut a = Fake {
            ms: 2.0,
            launches: 0,
        };
        let mut b = Fake {
            ms: 10.0,
            launches: 0,
        };
        let p = time_pair(&mut a, &mut b, 1, &Protocol::default()).unwrap();
        assert_eq!(p.speedup, 5.0);
        assert_eq!(a.launches, b.launches);
    }

    #[test]
    fn timing_summary() {
        let t = Timing::from_samples(&[3.0, 1.0, 2.0, 10.0]);
        assert_eq!((t.median_ms, t.min_ms, t.max_ms), (2.5, 1.0, 10.0));
    }

    #[test]
    fn floor_is_max_of_memory_and_compute() {
        let spec = crate::ConvParams::seed().validate().unwrap();
        let c = Ceilings {
            copy_gbps: 2970.0,
            fma_gflops: 51_000.0,
            tensor_gflops: None,
        };
        // 442 MB at 2.97 TB/s = 0.149 ms; 16.3 GFLOP at 51 TFLOP/s = 0.32 ms
        assert!((c.floor_ms(&spec.clone().into()) - 0.3198).abs() < 1e-3);
        let c = Ceilings {
            tensor_gflops: Some(800_000.0),
            ..c
        };
        assert!((c.floor_ms(&spec.clone().into()) - 0.1490).abs() < 1e-3);
    }
}
