//! `wgrad_cl`: grad-weight and grad-bias on channels-last data (kernels/wgrad_cl.cu), a
//! lane per `bytes` of adjacent channels (4, 8 or 16) and `rows` tap rows, the inputs of
//! its kernel window in a register ring along each output row. Deterministic, with
//! wgrad's partials and finalize. Parameters: `bytes` a lane loads, `rows` tap rows
//! (kd, kh) per lane, `lanes` channel vectors per block, `workers` per block (each takes
//! every workers-th output row of the block's slice; summed in order), `splits` slices of
//! the output rows.

use super::wgrad::Wgrad;
use super::{grid_x, Config, Launch, Param, Variant};
use crate::error::Result;
use crate::pass::Pass;
use crate::spec::{ConvSpec, Layout};

pub struct WgradCl;

typed_params!(Params {
    bytes,
    rows,
    lanes,
    workers,
    splits,
    seg
});

/// Registers of values a lane holds (accumulators, ring, fetched vectors); mirrors
/// MAX_WGRAD_CL_VALUES.
const MAX_VALUES: usize = 100;
/// Outputs per work item along W (0: whole rows).
const SEGS: [i64; 6] = [0, 32, 64, 128, 256, 512];
/// Threads of a block; mirrors `__launch_bounds__(256)` (no register cap below 255:
/// run 90's 128-register cap spilled).
const MAX_THREADS: usize = 256;
const BYTES: [i64; 3] = [16, 8, 4];

impl WgradCl {
    /// Input positions of the ring: the window's span rounded up to a multiple of the W
    /// stride (the kernel's R).
    fn ring(spec: &ConvSpec) -> usize {
        let (kw, sw, dw) = (spec.kernel3()[2], spec.stride3()[2], spec.dilation3()[2]);
        ((kw - 1) * dw + 1).div_ceil(sw) * sw
    }

    /// Outputs per chunk (the kernel's U).
    fn chunk(spec: &ConvSpec) -> usize {
        Self::ring(spec) / spec.stride3()[2]
    }

    /// Taps whose input position is new at each output (the kernel's NK): those no
    /// earlier output of the row reads.
    fn new_taps(spec: &ConvSpec) -> usize {
        let (kw, sw, dw) = (spec.kernel3()[2], spec.stride3()[2], spec.dilation3()[2]);
        let seen = |k: usize| {
            (1..)
                .take_while(|d| d * sw <= (kw - 1) * dw)
                .any(|d| (k * dw + d * sw).is_multiple_of(dw) && (k * dw + d * sw) / dw < kw)
        };
        (0..kw).filter(|&k| !seen(k)).count()
    }

    /// Channels a lane of `bytes` holds.
    fn vector(spec: &ConvSpec, bytes: usize) -> usize {
        (bytes / spec.dtype().size_bytes()).max(1)
    }

    /// Registers of values a lane holds: accumulators and ring for `rows` tap rows, and
    /// the raw vectors of the next chunk (mirrors the kernel's static_assert).
    fn values(spec: &ConvSpec, bytes: usize, rows: usize) -> usize {
        let u = Self::chunk(spec);
        rows * (spec.kernel3()[2] + Self::ring(spec)) * Self::vector(spec, bytes)
            + (rows * u * Self::new_taps(spec) + u) * (bytes / 4)
    }

    /// Channel vectors of a block: `lanes`, or all of them when there are fewer.
    fn block_lanes(spec: &ConvSpec, bytes: usize, lanes: usize) -> usize {
        lanes.min(spec.c() / Self::vector(spec, bytes)).max(1)
    }

    fn threads(spec: &ConvSpec, p: &Params) -> usize {
        Self::block_lanes(spec, p.bytes, p.lanes) * Wgrad::groups(spec, p.rows) * p.workers
    }

    fn output_rows(spec: &ConvSpec) -> usize {
        let [od, oh, _] = spec.output3();
        spec.n() * od * oh
    }
}

