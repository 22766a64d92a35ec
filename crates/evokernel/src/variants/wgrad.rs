//! `wgrad`: grad-weight and grad-bias, deterministic (kernels/wgrad.cu): blocks sum
//! fixed slices of each channel's batch and outputs into f32 partials, a second kernel
//! adds the `splits` partials of each weight in order. Parameters: `run` outputs per
//! work item along W (inputs held in registers), `rows` tap rows (kd, kh) per thread
//! (accumulators: rows x KW; the block has one group of `warps` warps per `rows` tap
//! rows), `splits` slices of the reduction domain.

use super::{channels_last, cuda_type, grid_x, Config, FinalizeKernel, Launch, Param, Variant};
use crate::error::Result;
use crate::pass::Pass;
use crate::spec::{ConvSpec, Layout};

pub struct Wgrad;

typed_params!(Params {
    rows,
    run,
    splits,
    warps
});

/// Most accumulators (tap rows x KW) a thread keeps; mirrors the kernel's static_assert.
const MAX_ACCUMULATORS: usize = 64;
/// Most warps a block has (256 threads); mirrors the kernel.
const MAX_GROUPS: usize = 8;

impl Wgrad {
    /// Blocks along x: one per channel (CF) or per 32 channels (CL).
    fn channel_blocks(spec: &ConvSpec) -> usize {
        match spec.layout() {
            Layout::ChannelsFirst => spec.c(),
            Layout::ChannelsLast => spec.c().div_ceil(32),
        }
    }

    pub(crate) fn tap_rows(spec: &ConvSpec) -> usize {
        let [kd, kh, _] = spec.kernel3();
        kd * kh
    }

    /// Tap-row groups in all for `rows` tap rows per thread.
    pub(crate) fn groups(spec: &ConvSpec, rows: usize) -> usize {
        Self::tap_rows(spec).div_ceil(rows.max(1))
    }

    /// Blocks along z that split the groups (at most MAX_GROUPS a block), and the groups
    /// a block; mirrors the kernel's ZB and G.
    fn group_blocks(spec: &ConvSpec, rows: usize) -> (usize, usize) {
        let all = Self::groups(spec, rows);
        let z = all.div_ceil(MAX_GROUPS);
        (z, all.div_ceil(z))
    }

    /// Work items of one channel: output rows x runs of `run` outputs.
    fn items(spec: &ConvSpec, run: usize) -> usize {
        let [od, oh, ow] = spec.output3();
        spec.n() * od * oh * ow.div_ceil(run)
    }

    /// Bytes of f32 partials a call needs: [splits][C][taps + 1].
    pub fn partial_bytes(spec: &ConvSpec, splits: usize) -> usize {
        splits * spec.c() * (spec.taps() + 1) * 4
    }

    /// The most splits whose partials stay within 1 / `fraction` of the bytes the pass
    /// reads (input and grad-output), at least 1: the split-count defaults' cap.
    pub(crate) fn splits_within(spec: &ConvSpec, fraction: usize) -> usize {
        let read = (spec.input_len() + spec.output_len()) * spec.dtype().size_bytes();
        (read / fraction / Self::partial_bytes(spec, 1)).max(1)
    }
}

