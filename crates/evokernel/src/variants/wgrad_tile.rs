//! `wgrad_tile`: grad-weight and grad-bias on channels-first data from shared-memory tiles
//! on the FMA pipes (kernels/wgrad_tile.cu), any dtype, unit stride and dilation along H.
//! A block takes one channel; one thread copies a work item (`th` output rows x `tw`
//! outputs of one image and depth, and the input window its taps read) into one of two
//! shared buffers as two TMA boxes (`tma` 1, where rows are 16-byte multiples and depth
//! dilation is 1; else the threads copy), and a thread sums 8 outputs of `th / workers`
//! rows against `rows` kernel rows of one kernel depth, each input row widened once and
//! met by the grad-output rows that reach it. Deterministic, with wgrad's partials and
//! finalize. Parameters: `tw`, `th`, `workers`, `rows`, `splits` slices of a channel's
//! items, `tma`, `minblocks` a register cap.

use super::wgrad::Wgrad;
use super::{
    cuda_type, grid_x, within_shared, Config, Launch, Param, TensorMaps, Variant, MAX_SHARED,
};
use crate::error::Result;
use crate::pass::Pass;
use crate::spec::{ConvSpec, Layout};

pub struct WgradTile;

typed_params!(Params {
    tw,
    rw,
    workers,
    rows,
    splits,
    tma,
    minblocks
});

/// Outputs a thread takes of a row (the kernel's V).
const SEGMENT: usize = 8;
/// Threads of a block; mirrors `__launch_bounds__(256)` and the kernel's static_assert.
const MAX_THREADS: usize = 256;
/// Values a thread holds (item and running sums, grad-output rows, an input span);
/// mirrors the kernel's static_assert.
const MAX_VALUES: usize = 160;
/// A TMA box's extent along any dim.
const MAX_BOX: usize = 256;
const TILE_COLS: [i64; 6] = [8, 16, 32, 64, 128, 256];
const WORKER_ROWS: [i64; 8] = [1, 2, 3, 4, 5, 6, 7, 8];

impl WgradTile {
    /// Elements of a 16-byte vector.
    fn vector(spec: &ConvSpec) -> usize {
        16 / spec.dtype().size_bytes()
    }

    /// Elements between the window's 16-byte aligned first column and the first tap's
    /// (the kernel's OFF): ow0 * SW is a multiple of 8, so the same for every tile.
    fn offset(spec: &ConvSpec) -> usize {
        let v = Self::vector(spec) as i64;
        (-(spec.pad_before3()[2] as i64)).rem_euclid(v) as usize
    }

    /// Input columns a tile row reads (the kernel's WT), and the window row in shared
    /// memory (XW: from the aligned column, in whole vectors).
    fn window_w(spec: &ConvSpec, tw: usize) -> usize {
        let (kw, sw, dw) = (spec.kernel3()[2], spec.stride3()[2], spec.dilation3()[2]);
        let wt = (tw - 1) * sw + (kw - 1) * dw + 1;
        (Self::offset(spec) + wt).next_multiple_of(Self::vector(spec))
    }

    /// Input rows a tile reads per kernel depth (HT; unit H stride and dilation).
    fn window_h(spec: &ConvSpec, th: usize) -> usize {
        th + spec.kernel3()[1] - 1
    }

    /// Input columns a thread's 8 outputs read (the kernel's SPAN).
    fn span(spec: &ConvSpec) -> usize {
        let (kw, sw, dw) = (spec.kernel3()[2], spec.stride3()[2], spec.dilation3()[2]);
        (SEGMENT - 1) * sw + (kw - 1) * dw + 1
    }

    fn threads(spec: &ConvSpec, p: &Params) -> usize {
        let [kd, kh, _] = spec.kernel3();
        p.tw / SEGMENT * kd * kh.div_ceil(p.rows) * p.workers
    }

    /// Where the buffers can be filled by TMA boxes: rows of both tensors 16-byte
    /// multiples (the engine hands over 16-byte aligned tensors), a box's KD depths
    /// consecutive, every box extent at most 256.
    fn tma_fits(spec: &ConvSpec, th: usize, tw: usize) -> std::result::Result<(), String> {
        let e = spec.dtype().size_bytes();
        if !(spec.input3()[2] * e).is_multiple_of(16) || !(spec.output3()[2] * e).is_multiple_of(16)
        {
            return Err("TMA boxes need input and output rows in 16-byte multiples".into());
        }
        let kd = spec.kernel3()[0];
        if kd > 1 && spec.dilation3()[0] != 1 {
            return Err("TMA boxes hold consecutive depths: depth dilation must be 1".into());
        }
        let extents = [
            Self::window_w(spec, tw),
            Self::window_h(spec, th),
            kd,
            tw,
            th,
        ];
        if extents.iter().any(|&x| x > MAX_BOX) {
            return Err(format!(
                "a TMA box of {extents:?} exceeds {MAX_BOX} along some dim"
            ));
        }
        Ok(())
    }

