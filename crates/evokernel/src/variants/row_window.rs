//! `row_window`: channels-first layers whose kernel is one row (KD = KH = 1) at W stride 1,
//! each thread a run of whole 16-byte output vectors of one row, its window's aligned input
//! vectors in registers (kernels/row_window.cu). `row_window_cl`'s channels-first twin.

use super::row_window_cl::{one_row_kernel, window_blocks, window_minblocks};
use super::{cuda_type, default_launches, grid_x, Config, Launch, Param, Variant};
use crate::error::Result;
use crate::spec::{ConvSpec, Layout};

pub struct RowWindow;

typed_params!(Params {
    run,
    block,
    minblocks
});

/// Most input elements a window may span ((KW - 1) x DW + 1) and most taps a thread holds
/// as f32: with a run of 32 the window's floats stay near 100 registers.
const MAX_SPAN: usize = 64;
const MAX_TAPS: usize = 32;

/// Output rows (n, c, od, oh): a thread's runs lie in one of them.
fn rows(spec: &ConvSpec) -> usize {
    let [od, oh, _] = spec.output3();
    spec.n() * spec.c() * od * oh
}

/// The window's first element within its first aligned vector: (-PW) mod VEC (a template
/// parameter of both window kernels).
pub(crate) fn window_offset(spec: &ConvSpec) -> usize {
    let vec = spec.dtype().per_16_bytes();
    (vec - spec.pad_before3()[2] % vec) % vec
}

/// Outputs a thread's run, whole 16-byte vectors of one to four: the window's extra loads
/// are spread over more outputs as it grows, and so are the registers. Shared with
/// wgrad_window.
pub(crate) fn vector_runs(spec: &ConvSpec) -> Param {
    let vec = spec.dtype().per_16_bytes() as i64;
    Param {
        name: "run",
        values: vec![vec, 2 * vec, 4 * vec],
    }
}

/// `Err` unless a thread can slide a register window along `spec`'s rows: channels-first,
/// a kernel of one row (1 x 1 x KW) at W stride 1, input and output rows of whole 16-byte
/// vectors, a window and taps within the registers. Shared with wgrad_window.
pub(crate) fn one_row_channels_first(spec: &ConvSpec) -> std::result::Result<(), String> {
    if spec.layout() != Layout::ChannelsFirst {
        return Err("needs a channels-first layout".into());
    }
    one_row_kernel(spec)?;
    let kw = spec.kernel3()[2];
    let vec = spec.dtype().per_16_bytes();
    let (iw, ow) = (spec.input3()[2], spec.output3()[2]);
    if !iw.is_multiple_of(vec) || !ow.is_multiple_of(vec) {
        return Err(format!(
            "needs input and output rows of whole 16-byte vectors ({vec} elements), not {iw} and {ow}"
        ));
    }
    let span = (kw - 1) * spec.dilation3()[2] + 1;
    if span > MAX_SPAN || kw > MAX_TAPS {
        return Err(format!(
            "a window of {span} inputs and {kw} taps, more than the {MAX_SPAN} and {MAX_TAPS} a thread holds"
        ));
    }
    Ok(())
}

impl Variant for RowWindow {
    fn name(&self) -> &'static str {
        "row_window"
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/row_window.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        one_row_channels_first(spec)?;
        default_launches(self, spec)
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        vec![vector_runs(spec), window_blocks(), window_minblocks()]
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        // Two output vectors a thread (causal-conv1d: 3 loads for 2 stores; 40 registers),
        // four resident blocks where the taps are few; Conformer's 31 taps need 80
        // registers at this run (64 spilled): two. The exhaustive tune (H200, run 364, 18
        // configs, one timing each) put runs of two vectors first on all three 1-D cases
        // (one: 1.25x slower, four: 1.07-1.18x) and blocks of 128 2-6% ahead of 256.
        Params {
            run: 2 * spec.dtype().per_16_bytes(),
            block: 128,
            minblocks: if spec.kernel3()[2] <= 8 { 4 } else { 2 },
        }
        .config(self.name())
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        Ok(format!(
            "row_window_dwconv<{}, {}, {}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            spec.kernel3()[2],
            spec.dilation3()[2],
            p.run,
            window_offset(spec),
            p.minblocks
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        let p = Params::parse(self, spec, config)?;
        let threads = rows(spec) * spec.output3()[2].div_ceil(p.run);
        Ok(Launch {
            grid: (grid_x(self, spec, threads.div_ceil(p.block))?, 1, 1),
            block: (p.block as u32, 1, 1),
            shared_bytes: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ConvParams, DType};

    fn spec(input: i64, kernel: Vec<i64>, padding: [i64; 2], dtype: DType) -> ConvSpec {
        let dims = kernel.len();
        let mut pad = vec![[0, 0]; dims];
        pad[dims - 1] = padding;
        ConvParams {
            n: 2,
            c: 24,
            input: vec![input; dims],
            kernel,
            stride: vec![],
            dilation: vec![],
            padding: pad,
            layout: Layout::ChannelsFirst,
            dtype,
        }
        .validate()
        .unwrap()
    }

    #[test]
    fn takes_one_row_kernels_over_whole_vector_rows() {
        let v = RowWindow;
        let causal = spec(64, vec![4], [3, 0], DType::Bf16);
        assert!(v.applies(&causal).is_ok());
        assert!(v
            .applies(&spec(64, vec![1, 31], [15, 15], DType::F16))
            .is_ok());
        assert!(v
            .applies(&spec(64, vec![1, 1, 5], [2, 2], DType::F32))
            .is_ok());
        // Two kernel rows; rows not whole vectors (in or out); windows past the registers;
        // channels-last.
        assert!(v
            .applies(&spec(64, vec![3, 3], [1, 1], DType::Bf16))
            .is_err());
        assert!(v.applies(&spec(60, vec![4], [3, 0], DType::Bf16)).is_err());
        assert!(v.applies(&spec(64, vec![4], [3, 3], DType::Bf16)).is_err());
        assert!(v
            .applies(&spec(64, vec![33], [16, 16], DType::F32))
            .is_err());
        assert!(v
            .applies(&causal.with_layout(Layout::ChannelsLast))
            .is_err());
        // The window's first element within its vector: (-PW) mod VEC.
        assert_eq!(window_offset(&causal), 5);
        assert_eq!(
            window_offset(&spec(64, vec![1, 31], [15, 15], DType::F16)),
            1
        );
        assert_eq!(
            window_offset(&spec(64, vec![1, 1, 5], [2, 2], DType::F32)),
            2
        );
        assert_eq!(window_offset(&spec(64, vec![4], [0, 3], DType::Bf16)), 0);
        // Threads cover every (row, run) once: 2 x 24 rows of 64 outputs in runs of 16.
        let l = v.launch(&causal, &v.default_config(&causal), 132).unwrap();
        assert_eq!((l.grid.0, l.block.0), (2, 128));
        assert_eq!(v.default_config(&causal).get("run"), Some(16));
    }
}