impl Variant for Wgrad {
    fn name(&self) -> &'static str {
        "wgrad"
    }
    fn pass(&self) -> Pass {
        Pass::Wgrad
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/wgrad.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        let kw = spec.kernel3()[2];
        if kw > MAX_ACCUMULATORS {
            return Err(format!(
                "a kernel {kw} wide needs more than {MAX_ACCUMULATORS} accumulators per thread"
            ));
        }
        Ok(())
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        let (rows, kw) = (Self::tap_rows(spec), spec.kernel3()[2]);
        // Rows a thread for 1..=8 groups; where none fits the accumulators, the most that
        // do and half that (their groups then split over blocks along z).
        let mut per_thread: Vec<i64> = (1..=MAX_GROUPS)
            .map(|g| rows.div_ceil(g))
            .filter(|&r| r * kw <= MAX_ACCUMULATORS)
            .map(|r| r as i64)
            .collect();
        if per_thread.is_empty() {
            let most = (MAX_ACCUMULATORS / kw).clamp(1, rows);
            per_thread = vec![most as i64, most.div_ceil(2) as i64];
        }
        per_thread.sort_unstable();
        per_thread.dedup();
        vec![
            Param {
                name: "rows",
                values: per_thread,
            },
            Param {
                name: "run",
                values: vec![4, 8, 16],
            },
            Param {
                name: "splits",
                // Up to 256: a few channel blocks (channels-last, 32 channels a block)
                // need many splits to fill the GPU.
                values: vec![1, 2, 4, 8, 16, 32, 64, 128, 256],
            },
            // Warps per tap-row group.
            Param {
                name: "warps",
                values: vec![1, 2, 4, 8],
            },
        ]
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        let kw = spec.kernel3()[2];
        let space = self.space(spec);
        // About 16-25 accumulators a thread (the seed: 5 tap rows of 5, 3 groups); at most
        // 12 for rows of 3 taps or fewer, whose threads have less to do: more groups
        // (odd-dilated, 21 rows of 3 taps: 4 rows a thread 0.090 ms, 7 rows 0.152; run
        // 188, exhaustive).
        let most = if kw <= 3 { 12 } else { 25 };
        let rows = space[0]
            .values
            .iter()
            .copied()
            .filter(|&r| r as usize * kw <= most)
            .max()
            .unwrap_or(space[0].values[0]);
        let (_, groups) = Self::group_blocks(spec, rows as usize);
        let warps = (8 / groups).clamp(1, MAX_GROUPS / groups);
        // Strided W reads a run's inputs `stride` apart: shorter runs (mobilenet-s2, stride
        // 2, channels-last: run 8 0.124 ms vs 16 0.259 ms, tuned in run 76); so do several
        // tap rows (odd-dilated: run 8 0.090 ms vs 16 0.124, run 188); one tap row of
        // narrow taps keeps 16 (causal-conv1d, run 76).
        let run = if kw >= 5 || spec.stride3()[2] > 1 || Self::tap_rows(spec) > 1 {
            8
        } else {
            16
        };
        // About 4 blocks per SM of a 132-SM H100, never slices of under 64 items.
        let blocks = Self::channel_blocks(spec);
        let want = (4 * 132usize).div_ceil(blocks.max(1));
        let cap = (Self::items(spec, run) / 64).clamp(1, 64);
        let mut splits = 1usize;
        while splits < want && splits * 2 <= cap {
            splits *= 2;
        }
        Config::new(
            self.name(),
            &[
                ("rows", rows),
                ("run", run as i64),
                ("splits", splits as i64),
                ("warps", warps as i64),
            ],
        )
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "wgrad_dwconv<{}, {}, {kd}, {kh}, {kw}, {}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            channels_last(spec),
            spec.stride3()[2],
            spec.dilation3()[2],
            p.run,
            p.rows
        ))
    }
    fn fits(&self, spec: &ConvSpec, config: &Config) -> std::result::Result<(), String> {
        let p = Params::read(config).map_err(|e| e.to_string())?;
        if p.rows * spec.kernel3()[2] > MAX_ACCUMULATORS {
            return Err(format!(
                "{} tap rows of {} taps exceed {MAX_ACCUMULATORS} accumulators",
                p.rows,
                spec.kernel3()[2]
            ));
        }
        let (_, groups) = Self::group_blocks(spec, p.rows);
        if groups * p.warps > MAX_GROUPS {
            return Err(format!(
                "{groups} groups of {} warps exceed a block of {MAX_GROUPS} warps",
                p.warps
            ));
        }
        Ok(())
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        // `parse` checked the config against the space and `fits`.
        let p = Params::parse(self, spec, config)?;
        let (z, groups) = Self::group_blocks(spec, p.rows);
        let threads = groups * p.warps * 32;
        Ok(Launch {
            grid: (
                grid_x(self, spec, Self::channel_blocks(spec))?,
                p.splits as u32,
                z as u32,
            ),
            block: (threads as u32, 1, 1),
            shared_bytes: 0,
        })
    }
    fn partial_splits(&self, spec: &ConvSpec, config: &Config) -> Result<Option<usize>> {
        Ok(Some(Params::parse(self, spec, config)?.splits))
    }
}