    /// Elements of one buffer (input window, then grad-output tile, each 128-byte
    /// aligned); mirrors the kernel's STAGE.
    fn stage_elems(spec: &ConvSpec, p: &Params) -> usize {
        let per128 = 128 / spec.dtype().size_bytes();
        let kd = spec.kernel3()[0];
        let input = kd * Self::window_h(spec, p.th()) * Self::window_w(spec, p.tw);
        input.next_multiple_of(per128) + (p.th() * p.tw).next_multiple_of(per128)
    }

    fn shared_bytes(spec: &ConvSpec, p: &Params) -> usize {
        let buffers = 2 * Self::stage_elems(spec, p) * spec.dtype().size_bytes();
        // The end's reduction reuses them: a thread's rows x KW sums and its grad-bias.
        let reduction = Self::threads(spec, p) * (p.rows * spec.kernel3()[2] + 1) * 4;
        buffers.max(reduction)
    }

    fn values(spec: &ConvSpec, rows: usize) -> usize {
        2 * rows * spec.kernel3()[2] + rows * SEGMENT + Self::span(spec)
    }

    /// `Err(reason)` when `p` cannot launch for `spec` (what `fits` says of a config).
    fn check(spec: &ConvSpec, p: &Params) -> std::result::Result<(), String> {
        let kh = spec.kernel3()[1];
        if !p.tw.is_multiple_of(SEGMENT) || p.tw == 0 {
            return Err(format!(
                "a tile of {} outputs is not whole segments of {SEGMENT}",
                p.tw
            ));
        }
        if p.workers == 0 || p.rw == 0 {
            return Err("a tile needs workers and rows".into());
        }
        if p.rows == 0 || p.rows > kh {
            return Err(format!("{} kernel rows a thread of {kh}", p.rows));
        }
        let values = Self::values(spec, p.rows);
        if values > MAX_VALUES {
            return Err(format!("{values} values a thread exceed {MAX_VALUES}"));
        }
        let threads = Self::threads(spec, p);
        if threads > MAX_THREADS {
            return Err(format!("{threads} threads exceed a block of {MAX_THREADS}"));
        }
        if p.tma != 0 {
            Self::tma_fits(spec, p.th(), p.tw)?;
        }
        within_shared("the two tile buffers", Self::shared_bytes(spec, p))
    }

    /// Work items of one channel: (n, od, row tile, column tile).
    fn items(spec: &ConvSpec, th: usize, tw: usize) -> usize {
        let [od, oh, ow] = spec.output3();
        spec.n() * od * oh.div_ceil(th) * ow.div_ceil(tw)
    }

    /// A whole row where it is at most 128 wide (1-D rows: the widest whose input window
    /// is one TMA box), else the row in equal parts of at most that (video-vae-decoder's
    /// 160: two of 80, not 128 + 32).
    fn default_width(spec: &ConvSpec) -> usize {
        let [od, oh, ow] = spec.output3();
        let widest = if oh == 1 && od == 1 {
            (1..=MAX_BOX / SEGMENT)
                .rev()
                .map(|k| k * SEGMENT)
                .find(|&t| Self::window_w(spec, t) <= MAX_BOX)
                .unwrap_or(SEGMENT)
        } else {
            128
        };
        let parts = ow.div_ceil(widest);
        ow.div_ceil(parts).next_multiple_of(SEGMENT)
    }

