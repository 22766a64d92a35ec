//! `channels_last`: NDHWC, threads over 16-byte channel vectors (kernels/channels_last.cu).

use super::{cuda_type, within_shared, Config, Launch, Param, Variant};
use crate::error::Result;
use crate::spec::{ConvSpec, Layout};

pub struct ChannelsLast;

typed_params!(Params {
    out_w,
    block,
    roll,
    minblocks
});

/// Channels a block owns (`CB` in the kernel).
const BLOCK_CHANNELS: usize = 64;

/// The block's weights in shared memory, f32, tap-major.
fn weight_bytes(spec: &ConvSpec) -> usize {
    spec.taps() * BLOCK_CHANNELS * 4
}

/// Channels per thread: a 16-byte vector when C is a multiple of it (aligned vector
/// accesses), else one.
fn vec_width(spec: &ConvSpec) -> usize {
    let v = spec.dtype().per_16_bytes();
    if spec.c().is_multiple_of(v) {
        v
    } else {
        1
    }
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
        within_shared(
            &format!("{} taps of weights", spec.taps()),
            weight_bytes(spec),
        )
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
            // 1: the depth loop stays rolled (smaller code, see the kernel).
            Param {
                name: "roll",
                values: vec![0, 1],
            },
            // Resident blocks the register allocation must allow (0: no constraint).
            Param {
                name: "minblocks",
                values: vec![0, 4],
            },
        ]
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        // roll=1: 4% faster on the seed in NDHWC, the same where KD = 1; minblocks=4:
        // 1.16x on the seed in NDHWC (occupancy 37.5% -> 50%) (docs/perf.md, run 21).
        // Strided along W, neighbouring outputs share few inputs, so one output per
        // thread and smaller blocks: mobilenet-s2's exhaustive tune (run 21) found
        // out_w=1, block=128 11% faster than out_w=2, block=256.
        let (out_w, block) = if spec.stride3()[2] > 1 {
            (1, 128)
        } else {
            (2, 256)
        };
        Config::new(
            self.name(),
            &[
                ("out_w", out_w),
                ("block", block),
                ("roll", 1),
                ("minblocks", 4),
            ],
        )
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "channels_last_dwconv<{}, {}, {}, {kd}, {kh}, {kw}, {}, {}>",
            cuda_type(spec.dtype()),
            vec_width(spec),
            p.out_w,
            p.roll,
            p.minblocks
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, sms: u32) -> Result<Launch> {
        let p = Params::parse(self, spec, config)?;
        let (out_w, block) = (p.out_w, p.block as u32);
        let [od, oh, ow] = spec.output3();
        let positions = (spec.n() * od * oh * ow.div_ceil(out_w)) as u64;
        let per_block = block as u64 / (BLOCK_CHANNELS / vec_width(spec)) as u64;
        let channel_blocks = spec.c().div_ceil(BLOCK_CHANNELS) as u32;
        // Enough blocks for several waves; the kernel's loop covers the rest.
        let cap = (sms.max(1) as u64 * 16)
            .div_ceil(channel_blocks as u64)
            .max(1);
        let grid = positions.div_ceil(per_block).min(cap).max(1) as u32;
        Ok(Launch {
            grid: (grid, channel_blocks, 1),
            block: (block, 1, 1),
            shared_bytes: weight_bytes(spec) as u32,
        })
    }
}
