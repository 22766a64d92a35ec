//! `depth_reuse_fma_cl`: depth_reuse_fma's rotation on channels-last data, lanes over
//! channels and no transposes (kernels/depth_reuse_fma_cl.cu).

use super::depth_reuse_fma::{fma_rotation_applies, MAX_THREADS, MAX_WEIGHTS};
use super::{
    block_sides, channels_last, chunk_fits_without_walk, cuda_type, default_launches,
    depth_chunk_at_most, depth_chunks, fill_table, fma_ring_bytes, grid_x, input_cols, input_rows,
    plane_offsets_fit_i32, plane_walk_ring_params, walkable_planes, walked_geometry,
    whole_chunk_pixels, within_shared, Config, Launch, Param, Variant, DEPTH_CHUNKS,
};
use crate::error::Result;
use crate::spec::{ConvSpec, DType};

pub struct DepthReuseFmaCl;

/// Slices in flight ahead of the one being read.
const STAGES: [i64; 3] = [1, 2, 4];
/// Channels per 16-byte chunk (one cp.async of one pixel).
pub(super) fn chunk_channels(spec: &ConvSpec) -> usize {
    spec.dtype().per_16_bytes()
}

typed_params!(
    /// A config's shape, read once.
    Shape {
        out_w,
        cv,
        lanes,
        tx,
        ty,
        dchunk,
        stages,
        minblocks,
        planes,
    }
);

impl Shape {
    /// The spec the kernel walks: with `planes`, its N x D planes as one image's depths.
    fn walked(&self, spec: &ConvSpec) -> ConvSpec {
        walked_geometry(spec, self.planes, walked_planes(spec))
    }
    fn threads(&self) -> usize {
        self.lanes * self.tx * self.ty
    }
    /// Pixels of a slice row: the region's runs and their halo (WS in the kernel).
    fn pixels(&self, spec: &ConvSpec) -> usize {
        input_cols(spec, self.tx * self.out_w)
    }
    /// 16-byte chunks of one pixel's block channels (CPP in the kernel).
    fn chunks_per_pixel(&self, spec: &ConvSpec) -> usize {
        self.lanes * self.cv / chunk_channels(spec)
    }
}

/// 16-byte chunks per slice row: the region's pixels (with halo) x the block's
/// channels, padded so rows start one warp-row segment apart in the banks. Mirrors
/// ROW_CH in the kernel.
fn row_chunks(spec: &ConvSpec, s: &Shape) -> usize {
    let raw = s.pixels(spec) * s.chunks_per_pixel(spec);
    let seg = s.chunks_per_pixel(spec) % 8;
    if seg == 0 {
        raw
    } else {
        raw + (seg + 8 - raw % 8) % 8
    }
}

/// The chunk table and the ring of slices of `ty` output rows' input rows.
fn shared_bytes(spec: &ConvSpec, s: &Shape) -> usize {
    let rows = input_rows(spec, s.ty);
    fma_ring_bytes(
        &s.walked(spec),
        s.dchunk,
        s.stages,
        rows * s.pixels(spec) * s.chunks_per_pixel(spec),
        rows * row_chunks(spec, s) * 16,
    )
}

/// The N x D planes of a channels-last tensor as one image's depths, where they can be
/// walked.
fn walked_planes(spec: &ConvSpec) -> Option<ConvSpec> {
    walkable_planes(spec.planes_as_depths())
}

/// Whether the default walks planes: where it may and each input pixel feeds at least 6
/// multiply-adds of a channel (taps / (H stride x W stride)). H100, run 240, walked /
/// one plane a block: convnext-t-nhwc (49) 0.52x, convnext-nhwc (49) 0.47x,
/// efficientnet-k5s2 (25 / 4) 0.73x, mobilenet-s1-nhwc (9) 0.69x; but mobilenet-s2
/// (9 / 4) 1.5x and causal-conv1d-nwc (4) 1.16x slower: there a block's slice is short
/// work, and a one-slice block's smaller shared memory keeps more of them in flight.
/// The dispatch ranks by this too.
pub(crate) fn walks_planes_by_default(spec: &ConvSpec) -> bool {
    let [_, sh, sw] = spec.stride3();
    walked_planes(spec).is_some() && spec.taps() >= 6 * sh * sw
}

