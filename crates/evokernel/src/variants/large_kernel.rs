//! `large_kernel`: smem_tile for kernels past the register budget (RepLKNet's 31x31):
//! a block per (n, c, output depth) with its KD input slices and the channel's weights in
//! shared memory as f32 (kernels/large_kernel.cu). Any stride and dilation up to 3 along
//! W; channels-first.

use super::smem_tile::{self, takes_layout_and_w_steps};
use super::{cuda_type, default_launches, grid_x, within_shared, Config, Launch, Param, Variant};
use crate::error::Result;
use crate::spec::ConvSpec;
#[cfg(test)]
use crate::spec::Layout;

pub struct LargeKernel;

typed_params!(Params { out_w, block });

/// The KD slices of padded input rows (as smem_tile lays them out) and the weights, each
/// kernel row padded to a multiple of 4 floats. Mirrors the kernel.
fn shared_bytes(spec: &ConvSpec, out_w: usize) -> usize {
    let [kd, kh, kw] = spec.kernel3();
    smem_tile::shared_bytes(spec, out_w) + kd * kh * kw.div_ceil(4) * 4 * 4
}

impl Variant for LargeKernel {
    fn name(&self) -> &'static str {
        "large_kernel"
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/large_kernel.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        takes_layout_and_w_steps(spec)?;
        within_shared("the slices and weights", shared_bytes(spec, 4))?;
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
                values: vec![64, 128, 256],
            },
        ]
    }
    fn default_config(&self, _spec: &ConvSpec) -> Config {
        // Eight outputs a thread: 8 x KW FMAs per window of KW + 7 inputs.
        Config::new(self.name(), &[("out_w", 8), ("block", 128)])
    }
    fn fits(&self, spec: &ConvSpec, config: &Config) -> std::result::Result<(), String> {
        let out_w = Params::read(config).map_err(|e| e.to_string())?.out_w;
        within_shared(&format!("out_w={out_w}"), shared_bytes(spec, out_w))
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "large_kernel_dwconv<{}, {kd}, {kh}, {kw}, {}, {}, {}>",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replknet_fits_and_channels_last_is_refused() {
        let spec = crate::suite::models_case("replknet-31x31");
        LargeKernel.applies(&spec).unwrap();
        // 58 padded rows of 64 floats, and 31 rows of 32 weights.
        assert_eq!(shared_bytes(&spec, 8), (58 * 64 + 31 * 32) * 4);
        let cl = spec.with_layout(Layout::ChannelsLast);
        assert!(LargeKernel.applies(&cl).is_err());
    }
}
