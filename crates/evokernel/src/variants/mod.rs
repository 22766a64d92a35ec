//! Kernel variants: one CUDA source and one small descriptor each. A descriptor says
//! which specs it applies to, its config space, the template specialization a config
//! compiles to, and the launch geometry. It knows nothing of timing or caches.

use std::collections::BTreeMap;
use std::fmt;

use crate::error::{Error, Result};
use crate::pass::Pass;
use crate::spec::{ConvSpec, DType, Layout};

/// A variant's typed parameters: a struct of named `usize` fields, read from a config in
/// one place (`read`, which `fits` uses), or read after the config was checked against
/// the variant's space for a spec (`parse`, what `specialization` and `launch` use).
macro_rules! typed_params {
    ($(#[$m:meta])* $name:ident { $($field:ident),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        struct $name {
            $($field: usize),*
        }
        impl $name {
            /// The values, not checked against a space.
            #[allow(dead_code)]
            fn read(config: &$crate::variants::Config) -> $crate::error::Result<Self> {
                Ok($name {
                    $($field: config.param(stringify!($field))? as usize),*
                })
            }
            /// The values of `config`, checked against `v`'s space for `spec` first.
            #[allow(dead_code)]
            fn parse(
                v: &dyn $crate::variants::Variant,
                spec: &$crate::spec::ConvSpec,
                config: &$crate::variants::Config,
            ) -> $crate::error::Result<Self> {
                $crate::variants::check_config(v, spec, config)?;
                Self::read(config)
            }
            /// These values as `variant`'s config.
            #[allow(dead_code)]
            fn config(&self, variant: &str) -> $crate::variants::Config {
                $crate::variants::Config::new(variant, &[$((stringify!($field), self.$field as i64)),*])
            }
        }
    };
}

mod channels_last;
pub(crate) mod depth_reuse;
pub(crate) mod depth_reuse_cl;
pub(crate) mod depth_reuse_fma;
pub(crate) mod depth_reuse_fma_cl;
mod dgrad_cell_cl;
mod dgrad_gather;
mod dgrad_gather_cl;
mod large_kernel;
mod naive;
mod row_reuse;
pub(crate) mod row_rotation_cl;
pub(crate) mod row_window;
pub(crate) mod row_window_cl;
mod smem_tile;
mod streaming;
mod streaming_cl;
mod tensor_core;
mod wgrad;
mod wgrad_cl;
mod wgrad_mma;
mod wgrad_mma_cl;
mod wgrad_strip_cl;
mod wgrad_tile;
mod wgrad_tile_cl;
mod wgrad_window;
mod wgrad_window_cl;

pub use channels_last::ChannelsLast;
pub use depth_reuse::DepthReuse;
pub use depth_reuse_cl::DepthReuseCl;
pub use depth_reuse_fma::DepthReuseFma;
pub use depth_reuse_fma_cl::DepthReuseFmaCl;
pub use dgrad_cell_cl::DgradCellCl;
pub use dgrad_gather::DgradGather;
pub use dgrad_gather_cl::DgradGatherCl;
pub use large_kernel::LargeKernel;
pub use naive::Naive;
pub use row_reuse::RowReuse;
pub use row_rotation_cl::RowRotationCl;
pub use row_window::RowWindow;
pub use row_window_cl::RowWindowCl;
pub use smem_tile::SmemTile;
pub use streaming::Streaming;
pub use streaming_cl::StreamingCl;
pub use tensor_core::TensorCore;
pub use wgrad::Wgrad;
pub use wgrad_cl::WgradCl;
pub use wgrad_mma::WgradMma;
pub use wgrad_mma_cl::WgradMmaCl;
pub use wgrad_strip_cl::WgradStripCl;
pub use wgrad_tile::WgradTile;
pub use wgrad_tile_cl::WgradTileCl;
pub use wgrad_window::WgradWindow;
pub use wgrad_window_cl::WgradWindowCl;

/// Dynamic shared memory a block may opt into on sm_90 (227 KiB).
pub(crate) const MAX_SHARED: usize = 227 * 1024;

/// `Err` when `what` needs more shared memory than a block may have.
pub(crate) fn within_shared(what: &str, bytes: usize) -> std::result::Result<(), String> {
    if bytes > MAX_SHARED {
        return Err(format!(
            "{what} needs {bytes} bytes of shared memory, more than the {MAX_SHARED} a block may have"
        ));
    }
    Ok(())
}

/// Output-depth chunk sizes the depth-sliding kernels offer; a block reads KD - 1 slices
/// more than it has depths, so longer chunks waste less.
pub(crate) const DEPTH_CHUNKS: [i64; 5] = [4, 8, 16, 32, 64];

/// The parameters every depth-rotation kernel with a cp.async ring shares: output depths
/// per block, slices in flight ahead of the one being read (`stages`), and the blocks per
/// SM its registers are capped for (`__launch_bounds__`).
pub(crate) fn ring_params(spec: &ConvSpec, stages: &[i64]) -> Vec<Param> {
    vec![
        Param {
            name: "dchunk",
            values: depth_chunks(spec, &DEPTH_CHUNKS),
        },
        Param {
            name: "stages",
            values: stages.to_vec(),
        },
        Param {
            name: "minblocks",
            values: vec![1, 2, 3, 4],
        },
    ]
}

