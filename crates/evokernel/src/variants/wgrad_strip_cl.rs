//! `wgrad_strip_cl`: grad-weight and grad-bias on channels-last data, streaming bands of
//! output rows through a ring of shared-memory slots (kernels/wgrad_strip_cl.cu): a step
//! loads only the input rows its output row adds to the window, so no halo rows are
//! copied twice and several rows fly while one is summed; deterministic, with wgrad's
//! partials and finalize. Parameters: `vec` bytes of channels a thread reads (4 or 8),
//! `cb` channels a block, `rows` tap rows (kd, kh) a thread, `tw` outputs a thread and
//! `segs` threads along a strip row (a strip is `tw * segs` outputs wide), `ring` slots, `splits` slices of the items, `tma` 1: one thread fills
//! a slot with two TMA boxes, `minblocks` a register cap.

use super::wgrad::Wgrad;
use super::wgrad_tile_cl::WgradTileCl;
use super::{cuda_type, grid_x, within_shared, Config, Launch, Param, TensorMaps, Variant};
use crate::error::Result;
use crate::pass::Pass;
use crate::spec::ConvSpec;

pub struct WgradStripCl;

typed_params!(Params {
    vec,
    cb,
    rows,
    tw,
    segs,
    ring,
    splits,
    tma,
    minblocks
});

/// Threads of a block; mirrors `__launch_bounds__(256)`.
const MAX_THREADS: usize = 256;
/// The widest TMA box extent.
const MAX_BOX: usize = 256;
/// SMs of the H100 the defaults are sized for (the launch still takes any count).
const SMS: usize = 132;

/// The ring's geometry along H, mirrored from the kernel: rows a step loads per depth
/// (`new`) and slots a window reaches back (`back`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    new: usize,
    back: usize,
}

impl WgradStripCl {
    fn window(spec: &ConvSpec) -> Window {
        let (kh, sh, dh) = (spec.kernel3()[1], spec.stride3()[1], spec.dilation3()[1]);
        let span = (kh - 1) * dh + 1;
        let new = sh.min(span);
        Window {
            new,
            back: (span - new).div_ceil(new),
        }
    }

    fn threads(spec: &ConvSpec, p: &Params) -> usize {
        p.cb / WgradTileCl::vector(spec, p.vec) * p.segs * Wgrad::groups(spec, p.rows)
    }

    /// Bytes of one slot: KD x NEW input rows of the strip and a grad-output row (regions
    /// 128-byte aligned where TMA boxes land).
    fn slot_bytes(spec: &ConvSpec, p: &Params) -> usize {
        let s = p.cb * spec.dtype().size_bytes();
        let input = spec.kernel3()[0]
            * Self::window(spec).new
            * WgradTileCl::window_w(spec, p.tw * p.segs)
            * s;
        let grad_output = p.tw * p.segs * s;
        WgradTileCl::region(input, p.tma) + WgradTileCl::region(grad_output, p.tma)
    }

    fn shared_bytes(spec: &ConvSpec, p: &Params) -> usize {
        // The segments' reduction reuses the slots (a float a thread).
        (p.ring * Self::slot_bytes(spec, p)).max(4 * Self::threads(spec, p))
    }

    /// `Err(reason)` where TMA boxes cannot fill a block of `cb` channels.
    fn tma_fits(spec: &ConvSpec, p: &Params) -> std::result::Result<(), String> {
        WgradTileCl::tma_pixels_fit(spec, p.cb)?;
        let extents = [
            p.cb,
            WgradTileCl::window_w(spec, p.tw * p.segs),
            Self::window(spec).new,
            spec.kernel3()[0],
        ];
        if extents.iter().any(|&e| e > MAX_BOX) {
            return Err(format!(
                "a TMA box of {extents:?} exceeds {MAX_BOX} along some dim"
            ));
        }
        Ok(())
    }

    /// `Err(reason)` when `p` cannot launch for `spec` (what `fits` says of a config).
    fn check(spec: &ConvSpec, p: &Params) -> std::result::Result<(), String> {
        WgradTileCl::check_thread(spec, p.vec, p.cb, p.rows, p.tw)?;
        let threads = Self::threads(spec, p);
        if threads > MAX_THREADS {
            return Err(format!("{threads} threads exceed a block of {MAX_THREADS}"));
        }
        let ow = spec.output3()[2];
        if (p.segs - 1) * p.tw >= ow {
            return Err(format!(
                "{} segments of {} outputs leave some past a row of {ow}",
                p.segs, p.tw
            ));
        }
        let back = Self::window(spec).back;
        if p.ring <= back {
            return Err(format!(
                "a ring of {} slots holds no step ahead of a window reaching {back} back",
                p.ring
            ));
        }
        if p.tma != 0 {
            Self::tma_fits(spec, p)?;
        }
        within_shared("the ring of slots", Self::shared_bytes(spec, p))
    }

