//! `streaming`: tensor-core blocks sliding along output depth with a ring of KD + stages
//! input slices fetched by 16-byte cp.async ahead of use (kernels/streaming.cu).

use super::tensor_core::{row_stride, shifted_tile_columns, tensor_core_applies};
use super::{
    cuda_type, default_launches, depth_chunk_at_most, depth_chunks, grid_x, within_shared, Config,
    Launch, Param, Variant, DEPTH_CHUNKS,
};
use crate::error::Result;
use crate::spec::ConvSpec;

pub struct Streaming;

typed_params!(Params {
    warps,
    dchunk,
    stages,
    seg
});

/// Run lengths (tiles a warp sweeps along a band). Longer runs read less but hold
/// more accumulators: on the H100 (docs/perf.md, run 24) runs of 2-4 gained up to 8%
/// where registers did not cost a block, runs of 8+ lost up to 2x and never won.
const SEGS: [i64; 3] = [1, 2, 4];

/// The ring of KD + `stages` padded slices of whole output-height bands.
fn shared_bytes(spec: &ConvSpec, stages: usize) -> usize {
    let oh = spec.output3()[1];
    let [kd, kh, _] = spec.kernel3();
    let hs = oh.div_ceil(16) * 16 + kh - 1;
    (kd + stages) * hs * row_stride(shifted_tile_columns(spec)) * 2
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
        within_shared("the slice ring", shared_bytes(spec, 1))?;
        default_launches(self, spec)
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        let dchunk = depth_chunks(spec, &DEPTH_CHUNKS);
        vec![
            Param {
                name: "warps",
                values: vec![2, 4, 8, 16],
            },
            // Output depths one block slides over.
            Param {
                name: "dchunk",
                values: dchunk,
            },
            // Slices fetched ahead of the one being consumed.
            Param {
                name: "stages",
                values: vec![1, 2, 3],
            },
            // Output tiles a warp sweeps along one band, reusing window halves.
            Param {
                name: "seg",
                values: SEGS.to_vec(),
            },
        ]
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        // About four 16x8 output tiles per warp, from the exhaustive tunes on the H100
        // (docs/perf.md, run 13): x3d's 32 and video-vae's 136 tiles are 1.24x and 1.8x
        // faster with 8 and 16 warps than with 4; the seed's 33 lose 2-4% at 8.
        let tiles = spec.output3()[1].div_ceil(16) * shifted_tile_columns(spec);
        let warps = match tiles / 4 {
            0..=7 => 4,
            8..=15 => 8,
            _ => 16,
        };
        let dchunk = depth_chunk_at_most(&depth_chunks(spec, &DEPTH_CHUNKS), 8);
        Config::new(
            self.name(),
            &[
                ("warps", warps),
                ("dchunk", dchunk),
                ("stages", 1),
                ("seg", 1),
            ],
        )
    }
    fn needs_repair(&self) -> bool {
        true
    }
    fn fits(&self, spec: &ConvSpec, config: &Config) -> std::result::Result<(), String> {
        let stages = Params::read(config).map_err(|e| e.to_string())?.stages;
        within_shared(
            &format!("a slice ring of stages={stages}"),
            shared_bytes(spec, stages),
        )
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "streaming_dwconv<{}, {kd}, {kh}, {kw}, {}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            p.warps,
            p.dchunk,
            p.stages,
            p.seg
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        let p = Params::parse(self, spec, config)?;
        let blocks = spec.n() * spec.c() * spec.output3()[0].div_ceil(p.dchunk);
        Ok(Launch {
            grid: (grid_x(self, spec, blocks)?, 1, 1),
            block: (p.warps as u32 * 32, 1, 1),
            shared_bytes: shared_bytes(spec, p.stages) as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::public_case;
    use crate::variants::valid_configs;

    fn case(name: &str) -> ConvSpec {
        public_case(name)
    }

    #[test]
    fn space_drops_duplicate_chunks_and_rings_that_do_not_fit() {
        let v = Streaming;
        // 1-D: one output depth, so one chunk size; a 3-stage ring of 2048-wide rows
        // exceeds shared memory.
        let conv1d = case("causal-conv1d");
        let all = valid_configs(&v, &conv1d);
        assert_eq!(all.len(), 4 * 2 * SEGS.len());
        assert!(all
            .iter()
            .all(|c| c.get("stages") != Some(3) && c.get("dchunk") == Some(4)));
        let cfg = Config::new(
            "streaming",
            &[("warps", 4), ("dchunk", 4), ("stages", 3), ("seg", 4)],
        );
        let err = v.specialization(&conv1d, &cfg).unwrap_err().to_string();
        assert!(err.contains("shared memory"), "{err}");
        assert!(all.contains(&v.default_config(&conv1d)));
        // x3d: 16 output depths, chunks 4, 8, 16.
        let x3d = case("x3d-3x3x3");
        assert_eq!(valid_configs(&v, &x3d).len(), 4 * 3 * 3 * SEGS.len());
        assert_eq!(v.default_config(&x3d).get("dchunk"), Some(8));
        // About four tiles per warp: seed 33 tiles, x3d 32, video-vae 136.
        assert_eq!(v.default_config(&x3d).get("warps"), Some(8));
        assert_eq!(v.default_config(&case("seed-bf16")).get("warps"), Some(8));
        assert_eq!(
            v.default_config(&case("video-vae-causal")).get("warps"),
            Some(16)
        );
        assert_eq!(
            valid_configs(&v, &case("seed-bf16")).len(),
            4 * 5 * 3 * SEGS.len()
        );
    }
}