impl Variant for WgradCl {
    fn name(&self) -> &'static str {
        "wgrad_cl"
    }
    fn pass(&self) -> Pass {
        Pass::Wgrad
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/wgrad_cl.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        if spec.layout() != Layout::ChannelsLast {
            return Err("needs channels-last data".into());
        }
        let v = Self::vector(spec, 4);
        if !spec.c().is_multiple_of(v) {
            return Err(format!(
                "needs channels in multiples of {v} (4-byte lane vectors); got {}",
                spec.c()
            ));
        }
        if Self::values(spec, 4, 1) > MAX_VALUES {
            return Err(format!(
                "a kernel row of {} taps needs more than {MAX_VALUES} registers of values a lane",
                spec.kernel3()[2]
            ));
        }
        if Wgrad::groups(spec, 1) > MAX_THREADS {
            return Err(format!(
                "{} tap rows exceed a block of {MAX_THREADS} threads",
                Wgrad::tap_rows(spec)
            ));
        }
        Ok(())
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        let rows = Wgrad::tap_rows(spec);
        let mut per_lane: Vec<i64> = (1..=rows)
            .map(|g| rows.div_ceil(g))
            .filter(|&r| Self::values(spec, 4, r) <= MAX_VALUES)
            .map(|r| r as i64)
            .collect();
        per_lane.sort_unstable();
        per_lane.dedup();
        vec![
            Param {
                name: "bytes",
                values: BYTES.to_vec(),
            },
            Param {
                name: "rows",
                values: per_lane,
            },
            Param {
                name: "lanes",
                values: vec![1, 2, 4, 8, 16, 32],
            },
            Param {
                name: "workers",
                values: vec![1, 2, 4, 8],
            },
            Param {
                name: "splits",
                // 512-2048 were tried on mobilenet, convnext and the NDHWC seed (runs
                // 102-103): slower than 256 everywhere.
                values: vec![1, 2, 4, 8, 16, 32, 64, 128, 256],
            },
            Param {
                name: "seg",
                values: SEGS.to_vec(),
            },
        ]
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        // The widest lane vector that divides C and fits one tap row's values.
        let bytes = BYTES
            .iter()
            .map(|&b| b as usize)
            .find(|&b| {
                spec.c().is_multiple_of(Self::vector(spec, b))
                    && Self::values(spec, b, 1) <= MAX_VALUES
            })
            .unwrap_or(4);
        let groups = Wgrad::groups(spec, 1);
        // The most channel vectors a block of at most 256 threads takes with all its groups.
        let lanes = [32usize, 16, 8, 4, 2, 1]
            .into_iter()
            .find(|&l| Self::block_lanes(spec, bytes, l) * groups <= MAX_THREADS)
            .unwrap_or(1);
        let cv = Self::block_lanes(spec, bytes, lanes);
        let mut workers = 1usize;
        while workers < 8 && cv * groups * workers * 2 <= 256 {
            workers *= 2;
        }
        // Whole rows where there are enough of them; else the longest segments that give
        // 256 items (1-D: causal-conv1d has 8 rows of 2048).
        let ow = spec.output3()[2];
        let rows = Self::output_rows(spec);
        let seg = if rows >= 256 {
            0
        } else {
            SEGS[1..]
                .iter()
                .rev()
                .map(|&s| s as usize)
                .find(|&s| s < ow && rows * ow.div_ceil(s) >= 256)
                .unwrap_or(32)
        };
        let items = rows * if seg == 0 { 1 } else { ow.div_ceil(seg) };
        // About 4 blocks per SM of a 132-SM H100, each worker at least 4 items, and
        // partials under ~1/16 of the bytes the pass reads.
        let blocks = (spec.c() / Self::vector(spec, bytes)).div_ceil(cv);
        let want = (4 * 132usize).div_ceil(blocks);
        let by_rows = (items / (4 * workers)).max(1);
        let by_bytes = Wgrad::splits_within(spec, 16);
        let mut splits = 1usize;
        while splits < want && splits * 2 <= by_rows.min(by_bytes).min(256) {
            splits *= 2;
        }
        Config::new(
            self.name(),
            &[
                ("bytes", bytes as i64),
                ("rows", 1),
                ("lanes", lanes as i64),
                ("workers", workers as i64),
                ("splits", splits as i64),
                ("seg", seg as i64),
            ],
        )
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "wgrad_cl_dwconv<{}, {}, {kd}, {kh}, {kw}, {}, {}, {}, {}>",
            super::cuda_type(spec.dtype()),
            Self::vector(spec, p.bytes),
            spec.stride3()[2],
            spec.dilation3()[2],
            p.rows,
            p.seg
        ))
    }
    fn fits(&self, spec: &ConvSpec, config: &Config) -> std::result::Result<(), String> {
        let p = Params::read(config).map_err(|e| e.to_string())?;
        let v = Self::vector(spec, p.bytes);
        if !spec.c().is_multiple_of(v) {
            return Err(format!(
                "{} channels are not whole {v}-channel vectors",
                spec.c()
            ));
        }
        if Self::values(spec, p.bytes, p.rows) > MAX_VALUES {
            return Err(format!(
                "{} tap rows of {}-channel vectors hold more than {MAX_VALUES} values a lane",
                p.rows, v
            ));
        }
        if Self::threads(spec, &p) > MAX_THREADS {
            return Err(format!(
                "{} threads exceed a block of {MAX_THREADS}",
                Self::threads(spec, &p)
            ));
        }
        Ok(())
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        // `parse` checked the config against the space and `fits`.
        let p = Params::parse(self, spec, config)?;
        let cv = Self::block_lanes(spec, p.bytes, p.lanes);
        let blocks = (spec.c() / Self::vector(spec, p.bytes)).div_ceil(cv);
        Ok(Launch {
            grid: (grid_x(self, spec, blocks)?, p.splits as u32, 1),
            block: (
                cv as u32,
                Wgrad::groups(spec, p.rows) as u32,
                p.workers as u32,
            ),
            shared_bytes: 0,
        })
    }
    fn partial_splits(&self, spec: &ConvSpec, config: &Config) -> Result<Option<usize>> {
        Ok(Some(Params::parse(self, spec, config)?.splits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ConvParams, DType};

    use crate::variants::test_specs::seed_channels_last as cl;

    #[test]
    fn default_uses_the_widest_vector_that_divides_c_and_fits() {
        // The seed (3x5x5): 16-byte lanes would hold 5 + 5 positions x 8 channels = 80
        // values and 10 fetched vectors of 4 registers (120 > 100); 8-byte lanes hold 60.
        let seed = cl(512, DType::Bf16);
        let d = WgradCl.default_config(&seed);
        assert_eq!(d.get("bytes"), Some(8));
        assert_eq!(WgradCl::values(&seed, 8, 1), 60);
        // A 3-wide row at stride 2 (mobilenet-s2): ring 4, 2 new taps an output, U = 2.
        let mut p = ConvParams::seed();
        p.layout = Layout::ChannelsLast;
        p.kernel = vec![1, 3, 3];
        p.stride = vec![1, 2, 2];
        p.padding = vec![[0, 0], [1, 1], [1, 1]];
        let s2 = p.validate().unwrap();
        assert_eq!((WgradCl::ring(&s2), WgradCl::new_taps(&s2)), (4, 2));
        assert_eq!(WgradCl.default_config(&s2).get("bytes"), Some(16));
        // 12 channels of bf16: 8 does not divide them, 4 does (8-byte lanes).
        let d = WgradCl.default_config(&cl(12, DType::Bf16));
        assert_eq!(d.get("bytes"), Some(8));
        for spec in [seed, cl(12, DType::Bf16), cl(6, DType::F32)] {
            let d = WgradCl.default_config(&spec);
            WgradCl.fits(&spec, &d).unwrap();
            let l = WgradCl.launch(&spec, &d, 132).unwrap();
            assert!(l.block.0 as usize * l.block.1 as usize * l.block.2 as usize <= MAX_THREADS);
        }
    }

    #[test]
    fn wide_kernel_rows_are_refused_with_the_reason() {
        let mut p = ConvParams::seed();
        p.layout = Layout::ChannelsLast;
        p.kernel = vec![1, 1, 31];
        p.padding = vec![[0, 0], [0, 0], [15, 15]];
        let err = WgradCl.applies(&p.validate().unwrap()).unwrap_err();
        assert!(err.contains("31 taps"), "{err}");
    }
}
