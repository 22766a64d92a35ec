//! `evokernel`: the command line. Parses flags, calls the library, prints tables and
//! JSON; it holds no logic of its own. One module per command (`commands/`).

mod args;
mod commands;
mod output;
mod plot;
mod table;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use evokernel::session::{SearchKind, Shard, TunePlan};
use evokernel::Error;

use args::{options, Common, GemmArgs, Op, ProblemArgs};

#[derive(Parser)]
#[command(
    name = "evokernel",
    version,
    about = "Verified, measured and tuned depthwise convolution kernels",
    long_about = "Verified, measured and tuned depthwise convolution kernels.\n\n\
        Every implementation is checked against an f64 oracle before it is timed.\n\n\
        Example: evokernel run"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Verify and time the embedded seed problem (depthwise 3-D, bf16, DESIGN.md)
    #[command(after_help = "Example:\n  evokernel run --iters 20 --json seed.json")]
    Run {
        #[command(flatten)]
        common: Common,
        /// Timed launches (at least; the timed launches also last at least 200 ms)
        #[arg(long, default_value_t = 50, value_name = "N")]
        iters: usize,
    },
    /// Check implementations against the f64 oracle on a spec or a suite
    #[command(after_help = "Examples:\n  \
        evokernel verify --suite suite/public.json\n  \
        evokernel verify --input 61x45x80 --channels 512 --kernel 3x5x5 --padding 0,2,2\n  \
        evokernel verify --input 2048 --channels 64 --kernel 4 --padding 3:0 --dtype f16")]
    Verify {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        problem: ProblemArgs,
    },
    /// Search kernel configs on the GPU and remember the best per device and spec (tune.json)
    #[command(after_help = "Examples:\n  \
        evokernel tune --suite public --case seed-bf16\n  \
        evokernel tune --suite public --case seed-bf16 --only streaming --search exhaustive --retune\n  \
        evokernel tune --input 56x56 -c 384 -n 16 --kernel 7 --padding 3 --search evolutionary --budget 12\n  \
        evokernel tune --op scaled-mm --suite gemm --case square-8192 --search exhaustive\n  \
        evokernel tune --op dense-conv --backend vulkan --suite dense --case resnet50-3x3-28\n\n\
        Later runs of run/bench/verify use the tuned configs (their note says \"tuned\").")]
    Tune {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        problem: ProblemArgs,
        #[command(flatten)]
        gemm: GemmArgs,
        /// Search: auto (exhaustive up to 16 configs, else evolutionary), exhaustive or evolutionary
        #[arg(long, default_value = "auto")]
        search: SearchKind,
        /// Evolutionary search: candidates to time at most (default: a quarter of the space)
        #[arg(long, value_name = "N")]
        budget: Option<usize>,
        /// Evolutionary search: seconds at most per variant
        #[arg(long, default_value_t = 60.0)]
        seconds: f64,
        /// Tune again even where the cache has a result for this device and spec
        #[arg(long)]
        retune: bool,
        /// Exhaustive search: only part K of N of the space (K from 1; the space in a fixed
        /// shuffle dealt into N like parts), for a search split across runs; caches nothing
        #[arg(long, value_name = "K/N")]
        shard: Option<Shard>,
        /// Timed launches per candidate (at least; also at least 200 ms)
        #[arg(long, default_value_t = 50, value_name = "N")]
        iters: usize,
    },
    /// Resources, occupancy, Nsight Compute counters and a bottleneck verdict per kernel, plus the plots
    #[command(after_help = "Examples:\n  \
        evokernel profile\n  \
        evokernel profile --suite public --case convnext-7x7 --only streaming\n  \
        evokernel profile --no-counters --out prof/\n  \
        evokernel profile --op scaled-mm --m 8192 --n 8192 --k 8192 --scaling blockwise\n\n\
        Without spec flags it profiles the seed problem (like run). Counters need Nsight\n\
        Compute: ncu on PATH, in /usr/local/cuda/bin, or EVOKERNEL_NCU=/path/to/ncu.")]
    Profile {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        problem: ProblemArgs,
        #[command(flatten)]
        gemm: GemmArgs,
        /// Timed launches (at least; the timed launches also last at least 200 ms)
        #[arg(long, default_value_t = 50, value_name = "N")]
        iters: usize,
        /// Skip Nsight Compute: resources, occupancy and timings only
        #[arg(long)]
        no_counters: bool,
        /// Folder for the ladder and roofline plots
        #[arg(long, value_name = "DIR", default_value = "evokernel-profile")]
        out: PathBuf,
    },
    /// Draw the ladder and roofline plots (PNG and SVG) of a saved run report
    #[command(
        after_help = "Example:\n  evokernel run --json run.json && evokernel plot --from run.json --out plots/"
    )]
    Plot {
        /// A report written by run or bench with --json
        #[arg(long, value_name = "FILE")]
        from: PathBuf,
        /// Folder for the plots
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// List the CUDA devices and what evokernel found of the driver, NVRTC and cuDNN
    #[command(after_help = "Example:\n  evokernel devices --json devices.json")]
    Devices {
        /// Write the list as JSON to FILE
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
    },
    /// Verify, then time implementations on a spec or a suite (convolutions, or the fp8 GEMM with --op scaled-mm)
    #[command(after_help = "Examples:\n  \
        evokernel bench --suite suite/public.json --case convnext-7x7\n  \
        evokernel bench --input 56x56 --channels 384 --batch 16 --kernel 7x7 --padding 3,3 --iters 100\n  \
        evokernel bench --op scaled-mm --m 8192 --n 8192 --k 8192 --scaling rowwise\n  \
        evokernel bench --op scaled-mm --suite gemm --case square-4096 --json gemm.json")]
    Bench {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        problem: ProblemArgs,
        #[command(flatten)]
        gemm: GemmArgs,
        /// Timed launches (at least; the timed launches also last at least 200 ms)
        #[arg(long, default_value_t = 50, value_name = "N")]
        iters: usize,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // One clear line, not clap's usage block.
            let text = e.render().to_string();
            let line: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty() && !l.starts_with("Usage:"))
                .map(str::trim)
                .collect();
            eprintln!("{} (see evokernel --help)", line.join(" "));
            return ExitCode::from(2);
        }
    };
    match execute(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Runs a command; `Ok(false)` when a check failed.
fn execute(cli: Cli) -> Result<bool, Error> {
    match cli.command {
        Command::Devices { json } => commands::devices::run(json),
        Command::Plot { from, out } => commands::plot::run(&from, &out),
        Command::Tune {
            common,
            problem,
            gemm,
            search,
            budget,
            seconds,
            retune,
            shard,
            iters,
        } => {
            let plan = TunePlan {
                search,
                max_candidates: budget,
                max_seconds: seconds,
                retune,
                shard,
            };
            plan.check()?;
            if gemm.op == Op::ScaledMm {
                return commands::gemm::tune(&common, &gemm, &problem, iters, &plan);
            }
            if gemm.op == Op::DenseConv {
                return commands::dense::tune(&common, &gemm, &problem, iters, &plan);
            }
            gemm.refuse_sizes()?;
            let opts = options(&common, true, iters)?;
            commands::tune::run(&common, problem.cases()?, &opts, &plan)
        }
        Command::Profile {
            common,
            problem,
            gemm,
            iters,
            no_counters,
            out: _,
        } if gemm.op == Op::ScaledMm => {
            commands::gemm::profile(&common, &gemm, &problem, iters, no_counters)
        }
        Command::Profile {
            common,
            problem,
            gemm,
            iters,
            no_counters,
            out,
        } => {
            gemm.refuse_sizes()?;
            let opts = options(&common, true, iters)?;
            let cases = if problem.given() {
                problem.cases()?
            } else {
                Vec::new()
            };
            commands::measure::run(common, cases, opts, "profile", Some((no_counters, out)))
        }
        Command::Run { common, iters } => {
            let opts = options(&common, true, iters)?;
            commands::measure::run(common, Vec::new(), opts, "seed problem", None)
        }
        Command::Verify { common, problem } => {
            let opts = options(&common, false, 0)?;
            let cases = problem.cases()?;
            commands::measure::run(common, cases, opts, "verify", None)
        }
        Command::Bench {
            common,
            problem,
            gemm,
            iters,
        } if gemm.op == Op::ScaledMm => commands::gemm::run(&common, &gemm, &problem, iters),
        Command::Bench {
            common,
            problem,
            gemm,
            iters,
        } if gemm.op == Op::DenseConv => commands::dense::run(&common, &gemm, &problem, iters),
        Command::Bench {
            common,
            problem,
            gemm,
            iters,
        } => {
            gemm.refuse_sizes()?;
            let opts = options(&common, true, iters)?;
            let cases = problem.cases()?;
            commands::measure::run(common, cases, opts, "bench", None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::profile::spec_flags;
    use evokernel::{ConvParams, ConvSpec, DType, Layout};

    fn parse_spec(flags: &[String]) -> ConvSpec {
        let mut argv = vec!["evokernel".to_string(), "bench".to_string()];
        argv.extend(flags.iter().cloned());
        let Command::Bench { problem, .. } = Cli::try_parse_from(argv).unwrap().command else {
            panic!("not bench");
        };
        problem.cases().unwrap().remove(0).1
    }

    #[test]
    fn spec_flags_round_trip_through_the_parser() {
        let specs = [
            ConvParams::seed(),
            ConvParams {
                n: 3,
                c: 24,
                input: vec![2048],
                kernel: vec![4],
                stride: vec![2],
                dilation: vec![3],
                padding: vec![[3, 0]],
                layout: Layout::ChannelsLast,
                dtype: DType::F16,
            },
            ConvParams {
                n: 2,
                c: 7,
                input: vec![30, 17],
                kernel: vec![3, 5],
                stride: vec![1, 2],
                dilation: vec![2, 1],
                padding: vec![[1, 2], [0, 4]],
                layout: Layout::ChannelsFirst,
                dtype: DType::F32,
            },
        ];
        for p in specs {
            let spec = p.validate().unwrap();
            assert_eq!(parse_spec(&spec_flags(&spec)), spec, "{spec}");
        }
    }

    #[test]
    fn sweep_l2_reaches_the_timing_protocol() {
        for (flags, want) in [
            (&["bench"][..], false),
            (&["bench", "--sweep-l2"][..], true),
        ] {
            let argv = std::iter::once("evokernel").chain(flags.iter().copied());
            let Command::Bench { common, .. } = Cli::try_parse_from(argv).unwrap().command else {
                panic!("not bench");
            };
            let opts = crate::args::options(&common, true, 50).unwrap();
            assert_eq!(opts.protocol.sweep_l2, want, "{flags:?}");
        }
    }

    #[test]
    fn profile_takes_no_spec_flags_or_a_full_spec() {
        let cli = Cli::try_parse_from(["evokernel", "profile", "--no-counters"]).unwrap();
        assert!(matches!(cli.command, Command::Profile { problem, .. } if !problem.given()));
        let cli = Cli::try_parse_from([
            "evokernel",
            "profile",
            "--input",
            "56x56",
            "--kernel",
            "7",
            "--padding",
            "3",
        ])
        .unwrap();
        assert!(matches!(cli.command, Command::Profile { problem, .. } if problem.given()));
    }
}