/// Sizes worth trying for one side of a block over `n` rows or runs: near-equal
/// divisions into 1-4 parts and powers of two, none over `cap`.
pub(crate) fn block_sides(n: usize, cap: usize) -> Vec<i64> {
    let mut v: Vec<i64> = (1..=4)
        .map(|k| n.div_ceil(k))
        .chain([1, 2, 4, 8, 16, 32])
        .filter(|&s| s >= 1 && s <= cap)
        .map(|s| s as i64)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Output-depth chunk sizes (how many output depths one block slides over) from
/// `sizes`: a chunk at least as deep as the output already gives one block per plane
/// stack, so only the first such size is kept.
pub(crate) fn depth_chunks(spec: &ConvSpec, sizes: &[i64]) -> Vec<i64> {
    let od = spec.output3()[0] as i64;
    match sizes.iter().position(|&d| d >= od) {
        Some(i) => sizes[..=i].to_vec(),
        None => sizes.to_vec(),
    }
}

/// Most slices one block of a depth-rotation kernel walks: its balanced chunk of at most
/// `dchunk` output depths plus KD - 1 (mirrors per_chunk in the kernels).
pub(crate) fn rotation_steps(spec: &ConvSpec, dchunk: usize) -> usize {
    let od = spec.output3()[0];
    let chunks = od.div_ceil(dchunk);
    od.div_ceil(chunks) + spec.kernel3()[0] - 1
}

/// Whether an FMA rotation kernel keeps a table of its slice chunks' sources (the
/// `TABLE` template argument): it pays from 4 steps a block; with one (2-D, 1-D) it is
/// pure setup and shared memory (mobilenet-s2 0.085 -> 0.138 ms, run 51).
pub(crate) fn fill_table(spec: &ConvSpec, dchunk: usize) -> bool {
    rotation_steps(spec, dchunk) >= 4
}

/// Shared memory of an FMA rotation kernel: the i32 table of where each of a slice's
/// `chunks` 16-byte chunks comes from (where it pays), then a ring of `stages` + 1
/// slices of `slice_bytes`, or as many as a block has steps. Mirrors both kernels.
pub(crate) fn fma_ring_bytes(
    spec: &ConvSpec,
    dchunk: usize,
    stages: usize,
    chunks: usize,
    slice_bytes: usize,
) -> usize {
    let table = if fill_table(spec, dchunk) {
        (chunks * 4).div_ceil(16) * 16
    } else {
        0
    };
    table + (stages + 1).min(rotation_steps(spec, dchunk)) * slice_bytes
}

/// `Err` where an input plane (H x W x C elements of one depth) does not fit the 32-bit
/// in-plane offsets the channels-last ring kernels work in.
pub(crate) fn plane_offsets_fit_i32(spec: &ConvSpec) -> std::result::Result<(), String> {
    let [_, ih, iw] = spec.input3();
    if ih * iw * spec.c() > i32::MAX as usize {
        return Err(format!(
            "an input plane of {ih} x {iw} x {} elements: the kernel's in-plane offsets are 32-bit",
            spec.c()
        ));
    }
    Ok(())
}

/// `Err` where channels-last pixels are not whole 16-byte chunks (the cp.async fills).
pub(crate) fn whole_chunk_pixels(spec: &ConvSpec) -> std::result::Result<(), String> {
    let e = spec.dtype().per_16_bytes();
    if !spec.c().is_multiple_of(e) {
        return Err(format!(
            "needs a channel count that is a multiple of {e} (16-byte pixel vectors)"
        ));
    }
    Ok(())
}

/// Input rows that `rows` consecutive output rows read.
pub(crate) fn input_rows(spec: &ConvSpec, rows: usize) -> usize {
    let (kh, sh, dh) = (spec.kernel3()[1], spec.stride3()[1], spec.dilation3()[1]);
    (rows - 1) * sh + (kh - 1) * dh + 1
}

/// Input columns that `cols` consecutive outputs of a row read.
pub(crate) fn input_cols(spec: &ConvSpec, cols: usize) -> usize {
    let (kw, sw, dw) = (spec.kernel3()[2], spec.stride3()[2], spec.dilation3()[2]);
    (cols - 1) * sw + (kw - 1) * dw + 1
}

/// Folded planes (`ConvSpec::planes_as_depths` and its channels-first twin) an FMA
/// rotation kernel can walk: it counts them in 32 bits.
pub(crate) fn walkable_planes(walked: Option<ConvSpec>) -> Option<ConvSpec> {
    walked.filter(|w| w.output3()[0] <= i32::MAX as usize)
}

/// `ring_params` of a kernel that may walk planes, and `planes` (0, or 0 and 1 where the
/// spec's planes can be walked as depths): the depth chunks are then the walked planes'.
pub(crate) fn plane_walk_ring_params(
    spec: &ConvSpec,
    walked: Option<ConvSpec>,
    stages: &[i64],
) -> Vec<Param> {
    let mut params = ring_params(walked.as_ref().unwrap_or(spec), stages);
    params.push(Param {
        name: "planes",
        values: if walked.is_some() {
            vec![0, 1]
        } else {
            vec![0]
        },
    });
    params
}

/// What an FMA rotation kernel with a `planes` parameter runs over: `walked` (the spec's
/// planes as one image's depths) where the config walks them and the spec allows it.
pub(crate) fn walked_geometry(
    spec: &ConvSpec,
    planes: usize,
    walked: Option<ConvSpec>,
) -> ConvSpec {
    match walked {
        Some(walked) if planes == 1 => walked,
        _ => spec.clone(),
    }
}

/// A depth chunk without the plane walk must be one of the spec's own: the space's chunks
/// are the walked planes', and past the spec's depth they all give the same blocks.
pub(crate) fn chunk_fits_without_walk(
    spec: &ConvSpec,
    planes: usize,
    dchunk: usize,
) -> std::result::Result<(), String> {
    let own = depth_chunks(spec, &DEPTH_CHUNKS);
    if planes == 0 && !own.contains(&(dchunk as i64)) {
        return Err(format!(
            "dchunk = {dchunk} without planes: the blocks of a chunk of {} output depths",
            own.last().copied().unwrap_or(1)
        ));
    }
    Ok(())
}

/// The largest of `chunks` not over `cap`, or the smallest when all are.
pub(crate) fn depth_chunk_at_most(chunks: &[i64], cap: i64) -> i64 {
    let smallest = chunks.iter().copied().min().unwrap_or(1);
    chunks
        .iter()
        .copied()
        .filter(|&d| d <= cap)
        .max()
        .unwrap_or(smallest)
}

/// A named integer parameter and the values it may take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    pub name: &'static str,
    pub values: Vec<i64>,
}

