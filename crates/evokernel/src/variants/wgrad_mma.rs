//! `wgrad_mma`: grad-weight and grad-bias on tensor cores (kernels/wgrad_mma.cu), bf16 and
//! f16 on channels-first data with unit H/W strides and unit H dilation. Per output row
//! an MMA of the KD*KH input rows it reads (M) with the grad-output row as a Toeplitz
//! matrix (N = the KW taps), along W (K); input rows stay in registers while the rows
//! that read them pass. Deterministic, with wgrad's partials and finalize. Parameters:
//! `ks` k-steps of 16 columns per W tile, `bk` output rows per work item in units of KH,
//! `ring` slots of each warp's ring (rows in flight + 1), `warps` per block (one
//! channel), `splits` slices of each channel's items, `tma` 1: the ring is filled by TMA
//! tensor copies (one lane, two boxes a slot) instead of every lane's cp.async chunks,
//! `rows` output rows a slot (TMA, where one tile is the whole row: fewer, larger boxes),
//! `minblocks` blocks an SM the register allocation must allow (`__launch_bounds__`),
//! `share` 1: the block's warps take consecutive output depths of one item from one
//! ring, whose slots hold the input depths they read between them once (TMA, whole-row
//! slots, unit depth stride and dilation): KD + warps - 1 input rows a row step instead of
//! KD a warp.

use super::{cuda_type, grid_x, Config, Launch, Param, TensorMaps, Variant};
use crate::error::Result;
use crate::pass::Pass;
use crate::spec::{ConvSpec, DType, Layout};

pub struct WgradMma;

typed_params!(Params {
    ks,
    bk,
    ring,
    warps,
    splits,
    tma,
    rows,
    minblocks,
    share
});

/// Most tap rows (KD*KH): one 16-row MMA tile; mirrors the kernel's static_assert.
pub(super) const MAX_TAP_ROWS: usize = 16;
/// Widest kernel row: two 8-column MMA tiles.
pub(super) const MAX_KW: usize = 16;
// Up to 12 (192 columns): video-vae-decoder's 160-wide rows as whole-row slots (11).
pub(super) const KSTEPS: [i64; 11] = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
pub(super) const BANDS: [i64; 10] = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16];

impl WgradMma {
    /// Alignment of a tile's first column and width: TMA copies start at multiples of 16
    /// bytes (the kernel's WgradMmaTile::ALIGN).
    pub(super) fn align(tma: bool) -> usize {
        if tma {
            8
        } else {
            4
        }
    }

    /// Outputs of a W tile with `ks` k-steps (the kernel's WgradMmaTile::TW).
    pub(super) fn tile_width(spec: &ConvSpec, ks: usize, tma: bool) -> usize {
        let (kw, dw) = (spec.kernel3()[2], spec.dilation3()[2]);
        let align = Self::align(tma);
        let cols = 16 * ks;
        let need = align - 1 + (kw - 1) * dw;
        if cols < need + align {
            0
        } else {
            (cols - need) / align * align
        }
    }

    /// Where the ring can be filled by TMA boxes: rows of both tensors 16-byte multiples
    /// (the engine hands over 16-byte aligned tensors), the KD input rows consecutive
    /// depths, the zero margin left of the grad-output row within 64 elements.
    fn tma_applies(spec: &ConvSpec) -> bool {
        let (kd, dd) = (spec.kernel3()[0], spec.dilation3()[0]);
        spec.input3()[2].is_multiple_of(8)
            && spec.output3()[2].is_multiple_of(8)
            && (dd == 1 || kd == 1)
            && Self::left(spec, true) <= 64
    }

    pub(super) fn n_tiles(spec: &ConvSpec) -> usize {
        spec.kernel3()[2].div_ceil(8)
    }

    /// Work items of one channel: (n, a group of `depths` output depths, band, W tile).
    pub(super) fn items(spec: &ConvSpec, ks: usize, bk: usize, tma: bool, depths: usize) -> usize {
        let [od, oh, ow] = spec.output3();
        let bh = bk * spec.kernel3()[1];
        spec.n()
            * od.div_ceil(depths)
            * oh.div_ceil(bh)
            * ow.div_ceil(Self::tile_width(spec, ks, tma).max(1))
    }

    /// Where the block's warps can share one ring of consecutive output depths: a kernel
    /// deeper than 1 (else no input plane serves two output depths), unit stride and
    /// dilation along D (consecutive depths read consecutive input planes).
    fn share_applies(spec: &ConvSpec) -> bool {
        let (kd, sd, dd) = (spec.kernel3()[0], spec.stride3()[0], spec.dilation3()[0]);
        Self::tma_applies(spec) && kd > 1 && sd == 1 && dd == 1
    }

