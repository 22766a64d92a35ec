//! `depth_reuse`: streaming's tensor-core formulation with each A fragment feeding all KD
//! output depths it reaches (one tile per warp, KD rotating accumulators), so a block
//! reads each input slice's fragments once instead of KD times (kernels/depth_reuse.cu).

use super::tensor_core::{row_stride, shifted_tile_columns, tensor_core_applies};
use super::{
    cuda_type, default_launches, depth_chunk_at_most, depth_chunks, grid_x, ring_params,
    within_shared, Config, Launch, Param, TensorMaps, Variant, DEPTH_CHUNKS,
};
use crate::error::Result;
use crate::spec::ConvSpec;

pub struct DepthReuse;

typed_params!(Params {
    bands,
    cols,
    dchunk,
    stages,
    minblocks,
    producer,
    planes
});

/// Most warps a block may have (1024 threads), one tile each.
const MAX_WARPS: i64 = 32;

/// 16-row bands and 8-wide tile columns of the output plane.
fn tile_grid(spec: &ConvSpec) -> (usize, usize) {
    (spec.output3()[1].div_ceil(16), shifted_tile_columns(spec))
}

/// Slices fetched ahead of the one being consumed.
// (5: a ring of 6 slots, two rounds of KD = 3, which the kernel walks without per-step
// ring arithmetic, like 2's one round.)
const STAGES: [i64; 5] = [1, 2, 4, 5, 6];

/// One slice of a block's region in the ring: its bands and their halo rows, `row_stride`
/// columns each (2-byte elements).
fn slice_shape(spec: &ConvSpec, bands: usize, cols: usize) -> (usize, usize) {
    (bands * 16 + spec.kernel3()[1] - 1, row_stride(cols))
}

/// The ring: `stages` + 1 slices of a region of `bands` x `cols` tiles. With a producer
/// warp: 128-byte aligned slots (the TMA's), the mbarriers (a full and an empty one a
/// slot, a staged and a free one a stage, 8 bytes each) to the next 128 bytes, the
/// stages of one output depth of the region, and walking planes a slot's B fragments
/// (mirrors STAGE_OFFSET and FRAG_OFFSET in the kernel).
fn shared_bytes(
    spec: &ConvSpec,
    bands: usize,
    cols: usize,
    stages: usize,
    producer: bool,
    planes: bool,
) -> usize {
    let (rows, width) = slice_shape(spec, bands, cols);
    let slice = rows * width * 2;
    let slots = stages + 1;
    if producer {
        let out_stages = output_stages(planes, spec.kernel3()[0]);
        let ring = slots * slice.div_ceil(128) * 128;
        let barriers = 8 * (2 * slots + 2 * out_stages);
        let stage = output_box(bands, cols).iter().product::<usize>() * 2;
        if planes {
            // Stages 1024-byte aligned (a 128-byte swizzle's atom), then each slot's
            // fragments and bias.
            (ring + barriers).div_ceil(1024) * 1024
                + out_stages * stage
                + slots * (spec.kernel3()[1] * 256 + 16)
        } else {
            ring + barriers.div_ceil(128) * 128 + out_stages * stage
        }
    } else {
        slots * slice
    }
}

/// Output stages (OST in the kernel): a plane walk's steps are short, so eight; walking
/// depths, one a kernel depth where KD is 2-4 (a step's stage is then known at compile
/// time), else 2.
fn output_stages(planes: bool, kd: usize) -> usize {
    match (planes, kd) {
        (true, _) => 8,
        (false, 2..=4) => kd,
        _ => 2,
    }
}

/// One output depth of a block's region: its tile columns and bands.
fn output_box(bands: usize, cols: usize) -> [usize; 2] {
    [cols * 8, bands * 16]
}

/// Whether a row has several regions of `cols` tiles (the kernel's SPLIT).
fn split_rows(spec: &ConvSpec, cols: usize) -> bool {
    tile_grid(spec).1 > cols
}