    /// Kernel rows a thread may take: KH's near-equal divisions whose values fit.
    fn rows_per_thread(spec: &ConvSpec) -> Vec<i64> {
        let kh = spec.kernel3()[1];
        let mut v: Vec<i64> = (1..=kh)
            .map(|g| kh.div_ceil(g))
            .filter(|&r| Self::values(spec, r) <= MAX_VALUES)
            .map(|r| r as i64)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

impl Variant for WgradTile {
    fn name(&self) -> &'static str {
        "wgrad_tile"
    }
    fn pass(&self) -> Pass {
        Pass::Wgrad
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/wgrad_tile.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        if spec.layout() != Layout::ChannelsFirst {
            return Err("needs channels-first data".into());
        }
        if spec.stride3()[1] != 1 || spec.dilation3()[1] != 1 {
            return Err(
                "needs unit stride and dilation along H (output rows share input rows)".into(),
            );
        }
        if Self::values(spec, 1) > MAX_VALUES {
            return Err(format!(
                "a kernel row of {} taps needs more than {MAX_VALUES} values a thread",
                spec.kernel3()[2]
            ));
        }
        let smallest = Params {
            tw: SEGMENT,
            rw: 1,
            workers: 1,
            rows: 1,
            splits: 1,
            tma: 0,
            minblocks: 1,
        };
        Self::check(spec, &smallest)
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        let ow = spec.output3()[2];
        // Tiles up to the first width that holds the whole row, and the whole row itself.
        let whole = ow.next_multiple_of(SEGMENT);
        let mut cols: Vec<i64> = TILE_COLS
            .iter()
            .copied()
            .filter(|&c| c == 8 || (c as usize) / 2 < ow)
            .chain([whole as i64, Self::default_width(spec) as i64])
            .chain((2..=4).map(|k| ow.div_ceil(k).next_multiple_of(SEGMENT) as i64))
            .filter(|&c| c as usize <= MAX_BOX)
            .collect();
        cols.sort_unstable();
        cols.dedup();
        vec![
            Param {
                name: "tw",
                values: cols,
            },
            Param {
                name: "rw",
                values: WORKER_ROWS.to_vec(),
            },
            Param {
                name: "workers",
                values: vec![1, 2, 4, 8, 16],
            },
            Param {
                name: "rows",
                values: Self::rows_per_thread(spec),
            },
            Param {
                name: "splits",
                values: vec![1, 2, 4, 8, 16, 32, 64, 128, 256],
            },
            Param {
                name: "tma",
                values: if Self::tma_fits(spec, 1, SEGMENT).is_ok() {
                    vec![0, 1]
                } else {
                    vec![0]
                },
            },
            Param {
                name: "minblocks",
                values: vec![1, 2, 3, 4],
            },
        ]
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        let kw = spec.kernel3()[2];
        let oh = spec.output3()[1];
        let tw = Self::default_width(spec);
        // All kernel rows a thread where they fit in ~32 sums (3x3, the seed's 5x5: 15,
        // 25), else the fewest groups that do.
        let rows = Self::rows_per_thread(spec)
            .into_iter()
            .map(|r| r as usize)
            .filter(|&r| r * kw <= 32)
            .max()
            .unwrap_or(1);
        // Workers until ~64-128 threads, each at least 2 rows where the plane has them
        // (tuned, run 196: 4 workers on the seed in both dtypes and on x3d, 8 rows a
        // worker on x3d, 6 on the seed).
        let base = Self::threads(
            spec,
            &Params {
                tw,
                rw: 1,
                workers: 1,
                rows,
                splits: 1,
                tma: 0,
                minblocks: 1,
            },
        );
        let mut workers = 1usize;
        while base * workers * 2 <= 128 && 2 * workers * 2 <= oh {
            workers *= 2;
        }
        // Rows a worker: 3-8 with the fewest padded rows, the most on a tie (the KH - 1
        // halo rows amortized): the seed's 45 rows at 4 workers: 6 (two tiles of 24).
        let rw = (3..=8usize)
            .rev()
            .min_by_key(|&r| oh.div_ceil(r * workers) * r * workers)
            .unwrap_or(1)
            .min(oh.max(1));
        let th = rw * workers;
        // About 16 blocks an SM of a 132-SM H100 over the launch (x3d tuned 32 splits, the
        // seed 16; run 289, A/B against 8: seed-f32 0.640 -> 0.602 ms, x3d 0.131 -> 0.126,
        // 1-D and RepLKNet within 1.5%), each at least 4 items, partials under ~1/4 of the
        // bytes the pass reads.
        let want = (16 * 132usize).div_ceil(spec.c());
        let by_items = (Self::items(spec, th, tw) / 4).max(1);
        let by_bytes = Wgrad::splits_within(spec, 4);
        let mut splits = 1usize;
        while splits < want && splits * 2 <= by_items.min(by_bytes).min(256) {
            splits *= 2;
        }
        // The register cap: 64 a thread where its values are few (x3d's 3x3 rows: 52,
        // tuned minblocks 4), 128 where a block of more than 128 threads must fit twice
        // (the seed's body takes 167 uncapped), none for smaller blocks (seed-f32 tuned:
        // 128 threads, minblocks 1).
        let threads = base * workers;
        let minblocks = if Self::values(spec, rows) <= 56 {
            4
        } else if threads > 128 {
            2
        } else {
            1
        };
        let mut p = Params {
            tw,
            rw,
            workers,
            rows,
            splits,
            tma: Self::tma_fits(spec, th, tw).is_ok() as usize,
            minblocks,
        };
        // Shrink the tile until it fits (f32's seed: 6 rows a worker take 140 KB).
        while (Self::check(spec, &p).is_err() || Self::shared_bytes(spec, &p) > MAX_SHARED / 2)
            && p.rw > 1
        {
            p.rw -= 1;
        }
        if Self::check(spec, &p).is_err() {
            p.tma = 0;
        }
        p.config(self.name())
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "wgrad_tile_dwconv<{}, {kd}, {kh}, {kw}, {}, {}, {}, {}, {}, {}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            spec.stride3()[2],
            spec.dilation3()[2],
            p.th(),
            p.tw,
            p.rw,
            p.rows,
            Self::offset(spec),
            p.tma,
            p.minblocks
        ))
    }
    fn tensor_maps(&self, spec: &ConvSpec, config: &Config) -> Option<TensorMaps> {
        let p = Params::read(config).ok()?;
        Some(if p.tma != 0 {
            // An item's KD x HT x XW input window and its TH x TW grad-output tile.
            TensorMaps::Boxes {
                input: [
                    Self::window_w(spec, p.tw) as u32,
                    Self::window_h(spec, p.th()) as u32,
                    spec.kernel3()[0] as u32,
                ],
                output: Some([p.tw as u32, p.th() as u32, 1]),
                output_swizzled: false,
            }
        } else {
            TensorMaps::Unused
        })
    }
    fn fits(&self, spec: &ConvSpec, config: &Config) -> std::result::Result<(), String> {
        Self::check(spec, &Params::read(config).map_err(|e| e.to_string())?)
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        // `parse` checked the config against the space and `fits`.
        let p = Params::parse(self, spec, config)?;
        Ok(Launch {
            grid: (grid_x(self, spec, spec.c())?, p.splits as u32, 1),
            block: (Self::threads(spec, &p).next_multiple_of(32) as u32, 1, 1),
            shared_bytes: Self::shared_bytes(spec, &p) as u32,
        })
    }
    fn partial_splits(&self, spec: &ConvSpec, config: &Config) -> Result<Option<usize>> {
        Ok(Some(Params::parse(self, spec, config)?.splits))
    }
}

