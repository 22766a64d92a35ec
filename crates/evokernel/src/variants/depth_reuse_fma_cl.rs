//! `depth_reuse_fma_cl`: depth_reuse_fma's rotation on channels-last data, lanes over
//! channels and no transposes (kernels/depth_reuse_fma_cl.cu).

use super::{
    channels_last, check_config, cuda_type, default_launches, depth_chunk_at_most, depth_chunks,
    grid_x, within_shared, Config, Launch, Param, Variant,
};
use crate::error::Result;
use crate::spec::ConvSpec;

pub struct DepthReuseFmaCl;

const DCHUNKS: [i64; 5] = [4, 8, 16, 32, 64];
const STAGES: [i64; 3] = [1, 2, 4];
const MIN_BLOCKS: [i64; 4] = [1, 2, 3, 4];
/// Weights of a thread's channels live in registers: taps x cv of them at most.
const MAX_WEIGHTS: usize = 128;
const MAX_THREADS: usize = 1024;

/// Channels per 16-byte chunk (one cp.async of one pixel).
fn chunk_channels(spec: &ConvSpec) -> usize {
    16 / spec.dtype().size_bytes()
}

/// A config's shape, read once.
struct Shape {
    out_w: usize,
    cv: usize,
    lanes: usize,
    tx: usize,
    ty: usize,
    stages: usize,
}

impl Shape {
    fn of(config: &Config) -> Result<Self> {
        let p = |name| config.param(name).map(|v| v as usize);
        Ok(Shape {
            out_w: p("out_w")?,
            cv: p("cv")?,
            lanes: p("lanes")?,
            tx: p("tx")?,
            ty: p("ty")?,
            stages: p("stages")?,
        })
    }
    fn threads(&self) -> usize {
        self.lanes * self.tx * self.ty
    }
}

/// 16-byte chunks per slice row: the region's pixels (with halo) x the block's
/// channels, padded so rows start one warp-row segment apart in the banks. Mirrors
/// ROW_CH in the kernel.
fn row_chunks(spec: &ConvSpec, s: &Shape) -> usize {
    let (sw, dw, kw) = (spec.stride3()[2], spec.dilation3()[2], spec.kernel3()[2]);
    let ws = (s.tx * s.out_w - 1) * sw + (kw - 1) * dw + 1;
    let block_bytes = s.lanes * s.cv * spec.dtype().size_bytes();
    let raw = ws * block_bytes / 16;
    let seg = block_bytes % 128 / 16;
    if seg == 0 {
        raw
    } else {
        raw + (seg + 8 - raw % 8) % 8
    }
}

fn shared_bytes(spec: &ConvSpec, s: &Shape) -> usize {
    let (kh, sh, dh) = (spec.kernel3()[1], spec.stride3()[1], spec.dilation3()[1]);
    let rows = (s.ty - 1) * sh + (kh - 1) * dh + 1;
    (s.stages + 1) * rows * row_chunks(spec, s) * 16
}

fn runs(spec: &ConvSpec, out_w: usize) -> usize {
    spec.output3()[2].div_ceil(out_w)
}