    /// Columns of a slot's grad-output rows with `rows` > 1 (the kernel's
    /// WgradMmaRing::GYROW): its k-range's reads and the next row's left margin.
    pub(super) fn gy_row(spec: &ConvSpec, ks: usize) -> usize {
        (16 * ks + 4)
            .max(Self::tile_width(spec, ks, true) + Self::left(spec, true))
            .div_ceil(8)
            * 8
    }

    /// Rows a slot of whole-row tiles holds by default: KH (one wait a phase cycle, no
    /// tests between its rows) where it is 2-8, else 4 (run 184).
    pub(super) fn whole_row_slot(spec: &ConvSpec) -> i64 {
        match spec.kernel3()[1] {
            kh @ 2..=8 => kh as i64,
            _ => 4,
        }
    }

    /// Output rows a slot may hold: 1, 2, 4, and KH and 2 KH up to 16 (whole phase
    /// cycles: the kernel runs a cycle's rows without tests between them).
    pub(super) fn rows_choices(spec: &ConvSpec) -> Vec<i64> {
        let kh = spec.kernel3()[1] as i64;
        let mut rows = vec![1, 2, 4];
        for r in [kh, 2 * kh] {
            if r <= 16 && !rows.contains(&r) {
                rows.push(r);
            }
        }
        rows.sort_unstable();
        rows
    }

    /// The default's k-steps and band (`ks_values`, `bk_values`: the space's) and whether
    /// its tile is the whole row; `wgrad_mma_cl` takes the same with TMA boxes.
    pub(super) fn tile_and_band(
        spec: &ConvSpec,
        ks_values: &[i64],
        bk_values: &[i64],
        tma: bool,
    ) -> (i64, i64, bool) {
        let [_, oh, ow] = spec.output3();
        let kh = spec.kernel3()[1];
        // A tile that is the whole row where at most 12 k-steps hold it (one box a slot
        // of several rows; run 184's tuning), else the tile that wastes fewest columns
        // (k-steps x tiles), fewer tiles on a tie (each tile reloads its band's first
        // KH - 1 rows), at most 8 k-steps (the input rows held take 4 registers a k-step).
        let fits = |k: i64| Self::tile_width(spec, k as usize, tma) > 0;
        let ks = ks_values
            .iter()
            .copied()
            .find(|&k| fits(k) && Self::tile_width(spec, k as usize, tma) >= ow)
            .or_else(|| {
                ks_values
                    .iter()
                    .copied()
                    .filter(|&k| k <= 8 && fits(k))
                    .min_by_key(|&k| {
                        let tiles = ow.div_ceil(Self::tile_width(spec, k as usize, tma));
                        (tiles * k as usize, tiles)
                    })
            })
            .unwrap_or(ks_values[0]);
        let whole_rows = tma && Self::tile_width(spec, ks as usize, true) >= ow;
        // Whole-row tiles: the plane in equal bands of at most 12 phase cycles (run 204's
        // tuning: bands of 45, 30, 36 and 56 rows on the seed, x3d, video-vae-causal and
        // convnext; each band's start waits for its first rows). Narrower TMA tiles: bands
        // of about half the plane (run 184's tuning picked 2-3 bands). Else the band whose
        // row steps, each band's KH - 1 filling rows included, are fewest.
        let bands = oh.div_ceil(12 * kh);
        let bk = bk_values
            .iter()
            .copied()
            .find(|&b| {
                if whole_rows {
                    b as usize * kh * bands >= oh
                } else {
                    tma && 2 * b as usize * kh >= oh && oh > 2 * kh
                }
            })
            .unwrap_or_else(|| {
                bk_values
                    .iter()
                    .copied()
                    .min_by_key(|&b| {
                        let bh = b as usize * kh;
                        (
                            oh.div_ceil(bh) * (bh.min(oh) + kh - 1),
                            usize::MAX - b as usize,
                        )
                    })
                    .unwrap_or(1)
            });
        (ks, bk, whole_rows)
    }

    /// Zeros left of a grad-output row (the kernel's WgradMmaRing::LEFT).
    pub(super) fn left(spec: &ConvSpec, tma: bool) -> usize {
        (Self::align(tma) + (8 * Self::n_tiles(spec) - 1) * spec.dilation3()[2]).div_ceil(4) * 4
    }

