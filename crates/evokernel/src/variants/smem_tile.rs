//! `smem_tile`: a block per (n, c, output depth) with its KD input slices in shared
//! memory as f32 (kernels/smem_tile.cu). Any stride and dilation (up to 3 along W).

use super::{
    cuda_type, default_launches, grid_x, input_cols, input_rows, within_shared, Config, Launch,
    Param, Variant,
};
use crate::error::Result;
use crate::spec::{ConvSpec, Layout};

pub struct SmemTile;

typed_params!(Params { out_w, block });

/// The KD slices of padded input rows the block's outputs read, as f32. Mirrors the
/// kernel: rows span (oh - 1) * sh + (kh - 1) * dh + 1; a row holds the whole input row
/// and every float4 window read. large_kernel lays its slices out the same way.
pub(super) fn shared_bytes(spec: &ConvSpec, out_w: usize) -> usize {
    let [_, oh, ow] = spec.output3();
    let kd = spec.kernel3()[0];
    let sw = spec.stride3()[2];
    let (pw, iw) = (spec.pad_before3()[2], spec.input3()[2]);
    let hs = input_rows(spec, oh);
    let window = input_cols(spec, out_w).div_ceil(4) * 4;
    let ws = ((ow.div_ceil(out_w) - 1) * out_w * sw + window)
        .div_ceil(4)
        .max((pw + iw).div_ceil(4))
        * 4;
    kd * hs * ws * 4
}

/// Channels-first, and the W stride and dilation the kernel compiles in (at most 3):
/// smem_tile's and large_kernel's common conditions.
pub(super) fn takes_layout_and_w_steps(spec: &ConvSpec) -> std::result::Result<(), String> {
    if spec.layout() != Layout::ChannelsFirst {
        return Err("needs a channels-first layout".into());
    }
    let (sw, dw) = (spec.stride3()[2], spec.dilation3()[2]);
    if sw > 3 || dw > 3 {
        return Err(format!(
            "stride {sw} and dilation {dw} along W: at most 3 each (compiled into the kernel)"
        ));
    }
    Ok(())
}

impl Variant for SmemTile {
    fn name(&self) -> &'static str {
        "smem_tile"
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/smem_tile.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        takes_layout_and_w_steps(spec)?;
        if spec.taps() > 128 {
            return Err(format!(
                "{} taps do not fit the register budget (128)",
                spec.taps()
            ));
        }
        within_shared("the slice tile", shared_bytes(spec, 4))?;
        default_launches(self, spec)
    }
    fn space(&self, _spec: &ConvSpec) -> Vec<Param> {
        vec![
            Param {
                name: "out_w",
                values: vec![4, 8],
            },
            Param {
                name: "block",
                values: vec![128, 256],
            },
        ]
    }
    fn default_config(&self, _spec: &ConvSpec) -> Config {
        // Best of the exhaustive tune on both cases smem_tile wins (seed-f32 1.16x,
        // causal-conv1d 1.57x over out_w=8, block=256; docs/perf.md).
        Config::new(self.name(), &[("out_w", 4), ("block", 128)])
    }
    fn fits(&self, spec: &ConvSpec, config: &Config) -> std::result::Result<(), String> {
        let out_w = Params::read(config).map_err(|e| e.to_string())?.out_w;
        within_shared(&format!("out_w={out_w}"), shared_bytes(spec, out_w))
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "smem_tile_dwconv<{}, {kd}, {kh}, {kw}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            p.out_w,
            spec.stride3()[2],
            spec.dilation3()[2]
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        let p = Params::parse(self, spec, config)?;
        let blocks = spec.n() * spec.c() * spec.output3()[0];
        Ok(Launch {
            grid: (grid_x(self, spec, blocks)?, 1, 1),
            block: (p.block as u32, 1, 1),
            shared_bytes: shared_bytes(spec, p.out_w) as u32,
        })
    }
}