/// One point of a variant's config space. Serializes as `variant:k=v,k=v`.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Config {
    pub variant: String,
    pub values: BTreeMap<String, i64>,
}

impl Config {
    pub fn new(variant: &str, values: &[(&str, i64)]) -> Self {
        Config {
            variant: variant.to_string(),
            values: values.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }

    pub fn get(&self, name: &str) -> Option<i64> {
        self.values.get(name).copied()
    }

    /// A parameter the variant needs; an error names it when the config lacks it.
    pub fn param(&self, name: &str) -> Result<i64> {
        self.get(name)
            .ok_or_else(|| Error::parse("config", &self.to_string(), format!("missing {name}")))
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kv: Vec<String> = self
            .values
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        write!(f, "{}:{}", self.variant, kv.join(","))
    }
}

impl std::str::FromStr for Config {
    type Err = Error;
    /// `variant:k=v,k=v`, or an instance name (its dtype and layout are dropped).
    fn from_str(s: &str) -> Result<Self> {
        if !s.contains(':') {
            if let Ok(i) = s.parse::<Instance>() {
                return Ok(i.config);
            }
        }
        let bad = || {
            Error::parse(
                "config",
                s,
                "expected variant:k=v,k=v (e.g. naive:block=256)",
            )
        };
        let (variant, rest) = s.split_once(':').unwrap_or((s, ""));
        if variant.trim().is_empty() {
            return Err(bad());
        }
        let mut values = BTreeMap::new();
        for kv in rest.split(',').filter(|p| !p.trim().is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(bad)?;
            let value = v.trim().parse::<i64>().map_err(|_| bad())?;
            if values.insert(k.trim().to_string(), value).is_some() {
                return Err(Error::parse(
                    "config",
                    s,
                    format!("'{}' is given twice", k.trim()),
                ));
            }
        }
        Ok(Config {
            variant: variant.trim().to_string(),
            values,
        })
    }
}

/// A kernel instance: a variant's config for one dtype and layout. Its canonical name
/// is the only text form reports, `tune.json` and the profiler's filter use, e.g.
/// `depth_reuse_bf16_cf_dchunk16_minblocks2_stages2` (variant, dtype, `cf` or `cl`,
/// then every parameter as name and value, in name order).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Instance {
    pub config: Config,
    pub dtype: DType,
    pub layout: Layout,
}

impl Instance {
    pub fn new(spec: &ConvSpec, config: Config) -> Self {
        Instance {
            config,
            dtype: spec.dtype(),
            layout: spec.layout(),
        }
    }

    /// `Err` naming both when the instance was made for another dtype or layout.
    pub fn check_spec(&self, spec: &ConvSpec) -> Result<()> {
        if self.dtype != spec.dtype() || self.layout != spec.layout() {
            return Err(Error::parse(
                "instance",
                &self.to_string(),
                format!(
                    "it is for {} {}, but the problem is {} {}",
                    self.dtype,
                    layout_tag(self.layout),
                    spec.dtype(),
                    layout_tag(spec.layout())
                ),
            ));
        }
        Ok(())
    }
}

fn layout_tag(l: Layout) -> &'static str {
    match l {
        Layout::ChannelsFirst => "cf",
        Layout::ChannelsLast => "cl",
    }
}

impl fmt::Display for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}_{}_{}",
            self.config.variant,
            self.dtype,
            layout_tag(self.layout)
        )?;
        for (k, v) in &self.config.values {
            write!(f, "_{k}{v}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Instance {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: String| Error::parse("instance name", s, why);
        // The longest registered variant name the text starts with, then `_`.
        let variant = registry()
            .into_iter()
            .map(|v| v.name())
            .filter(|n| s.starts_with(n) && s[n.len()..].starts_with('_'))
            .max_by_key(|n| n.len())
            .ok_or_else(|| bad("it does not start with a known variant and '_'".into()))?;
        let mut parts = s[variant.len() + 1..].splitn(3, '_');
        let dtype: DType = parts
            .next()
            .unwrap_or_default()
            .parse()
            .map_err(|_| bad("expected the dtype (bf16, f16, f32) after the variant".into()))?;
        let layout = match parts.next().unwrap_or_default() {
            "cf" => Layout::ChannelsFirst,
            "cl" => Layout::ChannelsLast,
            other => {
                return Err(bad(format!(
                    "expected cf or cl after the dtype, found '{other}'"
                )))
            }
        };
        let mut values = BTreeMap::new();
        let mut rest = parts.next().unwrap_or_default();
        while !rest.is_empty() {
            // A parameter is letters and '_' then digits, parameters joined by '_'.
            let digits = rest
                .find(|ch: char| ch.is_ascii_digit())
                .ok_or_else(|| bad(format!("parameter '{rest}' has no value")))?;
            let name = &rest[..digits];
            let end = rest[digits..]
                .find(|ch: char| !ch.is_ascii_digit())
                .map_or(rest.len(), |e| digits + e);
            let value: i64 = rest[digits..end]
                .parse()
                .map_err(|_| bad(format!("value of '{name}' is out of range")))?;
            if name.is_empty() || values.insert(name.to_string(), value).is_some() {
                return Err(bad(format!("parameter '{name}' is empty or repeated")));
            }
            rest = &rest[end..];
            if let Some(r) = rest.strip_prefix('_') {
                rest = r;
            } else if !rest.is_empty() {
                return Err(bad(format!("expected '_' before '{rest}'")));
            }
        }
        Ok(Instance {
            config: Config {
                variant: variant.to_string(),
                values,
            },
            dtype,
            layout,
        })
    }
}