    /// Elements of one ring slot (the kernel's WgradMmaRing::SLOT) holding `rows` output
    /// rows of `depths` output depths: their grad-output rows between zero margins and the
    /// KD + depths - 1 input depths they read.
    pub(super) fn slot(spec: &ConvSpec, ks: usize, rows: usize, tma: bool, depths: usize) -> usize {
        let xrows = (spec.kernel3()[0] + depths - 1) * 16 * ks;
        let left = Self::left(spec, tma);
        let up64 = |v: usize| v.div_ceil(64) * 64;
        if tma {
            let gy = up64(left);
            let gy_rows = if rows > 1 {
                depths * rows * Self::gy_row(spec, ks)
            } else {
                16 * ks + 4
            };
            up64(up64(gy + gy_rows) + rows * xrows)
        } else {
            xrows + left + 16 * ks + 8
        }
    }

    /// Shared bytes of a block: per warp a ring of `ring` slots (KD input rows and a
    /// grad-output row between zero margins, for each of `rows` output rows) and the f32
    /// sums, and with `tma` a barrier a slot (mirrors the kernel's WgradMmaRing and its
    /// barrier offset).
    fn shared_bytes(spec: &ConvSpec, p: &Params) -> usize {
        let (ks, ring, warps, tma, rows) = (p.ks, p.ring, p.warps, p.tma != 0, p.rows);
        // Depths of grad-output rows and input rows a slot holds, and rings a block.
        let rings = if p.share != 0 { 1 } else { warps };
        let slot = Self::slot(spec, ks, rows, tma, p.depths());
        let sums = rings * ring * slot * 2 + warps * (spec.taps() + 1) * 4;
        if tma {
            sums.div_ceil(8) * 8 + rings * ring * 8
        } else {
            sums
        }
    }
}

