//! `streaming_cl`: the streaming tensor-core kernel on channels-last data, transposing
//! 8-channel pixel vectors into a channel-major slice ring in shared memory and back
//! (kernels/streaming_cl.cu).

use super::tensor_core::{banded_applies, row_stride, shifted_tile_columns};
use super::{
    cuda_type, default_launches, depth_chunk_at_most, depth_chunks, grid_x, within_shared, Config,
    Launch, Param, Variant, MAX_SHARED,
};
use crate::error::Result;
use crate::spec::{ConvSpec, Layout};

pub struct StreamingCl;

typed_params!(Params { wpc, dchunk });

/// Output depths a block may slide over.
const DCHUNKS: [i64; 4] = [4, 8, 16, 32];

/// Channels a block owns: one 16-byte vector of bf16/f16 per pixel (`CG` in the kernel).
const CHANNELS: usize = 8;
/// Most tiles one warp runs along its band: its accumulators live in registers.
const MAX_RUN: usize = 16;

/// A ring of KD + 1 slices of 8 channels x (16 + KH - 1) rows and `ostages` output
/// stages of 8 channels x 16 rows.
fn shared_bytes(spec: &ConvSpec, ostages: usize) -> usize {
    let [kd, kh, _] = spec.kernel3();
    let ws = row_stride(shifted_tile_columns(spec));
    ((kd + 1) * (16 + kh - 1) + ostages * 16) * CHANNELS * ws * 2
}

/// Two output stages (write-out overlaps the next depth) where they fit, else one.
fn output_stages(spec: &ConvSpec) -> usize {
    if shared_bytes(spec, 2) <= MAX_SHARED {
        2
    } else {
        1
    }
}

/// Tiles per warp with `wpc` warps per channel.
fn run_length(spec: &ConvSpec, wpc: usize) -> usize {
    shifted_tile_columns(spec).div_ceil(wpc)
}

/// What the channels-last banded kernels (streaming_cl, depth_reuse_cl) need: the banded
/// formulation on channels-last data moved as 8-channel, 16-byte pixel vectors.
pub(super) fn pixel_vector_applies(spec: &ConvSpec) -> std::result::Result<(), String> {
    if spec.layout() != Layout::ChannelsLast {
        return Err("needs a channels-last layout".into());
    }
    banded_applies(spec)?;
    if !spec.c().is_multiple_of(CHANNELS) {
        return Err(format!(
            "needs channels in multiples of {CHANNELS} (one 16-byte vector per pixel)"
        ));
    }
    Ok(())
}