/// Grid, block and dynamic shared memory of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_bytes: u32,
}

/// Most blocks one launch's x dimension takes (2^31 - 1 on every CUDA GPU).
const MAX_GRID_X: u64 = i32::MAX as u64;

/// The grid x dimension for `blocks` blocks of `v`; an error, never a wrapped grid.
pub(crate) fn grid_x(v: &dyn Variant, spec: &ConvSpec, blocks: usize) -> Result<u32> {
    if blocks as u64 > MAX_GRID_X {
        return Err(Error::NotApplicable {
            variant: v.name().into(),
            spec: spec.to_string(),
            reason: format!("{blocks} blocks exceed one launch's grid ({MAX_GRID_X})"),
        });
    }
    Ok(blocks as u32)
}

/// `Err` when `v`'s default config cannot launch `spec` (e.g. more blocks than one
/// launch's grid). Per-plane variants end `applies` with it, so the grid rule lives in
/// their `launch` alone and dispatch takes another variant (naive and row_reuse stride
/// over any size).
pub(crate) fn default_launches(
    v: &dyn Variant,
    spec: &ConvSpec,
) -> std::result::Result<(), String> {
    match v.launch(spec, &v.default_config(spec), 1) {
        Ok(_) => Ok(()),
        Err(Error::NotApplicable { reason, .. }) => Err(reason),
        Err(e) => Err(e.to_string()),
    }
}

/// The space of a grid-stride kernel: threads per block, and blocks per SM in the grid
/// (naive, dgrad_gather).
pub(crate) fn grid_stride_space() -> Vec<Param> {
    vec![
        Param {
            name: "block",
            values: vec![128, 256],
        },
        // Blocks per SM in the grid-stride loop's grid.
        Param {
            name: "waves",
            values: vec![4, 8, 16, 32],
        },
    ]
}

/// A grid-stride kernel's launch: `threads` work items in blocks of `block`, at most
/// `waves` blocks per SM (naive, row_reuse).
pub(crate) fn grid_stride_launch(threads: u64, block: u64, waves: u64, sms: u32) -> Launch {
    let grid = threads
        .div_ceil(block)
        .min(sms.max(1) as u64 * waves)
        .max(1) as u32;
    Launch {
        grid: (grid, 1, 1),
        block: (block as u32, 1, 1),
        shared_bytes: 0,
    }
}

/// One algorithm for depthwise convolution on the GPU.
pub trait Variant: Sync {
    fn name(&self) -> &'static str;
    /// The `.cu` source (without the common header).
    fn source(&self) -> &'static str;
    /// `Err(reason)` when this variant cannot compute `spec`.
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String>;
    /// The named parameters and their allowed values.
    fn space(&self, spec: &ConvSpec) -> Vec<Param>;
    fn default_config(&self, spec: &ConvSpec) -> Config;
    /// The template specialization a config compiles to (an NVRTC name expression).
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String>;
    /// Launch geometry on a device with `sms` multiprocessors.
    fn launch(&self, spec: &ConvSpec, config: &Config, sms: u32) -> Result<Launch>;
    /// `Err(reason)` when a config of the space cannot launch for `spec` (e.g. more
    /// shared memory than a block may have). The tuner prunes these before compiling.
    fn fits(&self, _spec: &ConvSpec, _config: &Config) -> std::result::Result<(), String> {
        Ok(())
    }
    /// Whether the kernel flags non-finite outputs for kernels/repair.cu to recompute
    /// (the tensor-core kernels: a NaN input poisons a whole tile there).
    fn needs_repair(&self) -> bool {
        false
    }
    /// The `__global__` function's name, which profilers filter launches on.
    fn kernel_function(&self) -> String {
        format!("{}_dwconv", self.name())
    }
    /// The `__global__` function `config` launches: `kernel_function` unless a config
    /// picks another kernel of the same file (depth_reuse_cl's producer form).
    fn kernel_function_of(&self, _config: &Config) -> String {
        self.kernel_function()
    }
    /// The pass the variant computes.
    fn pass(&self) -> Pass {
        Pass::Forward
    }
    /// Kernels that take TMA tensor maps of their input and output as a third
    /// parameter: the boxes `config` moves with them.
    fn tensor_maps(&self, _spec: &ConvSpec, _config: &Config) -> Option<TensorMaps> {
        None
    }
    /// Grad-weight variants that write wgrad's f32 partials [splits][C][taps + 1]: how
    /// many splits `config` sums into (the workspace holds them, wgrad_finalize adds
    /// them). `None`: the variant writes its result directly.
    fn partial_splits(&self, _spec: &ConvSpec, _config: &Config) -> Result<Option<usize>> {
        Ok(None)
    }
    /// Device scratch one call needs (the plan allocates it on the call's stream when
    /// the caller passes none).
    fn workspace_bytes(&self, spec: &ConvSpec, config: &Config) -> Result<usize> {
        Ok(self
            .partial_splits(spec, config)?
            .map_or(0, |splits| Wgrad::partial_bytes(spec, splits)))
    }
    /// A second kernel launched after the main one on the same stream (wgrad's sum of
    /// its partials).
    fn finalize_kernel(
        &self,
        spec: &ConvSpec,
        config: &Config,
        sms: u32,
    ) -> Result<Option<FinalizeKernel>> {
        Ok(self
            .partial_splits(spec, config)?
            .map(|splits| wgrad::finalize(spec, splits, sms)))
    }
}