impl Variant for WgradMma {
    fn name(&self) -> &'static str {
        "wgrad_mma"
    }
    fn pass(&self) -> Pass {
        Pass::Wgrad
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/wgrad_mma.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        if spec.dtype() == DType::F32 {
            return Err("f32 has no tensor-core path (bf16 and f16 only)".into());
        }
        if spec.layout() != Layout::ChannelsFirst {
            return Err("channels-first data only".into());
        }
        let ([_, sh, sw], [_, dh, _]) = (spec.stride3(), spec.dilation3());
        if sh != 1 || sw != 1 || dh != 1 {
            return Err("unit strides along H and W and unit dilation along H only".into());
        }
        let [kd, kh, kw] = spec.kernel3();
        if kd * kh > MAX_TAP_ROWS {
            return Err(format!(
                "{} tap rows (KD x KH) exceed one {MAX_TAP_ROWS}-row MMA tile",
                kd * kh
            ));
        }
        if kw > MAX_KW {
            return Err(format!("a kernel {kw} wide exceeds {MAX_KW} taps per row"));
        }
        if self.space(spec)[0].values.is_empty() {
            return Err("no W tile of at most 12 k-steps holds the kernel's width".into());
        }
        Ok(())
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        let [_, oh, ow] = spec.output3();
        let kh = spec.kernel3()[1];
        // No wider tile than one that holds the whole row (as TMA tiles where they apply,
        // which are at most as wide); no taller band than the plane.
        let tma = Self::tma_applies(spec);
        let mut ks = Vec::new();
        for &k in &KSTEPS {
            if Self::tile_width(spec, k as usize, false) >= 4 {
                ks.push(k);
                if Self::tile_width(spec, k as usize, tma) >= ow {
                    break;
                }
            }
        }
        let mut bk = Vec::new();
        for &b in &BANDS {
            bk.push(b);
            if b as usize * kh >= oh {
                break;
            }
        }
        // TMA's choices where it applies, else the first (cp.async, one row a slot).
        let with_tma = |values: Vec<i64>| {
            if tma {
                values
            } else {
                values[..1].to_vec()
            }
        };
        vec![
            Param {
                name: "ks",
                values: ks,
            },
            Param {
                name: "bk",
                values: bk,
            },
            Param {
                name: "ring",
                values: vec![2, 4, 8],
            },
            Param {
                name: "warps",
                values: vec![2, 4, 8],
            },
            Param {
                name: "splits",
                values: vec![1, 2, 4, 8, 16, 32],
            },
            Param {
                name: "tma",
                values: with_tma(vec![0, 1]),
            },
            Param {
                name: "minblocks",
                values: vec![2, 3, 4, 5, 6, 8],
            },
            Param {
                name: "rows",
                values: with_tma(Self::rows_choices(spec)),
            },
            Param {
                name: "share",
                values: if Self::share_applies(spec) {
                    vec![0, 1]
                } else {
                    vec![0]
                },
            },
        ]
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        let space = self.space(spec);
        let tma = Self::tma_applies(spec);
        let (ks, bk, whole_rows) =
            Self::tile_and_band(spec, &space[0].values, &space[1].values, tma);
        // TMA boxes of narrower tiles (one row a slot): more, smaller blocks with a deeper
        // ring and up to 204 registers (run 184's tuning of video-vae-decoder: 2 warps,
        // 8 slots, 5 blocks, 32 splits). cp.async: run 76's defaults.
        // Whole-row tiles: up to 32 blocks an SM over the launch, an item a warp (run 204).
        let (warps, ring, minblocks, blocks_per_sm) = match (tma, whole_rows) {
            (true, true) => (4usize, 2, 4, 32usize),
            (true, false) => (2, 8, 5, 32),
            (false, _) => (4, 4, 4, 4),
        };
        // Whole-row slots: the block's warps share one ring of consecutive output depths
        // where the depths allow it and there are at least two groups of them.
        let share = whole_rows && Self::share_applies(spec) && spec.output3()[0] >= 2 * warps;
        // About `blocks_per_sm` blocks an SM of a 132-SM H100 over the launch, each warp
        // (with `share`, each block) with `per_warp` items or more.
        let want = (blocks_per_sm * 132).div_ceil(spec.c().max(1));
        // (At least one item a warp with TMA boxes: the tunings' 8-32 splits.)
        let per_warp = if tma { 1 } else { 2 };
        let (depths, takers) = if share { (warps, 1) } else { (1, warps) };
        let cap = (Self::items(spec, ks as usize, bk as usize, tma, depths) / (per_warp * takers))
            .clamp(1, 32);
        let mut splits = 1usize;
        while splits < want && splits * 2 <= cap {
            splits *= 2;
        }
        Config::new(
            self.name(),
            &[
                ("ks", ks),
                ("bk", bk),
                // Whole-row tiles: slots of 4 rows, 2 of them (one filling while the
                // other is read).
                ("ring", ring),
                ("warps", warps as i64),
                ("splits", splits as i64),
                ("tma", i64::from(tma)),
                (
                    "rows",
                    if whole_rows {
                        Self::whole_row_slot(spec)
                    } else {
                        1
                    },
                ),
                ("minblocks", minblocks),
                ("share", i64::from(share)),
            ],
        )
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "wgrad_mma_dwconv<{}, {kd}, {kh}, {kw}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            spec.dilation3()[2],
            p.ks,
            Self::n_tiles(spec),
            p.bk,
            p.ring,
            p.tma,
            p.rows,
            p.share,
            p.warps,
            p.minblocks
        ))
    }
    fn tensor_maps(&self, spec: &ConvSpec, config: &Config) -> Option<TensorMaps> {
        let p = Params::read(config).ok()?;
        Some(if p.tma != 0 {
            // The KD input rows of a k-range, and the grad-output row of a tile.
            let gy_cols = if p.rows > 1 {
                Self::gy_row(spec, p.ks)
            } else {
                Self::tile_width(spec, p.ks, true)
            };
            // The slot's depths: output depths, and the KD + depths - 1 input ones.
            let depths = p.depths();
            TensorMaps::Boxes {
                input: [
                    16 * p.ks as u32,
                    p.rows as u32,
                    (spec.kernel3()[0] + depths - 1) as u32,
                ],
                output: Some([gy_cols as u32, p.rows as u32, depths as u32]),
                output_swizzled: false,
            }
        } else {
            TensorMaps::Unused
        })
    }
    /// The slot shape's rules, here so the tuner's space leaves out what cannot launch
    /// (run 264: 4 of an evolutionary search's 6 candidates on the seed were refused at
    /// launch).
    fn fits(&self, spec: &ConvSpec, config: &Config) -> std::result::Result<(), String> {
        let p = Params::read(config).map_err(|e| e.to_string())?;
        let tw = Self::tile_width(spec, p.ks, p.tma != 0);
        if tw < Self::align(p.tma != 0) {
            return Err(format!("{} k-steps hold no W tile", p.ks));
        }
        if p.rows > 1 && (p.tma == 0 || tw < spec.output3()[2]) {
            return Err(format!(
                "{} rows a slot need TMA copies and a tile that is the whole row ({tw} of {} outputs)",
                p.rows,
                spec.output3()[2]
            ));
        }
        if p.share != 0 && (p.rows < 2 || !Self::share_applies(spec)) {
            return Err(
                "a shared ring needs slots of several whole rows (rows > 1), TMA and \
                        unit stride and dilation along D"
                    .into(),
            );
        }
        Ok(())
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        // `parse` checked the config against the space and `fits`.
        let p = Params::parse(self, spec, config)?;
        Ok(Launch {
            grid: (grid_x(self, spec, spec.c())?, p.splits as u32, 1),
            block: (p.warps as u32 * 32, 1, 1),
            shared_bytes: Self::shared_bytes(spec, &p) as u32,
        })
    }
    fn partial_splits(&self, spec: &ConvSpec, config: &Config) -> Result<Option<usize>> {
        Ok(Some(Params::parse(self, spec, config)?.splits))
    }
}

