//! `ConvSpec`: one depthwise convolution problem, validated.
//!
//! Specs of 1 or 2 spatial dims are stored as 3-D with leading unit dims (kernel 1,
//! stride 1, dilation 1, no padding), so every backend indexes one 5-D shape; the
//! spatial rank is kept for names and display.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Element type of input, weight and output. Accumulation is always f32 (f64 in the oracle).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Bf16,
    F16,
    F32,
}

impl DType {
    pub const ALL: [DType; 3] = [DType::Bf16, DType::F16, DType::F32];

    pub fn size_bytes(self) -> usize {
        match self {
            DType::Bf16 | DType::F16 => 2,
            DType::F32 => 4,
        }
    }

    /// Elements in one 16-byte vector (the unit of vector loads and cp.async copies).
    pub fn per_16_bytes(self) -> usize {
        16 / self.size_bytes()
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
        }
    }

    /// The relative-L2 gate of MEASURE.md for outputs of this dtype.
    pub fn rel_l2_gate(self) -> f64 {
        match self {
            DType::Bf16 => 5e-3,
            DType::F16 => 1e-3,
            DType::F32 => 1e-5,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            "f16" | "fp16" | "half" | "float16" => Ok(DType::F16),
            "f32" | "fp32" | "float" | "float32" => Ok(DType::F32),
            _ => Err(Error::parse("dtype", s, "expected bf16, f16 or f32")),
        }
    }
}

/// Memory order of activations. Weights are always `[C, 1, KD, KH, KW]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Layout {
    /// NCW / NCHW / NCDHW
    ChannelsFirst,
    /// NWC / NHWC / NDHWC
    ChannelsLast,
}

impl Layout {
    /// The conventional name for a spatial rank, e.g. `NCDHW` or `NHWC`.
    pub fn name(self, spatial_dims: usize) -> &'static str {
        match (self, spatial_dims) {
            (Layout::ChannelsFirst, 1) => "NCW",
            (Layout::ChannelsFirst, 2) => "NCHW",
            (Layout::ChannelsFirst, _) => "NCDHW",
            (Layout::ChannelsLast, 1) => "NWC",
            (Layout::ChannelsLast, 2) => "NHWC",
            (Layout::ChannelsLast, _) => "NDHWC",
        }
    }
}

impl FromStr for Layout {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "channels-first" | "channels_first" | "cf" | "ncw" | "nchw" | "ncdhw" => {
                Ok(Layout::ChannelsFirst)
            }
            "channels-last" | "channels_last" | "cl" | "nwc" | "nhwc" | "ndhwc" => {
                Ok(Layout::ChannelsLast)
            }
            _ => Err(Error::parse(
                "layout",
                s,
                "expected channels-first (NCW/NCHW/NCDHW) or channels-last (NWC/NHWC/NDHWC)",
            )),
        }
    }
}

/// Unvalidated description of a depthwise convolution, as a user or a file gives it.
/// Signed so that validation can name a negative value instead of failing to parse it.
/// Empty `stride`, `dilation` or `padding` mean 1, 1 and 0 in every dim; a list of one
/// entry (kernel included) applies to every dim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvParams {
    pub n: i64,
    pub c: i64,
    pub input: Vec<i64>,
    pub kernel: Vec<i64>,
    pub stride: Vec<i64>,
    pub dilation: Vec<i64>,
    pub padding: Vec<[i64; 2]>,
    pub layout: Layout,
    pub dtype: DType,
}

impl ConvParams {
    /// The seed problem of DESIGN.md: the depthwise 3-D conv of a video VAE.
    pub fn seed() -> Self {
        ConvParams {
            n: 1,
            c: 512,
            input: vec![61, 45, 80],
            kernel: vec![3, 5, 5],
            stride: vec![1, 1, 1],
            dilation: vec![1, 1, 1],
            padding: vec![[0, 0], [2, 2], [2, 2]],
            layout: Layout::ChannelsFirst,
            dtype: DType::Bf16,
        }
    }

    pub fn validate(&self) -> Result<ConvSpec> {
        ConvSpec::new(self)
    }
}

/// Largest element count of any one tensor; keeps every byte offset inside `i64`
/// and leaves GPU kernels an explicit 64-bit index path above `u32::MAX`.
const MAX_ELEMENTS: u64 = 1 << 40;