impl Params {
    /// Output rows of a tile.
    fn th(&self) -> usize {
        self.rw * self.workers
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::ConvParams;
    use crate::suite::{models_suite, public_suite};

    #[test]
    fn defaults_fit_and_launch_on_every_case_it_takes() {
        let cases = public_suite()
            .unwrap()
            .into_iter()
            .chain(models_suite().unwrap());
        let mut taken = 0;
        for case in cases {
            let spec = &case.spec;
            if WgradTile.applies(spec).is_err() {
                continue;
            }
            taken += 1;
            let d = WgradTile.default_config(spec);
            WgradTile
                .fits(spec, &d)
                .unwrap_or_else(|e| panic!("{}: {d}: {e}", case.name));
            let l = WgradTile.launch(spec, &d, 132).unwrap();
            assert!(l.block.0 as usize <= MAX_THREADS, "{}: {d}", case.name);
            assert!(l.block.0 >= 32, "{}: {d}", case.name);
        }
        // The seed (three dtypes), x3d, video-vae, convnext, causal-conv1d at least.
        assert!(taken >= 7, "{taken}");
    }

    #[test]
    fn the_seed_takes_tma_boxes_and_every_kernel_row() {
        let seed = ConvParams::seed().validate().unwrap();
        let d = WgradTile.default_config(&seed);
        assert_eq!(
            (d.get("tw"), d.get("rows"), d.get("tma")),
            (Some(80), Some(5), Some(1)),
            "{d}"
        );
        // pw = 2: the window starts 6 bf16 (one vector minus 2) left of the first tap.
        assert_eq!(WgradTile::offset(&seed), 6);
        assert_eq!(WgradTile::window_w(&seed, 80), 96);
        let mut f32 = ConvParams::seed();
        f32.dtype = crate::spec::DType::F32;
        let f32 = f32.validate().unwrap();
        assert_eq!(WgradTile::offset(&f32), 2);
        assert_eq!(WgradTile::window_w(&f32, 80), 88);
    }

    #[test]
    fn strided_rows_and_odd_widths_are_refused_or_copied_by_threads() {
        let mut p = ConvParams::seed();
        p.stride = vec![1, 2, 1];
        assert!(WgradTile.applies(&p.validate().unwrap()).is_err());
        // 47 columns: rows are not 16-byte multiples, so the threads copy.
        let mut p = ConvParams::seed();
        p.input = vec![5, 9, 47];
        let spec = p.validate().unwrap();
        assert!(WgradTile.applies(&spec).is_ok());
        assert_eq!(WgradTile.default_config(&spec).get("tma"), Some(0));
        assert_eq!(WgradTile.space(&spec)[5].values, vec![0]);
    }
}