fn side_sizes(n: usize, cap: usize) -> Vec<i64> {
    let mut v: Vec<i64> = (1..=4)
        .map(|k| n.div_ceil(k))
        .chain([1, 2, 4, 8, 16])
        .filter(|&s| s >= 1 && s <= cap)
        .map(|s| s as i64)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
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
        if spec.stride3()[0] != 1 || spec.dilation3()[0] != 1 {
            return Err("needs stride 1 and dilation 1 along depth (the rotation)".into());
        }
        let (sw, dw) = (spec.stride3()[2], spec.dilation3()[2]);
        if sw > 3 || dw > 3 {
            return Err(format!(
                "stride {sw} and dilation {dw} along W: at most 3 each (compiled into the kernel)"
            ));
        }
        if spec.taps() > MAX_WEIGHTS {
            return Err(format!(
                "{} taps do not fit the register budget ({MAX_WEIGHTS})",
                spec.taps()
            ));
        }
        let e = chunk_channels(spec);
        if !spec.c().is_multiple_of(e) {
            return Err(format!(
                "needs a channel count that is a multiple of {e} (16-byte pixel vectors)"
            ));
        }
        self.fits(spec, &self.default_config(spec))?;
        default_launches(self, spec)
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        let oh = spec.output3()[1];
        vec![
            // Consecutive outputs along W per thread.
            Param {
                name: "out_w",
                values: vec![4, 8],
            },
            // Channels per thread (one shared load per pixel) and lanes per row.
            Param {
                name: "cv",
                values: vec![1, 2, 4],
            },
            Param {
                name: "lanes",
                values: vec![8, 16, 32],
            },
            // Runs along W and rows along H per block.
            Param {
                name: "tx",
                values: side_sizes(runs(spec, 4), 16),
            },
            Param {
                name: "ty",
                values: side_sizes(oh, 32),
            },
            Param {
                name: "dchunk",
                values: depth_chunks(spec, &DCHUNKS),
            },
            Param {
                name: "stages",
                values: STAGES.to_vec(),
            },
            Param {
                name: "minblocks",
                values: MIN_BLOCKS.to_vec(),
            },
        ]
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        // Not yet measured: two channels per thread where the weights are few, 32
        // channels per block (64-byte pixel pieces of bf16), ~256 threads over rows first.
        let oh = spec.output3()[1];
        let cv = if spec.taps() <= 32 { 2 } else { 1 };
        let lanes = 32 / cv;
        let out_w = 8;
        let per_block = 256 / lanes;
        let tx = runs(spec, out_w).min(if oh >= 4 { 2 } else { per_block });
        let ty = oh.min(per_block / tx).max(1);
        let dchunk = depth_chunk_at_most(&depth_chunks(spec, &DCHUNKS), 64);
        Config::new(
            self.name(),
            &[
                ("out_w", out_w as i64),
                ("cv", cv as i64),
                ("lanes", lanes as i64),
                ("tx", tx as i64),
                ("ty", ty as i64),
                ("dchunk", dchunk),
                ("stages", 2),
                ("minblocks", 2),
            ],
        )
    }
    fn fits(&self, spec: &ConvSpec, config: &Config) -> std::result::Result<(), String> {
        let s = Shape::of(config).map_err(|e| e.to_string())?;
        let e = chunk_channels(spec);
        if (s.lanes * s.cv) % e != 0 {
            return Err(format!(
                "lanes x cv = {} channels per block, not whole 16-byte chunks of {e}",
                s.lanes * s.cv
            ));
        }
        if s.cv > e {
            return Err(format!("cv = {} is more than a chunk's {e} channels", s.cv));
        }
        if spec.taps() * s.cv > MAX_WEIGHTS {
            return Err(format!(
                "{} taps x cv = {} weights per thread, over {MAX_WEIGHTS}",
                spec.taps(),
                s.cv
            ));
        }
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
        check_config(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        let p = |name| config.param(name);
        Ok(format!(
            "depth_reuse_fma_cl_dwconv<{}, {kd}, {kh}, {kw}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            p("out_w")?,
            spec.stride3()[2],
            spec.dilation3()[2],
            p("cv")?,
            p("lanes")?,
            p("tx")?,
            p("ty")?,
            p("dchunk")?,
            p("stages")?,
            p("minblocks")?
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        check_config(self, spec, config)?;
        let s = Shape::of(config)?;
        let dchunk = config.param("dchunk")? as usize;
        let [od, oh, _] = spec.output3();
        let regions = oh.div_ceil(s.ty) * runs(spec, s.out_w).div_ceil(s.tx);
        let groups = spec.c().div_ceil(s.lanes * s.cv);
        let blocks = spec.n() * groups * od.div_ceil(dchunk) * regions;
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

    #[test]
    fn blocks_take_32_channels_and_rows_first() {
        let v = DepthReuseFmaCl;
        let x3d = channels_last_suite()
            .unwrap()
            .into_iter()
            .find(|c| c.name == "x3d-ndhwc")
            .unwrap()
            .spec;
        v.applies(&x3d).unwrap();
        let d = v.default_config(&x3d);
        assert_eq!(
            (d.get("cv"), d.get("lanes"), d.get("tx"), d.get("ty")),
            (Some(2), Some(16), Some(2), Some(8))
        );
        let s = Shape::of(&d).unwrap();
        // 18 pixels x 64 bytes = 72 chunks; rows 64 bytes apart mod 128: 76 (76 mod 8 = 4).
        assert_eq!(row_chunks(&x3d, &s), 76);
        let l = v.launch(&x3d, &d, 132).unwrap();
        assert_eq!(l.block.0, 256);
        // 4 batches x 6 channel groups x 1 depth chunk x (7 x 4) regions.
        assert_eq!(l.grid.0, 4 * 6 * 28);
        assert_eq!(l.shared_bytes as usize, 3 * 10 * 76 * 16);
        assert!(valid_configs(&v, &x3d).contains(&d));
        // The seed's 75 taps: one channel per thread, 32 lanes.
        let seed = public_case("seed-bf16-ndhwc");
        let d = v.default_config(&seed);
        assert_eq!((d.get("cv"), d.get("lanes")), (Some(1), Some(32)));
        v.applies(&seed).unwrap();
        assert!(v.applies(&public_case("seed-bf16")).is_err());
        // cv 4 with 75 taps is 300 weights per thread: pruned.
        assert!(valid_configs(&v, &seed)
            .iter()
            .all(|c| c.get("cv") != Some(4)));
    }
}
