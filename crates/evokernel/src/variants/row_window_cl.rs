//! `row_window_cl`: channels-last layers whose kernel is one row (KD = KH = 1) at W stride
//! 1, each thread a 16-byte channel vector sliding a register window along its run of
//! outputs (kernels/row_window_cl.cu).

use super::{
    cuda_type, default_launches, grid_x, whole_chunk_pixels, Config, Launch, Param, Variant,
};
use crate::error::Result;
use crate::spec::{ConvSpec, Layout};

pub struct RowWindowCl;

typed_params!(Params {
    run,
    block,
    minblocks
});

/// Input vectors a thread's window spans, (KW - 1) x DW + 1: held in registers.
fn span(spec: &ConvSpec) -> usize {
    (spec.kernel3()[2] - 1) * spec.dilation3()[2] + 1
}

/// Most input vectors a window may span and most weights a thread may hold (f32
/// registers: VEC channels x KW taps).
const MAX_SPAN: usize = 32;
const MAX_WEIGHTS: usize = 64;

/// 16-byte channel vectors of a pixel: the threads along C.
pub(crate) fn channel_vectors(spec: &ConvSpec) -> usize {
    spec.c() / spec.dtype().per_16_bytes()
}

/// Threads a block of the window kernels (all four share these).
pub(crate) fn window_blocks() -> Param {
    Param {
        name: "block",
        values: vec![128, 256],
    }
}

/// Resident 256-thread blocks the register allocation of a forward window kernel must
/// allow (`__launch_bounds__(256, MINB)`).
pub(crate) fn window_minblocks() -> Param {
    Param {
        name: "minblocks",
        values: vec![1, 2, 4],
    }
}

/// Runs of `run` outputs over every output row (n, od, oh): the work items of both window
/// kernels.
pub(crate) fn window_runs(spec: &ConvSpec, run: usize) -> usize {
    let [od, oh, ow] = spec.output3();
    spec.n() * od * oh * ow.div_ceil(run)
}

/// `Err` unless the kernel is one row (1 x 1 x KW) at W stride 1, what every window
/// kernel slides along a row (both layouts).
pub(crate) fn one_row_kernel(spec: &ConvSpec) -> std::result::Result<(), String> {
    let [kd, kh, kw] = spec.kernel3();
    if kd != 1 || kh != 1 {
        return Err(format!(
            "needs a kernel of one row (1 x 1 x KW), not {kd} x {kh} x {kw}"
        ));
    }
    if spec.stride3()[2] != 1 {
        return Err("needs W stride 1 (outputs slide the window by one input)".into());
    }
    Ok(())
}

/// `Err` unless a thread can slide a register window along `spec`'s rows: channels-last,
/// a kernel of one row (1 x 1 x KW) at W stride 1, whole 16-byte channel vectors, a window
/// and weights (or grad-weight sums) within the registers. Shared with wgrad_window_cl.
pub(crate) fn one_row_window(spec: &ConvSpec) -> std::result::Result<(), String> {
    if spec.layout() != Layout::ChannelsLast {
        return Err("needs a channels-last layout".into());
    }
    one_row_kernel(spec)?;
    whole_chunk_pixels(spec)?;
    if span(spec) > MAX_SPAN {
        return Err(format!(
            "a window of {} input vectors (KW x dilation), more than the {MAX_SPAN} a thread holds",
            span(spec)
        ));
    }
    let weights = spec.kernel3()[2] * spec.dtype().per_16_bytes();
    if weights > MAX_WEIGHTS {
        return Err(format!(
            "{weights} weights a thread, more than the {MAX_WEIGHTS} registers allow"
        ));
    }
    Ok(())
}

impl Variant for RowWindowCl {
    fn name(&self) -> &'static str {
        "row_window_cl"
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/row_window_cl.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        one_row_window(spec)?;
        default_launches(self, spec)
    }
    fn space(&self, _spec: &ConvSpec) -> Vec<Param> {
        vec![
            // Outputs a thread (a run of one row): the window's SPAN - 1 extra loads are
            // spread over more outputs as it grows, and so are the registers.
            Param {
                name: "run",
                values: vec![2, 4, 8, 16],
            },
            window_blocks(),
            window_minblocks(),
        ]
    }
    fn default_config(&self, _spec: &ConvSpec) -> Config {
        // Eight outputs a thread (11 loads for 8 outputs of a 4-tap row), two resident
        // blocks (<= 128 registers: 106 on mamba2-conv1d). The exhaustive tune found a
        // plateau around it (H200, run 357: best 1.04x on mamba2-conv1d, 1.01x on
        // causal-conv1d-nwc; runs of 2 1.4x slower, four blocks an SM spill).
        Params {
            run: 8,
            block: 256,
            minblocks: 2,
        }
        .config(self.name())
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        Ok(format!(
            "row_window_cl_dwconv<{}, {}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            spec.kernel3()[2],
            spec.dilation3()[2],
            p.run,
            p.minblocks
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        let p = Params::parse(self, spec, config)?;
        let threads = channel_vectors(spec) * window_runs(spec, p.run);
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

    fn spec(kernel: Vec<i64>, dilation: Vec<i64>, c: i64, dtype: DType) -> ConvSpec {
        let dims = kernel.len();
        ConvParams {
            n: 2,
            c,
            input: vec![64; dims],
            kernel,
            stride: vec![],
            dilation,
            padding: vec![[1, 1]; dims],
            layout: Layout::ChannelsLast,
            dtype,
        }
        .validate()
        .unwrap()
    }

    #[test]
    fn takes_one_row_kernels_within_its_registers() {
        let v = RowWindowCl;
        assert!(v.applies(&spec(vec![4], vec![], 64, DType::Bf16)).is_ok());
        assert!(v.applies(&spec(vec![1, 7], vec![], 64, DType::F16)).is_ok());
        assert!(v.applies(&spec(vec![16], vec![2], 64, DType::F32)).is_ok());
        // Two kernel rows, ragged channel vectors, windows or weights past the registers.
        assert!(v
            .applies(&spec(vec![3, 3], vec![], 64, DType::Bf16))
            .is_err());
        assert!(v.applies(&spec(vec![4], vec![], 60, DType::Bf16)).is_err());
        assert!(v.applies(&spec(vec![9], vec![], 64, DType::Bf16)).is_err());
        assert!(v.applies(&spec(vec![8], vec![5], 64, DType::Bf16)).is_err());
        // Threads cover every (channel vector, run, row) once.
        let s = spec(vec![4], vec![], 64, DType::Bf16);
        let l = v.launch(&s, &v.default_config(&s), 132).unwrap();
        let threads = (l.grid.0 * l.block.0) as usize;
        let [_, _, ow] = s.output3();
        assert!(threads >= 8 * ow.div_ceil(8) * 2 && threads < 8 * ow.div_ceil(8) * 2 + 256);
    }
}