/// Channels a thread takes (`cv`: one 2- to 16-byte shared load of a pixel) and lanes
/// side by side over a pixel's channels (`lanes`): the channels-last FMA kernels' shared
/// parameters (this one and row_rotation_cl).
pub(super) fn channel_vector_params() -> [Param; 2] {
    [
        Param {
            name: "cv",
            values: vec![1, 2, 4],
        },
        Param {
            name: "lanes",
            values: vec![8, 16, 32],
        },
    ]
}

/// `Err` where `lanes` x `cv` channels are not whole 16-byte chunks, `cv` is more than a
/// chunk, or a thread's `cv` channels of weights pass the register budget (the
/// channels-last FMA kernels' shared `fits` rules).
pub(super) fn channel_vector_fits(
    spec: &ConvSpec,
    lanes: usize,
    cv: usize,
) -> std::result::Result<(), String> {
    let e = chunk_channels(spec);
    if !(lanes * cv).is_multiple_of(e) {
        return Err(format!(
            "lanes x cv = {} channels per block, not whole 16-byte chunks of {e}",
            lanes * cv
        ));
    }
    if cv > e {
        return Err(format!("cv = {cv} is more than a chunk's {e} channels"));
    }
    if spec.taps() * cv > MAX_WEIGHTS {
        return Err(format!(
            "{} taps x cv = {} weights per thread, over {MAX_WEIGHTS}",
            spec.taps(),
            cv
        ));
    }
    Ok(())
}

fn runs(spec: &ConvSpec, out_w: usize) -> usize {
    spec.output3()[2].div_ceil(out_w)
}