/// The columns of a region's output depth that leave by one TMA store. A whole-row
/// region stores from column 0 all its `cols` * 8. Split rows: a region's tiles start at
/// col0 * 8 - S (S = pw rounded up to 8, minus pw) and a TMA copy must start at a
/// multiple of 8 elements, so the aligned inside, 8 fewer where S > 0 (mirrors BW in the
/// kernel; the rest go from registers).
fn stored_columns(spec: &ConvSpec, cols: usize) -> usize {
    let shifted = !spec.pad_before3()[2].is_multiple_of(8);
    (cols * 8).saturating_sub(if shifted && split_rows(spec, cols) {
        8
    } else {
        0
    })
}

/// The kernel's STAGED: output depths leave through the stages and one TMA store each
/// where the producer runs, output rows are 16-byte multiples and the stored box has
/// columns (the output map of `tensor_maps`); 1 where the tiles' shift S = (-pw) mod 8 is
/// even (a lane's two columns one 4-byte word), 2 where odd; 0: from registers.
fn staged_output(spec: &ConvSpec, producer: bool, cols: usize) -> usize {
    if !producer || !spec.output3()[2].is_multiple_of(8) || stored_columns(spec, cols) == 0 {
        return 0;
    }
    1 + spec.pad_before3()[2] % 2
}

/// The TMA's limit on each side of a box.
const MAX_BOX: usize = 256;

/// Threads of a block: a warp per tile, the producer warp where there is one, and walking
/// planes a warp that stores the output planes.
fn block_threads(bands: usize, cols: usize, producer: bool, planes: bool) -> usize {
    (bands * cols + usize::from(producer) + usize::from(planes)) * 32
}

/// Registers a thread gets when `minblocks` blocks of `threads` share an SM's 64 K (the
/// compiler's cap under `__launch_bounds__`, in whole allocation units of 8).
fn register_cap(minblocks: usize, threads: usize) -> usize {
    65536 / (minblocks * threads) / 8 * 8
}

/// Whether a block may walk consecutive planes of the flattened (n, c, d) sequence (the
/// kernel's PLANES): one kernel depth and no depth padding, so each plane is one slice and
/// nothing rotates; the kernel indexes planes with 32-bit integers.
pub(crate) fn walks_planes(spec: &ConvSpec) -> bool {
    spec.kernel3()[0] == 1
        && spec.pad_before3()[0] == 0
        && spec.pad_after3()[0] == 0
        && spec.n() * spec.c() * spec.output3()[0] < i32::MAX as usize
}

/// Whether the default walks planes: where it may and output rows are 16-byte multiples
/// (the producer's default, for its TMA stores). The dispatch ranks by this too.
pub(crate) fn walks_planes_by_default(spec: &ConvSpec) -> bool {
    spec.output3()[2].is_multiple_of(8) && walks_planes(spec)
}

/// Whether the default runs a whole output row of 16 to 21 tiles as one region with the
/// producer warp (TMA slices in, whole-row TMA stores out): rows of 121-168 columns
/// (video-vae-causal's 128). The dispatch ranks by this.
pub(crate) fn one_wide_region_by_default(spec: &ConvSpec) -> bool {
    let nt = tile_grid(spec).1;
    spec.output3()[2].is_multiple_of(8) && !walks_planes(spec) && (16..=21).contains(&nt)
}

/// The depth chunk a plane walk takes: it does not use one, so the space's smallest (one
/// value, no twins in the space).
fn plane_walk_dchunk(spec: &ConvSpec) -> i64 {
    depth_chunks(spec, &DEPTH_CHUNKS)[0]
}

/// Blocks along the plane sequence with `planes` (waves of `minblocks` blocks an SM over
/// `sms` SMs, whole regions each), at most one a plane.
fn plane_chunks(
    spec: &ConvSpec,
    regions: usize,
    planes: usize,
    minblocks: usize,
    sms: u32,
) -> usize {
    let total = spec.n() * spec.c() * spec.output3()[0];
    (planes * minblocks * sms as usize)
        .div_ceil(regions)
        .clamp(1, total)
}

/// Depth chunks of `dchunk` or fewer output depths, balanced (33 depths in chunks of
/// 16 are three of 11, not 16, 16 and 1); mirrors depth_reuse.cu.
fn depth_chunk_count(spec: &ConvSpec, dchunk: usize) -> usize {
    spec.output3()[0].div_ceil(dchunk)
}