    /// Output rows of every column: what the splits share.
    fn rows(spec: &ConvSpec, p: &Params) -> usize {
        let [od, oh, ow] = spec.output3();
        spec.n() * od * oh * ow.div_ceil(p.tw * p.segs)
    }

    /// Blocks of `p` an SM holds by shared memory and threads (at most 4 counted).
    fn blocks_per_sm(spec: &ConvSpec, p: &Params) -> usize {
        // 228 KB an SM, 1 KB of it reserved per block.
        let by_shared = (228 * 1024) / (Self::shared_bytes(spec, p) + 1024);
        let by_threads = 2048 / Self::threads(spec, p).next_multiple_of(32);
        by_shared.min(by_threads).clamp(1, 4)
    }
}

impl Variant for WgradStripCl {
    fn name(&self) -> &'static str {
        "wgrad_strip_cl"
    }
    fn pass(&self) -> Pass {
        Pass::Wgrad
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/wgrad_strip_cl.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        WgradTileCl::takes_pixels(spec)?;
        if spec.kernel3()[0] > 1 && spec.dilation3()[0] != 1 {
            return Err("a slot holds consecutive input depths: depth dilation must be 1".into());
        }
        let smallest = WgradTileCl::channel_blocks(spec).first().map(|&cb| Params {
            vec: 4,
            cb: cb as usize,
            rows: 1,
            tw: 2,
            segs: 1,
            ring: Self::window(spec).back + 1,
            splits: 1,
            tma: 0,
            minblocks: 1,
        });
        match smallest {
            Some(p) => Self::check(spec, &p).map_err(|why| format!("no config fits: {why}")),
            None => Err("no channel block fits".into()),
        }
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        let back = Self::window(spec).back as i64;
        let tma_any = WgradTileCl::channel_blocks(spec)
            .iter()
            .any(|&cb| WgradTileCl::tma_pixels_fit(spec, cb as usize).is_ok());
        vec![
            Param {
                name: "vec",
                values: vec![4, 8],
            },
            Param {
                name: "cb",
                values: WgradTileCl::channel_blocks(spec),
            },
            Param {
                name: "rows",
                values: WgradTileCl::rows_per_thread(spec),
            },
            Param {
                name: "tw",
                values: WgradTileCl::even_sizes(&[2, 4, 8], spec.output3()[2], 32),
            },
            // Any count up to 16: a row of 56 outputs is 7 segments of 8, 14 of 4.
            Param {
                name: "segs",
                values: (1..=16).collect(),
            },
            // A window's slots plus 1-6 steps ahead.
            Param {
                name: "ring",
                values: (back + 1..=back + 6).collect(),
            },
            // Powers of two, and whole waves of 1-6 blocks on each of an H100's 132 SMs.
            Param {
                name: "splits",
                values: vec![
                    1, 2, 4, 8, 16, 32, 64, 128, 132, 256, 264, 396, 512, 528, 660, 792,
                ],
            },
            Param {
                name: "tma",
                values: if tma_any { vec![0, 1] } else { vec![0] },
            },
            Param {
                name: "minblocks",
                values: vec![1, 2, 3, 4],
            },
        ]
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        // Tap rows a thread and channels a block as wgrad_tile_cl's defaults.
        let (rows, cb) = WgradTileCl::default_rows_and_block(spec);
        let ow = spec.output3()[2];
        // Wide runs on wide kernel rows: a step's tap row is tw x KW multiply-adds for
        // tw + KW - 1 reads and the step's fixed costs (convnext-t-nhwc, 7x7: 14 outputs
        // 0.061 ms, 4 outputs 0.106; efficientnet-k5s2 0.070 vs 0.077; 3x3 rows gain
        // nothing: run 251); a divisor of the row, so no strip runs past its end.
        let tw = if spec.kernel3()[2] >= 5 {
            WgradTileCl::even_sizes(&[], ow, 14)
                .into_iter()
                .rfind(|&d| d >= 4)
                .map_or(8, |d| d as usize)
        } else {
            4
        };
        let mut p = Params {
            vec: 4,
            cb,
            rows,
            tw,
            segs: 1,
            ring: Self::window(spec).back + 4,
            splits: 1,
            tma: 0,
            minblocks: 1,
        };
        p.tma = Self::tma_fits(spec, &p).is_ok() as usize;
        // The most segments a block's threads take, none wholly past the row.
        for segs in 2..=16 {
            let q = Params { segs, ..p };
            if (segs - 1) * tw < ow
                && Self::check(spec, &q).is_ok()
                && Self::threads(spec, &q) <= 160
            {
                p.segs = segs;
            }
        }
        // Fewer slots where the ring would not fit.
        while p.ring > Self::window(spec).back + 1 && Self::check(spec, &p).is_err() {
            p.ring -= 1;
        }
        // One wave of the blocks the SMs hold.
        let blocks = spec.c().div_ceil(cb);
        let resident = SMS * Self::blocks_per_sm(spec, &p);
        // At least 8 rows a block (each slice start costs P prologue steps).
        let rows = Self::rows(spec, &p) / 8;
        while p.splits * 2 * blocks <= resident && p.splits * 2 <= rows.min(512) {
            p.splits *= 2;
        }
        p.config(self.name())
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        let [_, sh, sw] = spec.stride3();
        let [_, dh, dw] = spec.dilation3();
        // `parse` checked the config (`fits`): the copies exist.
        let copy = WgradTileCl::copy_bytes(spec, p.cb).unwrap_or_default();
        Ok(format!(
            "wgrad_strip_cl_dwconv<{}, {}, {}, {kd}, {kh}, {kw}, {sh}, {sw}, {dh}, {dw}, {}, {}, {}, {}, {copy}, {}, {}>",
            cuda_type(spec.dtype()),
            WgradTileCl::vector(spec, p.vec),
            p.cb,
            p.tw,
            p.segs,
            p.rows,
            p.ring,
            p.tma,
            p.minblocks
        ))
    }
    fn tensor_maps(&self, spec: &ConvSpec, config: &Config) -> Option<TensorMaps> {
        let p = Params::read(config).ok()?;
        Some(if p.tma != 0 {
            // A step's KD x NEW input rows of the strip and its grad-output row.
            TensorMaps::ChannelsLast {
                input: [
                    p.cb as u32,
                    WgradTileCl::window_w(spec, p.tw * p.segs) as u32,
                    Self::window(spec).new as u32,
                    spec.kernel3()[0] as u32,
                ],
                output: Some([p.cb as u32, (p.tw * p.segs) as u32, 1, 1]),
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
        let p = Params::parse(self, spec, config)?;
        Ok(Launch {
            grid: (
                grid_x(self, spec, spec.c().div_ceil(p.cb))?,
                p.splits as u32,
                1,
            ),
            block: (
                (p.cb / WgradTileCl::vector(spec, p.vec) * p.segs) as u32,
                Wgrad::groups(spec, p.rows) as u32,
                1,
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
    use crate::suite::{channels_last_suite, models_suite, public_suite};

    #[test]
    fn defaults_fit_and_launch_on_every_channels_last_case() {
        crate::variants::test_specs::assert_defaults_fit_every_channels_last_case(&WgradStripCl);
    }

    #[test]
    fn the_window_counts_the_rows_a_step_adds() {
        let case = |name: &str| {
            public_suite()
                .unwrap()
                .into_iter()
                .chain(channels_last_suite().unwrap())
                .find(|c| c.name == name)
                .unwrap()
                .spec
        };
        // 3x3 stride 2: two new rows a step, the window's first row in the slot before.
        assert_eq!(
            WgradStripCl::window(&case("mobilenet-s2")),
            Window { new: 2, back: 1 }
        );
        // 5 rows at stride 1: one row a step, four slots back.
        assert_eq!(
            WgradStripCl::window(&case("seed-bf16-ndhwc")),
            Window { new: 1, back: 4 }
        );
    }

    #[test]
    fn wide_kernel_rows_get_runs_that_divide_the_row() {
        let cases: Vec<_> = public_suite()
            .unwrap()
            .into_iter()
            .chain(channels_last_suite().unwrap())
            .chain(models_suite().unwrap())
            .collect();
        let tw = |name: &str| {
            let spec = &cases.iter().find(|c| c.name == name).unwrap().spec;
            let config = WgradStripCl.default_config(spec);
            assert!(WgradStripCl.fits(spec, &config).is_ok(), "{name}");
            config.values["tw"]
        };
        // 7x7 and 5x5 rows: the largest divisor of the output row up to 14 (28 and 80
        // outputs); 3- and 4-tap rows keep runs of 4.
        assert_eq!(tw("convnext-t-nhwc"), 14);
        assert_eq!(tw("convnext-nhwc"), 14);
        assert_eq!(tw("efficientnet-k5s2"), 14);
        assert_eq!(tw("seed-f16-ndhwc"), 10);
        assert_eq!(tw("mobilenet-s2"), 4);
        assert_eq!(tw("causal-conv1d-nwc"), 4);
    }

    #[test]
    fn a_ring_without_a_step_ahead_is_refused_with_the_reason() {
        let spec = public_suite()
            .unwrap()
            .into_iter()
            .find(|c| c.name == "seed-bf16-ndhwc")
            .unwrap()
            .spec;
        let mut c = WgradStripCl.default_config(&spec);
        c.values.insert("ring".into(), 4);
        let why = WgradStripCl.fits(&spec, &c).unwrap_err();
        assert!(why.contains("ring of 4 slots"), "{why}");
    }
}
