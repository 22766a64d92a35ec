//! `evokernel`: the command line. Parses flags, calls the library, prints tables and
//! JSON; it holds no logic of its own.

mod plot;
mod table;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use evokernel::backend::BackendChoice;
use evokernel::bench::Protocol;
use evokernel::profile::{profile_run, Ncu};
use evokernel::session::{CaseReport, Options, RunReport, Session, TuneEvent, TunePlan};
use evokernel::spec::{parse_dims, parse_padding};
use evokernel::suite::load_suite;
use evokernel::variants::{check_only, forced_configs, registry};
use evokernel::{ConvParams, ConvSpec, DType, Epilogue, Error, Layout};
use indicatif::{ProgressBar, ProgressStyle};

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
        evokernel tune --input 56x56 -c 384 -n 16 --kernel 7 --padding 3 --search evolutionary --budget 12\n\n\
        Later runs of run/bench/verify use the tuned configs (their note says \"tuned\").")]
    Tune {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        problem: ProblemArgs,
        /// Search: auto (exhaustive up to 16 configs, else evolutionary), exhaustive or evolutionary
        #[arg(long, default_value = "auto")]
        search: String,
        /// Evolutionary search: candidates to time at most (default: a quarter of the space)
        #[arg(long, value_name = "N")]
        budget: Option<usize>,
        /// Evolutionary search: seconds at most per variant
        #[arg(long, default_value_t = 60.0)]
        seconds: f64,
        /// Tune again even where the cache has a result for this device and spec
        #[arg(long)]
        retune: bool,
        /// Timed launches per candidate (at least; also at least 200 ms)
        #[arg(long, default_value_t = 50, value_name = "N")]
        iters: usize,
    },
    /// Resources, occupancy, Nsight Compute counters and a bottleneck verdict per kernel, plus the plots
    #[command(after_help = "Examples:\n  \
        evokernel profile\n  \
        evokernel profile --suite public --case convnext-7x7 --only streaming\n  \
        evokernel profile --no-counters --out prof/\n\n\
        Without spec flags it profiles the seed problem (like run). Counters need Nsight\n\
        Compute: ncu on PATH, in /usr/local/cuda/bin, or EVOKERNEL_NCU=/path/to/ncu.")]
    Profile {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        problem: ProblemArgs,
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
    /// Verify, then time implementations on a spec or a suite
    #[command(after_help = "Examples:\n  \
        evokernel bench --suite suite/public.json --case convnext-7x7\n  \
        evokernel bench --input 56x56 --channels 384 --batch 16 --kernel 7x7 --padding 3,3 --iters 100")]
    Bench {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        problem: ProblemArgs,
        /// Timed launches (at least; the timed launches also last at least 200 ms)
        #[arg(long, default_value_t = 50, value_name = "N")]
        iters: usize,
    },
}

#[derive(Args)]
struct Common {
    /// Backend: auto (the GPU when there is one), cpu or cuda
    #[arg(long, default_value = "auto", value_name = "auto|cpu|cuda")]
    backend: String,
    /// Write the full report as JSON to FILE
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Seed of the random inputs
    #[arg(long, default_value_t = Options::default().seed)]
    seed: u64,
    /// Force a kernel config, e.g. naive:block=128,waves=8 (repeatable; also EVOKERNEL_CONFIG)
    #[arg(long, value_name = "VARIANT:K=V,..")]
    config: Vec<String>,
    /// Also draw the ladder and roofline plots (PNG and SVG) into DIR
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
    /// Fuse a per-channel bias (a random [C] tensor) into the convolution's epilogue
    #[arg(long)]
    bias: bool,
    /// Fuse an activation after the bias: none, relu, silu or gelu-tanh
    #[arg(long, default_value = "none", value_name = "ACT")]
    activation: String,
    /// Fuse a residual add (a random tensor of the output's shape) after the activation
    #[arg(long)]
    residual: bool,
    /// Run only these implementations (repeatable): naive, row_reuse, channels_last, smem_tile, tensor_core, streaming, streaming_cl, depth_reuse, depth_reuse_cl, depth_reuse_fma, depth_reuse_fma_cl, cudnn
    #[arg(long = "only", value_name = "NAME")]
    only: Vec<String>,
}

