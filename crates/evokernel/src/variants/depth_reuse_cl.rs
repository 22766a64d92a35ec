//! `depth_reuse_cl`: depth_reuse's rotation (each input slice feeds all KD output depths
//! it reaches) on channels-last data, transposing 8-channel pixel vectors into a
//! channel-major ring and back as streaming_cl does (kernels/depth_reuse_cl.cu). Two
//! forms: a block barrier a slice, and with `producer` (the default where there are
//! depths and two tile columns: `producer_config`) a producer warp (TMA boxes in,
//! stmatrix transposes) and storer warps handing slots over by mbarriers, 8 or 16
//! channels a block.

use super::streaming_cl::pixel_vector_applies;
use super::tensor_core::{row_stride, shifted_tile_columns};
use super::{
    cuda_type, default_launches, depth_chunk_at_most, depth_chunks, grid_x, plane_offsets_fit_i32,
    within_shared, Config, Launch, Param, TensorMaps, Variant, DEPTH_CHUNKS,
};
use crate::error::Result;
use crate::spec::ConvSpec;

pub struct DepthReuseCl;

typed_params!(Params {
    cols,
    channels,
    dchunk,
    stages,
    trans,
    producer,
    storers,
    ring,
    out_stages,
    warp_channels,
    producers,
    minblocks
});

/// Channels a block of the block-barrier form owns: one 16-byte vector of bf16/f16 per
/// pixel (`CG` in the kernel; the producer form takes `channels`, 8 or 16).
const CHANNELS: usize = 8;

/// Elements of one channel's slice plane: (16 + KH - 1) rows of the region's row stride,
/// grown to an odd number of 16-byte chunks for the stmatrix transpose (`trans`: the
/// kernel's `channel_plane_odd_chunks`).
fn channel_plane(spec: &ConvSpec, cols: usize, trans: usize) -> usize {
    let plane = (16 + spec.kernel3()[1] - 1) * row_stride(cols);
    if trans == 1 && (plane / 8).is_multiple_of(2) {
        plane + 8
    } else {
        plane
    }
}

/// Elements of an output stage's row (the kernels' SW): a warp stores 8 rows x 4 words of
/// its tile, on distinct 4-bank groups.
fn stage_row(cols: usize) -> usize {
    if cols == 1 {
        8
    } else {
        cols * 8 + 8
    }
}

/// Two channel-major slices of 8 channel planes, and two output stages of 8 channels x 16
/// rows (mirrors the kernel's constants).
fn shared_bytes(spec: &ConvSpec, cols: usize, stages: usize, trans: usize) -> usize {
    let kh = spec.kernel3()[1];
    let ring = 2 * CHANNELS * channel_plane(spec, cols, trans);
    let out_stages = 2 * CHANNELS * 16 * stage_row(cols);
    // The pixel-major staging slots: 16 + KH - 1 rows of (cols + 1) x 8 pixels.
    let staging = (stages + 1) * (16 + kh - 1) * (cols + 1) * 8 * 16;
    (ring + out_stages) * 2 + staging
}

/// Staging slot bytes of the producer form: (16 + KH - 1) rows of (cols + 1) x 8 pixels
/// of `channels` 2-byte elements, 128-byte aligned for the TMA.
fn producer_staging_bytes(spec: &ConvSpec, cols: usize, channels: usize) -> usize {
    ((16 + spec.kernel3()[1] - 1) * (cols + 1) * 8 * channels * 2).next_multiple_of(128)
}

/// Warps of a producer-form block: one a (`warp_channels` channels, tile column), the
/// producers, the storers.
fn producer_warps(p: &Params) -> usize {
    p.channels / p.warp_channels * p.cols + p.producers + p.storers
}