/// The third kernel parameter of variants that move their data with the TMA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorMaps {
    /// The kernel takes the parameter, this config does not read it (passed zeroed).
    Unused,
    /// Boxes (columns, rows, depths) of one image-channel: the input's and, where the
    /// kernel moves it through the TMA, the output-shaped tensor's (the output; for a
    /// grad-weight kernel, grad-output).
    Boxes {
        input: [u32; 3],
        output: Option<[u32; 3]>,
        /// The output box's 128-byte rows swizzled in shared memory (16-byte chunks XORed
        /// with the row mod 8: `CU_TENSOR_MAP_SWIZZLE_128B`), so a stage's fragment
        /// stores fall on distinct banks.
        output_swizzled: bool,
    },
    /// Boxes (channels, columns, rows, depths) of one image of channels-last data: the
    /// input's and, where the kernel moves it through the TMA, the output-shaped tensor's.
    ChannelsLast {
        input: [u32; 4],
        output: Option<[u32; 4]>,
        /// The input box's 32-byte pixels swizzled in shared memory (their 16-byte halves
        /// swapped where address bit 7 is set: `CU_TENSOR_MAP_SWIZZLE_32B`), so the 8
        /// pixels an ldmatrix reads fall on distinct banks; needs boxes of 32-byte pixels.
        input_swizzled: bool,
    },
}

/// A variant's second kernel: name, source, name expression (without the epilogue
/// code) and launch.
pub struct FinalizeKernel {
    pub name: &'static str,
    pub source: &'static str,
    pub expr: String,
    pub launch: Launch,
}

/// What a tuned result of `v` depends on besides the problem: its source, the common
/// header, the epilogue code path's header and the NVRTC version (`tune.json` entries with
/// another hash are stale).
pub fn kernel_hash(v: &dyn Variant, nvrtc: &str) -> String {
    crate::cache::stable_hash(&[
        v.name().as_bytes(),
        v.source().as_bytes(),
        crate::cuda::jit::COMMON_HEADER.as_bytes(),
        nvrtc.as_bytes(),
    ])
}

/// Every registered variant, in ladder order.
pub fn registry() -> Vec<&'static dyn Variant> {
    vec![
        &Naive,
        &RowReuse,
        &ChannelsLast,
        &SmemTile,
        &LargeKernel,
        &TensorCore,
        &Streaming,
        &StreamingCl,
        &DepthReuse,
        &DepthReuseCl,
        &DepthReuseFma,
        &DepthReuseFmaCl,
        &RowRotationCl,
        &RowWindowCl,
        &RowWindow,
        &DgradGather,
        &DgradGatherCl,
        &DgradCellCl,
        &Wgrad,
        &WgradCl,
        &WgradMma,
        &WgradMmaCl,
        &WgradTile,
        &WgradTileCl,
        &WgradStripCl,
        &WgradWindowCl,
        &WgradWindow,
    ]
}