#[derive(Args)]
struct ProblemArgs {
    /// Suite file of cases (the format of suite/public.json; `public` and `channels-last` name the embedded suites); replaces the spec flags
    #[arg(long, value_name = "FILE", conflicts_with_all = ["input", "kernel", "channels", "batch", "stride", "dilation", "padding", "layout", "dtype"])]
    suite: Option<PathBuf>,
    /// Only the suite cases with this name (repeatable)
    #[arg(long, value_name = "NAME", requires = "suite")]
    case: Vec<String>,
    /// Spatial input sizes: W, HxW or DxHxW (e.g. 61x45x80)
    #[arg(long, value_name = "DIMS", allow_hyphen_values = true)]
    input: Option<String>,
    /// Channels (= groups)
    #[arg(long, short = 'c', default_value_t = 1, allow_negative_numbers = true)]
    channels: i64,
    /// Batch size
    #[arg(long, short = 'n', default_value_t = 1, allow_negative_numbers = true)]
    batch: i64,
    /// Kernel sizes, one per spatial dim or one for all (e.g. 3x5x5)
    #[arg(long, value_name = "DIMS", allow_hyphen_values = true)]
    kernel: Option<String>,
    /// Strides, one per dim or one for all (default 1)
    #[arg(long, value_name = "DIMS", allow_hyphen_values = true)]
    stride: Option<String>,
    /// Dilations, one per dim or one for all (default 1)
    #[arg(long, value_name = "DIMS", allow_hyphen_values = true)]
    dilation: Option<String>,
    /// Padding per dim: N (both sides) or BEFORE:AFTER, comma separated (e.g. 2:0,1,1)
    #[arg(long, value_name = "PADS", allow_hyphen_values = true)]
    padding: Option<String>,
    /// Layout: channels-first (NCW/NCHW/NCDHW) or channels-last (NWC/NHWC/NDHWC)
    #[arg(long, default_value = "channels-first")]
    layout: String,
    /// Element type: bf16, f16 or f32 (accumulation is f32)
    #[arg(long, default_value = "bf16")]
    dtype: String,
}

impl ProblemArgs {
    /// Whether any problem was given (profile falls back to the seed problem).
    fn given(&self) -> bool {
        self.suite.is_some() || self.input.is_some() || self.kernel.is_some()
    }