impl Variant for DepthReuseFmaCl {
    fn name(&self) -> &'static str {
        "depth_reuse_fma_cl"
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/depth_reuse_fma_cl.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        if !channels_last(spec) {
            return Err("needs a channels-last layout".into());
        }
        fma_rotation_applies(spec)?;
        plane_offsets_fit_i32(spec)?;
        whole_chunk_pixels(spec)?;
        default_launches(self, spec)
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        let oh = spec.output3()[1];
        let [cv, lanes] = channel_vector_params();
        let mut params = vec![
            // Consecutive outputs along W per thread.
            Param {
                name: "out_w",
                values: vec![4, 8],
            },
            // Channels per thread (one shared load per pixel) and lanes per row.
            cv,
            lanes,
            // Runs along W and rows along H per block.
            Param {
                name: "tx",
                values: block_sides(runs(spec, 4), 16),
            },
            Param {
                name: "ty",
                values: block_sides(oh, 32),
            },
        ];
        params.extend(plane_walk_ring_params(spec, walked_planes(spec), &STAGES));
        params
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        // From the H100 sweeps (docs/perf.md, run 49). Channels per thread by weight count
        // (taps x cv <= 36): one with 27 taps (x3d 0.117 vs 0.121 ms with two), two to four
        // with 9 (mobilenet-s1 0.040 with four vs 0.057 with two), four with 4 (causal
        // conv1d 0.060 vs 0.066). 32 channels per block (64-byte pixel pieces of bf16).
        // Eight rows of one run with 32 lanes (x3d 0.117, video-vae 0.196), 16 runs over
        // 8 rows with fewer lanes; 1-D rows take 16 runs side by side.
        // Walking planes (run 240, H100): three blocks an SM (convnext-t-nhwc 0.064 vs
        // 0.068 ms at two); 8 planes a block, 16 with 9 taps (mobilenet-s1-nhwc 0.031 vs
        // 0.038 at 8); past 9 taps of 16-bit data two channels a lane, 16 lanes, one run
        // (convnext-t-nhwc 0.060 vs 0.064, convnext-nhwc 0.087 vs 0.094); with 9 taps
        // runs of 4 outputs (mobilenet-s1-nhwc 0.031 vs 0.035).
        let [_, oh, _] = spec.output3();
        let taps = spec.taps();
        let walk = walks_planes_by_default(spec);
        let pair = walk && taps > 9 && spec.dtype() != DType::F32;
        let cv = if pair {
            2
        } else {
            [4usize, 2, 1]
                .into_iter()
                .find(|&cv| taps * cv <= 36)
                .unwrap_or(1)
                .min(chunk_channels(spec))
        };
        let lanes = (32 / cv).max(chunk_channels(spec) / cv);
        let per_block = if lanes >= 32 || pair { 8 } else { 16 };
        let space = self.space(spec);
        let pick = |name: &str, want: usize| {
            let values = &space.iter().find(|p| p.name == name).unwrap().values;
            values
                .iter()
                .copied()
                .filter(|&v| v as usize <= want)
                .max()
                .unwrap_or(values[0])
        };
        let ty = pick("ty", oh.min(8));
        let out_w = if walk && taps <= 9 { 4 } else { 8 };
        let tx = pick(
            "tx",
            (per_block / ty as usize).min(runs(spec, out_w)).max(1),
        );
        let geometry = walked_geometry(spec, walk.into(), walked_planes(spec));
        let dchunk = depth_chunk_at_most(
            &depth_chunks(&geometry, &DEPTH_CHUNKS),
            match (walk, taps <= 9) {
                (true, true) => 16,
                (true, false) => 8,
                (false, _) => 64,
            },
        );
        Config::new(
            self.name(),
            &[
                ("out_w", out_w as i64),
                ("cv", cv as i64),
                ("lanes", lanes as i64),
                ("tx", tx),
                ("ty", ty),
                ("dchunk", dchunk),
                ("stages", 2),
                ("minblocks", if walk { 3 } else { 2 }),
                ("planes", walk as i64),
            ],
        )
    }
    fn fits(&self, spec: &ConvSpec, config: &Config) -> std::result::Result<(), String> {
        let s = Shape::read(config).map_err(|e| e.to_string())?;
        channel_vector_fits(spec, s.lanes, s.cv)?;
        chunk_fits_without_walk(spec, s.planes, s.dchunk)?;
        if s.threads() > MAX_THREADS {
            return Err(format!(
                "lanes x tx x ty = {} threads, more than a block's {MAX_THREADS}",
                s.threads()
            ));
        }
        within_shared(
            &format!("a ring of {} slices", s.stages + 1),
            shared_bytes(spec, &s),
        )
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let s = Shape::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "depth_reuse_fma_cl_dwconv<{}, {kd}, {kh}, {kw}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            s.out_w,
            spec.stride3()[2],
            spec.dilation3()[2],
            s.cv,
            s.lanes,
            s.tx,
            s.ty,
            s.dchunk,
            s.stages,
            s.minblocks,
            fill_table(&s.walked(spec), s.dchunk),
            s.planes
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        let s = Shape::parse(self, spec, config)?;
        let walked = s.walked(spec);
        let [od, oh, _] = walked.output3();
        let regions = oh.div_ceil(s.ty) * runs(spec, s.out_w).div_ceil(s.tx);
        let groups = spec.c().div_ceil(s.lanes * s.cv);
        let blocks = walked.n() * groups * od.div_ceil(s.dchunk) * regions;
        Ok(Launch {
            grid: (grid_x(self, spec, blocks)?, 1, 1),
            block: (s.threads() as u32, 1, 1),
            shared_bytes: shared_bytes(spec, &s) as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::{channels_last_suite, public_case};
    use crate::variants::valid_configs;

    fn cl_case(name: &str) -> ConvSpec {
        channels_last_suite()
            .unwrap()
            .into_iter()
            .find(|c| c.name == name)
            .unwrap()
            .spec
    }

    fn shape(spec: &ConvSpec) -> (i64, i64, i64, i64) {
        let d = DepthReuseFmaCl.default_config(spec);
        let g = |k| d.get(k).unwrap();
        (g("cv"), g("lanes"), g("tx"), g("ty"))
    }

    #[test]
    fn defaults_follow_the_weight_count_and_rows() {
        let v = DepthReuseFmaCl;
        let x3d = cl_case("x3d-ndhwc");
        v.applies(&x3d).unwrap();
        assert_eq!(shape(&x3d), (1, 32, 1, 8));
        assert_eq!(shape(&cl_case("mobilenet-s1-nhwc")), (4, 8, 2, 8));
        assert_eq!(shape(&cl_case("causal-conv1d-nwc")), (4, 8, 16, 1));
        assert_eq!(shape(&public_case("seed-bf16-ndhwc")), (1, 32, 1, 8));
        for name in [
            "x3d-ndhwc",
            "video-vae-ndhwc",
            "convnext-nhwc",
            "mobilenet-s1-nhwc",
        ] {
            let spec = cl_case(name);
            assert!(valid_configs(&v, &spec).contains(&v.default_config(&spec)));
        }
        let d = v.default_config(&x3d);
        let s = Shape::read(&d).unwrap();
        // 10 pixels x 64 bytes = 40 chunks; rows 64 bytes apart mod 128: 44 (44 mod 8 = 4).
        assert_eq!(row_chunks(&x3d, &s), 44);
        let l = v.launch(&x3d, &d, 132).unwrap();
        assert_eq!(l.block.0, 256);
        // 4 batches x 6 channel groups x 1 depth chunk x (7 x 7) regions.
        assert_eq!(l.grid.0, 4 * 6 * 49);
        // 10 rows x 10 pixels x 4 chunk offsets, then the ring.
        assert_eq!(l.shared_bytes as usize, 10 * 10 * 4 * 4 + 3 * 10 * 44 * 16);
        // mobilenet-s2 (2-D): no table and one slice, not three.
        let mb = public_case("mobilenet-s2");
        let d = v.default_config(&mb);
        assert!(v.specialization(&mb, &d).unwrap().ends_with(", false, 0>"));
        let s = Shape::read(&d).unwrap();
        let one = v.launch(&mb, &d, 132).unwrap();
        assert_eq!(one.shared_bytes as usize, 17 * row_chunks(&mb, &s) * 16);
        // Walking its 32 images as depths, 8 a block: a table and a ring of three slices,
        // an eighth of the blocks.
        let walk = Shape {
            planes: 1,
            dchunk: 8,
            ..s
        }
        .config(v.name());
        assert!(v
            .specialization(&mb, &walk)
            .unwrap()
            .ends_with(", true, 1>"));
        let l = v.launch(&mb, &walk, 132).unwrap();
        assert_eq!(l.grid.0 * 8, one.grid.0);
        let chunks = 17 * input_cols(&mb, s.tx * s.out_w) * s.chunks_per_pixel(&mb);
        assert_eq!(
            l.shared_bytes as usize,
            (chunks * 4).div_ceil(16) * 16 + 3 * 17 * row_chunks(&mb, &s) * 16
        );
        // Without the walk, one chunk size is enough; 3-D planes with a depth kernel
        // are not walked.
        let mut eight = d.clone();
        eight.values.insert("dchunk".into(), 8);
        assert!(v.fits(&mb, &eight).is_err());
        assert!(!valid_configs(&v, &x3d)
            .iter()
            .any(|c| c.get("planes") == Some(1)));
        assert!(v.applies(&public_case("seed-bf16")).is_err());
        // Walking planes by default where an input pixel feeds >= 6 multiply-adds.
        let walk = |spec: &ConvSpec| {
            let d = v.default_config(spec);
            let g = |k| d.get(k).unwrap();
            (
                g("planes"),
                g("cv"),
                g("lanes"),
                g("tx"),
                g("out_w"),
                g("dchunk"),
                g("minblocks"),
            )
        };
        assert_eq!(walk(&cl_case("convnext-nhwc")), (1, 2, 16, 1, 8, 8, 3));
        assert_eq!(walk(&cl_case("mobilenet-s1-nhwc")), (1, 4, 8, 2, 4, 16, 3));
        assert_eq!(walk(&mb).0, 0);
        assert_eq!(walk(&cl_case("causal-conv1d-nwc")).0, 0);
        assert_eq!(walk(&x3d).0, 0);
        // cv 4 with 75 taps is 300 weights per thread: pruned.
        let seed = public_case("seed-bf16-ndhwc");
        assert!(valid_configs(&v, &seed)
            .iter()
            .all(|c| c.get("cv") != Some(4)));
    }
}