/// A validated depthwise convolution (groups = channels, depth multiplier 1).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvSpec {
    n: usize,
    c: usize,
    spatial_dims: usize,
    input: [usize; 3],
    kernel: [usize; 3],
    stride: [usize; 3],
    dilation: [usize; 3],
    pad_before: [usize; 3],
    pad_after: [usize; 3],
    output: [usize; 3],
    layout: Layout,
    dtype: DType,
}

fn per_dim(field: &'static str, list: &[i64], dims: usize, default: i64) -> Result<Vec<i64>> {
    match list.len() {
        0 => Ok(vec![default; dims]),
        1 => Ok(vec![list[0]; dims]),
        n if n == dims => Ok(list.to_vec()),
        n => Err(Error::DimMismatch {
            field,
            got: n,
            want: dims,
        }),
    }
}

const DIM_NAMES: [[&str; 3]; 3] = [["w", "", ""], ["h", "w", ""], ["d", "h", "w"]];

impl ConvSpec {
    pub fn new(p: &ConvParams) -> Result<Self> {
        let dims = p.input.len();
        if !(1..=3).contains(&dims) {
            return Err(Error::invalid(
                "input",
                format!("{} spatial dims", dims),
                "1 to 3 spatial dims ([W], [H,W] or [D,H,W])",
            ));
        }
        if p.n <= 0 {
            return Err(Error::invalid("batch n", p.n, "at least 1"));
        }
        if p.c <= 0 {
            return Err(Error::invalid("channels c", p.c, "at least 1"));
        }
        if p.kernel.is_empty() {
            return Err(Error::DimMismatch {
                field: "kernel",
                got: 0,
                want: dims,
            });
        }
        let kernel = per_dim("kernel", &p.kernel, dims, 1)?;
        let stride = per_dim("stride", &p.stride, dims, 1)?;
        let dilation = per_dim("dilation", &p.dilation, dims, 1)?;
        let padding: Vec<[i64; 2]> = match p.padding.len() {
            0 => vec![[0, 0]; dims],
            1 => vec![p.padding[0]; dims],
            n if n == dims => p.padding.clone(),
            n => {
                return Err(Error::DimMismatch {
                    field: "padding",
                    got: n,
                    want: dims,
                })
            }
        };

        let off = 3 - dims;
        let mut s = ConvSpec {
            n: p.n as usize,
            c: p.c as usize,
            spatial_dims: dims,
            input: [1; 3],
            kernel: [1; 3],
            stride: [1; 3],
            dilation: [1; 3],
            pad_before: [0; 3],
            pad_after: [0; 3],
            output: [1; 3],
            layout: p.layout,
            dtype: p.dtype,
        };
        const LIMIT: i64 = i32::MAX as i64;
        for i in 0..dims {
            let name = DIM_NAMES[dims - 1][i];
            let check = |field: &str, v: i64, min: i64| -> Result<usize> {
                if v < min || v > LIMIT {
                    Err(Error::invalid(
                        format!("{field} along {name}"),
                        v,
                        format!("an integer from {min} to {LIMIT}"),
                    ))
                } else {
                    Ok(v as usize)
                }
            };
            let input = check("input size", p.input[i], 1)?;
            let kernel = check("kernel size", kernel[i], 1)?;
            let stride = check("stride", stride[i], 1)?;
            let dilation = check("dilation", dilation[i], 1)?;
            let before = check("padding before", padding[i][0], 0)?;
            let after = check("padding after", padding[i][1], 0)?;
            let padded = input as u64 + before as u64 + after as u64;
            let span = dilation as u64 * (kernel as u64 - 1) + 1;
            if span > padded {
                return Err(Error::invalid(
                    format!("kernel along {name}"),
                    format!("{kernel} (dilation {dilation}, spanning {span})"),
                    format!("a span of at most the padded input size {padded}"),
                ));
            }
            let out = (padded - span) / stride as u64 + 1;
            let j = off + i;
            s.input[j] = input;
            s.kernel[j] = kernel;
            s.stride[j] = stride;
            s.dilation[j] = dilation;
            s.pad_before[j] = before;
            s.pad_after[j] = after;
            s.output[j] = out as usize;
        }
        for (what, dims) in [
            ("input", s.input),
            ("output", s.output),
            ("kernel", s.kernel),
        ] {
            let per_channel = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64));
            let total = per_channel
                .and_then(|x| x.checked_mul(s.c as u64))
                .and_then(|x| x.checked_mul(if what == "kernel" { 1 } else { s.n as u64 }));
            match total {
                Some(t) if t <= MAX_ELEMENTS => {}
                _ => {
                    return Err(Error::invalid(
                        format!("{what} element count"),
                        format!("n={} x c={} x {}", s.n, s.c, dims_text(&dims)),
                        "at most 2^40 elements per tensor",
                    ))
                }
            }
        }
        Ok(s)
    }

    pub fn n(&self) -> usize {
        self.n
    }
    pub fn c(&self) -> usize {
        self.c
    }
    pub fn spatial_dims(&self) -> usize {
        self.spatial_dims
    }
    pub fn layout(&self) -> Layout {
        self.layout
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Input spatial sizes as `[D, H, W]` (leading 1s below 3-D).
    pub fn input3(&self) -> [usize; 3] {
        self.input
    }
    pub fn output3(&self) -> [usize; 3] {
        self.output
    }
    pub fn kernel3(&self) -> [usize; 3] {
        self.kernel
    }
    pub fn stride3(&self) -> [usize; 3] {
        self.stride
    }
    pub fn dilation3(&self) -> [usize; 3] {
        self.dilation
    }
    pub fn pad_before3(&self) -> [usize; 3] {
        self.pad_before
    }
    pub fn pad_after3(&self) -> [usize; 3] {
        self.pad_after
    }

    /// The same problem in another dtype or layout.
    pub fn with_dtype(&self, dtype: DType) -> Self {
        ConvSpec {
            dtype,
            ..self.clone()
        }
    }
    pub fn with_layout(&self, layout: Layout) -> Self {
        ConvSpec {
            layout,
            ..self.clone()
        }
    }
    /// The same problem on `c` of its channels (each channel is its own convolution).
    pub fn with_channels(&self, c: usize) -> Self {
        ConvSpec { c, ..self.clone() }
    }

    /// The same convolution with its N x D planes as the depths of one image, where that
    /// is the same memory and the same arithmetic: a channels-last tensor keeps each
    /// (n, d) plane as one run of H x W x C elements, planes in (n, d) order, and with one
    /// kernel depth and no depth padding (so as many output depths as input depths) no
    /// output reads two planes. A kernel that slides along depth then slides across
    /// images too. None elsewhere.
    pub fn planes_as_depths(&self) -> Option<ConvSpec> {
        if self.layout != Layout::ChannelsLast || !self.one_plane_a_depth() {
            return None;
        }
        Some(self.folded(self.n * self.input[0], self.c))
    }

    /// The geometry of a channels-first tensor's N x C x D planes, each one run of H x W
    /// elements in (n, c, d) order, as the depths of one image of one channel, where one
    /// kernel depth and no depth padding make each output plane read one input plane.
    /// Not the same convolution: a kernel walking these depths gives each its own
    /// channel's weights (plane / D mod C). None elsewhere.
    pub fn channel_planes_as_depths(&self) -> Option<ConvSpec> {
        if self.layout != Layout::ChannelsFirst || !self.one_plane_a_depth() {
            return None;
        }
        Some(self.folded(self.n * self.c * self.input[0], 1))
    }

    /// One kernel depth and no depth padding: output depth d reads input depth d alone.
    fn one_plane_a_depth(&self) -> bool {
        self.kernel[0] == 1
            && self.pad_before[0] == 0
            && self.pad_after[0] == 0
            && self.output[0] == self.input[0]
    }

    /// This spec as one image of `c` channels and `planes` depths, H and W unchanged.
    fn folded(&self, planes: usize, c: usize) -> ConvSpec {
        let mut s = self.clone();
        s.n = 1;
        s.c = c;
        s.spatial_dims = 3;
        s.input[0] = planes;
        s.output[0] = planes;
        s.stride[0] = 1;
        s.dilation[0] = 1;
        s
    }

    fn spatial<'a>(&self, a: &'a [usize; 3]) -> &'a [usize] {
        &a[3 - self.spatial_dims..]
    }
    pub fn input_dims(&self) -> &[usize] {
        self.spatial(&self.input)
    }
    pub fn output_dims(&self) -> &[usize] {
        self.spatial(&self.output)
    }
    pub fn kernel_dims(&self) -> &[usize] {
        self.spatial(&self.kernel)
    }

    pub fn taps(&self) -> usize {
        self.kernel.iter().product()
    }
    pub fn input_len(&self) -> usize {
        self.n * self.c * self.input.iter().product::<usize>()
    }
    pub fn output_len(&self) -> usize {
        self.n * self.c * self.output.iter().product::<usize>()
    }
    pub fn weight_len(&self) -> usize {
        self.c * self.taps()
    }

    /// Shape of the input tensor in its memory order (PyTorch's dims for the layout).
    pub fn input_shape(&self) -> Vec<usize> {
        self.activation_shape(self.input_dims())
    }
    pub fn output_shape(&self) -> Vec<usize> {
        self.activation_shape(self.output_dims())
    }
    pub fn weight_shape(&self) -> Vec<usize> {
        let mut v = vec![self.c, 1];
        v.extend_from_slice(self.kernel_dims());
        v
    }
    fn activation_shape(&self, sp: &[usize]) -> Vec<usize> {
        let mut v = vec![self.n];
        match self.layout {
            Layout::ChannelsFirst => {
                v.push(self.c);
                v.extend_from_slice(sp);
            }
            Layout::ChannelsLast => {
                v.extend_from_slice(sp);
                v.push(self.c);
            }
        }
        v
    }

    /// Floating-point operations, 2 per multiply-add, padding taps included (the
    /// convention cuDNN and PyTorch profilers use).
    pub fn flops(&self) -> u64 {
        2 * self.output_len() as u64 * self.taps() as u64
    }

    /// Bytes any implementation must move: input and weight read once, output written once.
    pub fn min_bytes(&self) -> u64 {
        ((self.input_len() + self.weight_len() + self.output_len()) * self.dtype.size_bytes())
            as u64
    }

    /// A stable identifier for caches and reports; changes only if the problem does.
    pub fn key(&self) -> String {
        let j = dims_text;
        let off = 3 - self.spatial_dims;
        let pads = (off..3)
            .map(|i| format!("{}:{}", self.pad_before[i], self.pad_after[i]))
            .collect::<Vec<_>>()
            .join(",");
        format!(
            "dw{}d-n{}-c{}-i{}-k{}-s{}-d{}-p{}-{}-{}",
            self.spatial_dims,
            self.n,
            self.c,
            j(self.input_dims()),
            j(self.kernel_dims()),
            j(self.spatial(&self.stride)),
            j(self.spatial(&self.dilation)),
            pads,
            self.layout.name(self.spatial_dims).to_ascii_lowercase(),
            self.dtype
        )
    }

    /// The input coordinate along dim `j` (of `[D, H, W]`) that output `o`'s tap `k`
    /// reads, or `None` where it lands in the padding. The one rule of the forward, and
    /// of grad-weight.
    #[inline]
    pub fn tap_input(&self, j: usize, o: usize, k: usize) -> Option<usize> {
        let pos = (o * self.stride[j] + k * self.dilation[j]) as i64 - self.pad_before[j] as i64;
        (pos >= 0 && (pos as usize) < self.input[j]).then_some(pos as usize)
    }

    /// The output along dim `j` whose tap `k` reads input coordinate `i`, if any (the
    /// same rule solved for the output: grad-input's gather).
    #[inline]
    pub fn tap_output(&self, j: usize, i: usize, k: usize) -> Option<usize> {
        let num = (i + self.pad_before[j]) as i64 - (k * self.dilation[j]) as i64;
        let s = self.stride[j] as i64;
        (num >= 0 && num % s == 0 && ((num / s) as usize) < self.output[j])
            .then_some((num / s) as usize)
    }

    /// The spec whose forward is this spec's dgrad, where strides are 1: input = the output's
    /// sizes, padding mirrored to (K - 1) * dilation - pad on each side. `None` when a
    /// stride is not 1 or a mirrored pad would be negative (padding past the kernel's span).
    pub fn dgrad_twin(&self) -> Option<ConvSpec> {
        if self.stride3() != [1, 1, 1] {
            return None;
        }
        let off = 3 - self.spatial_dims();
        let (k, d, b, a) = (
            self.kernel3(),
            self.dilation3(),
            self.pad_before3(),
            self.pad_after3(),
        );
        let mut padding = Vec::new();
        for j in off..3 {
            let span = (k[j] - 1) * d[j];
            if b[j] > span || a[j] > span {
                return None;
            }
            padding.push([(span - b[j]) as i64, (span - a[j]) as i64]);
        }
        let dims = |v: [usize; 3]| v[off..].iter().map(|&x| x as i64).collect::<Vec<_>>();
        ConvParams {
            n: self.n() as i64,
            c: self.c() as i64,
            input: dims(self.output3()),
            kernel: dims(k),
            stride: vec![],
            dilation: dims(d),
            padding,
            layout: self.layout(),
            dtype: self.dtype(),
        }
        .validate()
        .ok()
        .filter(|t| t.output3() == self.input3())
    }

    /// The spec a `key()` names (an epilogue suffix such as `+bias` is ignored).
    pub fn from_key(key: &str) -> Result<ConvSpec> {
        let bad = || Error::parse("spec key", key, "expected a key written by ConvSpec::key");
        let key = key.split('+').next().unwrap_or_default();
        let parts: Vec<&str> = key.split('-').collect();
        let [dw, n, c, i, k, s, d, p, layout, dtype] = parts.as_slice() else {
            return Err(bad());
        };
        let num = |t: &str, prefix: char| -> Result<i64> {
            t.strip_prefix(prefix)
                .and_then(|v| v.parse().ok())
                .ok_or_else(bad)
        };
        let dims = |t: &str, prefix: char| -> Result<Vec<i64>> {
            parse_dims("spec key", t.strip_prefix(prefix).ok_or_else(bad)?)
        };
        if !dw.starts_with("dw") {
            return Err(bad());
        }
        let padding = p
            .strip_prefix('p')
            .ok_or_else(bad)?
            .split(',')
            .map(|pair| {
                let (a, b) = pair.split_once(':').ok_or_else(bad)?;
                Ok([a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?])
            })
            .collect::<Result<Vec<[i64; 2]>>>()?;
        ConvParams {
            n: num(n, 'n')?,
            c: num(c, 'c')?,
            input: dims(i, 'i')?,
            kernel: dims(k, 'k')?,
            stride: dims(s, 's')?,
            dilation: dims(d, 'd')?,
            padding,
            layout: layout.parse()?,
            dtype: dtype.parse()?,
        }
        .validate()
    }

    /// How far apart two specs of the same kernel, strides, dilations, layout and dtype
    /// are (sum of |log ratio| of batch, channels and each input size); `None` when they
    /// differ in any of those, so a tuned config of one says nothing of the other.
    pub fn distance(&self, other: &ConvSpec) -> Option<f64> {
        let same = self.spatial_dims == other.spatial_dims
            && self.kernel == other.kernel
            && self.stride == other.stride
            && self.dilation == other.dilation
            && self.layout == other.layout
            && self.dtype == other.dtype;
        if !same {
            return None;
        }
        let lr = |a: usize, b: usize| ((a as f64) / (b as f64)).ln().abs();
        Some(
            lr(self.n, other.n)
                + lr(self.c, other.c)
                + (0..3)
                    .map(|i| lr(self.input[i], other.input[i]))
                    .sum::<f64>(),
        )
    }

    /// Flat index of input element (n, c, d, h, w) in the spec's layout.
    #[inline]
    pub fn input_index(&self, n: usize, c: usize, d: usize, h: usize, w: usize) -> usize {
        activation_index(self.layout, self.c, self.input, n, c, d, h, w)
    }
    #[inline]
    pub fn output_index(&self, n: usize, c: usize, d: usize, h: usize, w: usize) -> usize {
        activation_index(self.layout, self.c, self.output, n, c, d, h, w)
    }
    #[inline]
    pub fn weight_index(&self, c: usize, kd: usize, kh: usize, kw: usize) -> usize {
        ((c * self.kernel[0] + kd) * self.kernel[1] + kh) * self.kernel[2] + kw
    }
}