/// Threads of wgrad_finalize that share one weight's splits: a power of two dividing
/// `splits`, about 8 splits each, at most 32 (a block then takes 8 weights).
fn finalize_parts(splits: usize) -> usize {
    let mut parts = 1;
    while parts < 32 && parts * 2 * 8 <= splits && splits.is_multiple_of(parts * 2) {
        parts *= 2;
    }
    parts
}

/// The sum of `splits` partials [splits][C][taps + 1] into grad-weight (and grad-bias),
/// in a fixed order: wgrad.cu's second kernel, shared by every grad-weight variant that
/// writes partials in that layout.
pub(crate) fn finalize(spec: &ConvSpec, splits: usize, sms: u32) -> FinalizeKernel {
    let parts = finalize_parts(splits);
    let slots = (spec.c() * (spec.taps() + 1)) as u64;
    // A block of 256 threads takes 256 / parts slots.
    let launch = super::grid_stride_launch(slots * parts as u64, 256, 8, sms);
    FinalizeKernel {
        name: "wgrad_finalize",
        source: Wgrad.source(),
        expr: format!(
            "wgrad_finalize_dwconv<{}, {}, {splits}, {parts}>",
            cuda_type(spec.dtype()),
            spec.taps(),
        ),
        launch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More than 8 tap-row groups split over blocks along z, at most 8 groups a block:
    /// 31 x 31 (31 tap rows) at 1 row a thread runs 4 z blocks of 8 groups, at 2 rows 2 of
    /// 8; the seed's 15 rows stay one block.
    #[test]
    fn tap_row_groups_past_a_block_split_along_z() {
        use crate::spec::ConvParams;
        let mut p = ConvParams::seed();
        p.input = vec![1, 40, 40];
        p.kernel = vec![1, 31, 31];
        p.padding = vec![[0, 0], [15, 15], [15, 15]];
        let spec = p.validate().unwrap();
        assert!(Wgrad.applies(&spec).is_ok());
        assert_eq!(Wgrad::group_blocks(&spec, 1), (4, 8));
        assert_eq!(Wgrad::group_blocks(&spec, 2), (2, 8));
        for rows in [1, 2] {
            let config = Config::new(
                "wgrad",
                &[("rows", rows), ("run", 8), ("splits", 4), ("warps", 1)],
            );
            let l = Wgrad.launch(&spec, &config, 132).unwrap();
            assert_eq!((l.grid.2, l.block.0), (4 / rows as u32, 256));
        }
        let seed = ConvParams::seed().validate().unwrap();
        let l = Wgrad
            .launch(&seed, &Wgrad.default_config(&seed), 132)
            .unwrap();
        assert_eq!(l.grid.2, 1);
        // Three rows a thread would need 93 accumulators: not in the space.
        assert!(!Wgrad.space(&spec)[0].values.contains(&3));
    }

    #[test]
    fn finalize_parts_divide_the_splits_and_the_block() {
        for splits in [1usize, 2, 3, 6, 8, 16, 24, 64, 256, 2048] {
            let p = finalize_parts(splits);
            assert!(splits.is_multiple_of(p) && 256 % p == 0, "{splits}: {p}");
        }
        assert_eq!(finalize_parts(8), 1);
        assert_eq!(finalize_parts(64), 8);
        assert_eq!(finalize_parts(256), 32);
        assert_eq!(finalize_parts(2048), 32);
    }
}
