//! `wgrad_tile_cl`: grad-weight and grad-bias on channels-last data from shared-memory
//! tiles (kernels/wgrad_tile_cl.cu): a block copies a tile of `th` output rows x `tw`
//! outputs and `cb` channels, with the input window its taps read, into shared memory
//! (cp.async, two buffers) and sums it there; deterministic, with wgrad's partials and
//! finalize. Parameters: `vec` bytes of channels a thread reads (4 or 8), `cb` channels a
//! block, `rows` tap rows (kd, kh) a thread, `th` and `tw` the tile, `workers` per block
//! (each takes every workers-th row of the tile; summed in order), `splits` slices of the
//! items, `tma` 1: one thread fills a buffer with two TMA boxes (where rows of `cb`
//! channels are 16-byte multiples and depth dilation is 1), `minblocks` a register cap.

use super::wgrad::Wgrad;
use super::{cuda_type, grid_x, within_shared, Config, Launch, Param, TensorMaps, Variant};
use crate::error::Result;
use crate::pass::Pass;
use crate::spec::{ConvSpec, Layout};

pub struct WgradTileCl;

typed_params!(Params {
    vec,
    cb,
    rows,
    th,
    tw,
    workers,
    splits,
    tma,
    minblocks
});

/// Accumulators a thread keeps (rows x KW x channels); mirrors the kernel's static_assert.
const MAX_ACCUMULATORS: usize = 64;
/// Values a thread holds: accumulators, a tile row's grad_output and input vectors.
const MAX_VALUES: usize = 160;
/// Threads of a block; mirrors `__launch_bounds__(256)`.
const MAX_THREADS: usize = 256;
const TILE_ROWS: [i64; 4] = [1, 2, 4, 8];
const TILE_COLS: [i64; 3] = [4, 8, 16];

impl WgradTileCl {
    /// Channels a thread reads (`bytes` of them).
    pub(super) fn vector(spec: &ConvSpec, bytes: usize) -> usize {
        (bytes / spec.dtype().size_bytes()).max(1)
    }

    /// Bytes one cp.async moves: the widest of 16, 8, 4 that divides a pixel's channels
    /// and a block's (a copy never straddles either); `None` when 4 does not.
    pub(super) fn copy_bytes(spec: &ConvSpec, cb: usize) -> Option<usize> {
        let s = spec.dtype().size_bytes();
        [16, 8, 4]
            .into_iter()
            .find(|&b| (spec.c() * s).is_multiple_of(b) && (cb * s).is_multiple_of(b))
    }

    /// `Err(reason)` unless the data is channels-last with a pixel's channels in whole
    /// 4-byte copies (what both channels-last grad-weight kernels need).
    pub(super) fn takes_pixels(spec: &ConvSpec) -> std::result::Result<(), String> {
        if spec.layout() != Layout::ChannelsLast {
            return Err("needs channels-last data".into());
        }
        if !(spec.c() * spec.dtype().size_bytes()).is_multiple_of(4) {
            return Err(format!(
                "needs a pixel's channels in whole 4-byte copies; {} channels of {} are not",
                spec.c(),
                spec.dtype()
            ));
        }
        Ok(())
    }

    /// A block's copy bytes, or `Err(reason)` unless a thread's vectors, a block's copies
    /// and a thread's registers fit: `cb` channels in whole `vec`-byte vectors and
    /// 4-16-byte copies, `rows` tap rows of KW taps within the accumulators, and with them
    /// `tw` outputs' grad-output and input vectors within the values a thread holds.
    pub(super) fn check_thread(
        spec: &ConvSpec,
        vec: usize,
        cb: usize,
        rows: usize,
        tw: usize,
    ) -> std::result::Result<usize, String> {
        let v = Self::vector(spec, vec);
        if !cb.is_multiple_of(v) {
            return Err(format!(
                "a block of {cb} channels is not whole {v}-channel vectors"
            ));
        }
        let Some(copy) = Self::copy_bytes(spec, cb) else {
            return Err(format!("{cb} channels a block are not whole 4-byte copies"));
        };
        let kw = spec.kernel3()[2];
        if rows * kw * v > MAX_ACCUMULATORS {
            return Err(format!(
                "{rows} tap rows of {kw} taps x {v} channels exceed {MAX_ACCUMULATORS} accumulators"
            ));
        }
        let values = (rows * kw + tw + Self::window_w(spec, tw)) * v;
        if values > MAX_VALUES {
            return Err(format!("{values} values a thread exceed {MAX_VALUES}"));
        }
        Ok(copy)
    }