#[inline]
#[allow(clippy::too_many_arguments)]
pub(crate) fn activation_index(
    layout: Layout,
    channels: usize,
    dims: [usize; 3],
    n: usize,
    c: usize,
    d: usize,
    h: usize,
    w: usize,
) -> usize {
    let [dd, hh, ww] = dims;
    match layout {
        Layout::ChannelsFirst => (((n * channels + c) * dd + d) * hh + h) * ww + w,
        Layout::ChannelsLast => (((n * dd + d) * hh + h) * ww + w) * channels + c,
    }
}

impl fmt::Display for ConvSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let j = dims_text;
        write!(
            f,
            "n{} c{} {} k{}",
            self.n,
            self.c,
            j(self.input_dims()),
            j(self.kernel_dims())
        )?;
        let off = 3 - self.spatial_dims;
        if self.stride[off..].iter().any(|&s| s != 1) {
            write!(f, " s{}", j(self.spatial(&self.stride)))?;
        }
        if self.dilation[off..].iter().any(|&s| s != 1) {
            write!(f, " d{}", j(self.spatial(&self.dilation)))?;
        }
        if (off..3).any(|i| self.pad_before[i] + self.pad_after[i] > 0) {
            let pads = (off..3)
                .map(|i| {
                    if self.pad_before[i] == self.pad_after[i] {
                        self.pad_before[i].to_string()
                    } else {
                        format!("{}:{}", self.pad_before[i], self.pad_after[i])
                    }
                })
                .collect::<Vec<_>>()
                .join(",");
            write!(f, " p{pads}")?;
        }
        write!(f, " {} {}", self.layout.name(self.spatial_dims), self.dtype)
    }
}

