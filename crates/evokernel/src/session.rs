//! A measuring session on one backend: resolves `--backend`, calibrates the device's
//! ceilings once, and evaluates cases (oracle, checks, timings) into reports.

use serde::Serialize;

use crate::backend::{rotation_sets, BackendChoice, ConvRun, CpuRun, Problem};
use crate::bench::{throughput, time_one, Ceilings, Protocol, Throughput, Timing};
use crate::cpu::{self, Isa};
use crate::error::{Error, Result};
use crate::spec::ConvSpec;
use crate::verify::{check, oracle, Verdict};

/// What a report says about the machine it ran on.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceInfo {
    pub backend: &'static str,
    pub name: String,
    pub detail: String,
}

/// How to evaluate a case.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Options {
    /// Seed of the random inputs (printed in every report).
    pub seed: u64,
    /// Time the implementations that pass, or only verify them.
    pub time: bool,
    pub protocol: Protocol,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            seed: 20261122,
            time: true,
            protocol: Protocol::default(),
        }
    }
}

/// One implementation's line in a case report. Timings exist only for passing checks.
#[derive(Clone, Debug, Serialize)]
pub struct RowReport {
    pub name: String,
    pub verdict: Verdict,
    pub timing: Option<Timing>,
    pub throughput: Option<Throughput>,
}

#[derive(Clone, Debug, Serialize)]
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
}

impl CaseReport {
    pub fn passed(&self) -> bool {
        self.rows.iter().all(|r| r.verdict.passed)
    }
}

/// Everything one command measured, as written by `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub evokernel_version: &'static str,
    pub commit: &'static str,
    pub date_utc: String,
    pub device: DeviceInfo,
    pub ceilings: Option<Ceilings>,
    pub options: Options,
    pub cases: Vec<CaseReport>,
}

/// Backend a session runs on.
enum Backend {
    Cpu,
}

pub struct Session {
    backend: Backend,
    ceilings: Option<Ceilings>,
    device: DeviceInfo,
}

/// Progress messages for a CLI to show (e.g. "oracle", "time cpu-avx512").
pub type Progress<'a> = &'a mut dyn FnMut(&str);

impl Session {
    pub fn open(choice: BackendChoice) -> Result<Self> {
        match choice {
            BackendChoice::Cpu | BackendChoice::Auto => Ok(Session {
                backend: Backend::Cpu,
                ceilings: None,
                device: DeviceInfo {
                    backend: "cpu",
                    name: cpu_name(),
                    detail: format!(
                        "{} threads, {}",
                        rayon::current_num_threads(),
                        Isa::detect().name()
                    ),
                },
            }),
            BackendChoice::Cuda => Err(Error::BackendUnavailable {
                backend: "cuda".into(),
                reason: "this build has no CUDA backend yet; use --backend cpu".into(),
            }),
        }
    }

    pub fn device(&self) -> &DeviceInfo {
        &self.device
    }

    /// The device's measured ceilings (measured on first use, then kept).
    pub fn ceilings(&mut self) -> Ceilings {
        *self.ceilings.get_or_insert_with(|| match self.backend {
            Backend::Cpu => cpu::calibrate(),
        })
    }

    /// Verifies (and with `opts.time`, times) every implementation of the session's
    /// backend that applies to `spec`.
    pub fn evaluate(
        &mut self,
        name: &str,
        spec: &ConvSpec,
        opts: &Options,
        progress: Progress,
    ) -> Result<CaseReport> {
        let sets = if opts.time {
            rotation_sets(spec, self.cache_bytes())
        } else {
            1
        };
        progress("generating inputs");
        let problem = Problem::random(spec, opts.seed, sets);
        progress("running the f64 oracle");
        let reference = oracle(&problem)?;
        let floor_ms = opts.time.then(|| self.ceilings().floor_ms(spec));
        let mut rows = Vec::new();
        let mut runs: Vec<Box<dyn ConvRun + '_>> = match self.backend {
            Backend::Cpu => vec![Box::new(CpuRun::new(&problem))],
        };
        for run in runs.iter_mut() {
            let name = run.name();
            progress(&format!("verifying {name}"));
            let verdict = check(run.as_mut(), &problem, &reference)?;
            let (timing, tp) = if opts.time && verdict.passed {
                progress(&format!("timing {name}"));
                let t = time_one(run.as_mut(), sets, &opts.protocol)?;
                (Some(t), floor_ms.map(|f| throughput(spec, t.median_ms, f)))
            } else {
                (None, None)
            };
            rows.push(RowReport {
                name,
                verdict,
                timing,
                throughput: tp,
            });
        }
        Ok(CaseReport {
            name: name.to_string(),
            spec: spec.to_string(),
            key: spec.key(),
            flops: spec.flops(),
            min_bytes: spec.min_bytes(),
            floor_ms,
            seed: opts.seed,
            input_sets: sets,
            rows,
        })
    }

    pub fn report(&self, opts: &Options, cases: Vec<CaseReport>) -> RunReport {
        RunReport {
            evokernel_version: env!("CARGO_PKG_VERSION"),
            commit: env!("EVOKERNEL_COMMIT"),
            date_utc: utc_now(),
            device: self.device.clone(),
            ceilings: self.ceilings,
            options: *opts,
            cases,
        }
    }

    /// Last-level cache of the device, which small problems are rotated past.
    fn cache_bytes(&self) -> u64 {
        match self.backend {
            Backend::Cpu => cpu_llc_bytes(),
        }
    }
}

fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn cpu_llc_bytes() -> u64 {
    let parse = |s: &str| -> Option<u64> {
        let s = s.trim();
        let (num, mult) = match s.strip_suffix('K') {
            Some(n) => (n, 1 << 10),
            None => match s.strip_suffix('M') {
                Some(n) => (n, 1 << 20),
                None => (s, 1),
            },
        };
        num.parse::<u64>().ok().map(|v| v * mult)
    };
    (0..8)
        .filter_map(|i| {
            std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu0/cache/index{i}/size"))
                .ok()
        })
        .filter_map(|s| parse(&s))
        .max()
        .unwrap_or(32 << 20)
}

/// `YYYY-MM-DDTHH:MM:SSZ` from the system clock (civil-from-days, no time-zone data).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}