impl Variant for DepthReuse {
    fn name(&self) -> &'static str {
        "depth_reuse"
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/depth_reuse.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        tensor_core_applies(spec)?;
        if !spec.input3()[2].is_multiple_of(8) {
            return Err(
                "needs an input width that is a multiple of 8 (16-byte async copies)".into(),
            );
        }
        default_launches(self, spec)
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        let (mt, nt) = tile_grid(spec);
        // ... and the producer default's regions of at most 15 tiles.
        let mut cols: Vec<i64> = [
            1,
            2,
            4,
            8,
            16,
            nt,
            nt.div_ceil(2),
            nt.div_ceil(3),
            nt.div_ceil(nt.div_ceil(15)),
        ]
        .into_iter()
        .map(|c| c as i64)
        .filter(|&c| c >= 1 && c <= (nt as i64).min(MAX_WARPS))
        .collect();
        cols.sort_unstable();
        cols.dedup();
        let bands: Vec<i64> = [1i64, 2, 4]
            .into_iter()
            .filter(|&b| b == 1 || b <= mt as i64)
            .collect();
        let mut params = vec![
            // 16-row bands of a block's region.
            Param {
                name: "bands",
                values: bands,
            },
            // 8-wide tile columns of a block's region (one warp per tile).
            Param {
                name: "cols",
                values: cols,
            },
        ];
        params.extend(ring_params(spec, &STAGES));
        // How slices reach the ring: 0, every thread copies and a block barrier a slice
        // hands them over; 1, a producer warp copies and mbarriers hand each slot over.
        params.push(Param {
            name: "producer",
            values: vec![0, 1],
        });
        // 0: a block owns a chunk of one (n, c)'s output depths; k >= 1 (one kernel depth,
        // the producer): a block walks consecutive planes of all (n, c, d), in k waves of
        // `minblocks` blocks an SM.
        params.push(Param {
            name: "planes",
            values: if walks_planes(spec) {
                vec![0, 1, 2, 4]
            } else {
                vec![0]
            },
        });
        params
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        // From the H100 sweeps (docs/perf.md, runs 34-37). Columns: a whole row of tiles
        // per block where it has at most 16, else the fewest equal regions of at most 16
        // (the seed's 11 columns in one, video-vae's 17 in two of 9). Two bands where they
        // divide the plane's bands (x3d 0.166 -> 0.149 ms, video-vae 0.267 -> 0.254; on the
        // seed's 3 bands half of the second region's warps would idle). Depth chunks as long
        // as offered: a chunk pays KD - 1 extra slices and a pipeline start (seed: 0.412 ms
        // with 16, 0.336 with 64). Four slices in flight (1.1x over one); registers capped
        // for two blocks per SM where a block has at most 16 warps (three spill: 1.3x slower).
        let (mt, nt) = tile_grid(spec);
        let dchunk = depth_chunk_at_most(&depth_chunks(spec, &DEPTH_CHUNKS), 64);
        // With 16-byte output rows (TMA stores): the producer warp, one band, the fewest
        // equal regions of at most 15 tiles, two blocks an SM (runs 171 and 178-179: seed
        // 0.334 -> 0.234 ms; video-vae-decoder 0.395 -> 0.312, video-vae-causal 0.265 ->
        // 0.201, x3d 0.148 -> 0.142 against the barrier walk's defaults below).
        let producer = usize::from(spec.output3()[2].is_multiple_of(8));
        let planes = i64::from(walks_planes_by_default(spec));
        let dchunk = if planes > 0 {
            plane_walk_dchunk(spec)
        } else {
            dchunk
        };
        // Walking planes (run 233, convnext-7x7): two bands a region where the plane has
        // them and they make at most 16 tile warps (0.058 ms vs one band's 0.062-0.065;
        // 2 x 15 tiles of 112-wide rows capped registers at 32: 0.046 vs streaming's
        // 0.040 on the H100, run 237; one band: 0.028 vs 0.038 on an H200, run 238),
        // two blocks an SM.
        let producer_cols = nt.div_ceil(nt.div_ceil(15));
        let (bands, cols, minblocks) = if planes > 0 {
            let bands = if mt >= 2 && 2 * producer_cols <= 16 {
                2
            } else {
                1
            };
            (bands, producer_cols, 2)
        } else if producer == 1 {
            // Rows of up to 21 tiles in one region (runs 313-315: video-vae-decoder's 21
            // tiles 0.276 vs 0.315 ms in two regions of 11, video-vae-causal's 17 0.133 vs
            // 0.204 in two of 9: a split row's edge columns go from registers). Registers
            // capped for two blocks an SM where that leaves >= 56 (video-vae-causal: 56
            // and a 32-byte spill, 0.133 vs 0.150 at one block; video-vae-decoder's 22
            // warps would get 40 and spill 200 bytes: 0.71 ms).
            let cols = if nt <= 21 { nt } else { producer_cols };
            let cap = register_cap(2, block_threads(1, cols, true, false));
            (1, cols, if cap >= 56 { 2 } else { 1 })
        } else {
            let cols = nt.div_ceil(nt.div_ceil(16));
            let bands = if mt.is_multiple_of(2) && 2 * cols <= 32 {
                2
            } else {
                1
            };
            (bands, cols, if bands * cols <= 16 { 2 } else { 1 })
        };
        // With the producer walking depths of KD = 3, six slots: two whole rounds, the ring
        // walked by rounds without per-step arithmetic (run 371: seed 0.2016 -> 0.1985 ms,
        // video-vae-decoder 0.968x; x3d best at 5, run 374), where the registers are not
        // capped under 64: video-vae-causal's 18 warps at two blocks an SM (56) ran 2%
        // faster at four (run 378, three rounds: forward 0.1052 -> 0.1030, grad-input
        // 0.1077 -> 0.1060); else four.
        let cap = register_cap(
            minblocks as usize,
            block_threads(bands, cols, producer == 1, planes > 0),
        );
        let by_rounds = producer == 1
            && planes == 0
            && cap >= 64
            && spec.kernel3()[0] == 3
            && within_shared(
                "a ring of 6 slices",
                shared_bytes(spec, bands, cols, 5, true, false),
            )
            .is_ok();
        Config::new(
            self.name(),
            &[
                ("bands", bands as i64),
                ("cols", cols as i64),
                ("dchunk", dchunk),
                ("stages", if by_rounds { 5 } else { 4 }),
                ("minblocks", minblocks),
                ("producer", producer as i64),
                ("planes", planes),
            ],
        )
    }
    fn needs_repair(&self) -> bool {
        true
    }
    fn fits(&self, spec: &ConvSpec, config: &Config) -> std::result::Result<(), String> {
        let Params {
            bands,
            cols,
            dchunk,
            stages,
            producer,
            planes,
            ..
        } = Params::read(config).map_err(|e| e.to_string())?;
        let producer = producer != 0;
        if planes > 0 {
            if !producer {
                return Err("walking planes needs the producer warp".into());
            }
            if !walks_planes(spec) {
                return Err("walking planes needs one kernel depth and no depth padding".into());
            }
            if dchunk as i64 != plane_walk_dchunk(spec) {
                return Err("walking planes takes the smallest dchunk (it is unused)".into());
            }
        }
        let warps = bands.saturating_mul(cols) + usize::from(producer) + usize::from(planes > 0);
        if warps as i64 > MAX_WARPS {
            return Err(format!(
                "bands x cols = {} tile warps{}, more than a block's {MAX_WARPS} warps",
                bands * cols,
                match (producer, planes > 0) {
                    (true, true) => " and a producer and a storer",
                    (true, false) => " and a producer",
                    _ => "",
                }
            ));
        }
        let (rows, width) = slice_shape(spec, bands, cols);
        if producer && rows.max(width) > MAX_BOX {
            return Err(format!(
                "the producer copies a slice of {rows} x {width} as one TMA box, at most {MAX_BOX} a side"
            ));
        }
        within_shared(
            &format!("a ring of {} slices", stages + 1),
            shared_bytes(spec, bands, cols, stages, producer, planes > 0),
        )
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "depth_reuse_dwconv<{}, {kd}, {kh}, {kw}, {}, {}, {}, {}, {}, {}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            p.bands,
            p.cols,
            p.dchunk,
            p.stages,
            p.minblocks,
            p.producer,
            usize::from(p.producer != 0 && split_rows(spec, p.cols)),
            staged_output(spec, p.producer != 0, p.cols),
            usize::from(p.planes > 0)
        ))
    }
    fn tensor_maps(&self, spec: &ConvSpec, config: &Config) -> Option<TensorMaps> {
        let p = Params::read(config).ok()?;
        let (rows, cols) = slice_shape(spec, p.bands, p.cols);
        let out_rows = output_box(p.bands, p.cols)[1];
        let out_cols = stored_columns(spec, p.cols);
        let tma_out = staged_output(spec, p.producer != 0, p.cols) != 0;
        Some(if p.producer != 0 {
            TensorMaps::Boxes {
                input: [cols as u32, rows as u32, 1],
                output: tma_out.then_some([out_cols as u32, out_rows as u32, 1]),
                // Walking planes, stage rows of 128 bytes are swizzled (mirrors
                // `swizzled` in the kernel).
                output_swizzled: p.planes > 0 && out_cols * 2 == 128,
            }
        } else {
            TensorMaps::Unused
        })
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, sms: u32) -> Result<Launch> {
        let Params {
            bands,
            cols,
            dchunk,
            stages,
            minblocks,
            producer,
            planes,
        } = Params::parse(self, spec, config)?;
        let producer = producer != 0;
        let (mt, nt) = tile_grid(spec);
        let regions = mt.div_ceil(bands) * nt.div_ceil(cols);
        let blocks = if planes > 0 {
            regions * plane_chunks(spec, regions, planes, minblocks, sms)
        } else {
            spec.n() * spec.c() * depth_chunk_count(spec, dchunk) * regions
        };
        Ok(Launch {
            grid: (grid_x(self, spec, blocks)?, 1, 1),
            block: (
                block_threads(bands, cols, producer, planes > 0) as u32,
                1,
                1,
            ),
            shared_bytes: shared_bytes(spec, bands, cols, stages, producer, planes > 0) as u32,
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
    fn regions_cover_the_plane_with_at_most_a_block_of_warps() {
        let v = DepthReuse;
        // Seed: 3 bands x 11 tile columns; one region is a whole band row.
        let seed = case("seed-bf16");
        assert_eq!(tile_grid(&seed), (3, 11));
        let d = v.default_config(&seed);
        assert_eq!(
            (
                d.get("bands"),
                d.get("cols"),
                d.get("dchunk"),
                d.get("minblocks")
            ),
            (Some(1), Some(11), Some(64), Some(2))
        );
        // Eleven tile warps and the producer.
        assert_eq!(d.get("producer"), Some(1));
        let l = v.launch(&seed, &d, 132).unwrap();
        assert_eq!(l.block.0, 12 * 32);
        assert_eq!(l.grid.0 as usize, 512 * 3);
        // Video-vae: 17 tile columns in one region, one band, the producer, registers
        // capped for two blocks (18 warps: 56 each).
        let vae = case("video-vae-causal");
        let d = v.default_config(&vae);
        assert_eq!(
            (
                d.get("bands"),
                d.get("cols"),
                d.get("minblocks"),
                d.get("producer")
            ),
            (Some(1), Some(17), Some(2), Some(1))
        );
        // 21 tiles (video-vae-decoder): one region, one block an SM.
        let decoder = crate::suite::models_case("video-vae-decoder");
        let dd = v.default_config(&decoder);
        assert_eq!((dd.get("cols"), dd.get("minblocks")), (Some(21), Some(1)));
        assert!(split_rows(&vae, 9) && !split_rows(&seed, 11));
        // Two regions of 9 tiles: each stores its 64 aligned inner columns (S = 6).
        assert_eq!(stored_columns(&vae, 9), 64);
        assert_eq!(stored_columns(&seed, 11), 88);
        assert_eq!(v.default_config(&case("x3d-3x3x3")).get("bands"), Some(1));
        // Every valid config has at most 32 warps; the too-big products are pruned.
        assert!(valid_configs(&v, &vae).contains(&d));
        let all = valid_configs(&v, &vae);
        assert!(all
            .iter()
            .all(|c| c.get("bands").unwrap() * c.get("cols").unwrap() <= 32));
        assert!(all.len() < enumerate_len(&v, &vae));
        // 1-D rows have one band; strided specs do not apply.
        assert_eq!(v.space(&case("causal-conv1d"))[0].values, vec![1]);
        assert!(v.applies(&case("odd-dilated")).is_err());
        assert!(v.applies(&case("seed-f32")).is_err());
    }

    #[test]
    fn planes_walk_the_flattened_sequence_only_without_depths_to_rotate() {
        let v = DepthReuse;
        // convnext-7x7 (2-D, 16 x 384 planes of 56 x 56): the producer, walking planes;
        // 2 regions of 2 bands, 132 chunks of planes each (2 blocks an SM, one wave).
        let convnext = case("convnext-7x7");
        let d = v.default_config(&convnext);
        assert_eq!((d.get("producer"), d.get("planes")), (Some(1), Some(1)));
        assert_eq!((d.get("bands"), d.get("cols")), (Some(2), Some(8)));
        let l = v.launch(&convnext, &d, 132).unwrap();
        assert_eq!(l.grid.0, 2 * 132);
        // Sixteen tile warps, the producer and the storer.
        assert_eq!(l.block.0, 18 * 32);
        assert_eq!(plane_chunks(&convnext, 4, 1, 2, 132), 66);
        // 4 waves of 4 blocks an SM; never more chunks than planes (8 below).
        assert_eq!(
            plane_chunks(&case("causal-conv1d"), 1, 4, 4, 132),
            4 * 4 * 132
        );
        let tiny = crate::spec::ConvParams {
            n: 1,
            c: 8,
            input: vec![16, 16],
            kernel: vec![3, 3],
            stride: vec![],
            dilation: vec![],
            padding: vec![[1, 1]],
            layout: crate::Layout::ChannelsFirst,
            dtype: crate::DType::Bf16,
        }
        .validate()
        .unwrap();
        assert_eq!(plane_chunks(&tiny, 1, 4, 4, 132), 8);
        // Depths to rotate through (the seed) or depth padding: no plane walk.
        assert_eq!(v.default_config(&case("seed-bf16")).get("planes"), Some(0));
        assert!(!walks_planes(&case("x3d-3x3x3")));
        assert_eq!(v.space(&case("seed-bf16")).last().unwrap().values, vec![0]);
        // Walking planes needs the producer, and takes one dchunk.
        let mut no_producer = d.clone();
        no_producer.values.insert("producer".into(), 0);
        assert!(v.fits(&convnext, &no_producer).is_err());
        let configs = valid_configs(&v, &convnext);
        assert!(configs
            .iter()
            .filter(|c| c.get("planes") != Some(0))
            .all(|c| c.get("producer") == Some(1) && c.get("dchunk") == Some(4)));
        assert!(configs.contains(&d));
        // A 1xKxK 3-D layer of 5 depths walks planes too, its default valid.
        let deep = crate::spec::ConvParams {
            n: 1,
            c: 6,
            input: vec![5, 17, 16],
            kernel: vec![1, 5, 5],
            stride: vec![],
            dilation: vec![],
            padding: vec![[0, 0], [2, 2], [2, 2]],
            layout: crate::Layout::ChannelsFirst,
            dtype: crate::DType::Bf16,
        }
        .validate()
        .unwrap();
        let d = v.default_config(&deep);
        assert_eq!((d.get("planes"), d.get("dchunk")), (Some(1), Some(4)));
        assert!(v.fits(&deep, &d).is_ok());
    }

    fn enumerate_len(v: &DepthReuse, spec: &ConvSpec) -> usize {
        v.space(spec).iter().map(|p| p.values.len()).product()
    }
}
