//! `tensor_core`: banded-Toeplitz `mma.sync.m16n8k16` with M = 16 output rows of one
//! channel, N = 8 outputs along W, K = 16 inputs along W (kernels/tensor_core.cu).

use super::{
    cuda_type, default_launches, grid_x, unit_stride_and_dilation, within_shared, Config, Launch,
    Param, Variant,
};
use crate::error::Result;
use crate::spec::{ConvSpec, DType, Layout};

pub struct TensorCore;

typed_params!(Params { warps });

/// Mirrors `tc_row_stride` in common.cuh.
pub(super) fn row_stride(nt: usize) -> usize {
    if (nt + 1) % 2 == 1 {
        (nt + 1) * 8
    } else {
        (nt + 2) * 8
    }
}

/// 8-wide tile columns of an output row in the streaming kernels' tiling (common to
/// streaming.cu and streaming_cl.cu): input column 0 sits at tile column `pw` rounded up
/// to 8, so the output tiles start that rounding left of column 0.
pub(super) fn shifted_tile_columns(spec: &ConvSpec) -> usize {
    let ow = spec.output3()[2];
    let pw = spec.pad_before3()[2];
    (ow + pw.div_ceil(8) * 8 - pw).div_ceil(8)
}

fn shared_bytes(spec: &ConvSpec) -> usize {
    let [_, oh, ow] = spec.output3();
    let [kd, kh, _] = spec.kernel3();
    let hs = oh.div_ceil(16) * 16 + kh - 1;
    kd * hs * row_stride(ow.div_ceil(8)) * 2
}

/// What the banded-Toeplitz formulation needs, whatever the tiling around it.
pub(super) fn tensor_core_applies(spec: &ConvSpec) -> std::result::Result<(), String> {
    if spec.layout() != Layout::ChannelsFirst {
        return Err("needs a channels-first layout".into());
    }
    banded_applies(spec)
}

/// The banded formulation in any layout: dtype, unit steps, kernel width.
pub(super) fn banded_applies(spec: &ConvSpec) -> std::result::Result<(), String> {
    if !matches!(spec.dtype(), DType::Bf16 | DType::F16) {
        return Err("tensor cores here take bf16 or f16".into());
    }
    unit_stride_and_dilation(spec)?;
    let kw = spec.kernel3()[2];
    if kw > 9 {
        return Err(format!(
            "kernel width {kw} exceeds the 16-wide window's 9 taps"
        ));
    }
    Ok(())
}

impl Variant for TensorCore {
    fn name(&self) -> &'static str {
        "tensor_core"
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/tensor_core.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        tensor_core_applies(spec)?;
        within_shared("the slice tile", shared_bytes(spec))?;
        default_launches(self, spec)
    }
    fn space(&self, _spec: &ConvSpec) -> Vec<Param> {
        vec![Param {
            name: "warps",
            values: vec![4, 8],
        }]
    }
    fn default_config(&self, _spec: &ConvSpec) -> Config {
        Config::new(self.name(), &[("warps", 4)])
    }
    fn needs_repair(&self) -> bool {
        true
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "tensor_core_dwconv<{}, {kd}, {kh}, {kw}, {}>",
            cuda_type(spec.dtype()),
            p.warps
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        let warps = Params::parse(self, spec, config)?.warps as u32;
        Ok(Launch {
            grid: (
                grid_x(self, spec, spec.n() * spec.c() * spec.output3()[0])?,
                1,
                1,
            ),
            block: (warps * 32, 1, 1),
            shared_bytes: shared_bytes(spec) as u32,
        })
    }
}