    /// `Err(reason)` unless TMA boxes can hold a block's pixels: a pixel's channels and a
    /// block's in 16-byte multiples.
    pub(super) fn tma_pixels_fit(spec: &ConvSpec, cb: usize) -> std::result::Result<(), String> {
        let s = spec.dtype().size_bytes();
        if !(spec.c() * s).is_multiple_of(16) || !(cb * s).is_multiple_of(16) {
            return Err(format!(
                "TMA boxes need a pixel's channels ({}) and a block's ({cb}) in 16-byte multiples",
                spec.c()
            ));
        }
        Ok(())
    }

    /// `base` and the divisors of `extent` from 3 to `max`, sorted: tile sides that split
    /// a plane's rows or columns evenly (convnext-t-nhwc's 28: 7 and 14), not only the
    /// powers of two that leave a ragged last tile.
    pub(super) fn even_sizes(base: &[i64], extent: usize, max: usize) -> Vec<i64> {
        let mut v: Vec<i64> = base
            .iter()
            .copied()
            .chain(
                (3..=max.min(extent))
                    .filter(|d| extent.is_multiple_of(*d))
                    .map(|d| d as i64),
            )
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Bytes of a shared-memory region of `bytes`: 128-byte aligned where a TMA box
    /// lands in it (the kernels' `region` / `ALIGN`).
    pub(super) fn region(bytes: usize, tma: usize) -> usize {
        if tma != 0 {
            bytes.next_multiple_of(128)
        } else {
            bytes
        }
    }

    /// The defaults' tap rows a thread and channels a block: about 16-32 accumulators a
    /// thread (3x3: all 3 rows; 7x7: 2; the seed's 3x5x5: 3), and the most channels a
    /// block of at most 80 threads before workers or segments (tuned, run 110:
    /// mobilenet-s1-nhwc all 144 channels, convnext-nhwc 32, x3d-ndhwc 64, the NDHWC seed
    /// 32).
    pub(super) fn default_rows_and_block(spec: &ConvSpec) -> (usize, usize) {
        let kw = spec.kernel3()[2];
        let v = Self::vector(spec, 4);
        let rows = Self::rows_per_thread(spec)
            .into_iter()
            .map(|r| r as usize)
            .filter(|&r| r * kw * v <= 32)
            .max()
            .unwrap_or(1);
        let groups = Wgrad::groups(spec, rows);
        let cbs = Self::channel_blocks(spec);
        let cb = cbs
            .iter()
            .rev()
            .map(|&b| b as usize)
            .find(|&b| b / v * groups <= 80)
            .unwrap_or(cbs[0] as usize);
        (rows, cb)
    }

    /// Whether a block of `cb` channels can be filled by TMA boxes: the tensors' pixel
    /// rows and the box's rows 16-byte multiples, consecutive kernel depths (a box holds
    /// KD depths), every box extent at most 256.
    fn tma_fits(
        spec: &ConvSpec,
        cb: usize,
        th: usize,
        tw: usize,
    ) -> std::result::Result<(), String> {
        Self::tma_pixels_fit(spec, cb)?;
        let kd = spec.kernel3()[0];
        if kd > 1 && spec.dilation3()[0] != 1 {
            return Err("TMA boxes hold consecutive depths: depth dilation must be 1".into());
        }
        let extents = [cb, Self::window_w(spec, tw), Self::window_h(spec, th), kd];
        if extents.iter().any(|&e| e > 256) {
            return Err(format!(
                "a TMA box of {extents:?} exceeds 256 along some dim"
            ));
        }
        Ok(())
    }

    /// Tap rows a thread may take: KD * KH's near-equal divisions whose accumulators fit
    /// with 4-byte vectors.
    pub(super) fn rows_per_thread(spec: &ConvSpec) -> Vec<i64> {
        let (rows, kw) = (Wgrad::tap_rows(spec), spec.kernel3()[2]);
        let v4 = Self::vector(spec, 4);
        let mut per_thread: Vec<i64> = (1..=rows)
            .map(|g| rows.div_ceil(g))
            .filter(|&r| r * kw * v4 <= MAX_ACCUMULATORS)
            .map(|r| r as i64)
            .collect();
        per_thread.sort_unstable();
        per_thread.dedup();
        per_thread
    }

    /// `Err(reason)` when `p` cannot launch for `spec` (what `fits` says of a config).
    fn check(spec: &ConvSpec, p: &Params) -> std::result::Result<(), String> {
        let copy = Self::check_thread(spec, p.vec, p.cb, p.rows, p.tw)?;
        // Every position's copies need a thread each (the kernel's pstep >= 1).
        let threads = Self::threads(spec, p);
        let copies = p.cb * spec.dtype().size_bytes() / copy;
        if threads < copies {
            return Err(format!(
                "{threads} threads are fewer than the {copies} copies of a position"
            ));
        }
        if p.workers > p.th {
            return Err(format!("{} workers for {} tile rows", p.workers, p.th));
        }
        if threads > MAX_THREADS {
            return Err(format!("{threads} threads exceed a block of {MAX_THREADS}"));
        }
        if p.tma != 0 {
            Self::tma_fits(spec, p.cb, p.th, p.tw)?;
        }
        within_shared("the two tile buffers", Self::shared_bytes(spec, p))
    }

    /// Input positions one tile row reads along W (the kernel's WT).
    pub(super) fn window_w(spec: &ConvSpec, tw: usize) -> usize {
        let (kw, sw, dw) = (spec.kernel3()[2], spec.stride3()[2], spec.dilation3()[2]);
        (tw - 1) * sw + (kw - 1) * dw + 1
    }

    /// Input rows a tile reads per kernel depth (the kernel's HT).
    fn window_h(spec: &ConvSpec, th: usize) -> usize {
        let (kh, sh, dh) = (spec.kernel3()[1], spec.stride3()[1], spec.dilation3()[1]);
        (th - 1) * sh + (kh - 1) * dh + 1
    }

    fn threads(spec: &ConvSpec, p: &Params) -> usize {
        p.cb / Self::vector(spec, p.vec) * Wgrad::groups(spec, p.rows) * p.workers
    }

    fn shared_bytes(spec: &ConvSpec, p: &Params) -> usize {
        let kd = spec.kernel3()[0];
        let s = p.cb * spec.dtype().size_bytes();
        let input = kd * Self::window_h(spec, p.th) * Self::window_w(spec, p.tw) * s;
        let grad_output = p.th * p.tw * s;
        // Two buffers; the workers' reduction reuses them (a float a thread).
        (2 * (Self::region(input, p.tma) + Self::region(grad_output, p.tma)))
            .max(4 * Self::threads(spec, p))
    }

    /// Channels a block may take: powers of two and C's near-equal divisions in whole
    /// 8-byte vectors, at most 256; fewer than 16 only when C itself is (rounded up to a
    /// vector: the copies zero-fill past C).
    pub(super) fn channel_blocks(spec: &ConvSpec) -> Vec<i64> {
        let c = spec.c();
        let v8 = Self::vector(spec, 8);
        let all = c.next_multiple_of(v8);
        let mut v: Vec<i64> = [16usize, 32, 64, 128, 256]
            .into_iter()
            .filter(|&b| b < all)
            .chain((1..=8).filter(|k| c.is_multiple_of(*k)).map(|k| c / k))
            .chain([all])
            .filter(|&b| b.is_multiple_of(v8) && b >= all.min(16) && b <= 256)
            .map(|b| b as i64)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    fn items(spec: &ConvSpec, th: usize, tw: usize) -> usize {
        let [od, oh, ow] = spec.output3();
        spec.n() * od * oh.div_ceil(th) * ow.div_ceil(tw)
    }
}

impl Variant for WgradTileCl {
    fn name(&self) -> &'static str {
        "wgrad_tile_cl"
    }
    fn pass(&self) -> Pass {
        Pass::Wgrad
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/wgrad_tile_cl.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        Self::takes_pixels(spec)?;
        if spec.kernel3()[2] * Self::vector(spec, 4) > MAX_ACCUMULATORS {
            return Err(format!(
                "a kernel row of {} taps needs more than {MAX_ACCUMULATORS} accumulators a thread",
                spec.kernel3()[2]
            ));
        }
        // The smallest config: one tap row a thread, the fewest channels, a 1 x 4 tile.
        let smallest = Self::channel_blocks(spec).first().map(|&cb| Params {
            vec: 4,
            cb: cb as usize,
            rows: 1,
            th: 1,
            tw: 4,
            workers: 1,
            splits: 1,
            tma: 0,
            minblocks: 1,
        });
        match smallest {
            Some(p) if Self::check(spec, &p).is_ok() => Ok(()),
            _ => Err(format!(
                "no tile of {} tap rows fits a block of {MAX_THREADS} threads and its shared memory",
                Wgrad::tap_rows(spec)
            )),
        }
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        vec![
            Param {
                name: "vec",
                values: vec![4, 8],
            },
            Param {
                name: "cb",
                values: Self::channel_blocks(spec),
            },
            Param {
                name: "rows",
                values: Self::rows_per_thread(spec),
            },
            Param {
                name: "th",
                values: Self::even_sizes(&TILE_ROWS, spec.output3()[1], 8),
            },
            Param {
                name: "tw",
                values: Self::even_sizes(&TILE_COLS, spec.output3()[2], 16),
            },
            Param {
                name: "workers",
                values: vec![1, 2, 4, 8],
            },
            Param {
                name: "splits",
                values: vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 512],
            },
            // TMA boxes where some channel block's rows are 16-byte multiples.
            Param {
                name: "tma",
                values: if Self::channel_blocks(spec)
                    .iter()
                    .any(|&cb| Self::tma_fits(spec, cb as usize, 1, 4).is_ok())
                {
                    vec![0, 1]
                } else {
                    vec![0]
                },
            },
            // A register cap for more resident warps (the kernel's MINB).
            Param {
                name: "minblocks",
                values: vec![1, 2, 3, 4],
            },
        ]
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        let v = Self::vector(spec, 4);
        let (rows, cb) = Self::default_rows_and_block(spec);
        let groups = Wgrad::groups(spec, rows);
        // Tall tiles where the kernel is (the halo's KH - 1 rows amortized), wide ones on
        // 2-D planes at unit stride (3-D tiles hold KD input planes in shared memory;
        // mobilenet-s2 at W stride 2: 16 wide 0.115 ms, 8 wide 0.091, run 111).
        let [kd, kh, _] = spec.kernel3();
        let ow = spec.output3()[2];
        let tw = if ow <= 4 {
            4
        } else if kd == 1 && ow >= 32 && spec.stride3()[2] == 1 {
            // 16, or 14 where that divides the row and 16 does not (no ragged last tile:
            // mobilenet-s1-nhwc's 56-wide rows 0.0352 -> 0.0329 ms, run 378, three rounds).
            if !ow.is_multiple_of(16) && ow.is_multiple_of(14) {
                14
            } else {
                16
            }
        } else {
            8
        };
        // (efficientnet-k5s2, H stride 2: 4 rows 0.077 ms, 8 rows 0.125; run 112).
        let th = if kh >= 5 && spec.stride3()[1] == 1 {
            8
        } else {
            4
        };
        let workers = if cb / v * groups * 2 <= MAX_THREADS {
            2
        } else {
            1
        };
        // About 4 blocks per SM of a 132-SM H100, each at least 4 items, and partials
        // under ~1/4 of the bytes the pass reads (convnext-t-nhwc, 49 taps: 1/16 held it
        // at 32 splits, 0.150 ms; tuned 64 splits of 16 channels 0.098; run 112).
        let blocks = spec.c().div_ceil(cb);
        let want = (4 * 132usize).div_ceil(blocks);
        let by_items = (Self::items(spec, th, tw) / 4).max(1);
        let by_bytes = Wgrad::splits_within(spec, 4);
        let mut splits = 1usize;
        while splits < want && splits * 2 <= by_items.min(by_bytes).min(512) {
            splits *= 2;
        }
        let tma = Self::tma_fits(spec, cb, th, tw).is_ok();
        let p = Params {
            vec: 4,
            cb,
            rows,
            th,
            tw,
            workers,
            splits,
            tma: tma as usize,
            minblocks: 1,
        };
        p.config(self.name())
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        // `parse` checked the config (`fits`): the copies exist.
        let copy = Self::copy_bytes(spec, p.cb).unwrap_or_default();
        Ok(format!(
            "wgrad_tile_cl_dwconv<{}, {}, {}, {kd}, {kh}, {kw}, {}, {}, {}, {}, {}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            Self::vector(spec, p.vec),
            p.cb,
            spec.stride3()[2],
            spec.dilation3()[2],
            p.rows,
            p.th,
            p.tw,
            copy,
            p.tma,
            p.minblocks
        ))
    }
    fn tensor_maps(&self, spec: &ConvSpec, config: &Config) -> Option<TensorMaps> {
        let p = Params::read(config).ok()?;
        Some(if p.tma != 0 {
            // An item's KD x HT x WT input window and its TH x TW grad_output tile.
            let kd = spec.kernel3()[0];
            TensorMaps::ChannelsLast {
                input: [
                    p.cb as u32,
                    Self::window_w(spec, p.tw) as u32,
                    Self::window_h(spec, p.th) as u32,
                    kd as u32,
                ],
                output: Some([p.cb as u32, p.tw as u32, p.th as u32, 1]),
                input_swizzled: false,
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
            grid: (
                grid_x(self, spec, spec.c().div_ceil(p.cb))?,
                p.splits as u32,
                1,
            ),
            block: (
                (p.cb / Self::vector(spec, p.vec)) as u32,
                Wgrad::groups(spec, p.rows) as u32,
                p.workers as u32,
            ),
            shared_bytes: Self::shared_bytes(spec, &p) as u32,
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
    fn tile_sides_add_the_divisors_of_the_extent() {
        // A 28-wide plane: 7 and 14 join the powers of two; the cap and 1-2 stay out.
        assert_eq!(
            WgradTileCl::even_sizes(&TILE_COLS, 28, 16),
            vec![4, 7, 8, 14, 16]
        );
        assert_eq!(
            WgradTileCl::even_sizes(&TILE_ROWS, 28, 8),
            vec![1, 2, 4, 7, 8]
        );
        // A prime extent adds only itself, and only under the cap.
        assert_eq!(
            WgradTileCl::even_sizes(&TILE_COLS, 13, 16),
            vec![4, 8, 13, 16]
        );
        assert_eq!(WgradTileCl::even_sizes(&TILE_COLS, 17, 16), vec![4, 8, 16]);
    }

    #[test]
    fn defaults_fit_and_launch_on_every_channels_last_case() {
        crate::variants::test_specs::assert_defaults_fit_every_channels_last_case(&WgradTileCl);
    }

    #[test]
    fn mobilenet_takes_all_its_channels_in_one_block() {
        // 144 f16 channels, 3x3: every tap row a thread (18 accumulators), 72 lanes.
        let mut p = ConvParams::seed();
        p.layout = Layout::ChannelsLast;
        p.c = 144;
        p.dtype = DType::F16;
        p.input = vec![1, 56, 56];
        p.kernel = vec![1, 3, 3];
        p.padding = vec![[0, 0], [1, 1], [1, 1]];
        let spec = p.validate().unwrap();
        let d = WgradTileCl.default_config(&spec);
        assert_eq!((d.get("cb"), d.get("rows")), (Some(144), Some(3)), "{d}");
        assert_eq!(WgradTileCl::copy_bytes(&spec, 144), Some(16));
    }

    #[test]
    fn oversized_tiles_are_refused_with_the_reason() {
        let spec = cl(512, DType::F32);
        let p = Params {
            vec: 8,
            cb: 256,
            rows: 1,
            th: 8,
            tw: 16,
            workers: 8,
            splits: 1,
            tma: 0,
            minblocks: 1,
        };
        let err = WgradTileCl
            .fits(&spec, &p.config("wgrad_tile_cl"))
            .unwrap_err();
        assert!(err.contains("threads") || err.contains("shared"), "{err}");
    }
}