impl Params {
    /// Output depths a slot holds: the block's warps' with `share`, else the warp's one.
    fn depths(&self) -> usize {
        if self.share != 0 {
            self.warps
        } else {
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::public_suite;

    #[test]
    fn the_default_fits_every_spec_the_variant_takes() {
        // Widths around the tile and k-step edges, kernel widths and W dilations, with and
        // without depths to share, both 16-bit dtypes.
        let mut checked = 0;
        for w in [
            1, 3, 7, 8, 15, 16, 17, 31, 40, 63, 80, 96, 127, 160, 176, 200,
        ] {
            for (kw, dw) in [
                (1, 1),
                (3, 1),
                (3, 2),
                (5, 1),
                (7, 1),
                (7, 3),
                (11, 1),
                (16, 1),
            ] {
                for (d, kd, h) in [(1, 1, 9), (12, 3, 6), (33, 3, 20)] {
                    for dtype in [DType::Bf16, DType::F16] {
                        let mut p = crate::spec::ConvParams::seed();
                        p.dtype = dtype;
                        p.c = 4;
                        p.input = vec![d, h, w];
                        p.kernel = vec![kd, 3, kw];
                        p.dilation = vec![1, 1, dw];
                        p.padding = vec![[0, 0], [1, 1], [(kw - 1) * dw / 2, 0]];
                        let Ok(spec) = p.validate() else { continue };
                        if WgradMma.applies(&spec).is_err() {
                            continue;
                        }
                        let c = WgradMma.default_config(&spec);
                        crate::variants::check_config(&WgradMma, &spec, &c)
                            .unwrap_or_else(|e| panic!("{spec}: {e}"));
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 300, "{checked}");
    }

    #[test]
    fn tiles_cover_the_rows_they_claim() {
        for case in public_suite().unwrap() {
            let s = &case.spec;
            if WgradMma.applies(s).is_err() {
                continue;
            }
            let (kw, dw, pw) = (s.kernel3()[2], s.dilation3()[2], s.pad_before3()[2]);
            for &ks in &WgradMma.space(s)[0].values {
                for tma in [false, true] {
                    let (tw, align) = (
                        WgradMma::tile_width(s, ks as usize, tma),
                        WgradMma::align(tma) as i64,
                    );
                    if tw == 0 {
                        continue;
                    }
                    assert_eq!(tw as i64 % align, 0);
                    // The first column is ow0 - pw rounded down to 4 (8); the last one
                    // read is (ow0 + tw - 1) - pw + (kw - 1) dw, inside the 16 ks columns.
                    let first = -(pw as i64) - (-(pw as i64)).rem_euclid(align);
                    let last = tw as i64 - 1 - pw as i64 + ((kw - 1) * dw) as i64;
                    assert!(last - first < 16 * ks, "{} ks={ks} tma={tma}", case.name);
                }
            }
        }
    }

    #[test]
    fn the_seed_takes_whole_row_tiles_a_plane_an_item() {
        let seed = crate::spec::ConvParams::seed().validate().unwrap();
        let c = WgradMma.default_config(&seed);
        // Slots of KH = 5 rows; one band of 10 phase cycles holds the 45 rows; the 4
        // warps share a ring of 4 output depths (15 items a channel).
        assert_eq!(
            c.to_string(),
            "wgrad_mma:bk=10,ks=6,minblocks=4,ring=2,rows=5,share=1,splits=8,tma=1,warps=4"
        );
        assert_eq!(WgradMma::items(&seed, 6, 10, true, 1), 59);
        assert_eq!(WgradMma::items(&seed, 6, 10, true, 4), 15);
        assert_eq!(WgradMma::tile_width(&seed, 6, true), 80);
    }
}