    fn cases(&self) -> Result<Vec<(String, ConvSpec)>, Error> {
        if let Some(path) = &self.suite {
            let cases = load_suite(path)?;
            for want in &self.case {
                if !cases.iter().any(|c| &c.name == want) {
                    return Err(Error::Suite {
                        path: path.clone(),
                        message: format!(
                            "has no case '{want}'; its cases are: {}",
                            cases
                                .iter()
                                .map(|c| c.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    });
                }
            }
            return Ok(cases
                .into_iter()
                .filter(|c| self.case.is_empty() || self.case.contains(&c.name))
                .map(|c| (c.name, c.spec))
                .collect());
        }
        for (flag, value) in [("--input", &self.input), ("--kernel", &self.kernel)] {
            if value.is_none() {
                return Err(Error::InvalidSpec {
                    field: flag.into(),
                    value: "missing".into(),
                    expected: "give --input DIMS and --kernel DIMS, or --suite FILE".into(),
                });
            }
        }
        let list = |what, v: &Option<String>| v.as_deref().map(|t| parse_dims(what, t)).transpose();
        let params = ConvParams {
            n: self.batch,
            c: self.channels,
            input: list("input", &self.input)?.unwrap_or_default(),
            kernel: list("kernel", &self.kernel)?.unwrap_or_default(),
            stride: list("stride", &self.stride)?.unwrap_or_default(),
            dilation: list("dilation", &self.dilation)?.unwrap_or_default(),
            padding: self
                .padding
                .as_deref()
                .map(parse_padding)
                .transpose()?
                .unwrap_or_default(),
            layout: self.layout.parse::<Layout>()?,
            dtype: self.dtype.parse::<DType>()?,
        };
        let spec = params.validate()?;
        Ok(vec![("spec".to_string(), spec)])
    }
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
    let mut profile: Option<(bool, PathBuf)> = None;
    let (common, cases, options, title) = match cli.command {
        Command::Devices { json } => {
            if let Some(path) = &json {
                check_output_path(path)?;
            }
            let survey = evokernel::cuda::survey();
            if survey.gpus.is_empty() {
                println!(
                    "no CUDA GPU: {}",
                    survey.cuda_unavailable.as_deref().unwrap_or("none found")
                );
            } else {
                println!("{}", table::devices(&survey.gpus));
            }
            println!(
                "NVRTC {}, cuDNN {}, CPU backend {}",
                survey.nvrtc_version.as_deref().unwrap_or("not found"),
                survey.cudnn_version.as_deref().unwrap_or("not found"),
                survey.cpu_backend
            );
            if let Some(path) = json {
                write_json_or_keep(&path, &survey);
            }
            return Ok(true);
        }
        Command::Plot { from, out } => {
            let text = std::fs::read_to_string(&from).map_err(|source| Error::Io {
                action: "cannot read report",
                path: from.clone(),
                source,
            })?;
            let report: RunReport = serde_json::from_str(&text).map_err(|e| Error::Parse {
                what: "run report",
                text: from.display().to_string(),
                expected: format!("a JSON report from evokernel run/bench --json ({e})"),
            })?;
            for f in plot::write_all(&report, &out)? {
                println!("wrote {}", f.display());
            }
            return Ok(true);
        }
        Command::Tune {
            common,
            problem,
            search,
            budget,
            seconds,
            retune,
            iters,
        } => {
            let opts = options(&common, true, iters)?;
            let plan = TunePlan {
                search: search.parse()?,
                max_candidates: budget,
                max_seconds: seconds,
                retune,
            };
            return tune(&common, problem.cases()?, &opts, &plan);
        }
        Command::Profile {
            common,
            problem,
            iters,
            no_counters,
            out,
        } => {
            let opts = options(&common, true, iters)?;
            let cases = if problem.given() {
                problem.cases()?
            } else {
                Vec::new()
            };
            profile = Some((no_counters, out));
            (common, cases, opts, "profile")
        }
        Command::Run { common, iters } => {
            let opts = options(&common, true, iters)?;
            (common, Vec::new(), opts, "seed problem")
        }
        Command::Verify { common, problem } => {
            let opts = options(&common, false, 0)?;
            (common, problem.cases()?, opts, "verify")
        }
        Command::Bench {
            common,
            problem,
            iters,
        } => {
            let opts = options(&common, true, iters)?;
            (common, problem.cases()?, opts, "bench")
        }
    };
    let backend: BackendChoice = common.backend.parse()?;
    let mut session = Session::open(backend)?;
    if profile.is_some() && session.cuda().is_none() {
        return Err(Error::BackendUnavailable {
            backend: "cuda".into(),
            reason: "profile reads kernel resources and hardware counters, which exist only on \
                     a CUDA GPU (evokernel run/bench time the CPU backend)"
                .into(),
        });
    }
    let cases = if cases.is_empty() {
        session.demo_cases()
    } else {
        cases
    };
    let dev = session.device().clone();
    println!(
        "evokernel {title}: {} ({}; {}), seed {}",
        dev.name, dev.backend, dev.detail, options.seed
    );
    if options.time {
        let bar = spinner("calibrating the device's ceilings");
        let c = session.ceilings();
        bar.finish_and_clear();
        let c = c?;
        println!(
            "ceilings: copy {:.1} GB/s, f32 FMA {:.1} GFLOP/s{}",
            c.copy_gbps,
            c.fma_gflops,
            c.tensor_gflops
                .map(|t| format!(", tensor {t:.0} GFLOP/s"))
                .unwrap_or_default()
        );
    }
    let mut reports: Vec<CaseReport> = Vec::new();
    for (name, spec) in &cases {
        let bar = spinner(&format!("{name}: starting"));
        let mut progress = |msg: &str| bar.set_message(format!("{name}: {msg}"));
        let report = session.evaluate(name, spec, &options, &mut progress);
        bar.finish_and_clear();
        reports.push(report?);
    }
    let all_passed = reports.iter().all(CaseReport::passed);
    let report = session.report(&options, reports);
    println!("{}", table::render(&report));
    if let Some((no_counters, out)) = profile {
        return profile_report(report, &cases, &common, no_counters, &out).map(|()| all_passed);
    }
    if let Some(path) = &common.json {
        write_json_or_keep(path, &report);
    }
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    if let Some(dir) = &common.plot {
        for f in plot::write_all(&report, dir)? {
            println!("plot written to {}", f.display());
        }
    }
    if !all_passed {
        eprintln!("error: some implementations failed verification (see the table)");
    }
    Ok(all_passed)
}

/// `evokernel profile` after the run: each kernel re-run alone under ncu (this binary's
/// `bench` with the row's exact config), then the verdicts, JSON and plots.
fn profile_report(
    report: RunReport,
    cases: &[(String, ConvSpec)],
    common: &Common,
    no_counters: bool,
    out: &std::path::Path,
) -> Result<(), Error> {
    let ncu = (!no_counters).then(|| {
        Ncu::locate()
            .and_then(|n| Ok((n.metrics()?, n)))
            .map_err(|e| e.to_string())
    });
    if let Some(Err(e)) = &ncu {
        eprintln!("warning: no counters: {e}");
    }
    let exe = std::env::current_exe().map_err(|source| Error::Io {
        action: "cannot find this executable to re-run under ncu",
        path: PathBuf::from("evokernel"),
        source,
    })?;
    let seed = report.options.seed;
    let bar = spinner("profiling");
    let profiled = profile_run(report, |case, row| {
        let (metrics, ncu) = match ncu.as_ref()? {
            Ok(found) => found,
            Err(e) => return Some(Err(Error::Profiler { message: e.clone() })),
        };
        bar.set_message(format!("{}: {} under ncu", case.name, row.name));
        let spec = &cases.iter().find(|(n, _)| *n == case.name)?.1;
        let variant = registry().into_iter().find(|v| v.name() == row.name)?;
        let mut args = vec!["bench".to_string()];
        args.extend(spec_flags(spec));
        args.extend(["--only".into(), row.name.clone()]);
        if let Some(cfg) = &row.config {
            args.extend(["--config".into(), cfg.clone()]);
        }
        args.extend([
            "--iters".into(),
            "1".into(),
            "--backend".into(),
            "cuda".into(),
        ]);
        args.extend(["--seed".into(), seed.to_string()]);
        let regex = format!("^{}$", variant.kernel_function());
        Some(ncu.profile(&regex, metrics, &exe, &args))
    });
    bar.finish_and_clear();
    println!("{}", table::profile(&profiled));
    if let Some(path) = &common.json {
        write_json_or_keep(path, &profiled);
    }
    let dir = common.plot.as_deref().unwrap_or(out);
    for f in plot::write_all(&profiled.run, dir)? {
        println!("plot written to {}", f.display());
    }
    Ok(())
}

/// The `bench` flags that describe `spec` exactly.
fn spec_flags(spec: &ConvSpec) -> Vec<String> {
    let off = 3 - spec.spatial_dims();
    let join = |v: &[usize]| {
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join("x")
    };
    let (before, after) = (spec.pad_before3(), spec.pad_after3());
    let pads = (off..3)
        .map(|i| format!("{}:{}", before[i], after[i]))
        .collect::<Vec<_>>()
        .join(",");
    vec![
        "--input".into(),
        join(spec.input_dims()),
        "--channels".into(),
        spec.c().to_string(),
        "--batch".into(),
        spec.n().to_string(),
        "--kernel".into(),
        join(spec.kernel_dims()),
        "--stride".into(),
        join(&spec.stride3()[off..]),
        "--dilation".into(),
        join(&spec.dilation3()[off..]),
        "--padding".into(),
        pads,
        "--layout".into(),
        match spec.layout() {
            Layout::ChannelsFirst => "channels-first".into(),
            Layout::ChannelsLast => "channels-last".into(),
        },
        "--dtype".into(),
        spec.dtype().to_string(),
    ]
}

/// `evokernel tune`: a progress bar per variant, then a table of default vs tuned.
fn tune(
    common: &Common,
    cases: Vec<(String, ConvSpec)>,
    opts: &Options,
    plan: &TunePlan,
) -> Result<bool, Error> {
    let backend: BackendChoice = common.backend.parse()?;
    let mut session = Session::open(backend)?;
    let dev = session.device().clone();
    println!(
        "evokernel tune: {} ({}; {}), seed {}",
        dev.name, dev.backend, dev.detail, opts.seed
    );
    let mut reports = Vec::new();
    for (name, spec) in &cases {
        let bar = ProgressBar::new(1);
        bar.set_style(
            ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        let mut current = String::new();
        let mut on_event = |e: TuneEvent| match e {
            TuneEvent::Stage(s) => bar.set_message(format!("{name}: {s}")),
            TuneEvent::Start { variant, space } => {
                current = variant.to_string();
                bar.reset();
                bar.set_length(space as u64);
                bar.set_message(format!("{name}: {variant}"));
            }
            TuneEvent::Trial {
                done,
                planned,
                best_ms,
                ..
            } => {
                bar.set_length(planned as u64);
                bar.set_position(done as u64);
                bar.set_message(format!(
                    "{name}: {current} best {}",
                    best_ms
                        .map(|m| format!("{m:.3} ms"))
                        .unwrap_or_else(|| "-".into())
                ));
            }
        };
        let report = session.tune(name, spec, opts, plan, &mut on_event);
        bar.finish_and_clear();
        let report = report?;
        if let Some(w) = &report.cache_warning {
            eprintln!("warning: {w}");
        }
        reports.push(report);
    }
    println!("{}", table::tuning(&reports));
    if let Some(path) = &common.json {
        write_json_or_keep(path, &reports);
    }
    Ok(true)
}

/// Most timed launches a command takes (`--iters`): past it a run would not end.
const MAX_ITERS: usize = 100_000;

fn options(common: &Common, time: bool, iters: usize) -> Result<Options, Error> {
    check_only(&common.only)?;
    if time && !(1..=MAX_ITERS).contains(&iters) {
        return Err(Error::Parse {
            what: "--iters",
            text: iters.to_string(),
            expected: format!("timed launches from 1 to {MAX_ITERS}"),
        });
    }
    for path in common.json.iter() {
        check_output_path(path)?;
    }
    if let Some(dir) = &common.plot {
        check_output_dir(dir)?;
    }
    Ok(Options {
        seed: common.seed,
        time,
        protocol: Protocol::default().with_launches(iters),
        configs: forced_configs(&common.config)?,
        only: common.only.clone(),
        epilogue: Epilogue {
            bias: common.bias,
            activation: common.activation.parse()?,
            residual: common.residual,
        },
    })
}

fn spinner(msg: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(msg.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

/// Before a run: `path` can be written (its folder exists; the file is writable), so a
/// long run never ends in a report it cannot save.
fn check_output_path(path: &std::path::Path) -> Result<(), Error> {
    let io = |source| Error::Io {
        action: "cannot write to",
        path: path.to_path_buf(),
        source,
    };
    if path.is_dir() {
        return Err(io(std::io::Error::other(
            "it is a folder; give a file name",
        )));
    }
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(io)?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Before a run: the plot folder exists or can be made.
fn check_output_dir(dir: &std::path::Path) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Io {
        action: "cannot create plot folder",
        path: dir.to_path_buf(),
        source,
    })
}

/// Writes a report after a run; if that fails the result is not lost: it goes to a file
/// in the temp folder, and the failure is reported without changing the exit status.
fn write_json_or_keep<T: serde::Serialize>(path: &PathBuf, report: &T) {
    if let Err(e) = write_json(path, report) {
        let fallback =
            std::env::temp_dir().join(format!("evokernel-report-{}.json", std::process::id()));
        match write_json(&fallback, report) {
            Ok(()) => eprintln!(
                "warning: {e}; the report was written to {} instead",
                fallback.display()
            ),
            Err(e2) => eprintln!(
                "warning: {e}; writing it to {} failed too: {e2}",
                fallback.display()
            ),
        }
    } else {
        println!("report written to {}", path.display());
    }
}

fn write_json<T: serde::Serialize>(path: &PathBuf, report: &T) -> Result<(), Error> {
    let text = serde_json::to_string_pretty(report).map_err(|e| Error::Io {
        action: "cannot serialize report for",
        path: path.clone(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(path, text + "\n").map_err(|source| Error::Io {
        action: "cannot write JSON report",
        path: path.clone(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
