//! `channels_last`: NDHWC, threads over 16-byte channel vectors (kernels/channels_last.cu).

use super::{check_config, cuda_type, Config, Launch, Param, Variant};
use crate::error::Result;
use crate::spec::{ConvSpec, DType, Layout};

pub struct ChannelsLast;

/// Channels per 16-byte vector.
fn vec_width(d: DType) -> usize {
    16 / d.size_bytes()
}

impl Variant for ChannelsLast {
    fn name(&self) -> &'static str {
        "channels_last"
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/channels_last.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        if spec.layout() != Layout::ChannelsLast {
            return Err("needs a channels-last layout".into());
        }
        let v = vec_width(spec.dtype());
        if spec.c() % v != 0 {
            return Err(format!("channels {} are not a multiple of the {v}-wide vector", spec.c()));
        }
        Ok(())
    }
    fn space(&self, _spec: &ConvSpec) -> Vec<Param> {
        vec![
            Param {
                name: "out_w",
                values: vec![1, 2, 4],
            },
            Param {
                name: "block",
                values: vec![128, 256],
            },
        ]
    }
    fn default_config(&self, _spec: &ConvSpec) -> Config {
        Config::new(self.name(), &[("out_w", 2), ("block", 256)])
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        check_config(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "channels_last_dwconv<{}, {}, {}, {kd}, {kh}, {kw}>",
            cuda_type(spec.dtype()),
            vec_width(spec.dtype()),
            config.get("out_w").unwrap_or(2)
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, sms: u32) -> Result<Launch> {
        check_config(self, spec, config)?;
        let out_w = config.get("out_w").unwrap_or(2) as usize;
        let block = config.get("block").unwrap_or(256) as u32;
        let [od, oh, ow] = spec.output3();
        let threads = (spec.n() * od * oh * ow.div_ceil(out_w) * (spec.c() / vec_width(spec.dtype()))) as u64;
        let grid = threads.div_ceil(block as u64).min(sms.max(1) as u64 * 32).max(1) as u32;
        Ok(Launch {
            grid: (grid, 1, 1),
            block: (block, 1, 1),
            shared_bytes: 0,
        })
    }
}
