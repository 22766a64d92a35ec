//! The flags every measuring command shares (`Common`), the problem flags
//! (`ProblemArgs`), and their checks before any work starts.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use evokernel::backend::BackendChoice;
use evokernel::bench::Protocol;
use evokernel::external::ExternalTimes;
use evokernel::gemm::Scaling;
use evokernel::session::Options;
use evokernel::spec::{parse_dims, parse_padding};
use evokernel::suite::load_suite;
use evokernel::variants::{check_only, forced_configs};
use evokernel::{Activation, ConvParams, ConvSpec, DType, Epilogue, Error, Layout, Pass};

#[derive(Args)]
pub struct Common {
    /// Backend: auto (the GPU when there is one), cpu, cuda or vulkan (--op dense-conv)
    #[arg(long, default_value = "auto", value_name = "auto|cpu|cuda|vulkan")]
    pub backend: BackendChoice,
    /// Write the full report as JSON to FILE
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Seed of the random inputs
    #[arg(long, default_value_t = Options::default().seed)]
    pub seed: u64,
    /// Force a kernel config, e.g. naive:block=128,waves=8 (repeatable; also EVOKERNEL_CONFIG); a convolution variant takes its default for the spec where a parameter is left out, the fp8 GEMM's configs name every one
    #[arg(long, value_name = "VARIANT:K=V,..")]
    pub config: Vec<String>,
    /// Also draw the ladder and roofline plots (PNG and SVG) into DIR
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Fuse a per-channel bias (a random [C] tensor) into the convolution's epilogue
    #[arg(long)]
    pub bias: bool,
    /// Fuse an activation after the bias: none, relu, silu or gelu-tanh
    #[arg(long, default_value = "none", value_name = "ACT")]
    pub activation: Activation,
    /// Fuse a residual add (a random tensor of the output's shape) after the activation
    #[arg(long)]
    pub residual: bool,
    /// Run only these implementations (repeatable): naive, row_reuse, channels_last, smem_tile, large_kernel, tensor_core, streaming, streaming_cl, depth_reuse, depth_reuse_cl, depth_reuse_fma, depth_reuse_fma_cl, row_rotation_cl, row_window, row_window_cl, dgrad_gather, dgrad_gather_cl, dgrad_cell_cl, wgrad, wgrad_cl, wgrad_mma, wgrad_mma_cl, wgrad_tile, wgrad_tile_cl, wgrad_strip_cl, wgrad_window, wgrad_window_cl, cudnn (the backend API's best engine), cudnn-legacy
    #[arg(long = "only", value_name = "NAME")]
    pub only: Vec<String>,
    /// The pass to measure: forward, dgrad (grad-input), wgrad (grad-weight, with
    /// grad-bias under --bias) or all
    #[arg(long, default_value = "forward", value_name = "PASS")]
    pub pass: PassChoice,
    /// Outside reference times to report and divide by (the JSON scripts/torch_reference.py
    /// writes: PyTorch's F.convNd and backward, measured in the same GPU call)
    #[arg(long, value_name = "FILE")]
    pub reference: Option<PathBuf>,
    /// GPU timing: read twice the L2 before every timed launch (outside its timing), so
    /// no row pays for the dirty cache lines the launch before left (e.g. cuDNN's)
    #[arg(long)]
    pub sweep_l2: bool,
}

/// `--pass`: one pass or all three.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassChoice(Option<Pass>);

impl PassChoice {
    /// The passes to run, in forward, dgrad, wgrad order.
    pub fn passes(self) -> Vec<Pass> {
        match self.0 {
            Some(p) => vec![p],
            None => Pass::ALL.to_vec(),
        }
    }
}

impl std::str::FromStr for PassChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        if s.trim().eq_ignore_ascii_case("all") {
            return Ok(PassChoice(None));
        }
        s.parse::<Pass>()
            .map(|p| PassChoice(Some(p)))
            .map_err(|_| Error::Parse {
                what: "--pass",
                text: s.to_string(),
                expected: "expected forward, dgrad, wgrad or all".into(),
            })
    }
}

/// `--op`: which kind of problem a bench measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Op {
    /// The depthwise convolution (the spec flags or a convolution suite)
    DepthwiseConv,
    /// The fp8 scaled GEMM D = scale_a * scale_b * (A @ B) (+ bias), e4m3 inputs
    ScaledMm,
    /// Dense or grouped convolution (--out-channels, --groups; or --suite dense), on
    /// Vulkan and the CPU
    DenseConv,
}

/// The fp8 scaled GEMM's problem flags (`bench --op scaled-mm`).
#[derive(Args)]
pub struct GemmArgs {
    /// The problem: depthwise-conv, scaled-mm (the fp8 GEMM; --m/--n/--k or --suite gemm) or dense-conv (--out-channels/--groups or --suite dense)
    #[arg(long, value_enum, default_value = "depthwise-conv")]
    pub op: Op,
    /// GEMM rows of A and D
    #[arg(long, allow_negative_numbers = true)]
    pub m: Option<i64>,
    /// GEMM columns of B and D
    #[arg(long, allow_negative_numbers = true)]
    pub n: Option<i64>,
    /// GEMM depth (a multiple of 16)
    #[arg(long, allow_negative_numbers = true)]
    pub k: Option<i64>,
    /// GEMM scaling: per-tensor, rowwise or blockwise (1x128 on A, 128x128 on B)
    #[arg(long, default_value = "per-tensor")]
    pub scaling: Scaling,
    /// GEMM output type: bf16, f16 or f32
    #[arg(long, default_value = "bf16")]
    pub out_dtype: DType,
    /// Dense convolution: output channels (default: the input channels)
    #[arg(long, allow_negative_numbers = true)]
    pub out_channels: Option<i64>,
    /// Dense convolution: groups, dividing both channel counts (default 1)
    #[arg(long, allow_negative_numbers = true)]
    pub groups: Option<i64>,
}