pub fn find(name: &str) -> Result<&'static dyn Variant> {
    registry()
        .into_iter()
        .find(|v| v.name() == name)
        .ok_or_else(|| {
            Error::parse(
                "variant",
                name,
                format!(
                    "known variants: {}",
                    registry()
                        .iter()
                        .map(|v| v.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })
}

/// Configs forced by `--config` flags and by `EVOKERNEL_CONFIG` (several separated by
/// `;`), as `variant:k=v,..` or an instance name; flags win over the environment for the
/// same variant, two flags for one variant are an error. Errors name where the text came
/// from. Whether the values fit a problem is checked per problem (`check_forced`).
pub fn forced_configs(flags: &[String]) -> Result<Vec<Config>> {
    let env = std::env::var("EVOKERNEL_CONFIG").unwrap_or_default();
    let mut out: Vec<Config> = Vec::new();
    let given = flags
        .iter()
        .map(|t| (t.as_str(), "--config"))
        .chain(env.split(';').map(|t| (t, "EVOKERNEL_CONFIG")));
    for (text, origin) in given {
        if text.trim().is_empty() {
            continue;
        }
        let named = |e: Error| match e {
            Error::Parse { text, expected, .. } => Error::Parse {
                what: if origin == "--config" {
                    "--config"
                } else {
                    "EVOKERNEL_CONFIG"
                },
                text,
                expected,
            },
            e => e,
        };
        let c: Config = text.parse().map_err(named)?;
        let v = find(&c.variant).map_err(named)?;
        let names: Vec<&str> = v
            .space(&crate::spec::ConvParams::seed().validate()?)
            .iter()
            .map(|p| p.name)
            .collect();
        if let Some(k) = c.values.keys().find(|k| !names.contains(&k.as_str())) {
            return Err(named(Error::parse(
                "config",
                text,
                format!(
                    "{} has no parameter '{k}'; its parameters are {}",
                    v.name(),
                    names.join(", ")
                ),
            )));
        }
        match out.iter().position(|o| o.variant == c.variant) {
            Some(_) if origin == "--config" => {
                return Err(named(Error::parse(
                    "config",
                    text,
                    format!("{} is forced twice; give one config per variant", c.variant),
                )))
            }
            Some(_) => {} // the flag wins over the environment
            None => out.push(c),
        }
    }
    Ok(out)
}

/// A forced config completed for `spec`: the parameters it names, the variant's default
/// config for `spec` for the rest, so `--config depth_reuse_cl:warp_channels=2` changes
/// one parameter of what would run (reports print the whole config).
pub fn forced_over_default(v: &dyn Variant, spec: &ConvSpec, forced: &Config) -> Config {
    let mut c = v.default_config(spec);
    c.values
        .extend(forced.values.iter().map(|(k, val)| (k.clone(), *val)));
    c
}

/// `Err` when a forced config of a variant that applies to `spec` does not fit it (a
/// value outside the variant's space, or, with the defaults for what it leaves out, a
/// combination the variant refuses): forced means forced, never a silent fallback to
/// another config.
pub fn check_forced(forced: &[Config], spec: &ConvSpec) -> Result<()> {
    for c in forced {
        let v = find(&c.variant)?;
        if v.applies(spec).is_ok() {
            check_config(v, spec, &forced_over_default(v, spec, c)).map_err(|e| {
                let origin = match std::env::var("EVOKERNEL_CONFIG") {
                    Ok(env) if env.contains(&c.to_string()) || env.contains(&c.variant) => {
                        "EVOKERNEL_CONFIG"
                    }
                    _ => "--config",
                };
                let why = match e {
                    Error::Parse { expected, .. } => expected,
                    e => e.to_string(),
                };
                // (check_config's own "it does not fit SPEC: " would name the spec twice)
                let fit = format!("it does not fit {spec}: ");
                let why = why.strip_prefix(&fit).unwrap_or(&why);
                Error::parse(
                    if origin == "--config" {
                        "--config"
                    } else {
                        "EVOKERNEL_CONFIG"
                    },
                    &c.to_string(),
                    format!("the forced config does not fit {spec}: {why}"),
                )
            })?;
        }
    }
    Ok(())
}

/// Checks `--only` names: variants, or `cudnn` / `cudnn-legacy` for cuDNN's rows.
pub fn check_only(names: &[String]) -> Result<()> {
    for n in names {
        if n != "cudnn" && n != "cudnn-legacy" {
            find(n)?;
        }
    }
    Ok(())
}

/// The CUDA C++ type of a dtype.
pub fn cuda_type(dtype: DType) -> &'static str {
    match dtype {
        DType::Bf16 => "__nv_bfloat16",
        DType::F16 => "__half",
        DType::F32 => "float",
    }
}

/// `Err` unless every stride and dilation is 1.
pub(crate) fn unit_stride_and_dilation(spec: &ConvSpec) -> std::result::Result<(), String> {
    if spec.stride3() != [1, 1, 1] || spec.dilation3() != [1, 1, 1] {
        return Err("needs stride 1 and dilation 1 in every dim".into());
    }
    Ok(())
}

pub(crate) fn channels_last(spec: &ConvSpec) -> bool {
    spec.layout() == Layout::ChannelsLast
}

/// Checks a config names exactly the variant's parameters with allowed values.
pub fn check_config(v: &dyn Variant, spec: &ConvSpec, config: &Config) -> Result<()> {
    let space = v.space(spec);
    let err = |msg: String| Error::parse("config", &config.to_string(), msg);
    if config.variant != v.name() {
        return Err(err(format!(
            "it is for variant '{}', not '{}'",
            config.variant,
            v.name()
        )));
    }
    for p in &space {
        match config.get(p.name) {
            Some(val) if p.values.contains(&val) => {}
            Some(val) => {
                return Err(err(format!(
                    "{}={} is not one of {:?}",
                    p.name, val, p.values
                )))
            }
            None => return Err(err(format!("missing {} (one of {:?})", p.name, p.values))),
        }
    }
    if let Some(k) = config
        .values
        .keys()
        .find(|k| !space.iter().any(|p| p.name == k.as_str()))
    {
        return Err(err(format!("unknown parameter {k}")));
    }
    v.fits(spec, config)
        .map_err(|reason| err(format!("it does not fit {spec}: {reason}")))
}

/// Every config of a space (the cartesian product of its parameters' values).
pub fn enumerate(variant: &str, space: &[Param]) -> Vec<Config> {
    let mut out = vec![BTreeMap::new()];
    for p in space {
        out = out
            .into_iter()
            .flat_map(|m| {
                p.values.iter().map(move |&v| {
                    let mut m = m.clone();
                    m.insert(p.name.to_string(), v);
                    m
                })
            })
            .collect();
    }
    out.into_iter()
        .map(|values| Config {
            variant: variant.to_string(),
            values,
        })
        .collect()
}

/// The configs of `v`'s space that fit `spec`, in enumeration order.
pub fn valid_configs(v: &dyn Variant, spec: &ConvSpec) -> Vec<Config> {
    enumerate(v.name(), &v.space(spec))
        .into_iter()
        .filter(|c| v.fits(spec, c).is_ok())
        .collect()
}

/// Specs the variants' unit tests share.
#[cfg(test)]
pub(crate) mod test_specs {
    use crate::spec::{ConvParams, ConvSpec, DType, Layout};

    /// Every channels-last case of the three suites is taken by `v` (the channels-first
    /// ones refused), and its default config fits and launches in a block of at most 256
    /// threads and the shared memory a block may have.
    pub(crate) fn assert_defaults_fit_every_channels_last_case(v: &dyn crate::variants::Variant) {
        use crate::suite::{channels_last_suite, models_suite, public_suite};
        let cases = public_suite()
            .unwrap()
            .into_iter()
            .chain(channels_last_suite().unwrap())
            .chain(models_suite().unwrap());
        for case in cases {
            let spec = &case.spec;
            if v.applies(spec).is_err() {
                assert_ne!(spec.layout(), Layout::ChannelsLast, "{}", case.name);
                continue;
            }
            let d = v.default_config(spec);
            v.fits(spec, &d)
                .unwrap_or_else(|e| panic!("{}: {e}", case.name));
            let l = v.launch(spec, &d, 132).unwrap();
            let threads = l.block.0 * l.block.1 * l.block.2;
            assert!(threads <= 256, "{}: {threads}", case.name);
            assert!(l.shared_bytes as usize <= super::MAX_SHARED);
        }
    }

    /// The seed problem, channels-last, with `c` channels of `dtype`.
    pub(crate) fn seed_channels_last(c: i64, dtype: DType) -> ConvSpec {
        let mut p = ConvParams::seed();
        p.layout = Layout::ChannelsLast;
        p.c = c;
        p.dtype = dtype;
        p.validate().unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_last_grad_weight_variants_take_whole_4_byte_channel_vectors() {
        use test_specs::seed_channels_last as cl;
        for v in [&WgradCl as &dyn Variant, &WgradTileCl] {
            assert!(v.applies(&cl(512, DType::Bf16)).is_ok(), "{}", v.name());
            assert!(v.applies(&cl(7, DType::Bf16)).is_err(), "{}", v.name());
            assert!(v.applies(&cl(7, DType::F32)).is_ok(), "{}", v.name());
            let seed = crate::spec::ConvParams::seed().validate().unwrap();
            assert!(v.applies(&seed).is_err(), "{}: channels-first", v.name());
        }
    }
    use crate::spec::ConvParams;

    /// 2^32 (n, c) planes: every per-plane kernel would need more blocks than one launch
    /// takes. They refuse the spec (dispatch goes to a grid-stride kernel) and a forced
    /// launch is an error, never a grid wrapped modulo 2^32.
    #[test]
    fn grids_past_one_launch_are_refused_not_wrapped() {
        let mut p = ConvParams::seed();
        p.n = 1 << 16;
        p.c = 1 << 16;
        p.input = vec![1, 8, 8];
        p.kernel = vec![3, 3, 3];
        p.padding = vec![[1, 1]; 3];
        let spec = p.validate().unwrap();
        for name in ["tensor_core", "smem_tile", "streaming", "depth_reuse"] {
            let why = find(name).unwrap().applies(&spec).unwrap_err();
            assert!(why.contains("grid"), "{name}: {why}");
        }
        let v = find("smem_tile").unwrap();
        let err = v
            .launch(&spec, &v.default_config(&spec), 132)
            .unwrap_err()
            .to_string();
        assert!(err.contains("exceed one launch's grid"), "{err}");
        // Channels-last kernels take 8 channels per block: 2^34 planes for 2^31 blocks.
        p.layout = Layout::ChannelsLast;
        p.c = 1 << 18;
        let cl = p.validate().unwrap();
        for name in ["streaming_cl", "depth_reuse_cl"] {
            assert!(find(name).unwrap().applies(&cl).is_err(), "{name}");
        }
        for name in ["naive", "row_reuse"] {
            let v = find(name).unwrap();
            assert!(v.applies(&spec).is_ok());
            let l = v.launch(&spec, &v.default_config(&spec), 132).unwrap();
            assert!(l.grid.0 <= 132 * 32, "{name}: grid-stride grids stay small");
        }
    }

    /// Every variant's geometry (applies, fits, the specialization and the launch of
    /// every valid config, up to 40 a case) over both suites and 60 random-ish specs, as
    /// one hash per variant. A refactor of the descriptors must not change any of it;
    /// a deliberate change updates the hash here (print them with --nocapture).
    #[test]
    fn descriptor_geometry_is_unchanged() {
        let mut specs: Vec<ConvSpec> = crate::suite::public_suite()
            .unwrap()
            .into_iter()
            .chain(crate::suite::channels_last_suite().unwrap())
            .map(|c| c.spec)
            .collect();
        for i in 0..60i64 {
            let dims = (i % 3 + 1) as usize;
            let p = ConvParams {
                n: 1 + i % 2,
                c: [1, 8, 24, 64, 130][(i % 5) as usize],
                input: (0..dims)
                    .map(|d| 5 + (i * 7 + d as i64 * 13) % 40)
                    .collect(),
                kernel: (0..dims).map(|d| 1 + (i + d as i64) % 5).collect(),
                stride: (0..dims)
                    .map(|d| 1 + ((i / 3 + d as i64) % 3) * (i % 2))
                    .collect(),
                dilation: (0..dims)
                    .map(|d| 1 + ((i / 5 + d as i64) % 2) * (i % 2))
                    .collect(),
                padding: (0..dims)
                    .map(|d| [(i + d as i64) % 3, (i / 2) % 3])
                    .collect(),
                layout: if i % 4 < 2 {
                    Layout::ChannelsFirst
                } else {
                    Layout::ChannelsLast
                },
                dtype: DType::ALL[(i % 3) as usize],
            };
            if let Ok(s) = p.validate() {
                specs.push(s);
            }
        }
        let mut lines = Vec::new();
        for v in registry() {
            let mut text = String::new();
            for spec in &specs {
                match v.applies(spec) {
                    Err(why) => text.push_str(&format!("{spec}: no: {why}\n")),
                    Ok(()) => {
                        let space = v.space(spec);
                        let all = enumerate(v.name(), &space);
                        let step = all.len().div_ceil(40).max(1);
                        for c in all.iter().step_by(step).chain([&v.default_config(spec)]) {
                            let fits = v.fits(spec, c);
                            let expr = v.specialization(spec, c).map_err(|e| e.to_string());
                            let launch = v.launch(spec, c, 132).map_err(|e| e.to_string());
                            text.push_str(&format!("{spec} {c}: {fits:?} {expr:?} {launch:?}\n"));
                        }
                    }
                }
            }
            lines.push(format!(
                "{} {}",
                v.name(),
                crate::cache::stable_hash(&[text.as_bytes()])
            ));
        }
        let got = lines.join("\n");
        eprintln!("{got}");
        assert_eq!(got, GEOMETRY_HASHES.trim());
    }

    const GEOMETRY_HASHES: &str = "
naive 76f78d2b04e8724b8b662fa062d9f7c4
row_reuse 315b89855fe9598466c553e517fa5381
channels_last f55a1bd0a08c7d580ef632e81179fe83
smem_tile bb2b83c12b5643dd13c7a097112b002a
large_kernel c53a9cbf41b81dfa94a561db48a39108
tensor_core 83f90c54e9f7b9edf15e7210ff6a57a6
streaming 7c4b5ee70cc97753761129ed78bf4994
streaming_cl 9b1b71bfd5b7d5520dc3d4f58d4a33f8
depth_reuse 9631c325b6e8258507b2c7e9c731652f
depth_reuse_cl 4adfb4ea8f3159a7e1575f0b4a4b8e82
depth_reuse_fma 939cf6c873e465b4328c931bd90724fc
depth_reuse_fma_cl 98e452d1b47d8904996b76e67eb476e8
row_rotation_cl fd231dd954be37108afecdae9352b62f
row_window_cl cd4e5e9ae61e17ffb8e70e5e8da001fe
row_window 8f23ddc66436328493c4e5f257faa6ba
dgrad_gather 5fc50c8418cde94ba899e1ae3e272897
dgrad_gather_cl 5b6d1fea50bd0b8cbc0b7c851fc0049c
dgrad_cell_cl a65a71300f53b9fb5e1f6b4a2525cf29
wgrad 12c90f7774f54ed0166b7d6ae9a858a1
wgrad_cl cf8a747ae51c53e28b3f060ab1a9199a
wgrad_mma caf782eacd970a65c4c0932ce440032b
wgrad_mma_cl 433b789c340257e34c3d84072d69d454
wgrad_tile 1f13126d011bb35613a0b2decee03689
wgrad_tile_cl 86a3cbaa94e47b7aeb710b6dd36a86af
wgrad_strip_cl 9bd7af0ab11763df959b098f8e80b3b6
wgrad_window_cl 64799bb1992bc70da7ca64e6fc6e21c7
wgrad_window bd5727ce93f6b5c5ac8928539dc5fe22
";

    #[test]
    fn instance_names_round_trip_for_every_default_of_the_suites() {
        let cl = crate::suite::channels_last_suite().unwrap();
        for case in crate::suite::public_suite().unwrap().into_iter().chain(cl) {
            for v in registry() {
                if v.applies(&case.spec).is_err() {
                    continue;
                }
                let inst = Instance::new(&case.spec, v.default_config(&case.spec));
                let name = inst.to_string();
                let back: Instance = name.parse().unwrap();
                assert_eq!(back, inst, "{name}");
                assert_eq!(back.to_string(), name);
                back.check_spec(&case.spec).unwrap();
            }
        }
        let i: Instance = "smem_tile_f32_cf_block128_out_w4".parse().unwrap();
        assert_eq!(i.config.to_string(), "smem_tile:block=128,out_w=4");
        let c: Config = "smem_tile_f32_cf_block128_out_w4".parse().unwrap();
        assert_eq!(c, i.config);
        // depth_reuse_fma_cl, not depth_reuse or depth_reuse_fma: the longest name wins.
        let i: Instance = "depth_reuse_fma_cl_bf16_cl_cv2".parse().unwrap();
        assert_eq!(i.config.variant, "depth_reuse_fma_cl");
        for bad in [
            "",
            "warp_bf16_cf",
            "naive_bf17_cf",
            "naive_bf16_xx",
            "naive_bf16_cf_block",
            "naive_bf16_cf_block1_block2",
            "naive_bf16_cf_block99999999999999999999",
        ] {
            assert!(bad.parse::<Instance>().is_err(), "{bad}");
        }
        let seed = crate::spec::ConvParams::seed().validate().unwrap();
        let f16: Instance = "naive_f16_cf_block256_waves16".parse().unwrap();
        assert!(f16
            .check_spec(&seed)
            .unwrap_err()
            .to_string()
            .contains("f16 cf"));
    }

    #[test]
    fn config_round_trips() {
        let c: Config = "naive:block=256,waves=4".parse().unwrap();
        assert_eq!(c.get("block"), Some(256));
        assert_eq!(c.to_string(), "naive:block=256,waves=4");
        assert!("naive:block".parse::<Config>().is_err());
        assert!(":block=1".parse::<Config>().is_err());
        assert!("naive:block=x".parse::<Config>().is_err());
    }

    #[test]
    fn every_variant_has_a_valid_default_for_the_suites() {
        let cases = crate::suite::public_suite()
            .unwrap()
            .into_iter()
            .chain(crate::suite::channels_last_suite().unwrap())
            .chain(crate::suite::models_suite().unwrap());
        for case in cases {
            for v in registry() {
                // A variant that refuses a spec must not do so over its own default.
                if let Err(why) = v.applies(&case.spec) {
                    assert!(
                        !why.contains("cannot parse config"),
                        "{} {}: {why}",
                        case.name,
                        v.name()
                    );
                }
                if v.applies(&case.spec).is_ok() {
                    let cfg = v.default_config(&case.spec);
                    check_config(v, &case.spec, &cfg)
                        .unwrap_or_else(|e| panic!("{} {}: {e}", case.name, v.name()));
                    v.specialization(&case.spec, &cfg).unwrap();
                    let l = v.launch(&case.spec, &cfg, 132).unwrap();
                    assert!(l.grid.0 > 0 && l.block.0 > 0);
                }
            }
        }
    }
}