/// Sizes written as `61x45x80`, the form keys, displays and flags use.
fn dims_text(a: &[usize]) -> String {
    a.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join("x")
}

/// Parses a list of sizes such as `61x45x80`, `3,5,5` or `7`.
pub fn parse_dims(what: &'static str, text: &str) -> Result<Vec<i64>> {
    let t = text.trim();
    if t.is_empty() {
        return Err(Error::parse(what, text, "expected sizes such as 61x45x80"));
    }
    t.split(['x', 'X', ','])
        .map(|p| {
            p.trim().parse::<i64>().map_err(|_| {
                Error::parse(
                    what,
                    text,
                    format!(
                        "'{}' is not an integer; expected sizes such as 61x45x80",
                        p.trim()
                    ),
                )
            })
        })
        .collect()
}

/// Parses padding: `0,2,2` (same before and after per dim) or `2:0,1,1,1:1`.
pub fn parse_padding(text: &str) -> Result<Vec<[i64; 2]>> {
    let t = text.trim();
    if t.is_empty() {
        return Err(Error::parse(
            "padding",
            text,
            "expected e.g. 0,2,2 or 2:0,1,1",
        ));
    }
    t.split([',', 'x'])
        .map(|p| {
            let bad = || {
                Error::parse(
                    "padding",
                    text,
                    format!(
                        "'{}' is not N or BEFORE:AFTER; expected e.g. 0,2,2 or 2:0,1,1",
                        p.trim()
                    ),
                )
            };
            let mut it = p.split(':');
            let a = it
                .next()
                .ok_or_else(bad)?
                .trim()
                .parse::<i64>()
                .map_err(|_| bad())?;
            let b = match it.next() {
                Some(b) => b.trim().parse::<i64>().map_err(|_| bad())?,
                None => a,
            };
            if it.next().is_some() {
                return Err(bad());
            }
            Ok([a, b])
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed() -> ConvSpec {
        ConvParams::seed().validate().unwrap()
    }

    /// Three images of 5 channels, 7 x 9, with stride, dilation and asymmetric padding.
    fn three_images(layout: Layout, dtype: DType) -> ConvParams {
        ConvParams {
            n: 3,
            c: 5,
            input: vec![7, 9],
            kernel: vec![3, 5],
            stride: vec![2, 1],
            dilation: vec![1, 2],
            padding: vec![[1, 0], [4, 4]],
            layout,
            dtype,
        }
    }

    /// `folded` holds every element of `s` where `s` does: (n, c, h, w) of `s` at
    /// (0, channel, depth, h, w) of `folded`, (channel, depth) = `to(n, c)`.
    fn assert_same_offsets(
        s: &ConvSpec,
        folded: &ConvSpec,
        to: impl Fn(usize, usize) -> (usize, usize),
    ) {
        assert_eq!(
            (folded.input_len(), folded.output_len()),
            (s.input_len(), s.output_len())
        );
        let [_, oh, ow] = s.output3();
        for n in 0..s.n() {
            for c in [0, 2, s.c() - 1] {
                let (fc, fd) = to(n, c);
                for (h, w) in [(0, 0), (oh - 1, ow - 1), (1, 2)] {
                    assert_eq!(
                        s.output_index(n, c, 0, h, w),
                        folded.output_index(0, fc, fd, h, w)
                    );
                    assert_eq!(
                        s.input_index(n, c, 0, h, w),
                        folded.input_index(0, fc, fd, h, w)
                    );
                }
            }
        }
    }

    #[test]
    fn channels_last_planes_fold_into_depths_at_the_same_offsets() {
        let p = three_images(Layout::ChannelsLast, DType::Bf16);
        let s = p.validate().unwrap();
        let f = s.planes_as_depths().unwrap();
        assert_eq!((f.n(), f.input3()[0], f.output3()[0]), (1, 3, 3));
        assert_eq!(f.flops(), s.flops());
        assert_same_offsets(&s, &f, |n, c| (c, n));
        // 1x3x3 over 4 depths of 2 images: 8 planes.
        let d3 = ConvParams {
            input: vec![4, 6, 6],
            kernel: vec![1, 3, 3],
            stride: vec![1],
            dilation: vec![1],
            padding: vec![[0, 0], [1, 1], [1, 1]],
            n: 2,
            ..p.clone()
        };
        assert_eq!(
            d3.validate().unwrap().planes_as_depths().unwrap().input3()[0],
            8
        );
        // Not where a plane's offset is not (n * D + d) x H x W x C, or outputs mix planes.
        let first = three_images(Layout::ChannelsFirst, DType::Bf16);
        assert!(first.validate().unwrap().planes_as_depths().is_none());
        for (kernel, padding) in [(vec![2, 3, 3], [0, 0]), (vec![1, 3, 3], [1, 0])] {
            let q = ConvParams {
                kernel,
                padding: vec![padding, [1, 1], [1, 1]],
                ..d3.clone()
            };
            assert!(q.validate().unwrap().planes_as_depths().is_none());
        }
    }

    #[test]
    fn channels_first_planes_fold_into_one_channel_at_the_same_offsets() {
        let s = three_images(Layout::ChannelsFirst, DType::F16)
            .validate()
            .unwrap();
        let f = s.channel_planes_as_depths().unwrap();
        assert_eq!(
            (f.n(), f.c(), f.input3()[0], f.output3()[0]),
            (1, 1, 15, 15)
        );
        assert_same_offsets(&s, &f, |n, c| (0, n * 5 + c));
        let last = three_images(Layout::ChannelsLast, DType::F16)
            .validate()
            .unwrap();
        assert!(last.channel_planes_as_depths().is_none());
    }

    #[test]
    fn seed_counts_match_design() {
        let s = seed();
        assert_eq!(s.output_dims(), &[59, 45, 80]);
        assert_eq!(s.flops(), 16_312_320_000);
        // 442 MB of unavoidable traffic
        assert_eq!(s.min_bytes(), (112_435_200 + 512 * 75 + 108_748_800) * 2);
        assert_eq!(s.input_shape(), vec![1, 512, 61, 45, 80]);
        assert_eq!(s.weight_shape(), vec![512, 1, 3, 5, 5]);
        assert_eq!(
            s.key(),
            "dw3d-n1-c512-i61x45x80-k3x5x5-s1x1x1-d1x1x1-p0:0,2:2,2:2-ncdhw-bf16"
        );
        assert_eq!(s.to_string(), "n1 c512 61x45x80 k3x5x5 p0,2,2 NCDHW bf16");
    }

    #[test]
    fn output_size_with_stride_dilation_asymmetric_padding() {
        let p = ConvParams {
            n: 2,
            c: 3,
            input: vec![10, 11],
            kernel: vec![3, 3],
            stride: vec![2, 3],
            dilation: vec![2, 1],
            padding: vec![[2, 0], [1, 2]],
            layout: Layout::ChannelsLast,
            dtype: DType::F16,
        };
        let s = p.validate().unwrap();
        // H: (10+2-5)/2+1 = 4; W: (11+3-3)/3+1 = 4
        assert_eq!(s.output_dims(), &[4, 4]);
        assert_eq!(s.output3(), [1, 4, 4]);
        assert_eq!(s.output_shape(), vec![2, 4, 4, 3]);
        assert_eq!(
            s.key(),
            "dw2d-n2-c3-i10x11-k3x3-s2x3-d2x1-p2:0,1:2-nhwc-f16"
        );
    }

    #[test]
    fn keys_round_trip_and_distances() {
        let s = seed();
        assert_eq!(ConvSpec::from_key(&s.key()).unwrap(), s);
        assert_eq!(
            ConvSpec::from_key(&format!("{}+bias+silu", s.key())).unwrap(),
            s
        );
        assert!(ConvSpec::from_key("dw3d-n1").is_err());
        let mut p = ConvParams::seed();
        p.c = 256;
        let half = p.validate().unwrap();
        assert!((s.distance(&half).unwrap() - 2f64.ln()).abs() < 1e-12);
        assert_eq!(s.distance(&s), Some(0.0));
        assert_eq!(s.distance(&s.with_dtype(DType::F16)), None);
    }

    #[test]
    fn single_entries_broadcast() {
        let p = ConvParams {
            n: 1,
            c: 4,
            input: vec![8, 8, 8],
            kernel: vec![3, 3, 3],
            stride: vec![2],
            dilation: vec![],
            padding: vec![[1, 1]],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        };
        let s = p.validate().unwrap();
        assert_eq!(s.stride3(), [2, 2, 2]);
        assert_eq!(s.output3(), [4, 4, 4]);
    }

    fn err(p: ConvParams) -> String {
        p.validate().unwrap_err().to_string()
    }

    #[test]
    fn invalid_specs_name_field_and_value() {
        let mut p = ConvParams::seed();
        p.c = 0;
        assert!(err(p.clone()).contains("channels c: 0"));
        p = ConvParams::seed();
        p.input[1] = -3;
        assert!(
            err(p.clone()).contains("input size along h: -3"),
            "{}",
            err(p)
        );
        p = ConvParams::seed();
        p.kernel = vec![3, 5];
        assert!(err(p.clone()).contains("kernel has 2 entries"));
        p = ConvParams::seed();
        p.kernel[0] = 62;
        assert!(err(p.clone()).contains("kernel along d"));
        p = ConvParams::seed();
        p.stride = vec![1, 0, 1];
        assert!(err(p.clone()).contains("stride along h: 0"));
        p = ConvParams::seed();
        p.padding = vec![[0, 0], [-1, 2], [2, 2]];
        assert!(err(p.clone()).contains("padding before along h: -1"));
        p = ConvParams::seed();
        p.input = vec![];
        assert!(err(p.clone()).contains("0 spatial dims"));
        p = ConvParams::seed();
        p.input = vec![2_000_000_000, 2_000_000_000, 2_000_000_000];
        p.kernel = vec![1, 1, 1];
        assert!(err(p.clone()).contains("element count"), "{}", err(p));
    }

    #[test]
    fn parses_dims_and_padding() {
        assert_eq!(parse_dims("input", "61x45x80").unwrap(), vec![61, 45, 80]);
        assert_eq!(parse_dims("kernel", "3,5,5").unwrap(), vec![3, 5, 5]);
        assert!(parse_dims("kernel", "3xa").is_err());
        assert_eq!(
            parse_padding("2:0,1,1:1").unwrap(),
            vec![[2, 0], [1, 1], [1, 1]]
        );
        assert_eq!(
            parse_padding("0,2,2").unwrap(),
            vec![[0, 0], [2, 2], [2, 2]]
        );
        assert!(parse_padding("1:2:3").is_err());
        assert!(parse_padding("").is_err());
        assert!("bf17".parse::<DType>().is_err());
        assert_eq!("NDHWC".parse::<Layout>().unwrap(), Layout::ChannelsLast);
    }

    #[test]
    fn index_layouts_agree_on_shape() {
        let mut p = ConvParams::seed();
        p.input = vec![4, 5, 6];
        p.c = 3;
        let s = p.validate().unwrap();
        assert_eq!(s.input_index(0, 1, 0, 0, 0), 4 * 5 * 6);
        let s = s.with_layout(Layout::ChannelsLast);
        assert_eq!(s.input_index(0, 1, 0, 0, 0), 1);
        assert_eq!(s.input_index(0, 0, 0, 0, 1), 3);
    }
}