/// The producer form's shared memory (mirrors depth_reuse_cl_producer_dwconv): `stages + 1`
/// staging slots, `ring` channel-major ring slots of `channels` planes (odd 16-byte
/// chunks), `out_stages` output stages, then 8-byte mbarriers (staging, ring full and
/// empty, stages staged and free).
fn producer_shared_bytes(spec: &ConvSpec, p: &Params) -> usize {
    let (cols, channels) = (p.cols, p.channels);
    let staging = (p.stages + 1) * producer_staging_bytes(spec, cols, channels);
    let ring = p.ring * channels * channel_plane(spec, cols, 1) * 2;
    let out_stages = p.out_stages * channels * 16 * stage_row(cols) * 2;
    let bars = 8 * ((p.stages + 1) + 2 * p.ring + 2 * p.out_stages);
    (staging + ring + out_stages).next_multiple_of(8) + bars
}

/// The default where there are depths to walk and two tile columns: the producer form.
/// With C a multiple of 16, 16 channels a block over one tile column, whose
/// TMA boxes and stores cover whole 32-byte sectors (H100 run 328, against 8 channels
/// over two columns in the same call: the seed 0.512 -> 0.381 ms at one staging slot
/// ahead, 0.339 at two; dgrad 0.532 -> 0.397; x3d-ndhwc 0.180 -> 0.146, video-vae-ndhwc
/// 0.282 -> 0.239), three slices staged ahead (run 329: the seed 0.336, dgrad 0.348,
/// video-vae-ndhwc 0.196, x3d-ndhwc 0.148; two: 0.339, 0.351, 0.205, 0.151).
/// Otherwise 8 channels over two tile columns, which beat every block-barrier config (run
/// 323: the seed 0.523 vs 0.609, video-vae-ndhwc 0.288 vs 0.336, x3d-ndhwc 0.192 vs 0.210),
/// one slice staged ahead of long depth chunks (1 < 2 < 3 < 4 there), three ahead of
/// x3d's 16-deep chunks; one tile column of 8 channels loses or ties (seed 0.595).
/// Three storer warps (run 325: the seed 0.533-0.553 -> 0.512-0.531 ms with 8 channels);
/// four with 16 channels (run 333: the seed 0.3365 -> 0.3262 ms, 0.970x; 21 warps cap
/// the registers at 80, no spill), whose 128 threads take a depth's 128 half pixel pairs
/// in one round. A fourth ring slot or a third output stage gained nothing there (1.012x,
/// 0.996x). Two channels a tile warp with 16 channels (13 warps, 128 registers; runs
/// 338-339, A B A B at the whole-depth chunk: the seed 0.3259 -> 0.3170 ms, 0.973x,
/// grad-input 0.974x, seed-f16-ndhwc 0.963x; stages 2 or 4 and storers 3 less). Without
/// depths (1-D, 2-D) not yet measured. `None` where the block-barrier form stays the
/// default.
pub(crate) fn producer_config(spec: &ConvSpec) -> Option<Config> {
    if shifted_tile_columns(spec) < 2 || spec.output3()[0] <= 1 {
        return None;
    }
    let dchunk = depth_chunk_at_most(&depth_chunks(spec, &DEPTH_CHUNKS), 64);
    let sixteen = spec.c().is_multiple_of(16);
    let config = Config::new(
        DepthReuseCl.name(),
        &[
            ("cols", if sixteen { 1 } else { 2 }),
            ("channels", if sixteen { 16 } else { 8 }),
            ("dchunk", dchunk),
            ("stages", if sixteen || dchunk < 32 { 3 } else { 1 }),
            ("trans", 1),
            ("producer", 1),
            ("storers", if sixteen { 4 } else { 3 }),
            ("ring", 3),
            ("out_stages", 2),
            ("warp_channels", if sixteen { 2 } else { 1 }),
            ("producers", 1),
            ("minblocks", 1),
        ],
    );
    DepthReuseCl.fits(spec, &config).is_ok().then_some(config)
}