impl Variant for StreamingCl {
    fn name(&self) -> &'static str {
        "streaming_cl"
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/streaming_cl.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        pixel_vector_applies(spec)?;
        if run_length(spec, 4) > MAX_RUN {
            return Err(format!(
                "output rows over {} tiles need more than 4 warps of {MAX_RUN} tiles per channel",
                4 * MAX_RUN
            ));
        }
        within_shared("the slice ring and one output stage", shared_bytes(spec, 1))?;
        default_launches(self, spec)
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        let dchunk = depth_chunks(spec, &DCHUNKS);
        vec![
            // Warps per channel, splitting its band's tiles (3: 24 warps at 80 registers
            // instead of 32 at 64; measured the same on the seed, run 30).
            Param {
                name: "wpc",
                values: vec![1, 2, 3, 4],
            },
            Param {
                name: "dchunk",
                values: dchunk,
            },
        ]
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        // The most warps that still have a tile each, and up to 32 output depths a block:
        // on the H100 the NDHWC seed ran 0.72 ms at wpc=1, dchunk=8, 0.66 at wpc=4,
        // dchunk=16 and 0.64 at wpc=4, dchunk=32 (docs/perf.md, runs 25-30).
        let nt = shifted_tile_columns(spec);
        let wpc = [4i64, 2, 1]
            .into_iter()
            .find(|&w| w as usize <= nt && run_length(spec, w as usize) <= MAX_RUN)
            .unwrap_or(1);
        let dchunk = depth_chunk_at_most(&depth_chunks(spec, &DCHUNKS), 32);
        Config::new(self.name(), &[("wpc", wpc), ("dchunk", dchunk)])
    }
    fn needs_repair(&self) -> bool {
        true
    }
    fn fits(&self, spec: &ConvSpec, config: &Config) -> std::result::Result<(), String> {
        let wpc = Params::read(config).map_err(|e| e.to_string())?.wpc;
        let run = run_length(spec, wpc);
        if run > MAX_RUN {
            return Err(format!(
                "wpc={wpc} leaves runs of {run} tiles, over the {MAX_RUN} kept in registers"
            ));
        }
        Ok(())
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let Params { wpc, dchunk } = Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "streaming_cl_dwconv<{}, {kd}, {kh}, {kw}, {wpc}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            run_length(spec, wpc),
            dchunk,
            output_stages(spec)
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        let Params { wpc, dchunk } = Params::parse(self, spec, config)?;
        let wpc = wpc as u32;
        let [od, oh, _] = spec.output3();
        let blocks = spec.n() * oh.div_ceil(16) * od.div_ceil(dchunk) * (spec.c() / CHANNELS);
        Ok(Launch {
            grid: (grid_x(self, spec, blocks)?, 1, 1),
            block: (CHANNELS as u32 * wpc * 32, 1, 1),
            shared_bytes: shared_bytes(spec, output_stages(spec)) as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::ConvParams;
    use crate::suite::public_suite;
    use crate::variants::valid_configs;

    #[test]
    fn takes_the_channels_last_seed_and_refuses_what_it_cannot_do() {
        let suite = public_suite().unwrap();
        let spec = |name: &str| suite.iter().find(|c| c.name == name).unwrap().spec.clone();
        let v = StreamingCl;
        let seed = spec("seed-bf16-ndhwc");
        v.applies(&seed).unwrap();
        // 11 tile columns: four warps per channel, runs of 3.
        assert_eq!(v.default_config(&seed).get("wpc"), Some(4));
        assert_eq!(run_length(&seed, 4), 3);
        // (4 slices x 20 rows + 2 stages x 16 rows) x 8 channels x 104 columns x 2 bytes.
        assert_eq!(shared_bytes(&seed, 2), 186_368);
        assert_eq!(output_stages(&seed), 2);
        assert_eq!(valid_configs(&v, &seed).len(), 4 * 4);
        assert!(v
            .applies(&spec("seed-bf16"))
            .unwrap_err()
            .contains("channels-last"));
        assert!(v
            .applies(&spec("mobilenet-s2"))
            .unwrap_err()
            .contains("stride"));
        let cl = |c: i64, input: Vec<i64>, kernel: Vec<i64>, padding: Vec<[i64; 2]>| {
            ConvParams {
                c,
                input,
                kernel,
                padding,
                stride: vec![1],
                dilation: vec![1],
                layout: Layout::ChannelsLast,
                ..ConvParams::seed()
            }
            .validate()
            .unwrap()
        };
        // video-vae's 128-wide rows: two stages need 252,928 bytes, one fits.
        let vae = cl(
            128,
            vec![33, 128, 128],
            vec![3, 3, 3],
            vec![[2, 0], [1, 1], [1, 1]],
        );
        assert_eq!(shared_bytes(&vae, 2), 252_928);
        assert_eq!(output_stages(&vae), 1);
        v.applies(&vae).unwrap();
        let odd_c = cl(12, vec![8, 16, 16], vec![3, 3, 3], vec![[1, 1]; 3]);
        assert!(v.applies(&odd_c).unwrap_err().contains("multiples of 8"));
        // 2048-wide rows: 257 tiles, more than 4 warps of 16.
        let wide = cl(8, vec![2048], vec![4], vec![[3, 0]]);
        assert!(v.applies(&wide).unwrap_err().contains("4 warps"));
    }
}