impl GemmArgs {
    /// For a convolution command: `Err` when GEMM sizes were given anyway.
    pub fn refuse_sizes(&self) -> Result<(), Error> {
        if self.m.is_some() || self.n.is_some() || self.k.is_some() {
            return Err(Error::parse(
                "--m/--n/--k",
                "given",
                "GEMM sizes need --op scaled-mm",
            ));
        }
        if self.out_channels.is_some() || self.groups.is_some() {
            return Err(Error::parse(
                "--out-channels/--groups",
                "given",
                "output channels and groups need --op dense-conv (the depthwise convolution has one output channel a group)",
            ));
        }
        Ok(())
    }
}

#[derive(Args)]
pub struct ProblemArgs {
    /// Suite file of cases (the format of suite/public.json; `public`, `channels-last` and `models` name the embedded suites, `dense` the dense one of --op dense-conv, `gemm` the GEMM's); replaces the spec flags
    #[arg(long, value_name = "FILE", conflicts_with_all = ["input", "kernel", "channels", "batch", "stride", "dilation", "padding", "layout", "dtype"])]
    pub suite: Option<PathBuf>,
    /// Only the suite cases with this name (repeatable)
    #[arg(long, value_name = "NAME", requires = "suite")]
    pub case: Vec<String>,
    /// Spatial input sizes: W, HxW or DxHxW (e.g. 61x45x80)
    #[arg(long, value_name = "DIMS", allow_hyphen_values = true)]
    pub input: Option<String>,
    /// Channels (depthwise: = groups; dense-conv: the input channels)
    #[arg(long, short = 'c', default_value_t = 1, allow_negative_numbers = true)]
    pub channels: i64,
    /// Batch size
    #[arg(long, short = 'n', default_value_t = 1, allow_negative_numbers = true)]
    pub batch: i64,
    /// Kernel sizes, one per spatial dim or one for all (e.g. 3x5x5)
    #[arg(long, value_name = "DIMS", allow_hyphen_values = true)]
    pub kernel: Option<String>,
    /// Strides, one per dim or one for all (default 1)
    #[arg(long, value_name = "DIMS", allow_hyphen_values = true)]
    pub stride: Option<String>,
    /// Dilations, one per dim or one for all (default 1)
    #[arg(long, value_name = "DIMS", allow_hyphen_values = true)]
    pub dilation: Option<String>,
    /// Padding per dim: N (both sides) or BEFORE:AFTER, comma separated (e.g. 2:0,1,1)
    #[arg(long, value_name = "PADS", allow_hyphen_values = true)]
    pub padding: Option<String>,
    /// Layout: channels-first (NCW/NCHW/NCDHW) or channels-last (NWC/NHWC/NDHWC)
    #[arg(long, default_value = "channels-first")]
    pub layout: Layout,
    /// Element type: bf16, f16 or f32 (accumulation is f32)
    #[arg(long, default_value = "bf16")]
    pub dtype: DType,
}

impl ProblemArgs {
    /// The spec flags as parameters (`--input` and `--kernel` required).
    pub fn params(&self) -> Result<ConvParams, Error> {
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
        Ok(ConvParams {
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
            layout: self.layout,
            dtype: self.dtype,
        })
    }

    /// Whether any problem was given (profile falls back to the seed problem).
    pub fn given(&self) -> bool {
        self.suite.is_some() || self.input.is_some() || self.kernel.is_some()
    }

    pub fn cases(&self) -> Result<Vec<(String, ConvSpec)>, Error> {
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
        let params = self.params()?;
        let spec = params.validate()?;
        Ok(vec![("spec".to_string(), spec)])
    }
}

/// Most timed launches a command takes (`--iters`): past it a run would not end.
const MAX_ITERS: usize = 100_000;

/// The timing protocol of `--iters` (checked: 1 to MAX_ITERS timed launches).
pub fn protocol(iters: usize) -> Result<Protocol, Error> {
    if !(1..=MAX_ITERS).contains(&iters) {
        return Err(Error::Parse {
            what: "--iters",
            text: iters.to_string(),
            expected: format!("timed launches from 1 to {MAX_ITERS}"),
        });
    }
    Ok(Protocol::default().with_launches(iters))
}

pub fn options(common: &Common, time: bool, iters: usize) -> Result<Options, Error> {
    check_only(&common.only)?;
    let mut protocol = if time {
        protocol(iters)?
    } else {
        Protocol::default().with_launches(iters)
    };
    protocol.sweep_l2 = common.sweep_l2;
    for path in common.json.iter() {
        check_output_path(path)?;
    }
    if let Some(dir) = &common.plot {
        check_output_dir(dir)?;
    }
    Ok(Options {
        seed: common.seed,
        time,
        protocol,
        configs: forced_configs(&common.config)?,
        only: common.only.clone(),
        epilogue: Epilogue {
            bias: common.bias,
            activation: common.activation,
            residual: common.residual,
        },
        pass: common.pass.passes()[0],
        references: common
            .reference
            .as_deref()
            .map(ExternalTimes::load)
            .transpose()?
            .map(std::sync::Arc::new),
    })
}

/// Before a run: `path` can be written (its folder exists; the file is writable), so a
/// long run never ends in a report it cannot save.
pub fn check_output_path(path: &std::path::Path) -> Result<(), Error> {
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
