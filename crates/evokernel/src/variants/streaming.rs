//! `streaming`: tensor-core blocks sliding along output depth with a ring of KD + stages
//! input slices fetched by 16-byte cp.async ahead of use (kernels/streaming.cu).

use super::tensor_core::{row_stride, tensor_core_applies};
use super::{check_config, cuda_type, Config, Launch, Param, Variant, MAX_SHARED};
use crate::error::Result;
use crate::spec::ConvSpec;

pub struct Streaming;

/// The ring of KD + `stages` padded slices. Mirrors the kernel: input column 0 at tile
/// column `pw` rounded up to 8, output tiles shifted left by that rounding.
fn shared_bytes(spec: &ConvSpec, stages: usize) -> usize {
    let [_, oh, ow] = spec.output3();
    let [kd, kh, _] = spec.kernel3();
    let pw = spec.pad_before3()[2];
    let shift = pw.div_ceil(8) * 8 - pw;
    let hs = oh.div_ceil(16) * 16 + kh - 1;
    (kd + stages) * hs * row_stride((ow + shift).div_ceil(8)) * 2
}

impl Variant for Streaming {
    fn name(&self) -> &'static str {
        "streaming"
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/streaming.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        tensor_core_applies(spec)?;
        if !spec.input3()[2].is_multiple_of(8) {
            return Err(
                "needs an input width that is a multiple of 8 (16-byte async copies)".into(),
            );
        }
        let bytes = shared_bytes(spec, 1);
        if bytes > MAX_SHARED {
            return Err(format!(
                "the {bytes}-byte slice ring exceeds shared memory ({MAX_SHARED})"
            ));
        }
        Ok(())
    }
    fn space(&self, _spec: &ConvSpec) -> Vec<Param> {
        vec![
            Param {
                name: "warps",
                values: vec![4, 8],
            },
            // Output depths one block slides over.
            Param {
                name: "dchunk",
                values: vec![4, 8, 16, 32, 64],
            },
            // Slices fetched ahead of the one being consumed.
            Param {
                name: "stages",
                values: vec![1, 2, 3],
            },
        ]
    }
    fn default_config(&self, _spec: &ConvSpec) -> Config {
        // Best of the hand sweep on the H100 (docs/perf.md) until the tuner exists.
        Config::new(self.name(), &[("warps", 4), ("dchunk", 8), ("stages", 1)])
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        check_config(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "streaming_dwconv<{}, {kd}, {kh}, {kw}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            config.get("warps").unwrap_or(4),
            config.get("dchunk").unwrap_or(8),
            config.get("stages").unwrap_or(1)
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        check_config(self, spec, config)?;
        let warps = config.get("warps").unwrap_or(4) as u32;
        let dchunk = config.get("dchunk").unwrap_or(8) as usize;
        let stages = config.get("stages").unwrap_or(1) as usize;
        let blocks = spec.n() * spec.c() * spec.output3()[0].div_ceil(dchunk);
        Ok(Launch {
            grid: (blocks as u32, 1, 1),
            block: (warps * 32, 1, 1),
            shared_bytes: shared_bytes(spec, stages) as u32,
        })
    }
}
