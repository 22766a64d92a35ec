//! `streaming`: tensor-core blocks sliding along depth; each input slice is fetched once
//! (16-byte cp.async, `stages` ahead) and each A fragment feeds all KD output depths
//! through rotating accumulators (kernels/streaming.cu).

use super::tensor_core::{row_stride, tensor_core_applies};
use super::{check_config, cuda_type, Config, Launch, Param, Variant, MAX_SHARED};
use crate::error::{Error, Result};
use crate::spec::ConvSpec;

pub struct Streaming;

/// Accumulator floats per thread we allow (TPW x KD x 4) before registers spill.
const MAX_ACCUMULATORS: usize = 96;

/// Tiles of 16x8 outputs per output depth, and the ring's row stride. Mirrors the
/// kernel: input column 0 at tile column `pw` rounded up to 8, tiles shifted by that.
fn geometry(spec: &ConvSpec) -> (usize, usize, usize) {
    let [_, oh, ow] = spec.output3();
    let kh = spec.kernel3()[1];
    let pw = spec.pad_before3()[2];
    let shift = pw.div_ceil(8) * 8 - pw;
    let (mt, nt) = (oh.div_ceil(16), (ow + shift).div_ceil(8));
    (mt * nt, mt * 16 + kh - 1, row_stride(nt))
}

fn tiles_per_warp(spec: &ConvSpec, warps: usize) -> usize {
    geometry(spec).0.div_ceil(warps)
}

fn accumulators(spec: &ConvSpec, warps: usize) -> usize {
    tiles_per_warp(spec, warps) * spec.kernel3()[0] * 4
}

/// The ring of `stages + 1` padded slices.
fn shared_bytes(spec: &ConvSpec, stages: usize) -> usize {
    let (_, hs, ws) = geometry(spec);
    (stages + 1) * hs * ws * 2
}

const WARPS: [i64; 3] = [4, 8, 16];

impl Variant for Streaming {
    fn name(&self) -> &'static str {
        "streaming"
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/streaming.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        tensor_core_applies(spec)?;
        if spec.input3()[2] % 8 != 0 {
            return Err("needs an input width that is a multiple of 8 (16-byte async copies)".into());
        }
        let bytes = shared_bytes(spec, 1);
        if bytes > MAX_SHARED {
            return Err(format!("the {bytes}-byte slice ring exceeds shared memory ({MAX_SHARED})"));
        }
        if accumulators(spec, 16) > MAX_ACCUMULATORS {
            return Err(format!(
                "{} tiles per output depth need {} accumulators per thread even with 16 warps (at most {MAX_ACCUMULATORS})",
                geometry(spec).0,
                accumulators(spec, 16)
            ));
        }
        Ok(())
    }
    fn space(&self, _spec: &ConvSpec) -> Vec<Param> {
        vec![
            Param {
                name: "warps",
                values: WARPS.to_vec(),
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
    fn default_config(&self, spec: &ConvSpec) -> Config {
        let warps = WARPS
            .iter()
            .copied()
            .find(|&w| accumulators(spec, w as usize) <= 64)
            .unwrap_or(16);
        Config::new(self.name(), &[("warps", warps), ("dchunk", 8), ("stages", 1)])
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        check_config(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        let warps = config.get("warps").unwrap_or(8) as usize;
        if accumulators(spec, warps) > MAX_ACCUMULATORS {
            return Err(Error::NotApplicable {
                variant: config.to_string(),
                spec: spec.to_string(),
                reason: format!(
                    "{} accumulators per thread would spill (at most {MAX_ACCUMULATORS}); use more warps",
                    accumulators(spec, warps)
                ),
            });
        }
        Ok(format!(
            "streaming_dwconv<{}, {kd}, {kh}, {kw}, {warps}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            config.get("dchunk").unwrap_or(8),
            config.get("stages").unwrap_or(1),
            tiles_per_warp(spec, warps)
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        check_config(self, spec, config)?;
        let warps = config.get("warps").unwrap_or(8) as u32;
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