impl Variant for DepthReuseCl {
    fn name(&self) -> &'static str {
        "depth_reuse_cl"
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/depth_reuse_cl.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        pixel_vector_applies(spec)?;
        plane_offsets_fit_i32(spec)?;
        default_launches(self, spec)
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        let nt = shifted_tile_columns(spec) as i64;
        let cols: Vec<i64> = [1i64, 2, 4]
            .into_iter()
            .filter(|&c| c == 1 || c <= nt)
            .collect();
        vec![
            // 8-wide tile columns of a block's region: 8 x cols warps, one per (channel, tile).
            Param {
                name: "cols",
                values: cols,
            },
            // Channels a block owns: 8 (one 16-byte vector a pixel), or 16 in the producer
            // form (32 bytes a pixel: whole sectors in its boxes and stores).
            Param {
                name: "channels",
                values: if spec.c().is_multiple_of(16) {
                    vec![8, 16]
                } else {
                    vec![8]
                },
            },
            Param {
                name: "dchunk",
                values: depth_chunks(spec, &DEPTH_CHUNKS),
            },
            // Slices in flight in the staging ring ahead of the one being transposed.
            Param {
                name: "stages",
                values: vec![1, 2, 3, 4],
            },
            // 1: slices transposed by ldmatrix.trans + stmatrix (sm_90), a warp's four
            // 8-pixel groups at once; 0: each lane moves two pixels' channels. In the
            // block-barrier form 1 ran 2.7% slower on the NDHWC seed (both passes), equal
            // on video-vae-ndhwc (H100 run 321, A/B two rounds): fewer instructions and
            // wavefronts, but every warp then waits on an LDSM -> STSM chain before its
            // MMAs (that form's default stays 0); the producer form takes 1.
            Param {
                name: "trans",
                values: vec![0, 1],
            },
            // 1: a producer warp (TMA boxes into the staging slots, stmatrix transposes
            // into a ring of `ring` slots) and storer warps, handing slots over by
            // mbarriers: no block barrier a step (takes trans=1; the default where
            // `producer_config` gives one).
            Param {
                name: "producer",
                values: vec![0, 1],
            },
            // Storer warps of the producer form, pixel pairs dealt round their lanes.
            Param {
                name: "storers",
                values: vec![1, 2, 3, 4],
            },
            // The producer form's channel-major ring slots and output stages: how far the
            // tile warps may run ahead of the slowest of them (every slot waits for all
            // of them) and of the storers.
            Param {
                name: "ring",
                values: vec![3, 4],
            },
            Param {
                name: "out_stages",
                values: vec![2, 3],
            },
            // Channels a tile warp of the producer form runs (two: half the warps every
            // slot and stage waits for, two independent MMA chains a warp, twice the
            // weight and accumulator registers).
            Param {
                name: "warp_channels",
                values: vec![1, 2],
            },
            // Producer warps of the producer form sharing each slice's transposes (the
            // first also issues the TMA boxes).
            Param {
                name: "producers",
                values: vec![1, 2],
            },
            // Blocks per SM the registers are capped for (`__launch_bounds__`).
            Param {
                name: "minblocks",
                values: vec![1, 2, 3, 4],
            },
        ]
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        // From the H100 sweep (docs/perf.md, run 40): one tile column per block (8 warps)
        // beat 2 and 4 everywhere (seed 0.640 vs 0.777-0.922 ms); a third block per SM
        // pays where the band fragments are few (video-vae's 9 rows: 0.376 -> 0.330 ms)
        // and not with the seed's 15 (0.640 -> 0.719, spills). Depth chunks as long as offered.
        // With the staging ring (run 303) no register cap where the band fragments are
        // few (video-vae-ndhwc 0.336 vs 0.415 ms at three blocks, x3d-ndhwc 0.207 vs
        // 0.209); two slices in flight (the seed 0.605, one: 0.657, three: 0.616).
        if let Some(producer) = producer_config(spec) {
            return producer;
        }
        let [kd, kh, _] = spec.kernel3();
        let minblocks = if kd * kh <= 9 { 1 } else { 2 };
        let dchunk = depth_chunk_at_most(&depth_chunks(spec, &DEPTH_CHUNKS), 64);
        Config::new(
            self.name(),
            &[
                ("cols", 1),
                ("channels", 8),
                ("dchunk", dchunk),
                ("stages", 2),
                ("trans", 0),
                ("producer", 0),
                ("storers", 1),
                ("ring", 3),
                ("out_stages", 2),
                ("warp_channels", 1),
                ("producers", 1),
                ("minblocks", minblocks),
            ],
        )
    }
    fn needs_repair(&self) -> bool {
        true
    }
    fn fits(&self, spec: &ConvSpec, config: &Config) -> std::result::Result<(), String> {
        let p = Params::read(config).map_err(|e| e.to_string())?;
        if p.channels != 8 && p.channels != 16 {
            return Err(format!(
                "channels={}: a block owns 8 or 16 channels",
                p.channels
            ));
        }
        if !spec.c().is_multiple_of(p.channels) {
            return Err(format!(
                "channels={} needs C a multiple of it (C = {}): take channels=8",
                p.channels,
                spec.c()
            ));
        }
        if p.producer == 1 {
            let warps = producer_warps(&p);
            if warps > 32 {
                return Err(format!(
                    "cols={} channels={} warp_channels={} producers={} storers={} with the \
                     producer is {warps} warps a block (one a warp_channels channels and tile \
                     column, the producers and the storers), more than 32: take fewer \
                     columns, channels, producers or storers, or more warp_channels",
                    p.cols, p.channels, p.warp_channels, p.producers, p.storers
                ));
            }
            if p.trans == 0 {
                return Err(
                    "the producer warp transposes with ldmatrix.trans + stmatrix: \
                            producer=1 takes trans=1"
                        .into(),
                );
            }
            return within_shared(
                "the staging slots, slice ring, output stages and mbarriers",
                producer_shared_bytes(spec, &p),
            );
        }
        if p.channels != 8 {
            return Err(format!(
                "channels={} is the producer form's: producer=0 takes channels=8",
                p.channels
            ));
        }
        // The producer form's own parameters, at the values the block-barrier form's
        // fixed layout (one warp a channel, two ring slots and two stages) is keyed by.
        if (
            p.storers,
            p.ring,
            p.out_stages,
            p.warp_channels,
            p.producers,
        ) != (1, 3, 2, 1, 1)
        {
            return Err(format!(
                "storers={} ring={} out_stages={} warp_channels={} producers={} belong to the \
                 producer form: producer=0 takes storers=1, ring=3, out_stages=2, \
                 warp_channels=1, producers=1",
                p.storers, p.ring, p.out_stages, p.warp_channels, p.producers
            ));
        }
        within_shared(
            "the slice ring, staging slots and output stages",
            shared_bytes(spec, p.cols, p.stages, p.trans),
        )
    }
    fn kernel_function_of(&self, config: &Config) -> String {
        match config.get("producer") {
            Some(1) => "depth_reuse_cl_producer_dwconv".into(),
            _ => self.kernel_function(),
        }
    }
    fn tensor_maps(&self, spec: &ConvSpec, config: &Config) -> Option<TensorMaps> {
        let p = Params::read(config).ok()?;
        // The producer's box: the block's channels x the region's (cols + 1) x 8 columns x
        // (16 + KH - 1) rows x one depth; 16 channels (32-byte pixels) land swizzled, as
        // the kernel's transpose reads them (`SW32`).
        (p.producer == 1).then(|| TensorMaps::ChannelsLast {
            input: [
                p.channels as u32,
                ((p.cols + 1) * 8) as u32,
                (16 + spec.kernel3()[1] - 1) as u32,
                1,
            ],
            output: None,
            input_swizzled: p.channels == 16,
        })
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        if p.producer == 1 {
            return Ok(format!(
                "depth_reuse_cl_producer_dwconv<{}, {kd}, {kh}, {kw}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}>",
                cuda_type(spec.dtype()),
                p.cols,
                p.channels,
                p.dchunk,
                p.stages,
                p.storers,
                p.ring,
                p.out_stages,
                p.warp_channels,
                p.producers,
                p.minblocks
            ));
        }
        Ok(format!(
            "depth_reuse_cl_dwconv<{}, {kd}, {kh}, {kw}, {}, {}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            p.cols,
            p.dchunk,
            p.stages,
            p.trans,
            p.minblocks
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        let p = Params::parse(self, spec, config)?;
        let Params {
            cols,
            channels,
            dchunk,
            stages,
            trans,
            producer,
            ..
        } = p;
        // The producer form adds the producer and storer warps.
        let (warps, shared) = if producer == 1 {
            (producer_warps(&p), producer_shared_bytes(spec, &p))
        } else {
            (CHANNELS * cols, shared_bytes(spec, cols, stages, trans))
        };
        let [od, oh, _] = spec.output3();
        let blocks = spec.n()
            * oh.div_ceil(16)
            * od.div_ceil(dchunk)
            * shifted_tile_columns(spec).div_ceil(cols)
            * (spec.c() / channels);
        Ok(Launch {
            grid: (grid_x(self, spec, blocks)?, 1, 1),
            block: ((warps * 32) as u32, 1, 1),
            shared_bytes: shared as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::{public_case, public_suite};
    use crate::variants::check_config;

    #[test]
    fn seed_ndhwc_geometry() {
        let spec = public_case("seed-bf16-ndhwc");
        let v = DepthReuseCl;
        assert!(v.applies(&spec).is_ok());
        // The default: the producer form, 16 channels over one tile column, three slices
        // staged ahead (8 channels over two columns where C is not a multiple of 16:
        // below).
        let d = v.default_config(&spec);
        let values = |c: &Config| {
            [
                "cols",
                "channels",
                "dchunk",
                "stages",
                "trans",
                "producer",
                "storers",
                "ring",
                "out_stages",
                "warp_channels",
                "producers",
                "minblocks",
            ]
            .map(|k| c.get(k))
        };
        assert_eq!(values(&d), [1, 16, 64, 3, 1, 1, 4, 3, 2, 2, 1, 1].map(Some));
        // 8 tile warps of two channels, the producer, four storers.
        assert_eq!(v.launch(&spec, &d, 132).unwrap().block.0, 13 * 32);
        let x3d = crate::suite::channels_last_case("x3d-ndhwc");
        assert_eq!(
            values(&v.default_config(&x3d)),
            [1, 16, 16, 3, 1, 1, 4, 3, 2, 2, 1, 1].map(Some)
        );
        // The block-barrier form.
        let d = Config::new(
            v.name(),
            &[
                ("cols", 1),
                ("channels", 8),
                ("dchunk", 64),
                ("stages", 2),
                ("trans", 0),
                ("producer", 0),
                ("storers", 1),
                ("ring", 3),
                ("out_stages", 2),
                ("warp_channels", 1),
                ("producers", 1),
                ("minblocks", 2),
            ],
        );
        // `base` with some parameters changed.
        let with = |base: &Config, changes: &[(&str, i64)]| {
            let mut c = base.clone();
            for &(k, val) in changes {
                c.values.insert(k.into(), val);
            }
            c
        };
        let l = v.launch(&spec, &d, 132).unwrap();
        // 3 bands x 1 depth chunk x 11 tile columns x 64 channel groups.
        assert_eq!(l.grid.0, 3 * 11 * 64);
        assert_eq!(l.block.0, 8 * 32);
        // Ring 2 x 8 planes of 20 x 24 elements + stages 2 x 8 x 16 x 8 elements of 2
        // bytes + 3 staging slots of 20 x 16 pixel vectors.
        assert_eq!(d.get("trans"), Some(0));
        assert_eq!(
            l.shared_bytes as usize,
            (2 * 8 * 20 * 24 + 2 * 8 * 16 * 8) * 2 + 3 * 20 * 16 * 16
        );
        // With the stmatrix transpose each plane grows to 61 16-byte chunks (an odd count).
        let trans = with(&d, &[("trans", 1)]);
        assert_eq!(
            v.launch(&spec, &trans, 132).unwrap().shared_bytes as usize,
            (2 * 8 * (20 * 24 + 8) + 2 * 8 * 16 * 8) * 2 + 3 * 20 * 16 * 16
        );
        // Every default is in its own space, 1-D rows (one tile column region) included.
        for case in public_suite().unwrap() {
            if v.applies(&case.spec).is_ok() {
                let d = v.default_config(&case.spec);
                assert!(check_config(&v, &case.spec, &d).is_ok(), "{}", case.name);
            }
        }
        // The producer form: two more warps, 3 staging slots of 20 x 16 pixel vectors
        // (5120 bytes, 128-aligned), 3 ring slots of 8 planes of 488 elements, two stages,
        // 13 mbarriers (3 staging, 3 + 3 ring, 2 + 2 stages); a TMA box of 8 channels x
        // 16 columns x 20 rows x 1 depth.
        let producer = with(&d, &[("trans", 1), ("producer", 1)]);
        assert!(check_config(&v, &spec, &producer).is_ok());
        let lp = v.launch(&spec, &producer, 132).unwrap();
        assert_eq!(lp.block.0, 10 * 32);
        assert_eq!(lp.grid.0, l.grid.0);
        assert_eq!(
            lp.shared_bytes as usize,
            3 * 5120 + 3 * 8 * 488 * 2 + 2 * 8 * 16 * 8 * 2 + 8 * 13
        );
        match v.tensor_maps(&spec, &producer) {
            Some(TensorMaps::ChannelsLast {
                input,
                output,
                input_swizzled,
            }) => {
                assert_eq!(
                    (input, output, input_swizzled),
                    ([8, 16, 20, 1], None, false)
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(v.tensor_maps(&spec, &d).is_none());
        assert!(v
            .specialization(&spec, &producer)
            .unwrap()
            .starts_with(&format!("{}<", v.kernel_function_of(&producer))));
        let wide = with(&producer, &[("cols", 4)]);
        assert!(check_config(&v, &spec, &wide).is_err());
        // Storers belong to the producer form; 8 x 2 tile warps + producer + 15 storers is
        // 32 warps, one more is past a block.
        let barrier_storers = with(&d, &[("storers", 2)]);
        assert!(v.fits(&spec, &barrier_storers).is_err());
        let many = with(&producer, &[("cols", 2), ("storers", 15)]);
        assert!(v.fits(&spec, &many).is_ok());
        let too_many = with(&many, &[("storers", 16)]);
        assert!(v.fits(&spec, &too_many).unwrap_err().contains("33 warps"));
        // 16 channels a block over one tile column: 16 tile warps + producer + 3 storers,
        // half the channel groups, a box of 16 channels (32 bytes a pixel); staging of
        // 20 x 16 pixels x 32 bytes, ring slots of 16 planes, stages of 16 planes.
        let sixteen = with(
            &d,
            &[
                ("producer", 1),
                ("trans", 1),
                ("channels", 16),
                ("storers", 3),
                ("stages", 1),
            ],
        );
        assert!(check_config(&v, &spec, &sixteen).is_ok());
        let l16 = v.launch(&spec, &sixteen, 132).unwrap();
        assert_eq!((l16.block.0, l16.grid.0), (20 * 32, 3 * 11 * 32));
        assert_eq!(
            l16.shared_bytes as usize,
            2 * 20 * 16 * 32 + 3 * 16 * 488 * 2 + 2 * 16 * 16 * 8 * 2 + 8 * 12
        );
        match v.tensor_maps(&spec, &sixteen) {
            Some(TensorMaps::ChannelsLast {
                input,
                input_swizzled,
                ..
            }) => assert_eq!((input, input_swizzled), ([16, 16, 20, 1], true)),
            other => panic!("{other:?}"),
        }
        let barrier16 = with(&d, &[("channels", 16)]);
        assert!(v.fits(&spec, &barrier16).is_err());
        // A fourth ring slot and a third output stage: one 16-channel slice (16 planes of
        // 488 elements) and one stage (16 channels x 16 rows x 8) more, two mbarriers each.
        let slack = with(&sixteen, &[("ring", 4), ("out_stages", 3)]);
        assert!(v.fits(&spec, &slack).is_ok());
        assert_eq!(
            v.launch(&spec, &slack, 132).unwrap().shared_bytes
                - v.launch(&spec, &sixteen, 132).unwrap().shared_bytes,
            16 * 488 * 2 + 16 * 16 * 8 * 2 + 2 * 8 + 2 * 8
        );
        assert!(v
            .specialization(&spec, &slack)
            .unwrap()
            .ends_with(", 3, 4, 3, 1, 1, 2>")); // storers, ring, out_stages, warp_channels, producers, minblocks
        let barrier_slack = with(&d, &[("ring", 4)]);
        assert!(v
            .fits(&spec, &barrier_slack)
            .unwrap_err()
            .contains("ring=3"));
        // Two channels a tile warp: 8 tile warps + producer + 3 storers, the same shared
        // memory; the block-barrier form keeps one.
        let paired = with(&sixteen, &[("warp_channels", 2)]);
        let lp = v.launch(&spec, &paired, 132).unwrap();
        assert_eq!(
            (lp.block.0, lp.grid.0, lp.shared_bytes),
            (12 * 32, l16.grid.0, l16.shared_bytes)
        );
        // storers, ring, out_stages, warp_channels, producers, minblocks
        assert!(v
            .specialization(&spec, &paired)
            .unwrap()
            .ends_with(", 3, 3, 2, 2, 1, 2>"));
        let barrier_paired = with(&d, &[("warp_channels", 2)]);
        assert!(v
            .fits(&spec, &barrier_paired)
            .unwrap_err()
            .contains("warp_channels=1"));
        // Two producer warps: one warp more, the same shared memory; the block-barrier
        // form has none; 16 x 1 tile warps + 2 producers + 15 storers is 33 warps.
        let two = with(&paired, &[("producers", 2)]);
        let lp = v.launch(&spec, &two, 132).unwrap();
        assert_eq!(
            (lp.block.0, lp.grid.0, lp.shared_bytes),
            (13 * 32, l16.grid.0, l16.shared_bytes)
        );
        assert!(v
            .specialization(&spec, &two)
            .unwrap()
            .ends_with(", 3, 3, 2, 2, 2, 2>"));
        let barrier_two = with(&d, &[("producers", 2)]);
        assert!(v
            .fits(&spec, &barrier_two)
            .unwrap_err()
            .contains("producers=1"));
        let crowded = with(&sixteen, &[("producers", 2), ("storers", 15)]);
        assert!(v.fits(&spec, &crowded).unwrap_err().contains("33 warps"));
        let c24 = crate::spec::ConvParams {
            n: 1,
            c: 24,
            input: vec![61, 45, 80],
            kernel: vec![3, 5, 5],
            stride: vec![],
            dilation: vec![],
            padding: vec![[0, 0], [2, 2], [2, 2]],
            layout: crate::Layout::ChannelsLast,
            dtype: crate::spec::DType::Bf16,
        }
        .validate()
        .unwrap();
        assert!(v.fits(&c24, &sixteen).unwrap_err().contains("multiple"));
        assert_eq!(
            values(&v.default_config(&c24)),
            [2, 8, 64, 1, 1, 1, 3, 3, 2, 1, 1, 1].map(Some)
        );
        assert!(!v
            .space(&c24)
            .iter()
            .any(|p| p.name == "channels" && p.values.contains(&16)));
        let no_trans = with(&producer, &[("trans", 0)]);
        assert!(check_config(&v, &spec, &no_trans).is_err());
        // No depths to walk (1-D rows): the block-barrier form.
        let nwc = crate::suite::channels_last_case("causal-conv1d-nwc");
        let d1 = v.default_config(&nwc);
        assert_eq!(values(&d1)[..7], [1, 8, 4, 2, 0, 0, 1].map(Some));
        assert!(check_config(&v, &nwc, &d1).is_ok());
        let cf = public_suite().unwrap().remove(0).spec;
        assert!(v.applies(&cf).is_err());
    }
}
