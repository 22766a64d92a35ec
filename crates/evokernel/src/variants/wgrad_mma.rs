//! `wgrad_mma`: grad-weight and grad-bias on tensor cores (kernels/wgrad_mma.cu), bf16 and
//! f16 on channels-first data with unit H/W strides and unit H dilation. Per output row
//! an MMA of the KD*KH input rows it reads (M) with the grad-output row as a Toeplitz
//! matrix (N = the KW taps), along W (K); input rows stay in registers while the rows
//! that read them pass. Deterministic, with wgrad's partials and finalize. Parameters:
//! `ks` k-steps of 16 columns per W tile, `bk` output rows per work item in units of KH,
//! `ring` slots of each warp's cp.async ring (rows in flight + 1), `warps` per block (one
//! channel), `splits` slices of each channel's items.

use super::{cuda_type, grid_x, Config, Launch, Param, Variant};
use crate::error::{Error, Result};
use crate::pass::Pass;
use crate::spec::{ConvSpec, DType, Layout};

pub struct WgradMma;

typed_params!(Params {
    ks,
    bk,
    ring,
    warps,
    splits
});

/// Most tap rows (KD*KH): one 16-row MMA tile; mirrors the kernel's static_assert.
const MAX_TAP_ROWS: usize = 16;
/// Widest kernel row: two 8-column MMA tiles.
const MAX_KW: usize = 16;
const KSTEPS: [i64; 9] = [2, 3, 4, 5, 6, 7, 8, 9, 10];
const BANDS: [i64; 10] = [1, 2, 3, 4, 5, 6, 8, 10, 12, 16];

impl WgradMma {
    /// Outputs of a W tile with `ks` k-steps (the kernel's WgradMmaTile::TW).
    fn tile_width(spec: &ConvSpec, ks: usize) -> usize {
        let (kw, dw) = (spec.kernel3()[2], spec.dilation3()[2]);
        let cols = 16 * ks;
        let need = 3 + (kw - 1) * dw;
        if cols < need + 4 {
            0
        } else {
            (cols - need) / 4 * 4
        }
    }

    fn n_tiles(spec: &ConvSpec) -> usize {
        spec.kernel3()[2].div_ceil(8)
    }

    /// Work items of one channel: (n, od, band, W tile).
    fn items(spec: &ConvSpec, ks: usize, bk: usize) -> usize {
        let [od, oh, ow] = spec.output3();
        let bh = bk * spec.kernel3()[1];
        spec.n() * od * oh.div_ceil(bh) * ow.div_ceil(Self::tile_width(spec, ks).max(1))
    }

    /// Shared bytes of a block: per warp a ring of `ring` slots (KD input rows and a
    /// grad-output row between zero margins each) and the f32 sums (mirrors the kernel's
    /// WgradMmaRing).
    fn shared_bytes(spec: &ConvSpec, ks: usize, ring: usize, warps: usize) -> usize {
        let dw = spec.dilation3()[2];
        let left = (4 + (8 * Self::n_tiles(spec) - 1) * dw).div_ceil(4) * 4;
        let slot = spec.kernel3()[0] * 16 * ks + left + 16 * ks + 8;
        warps * (ring * slot * 2 + (spec.taps() + 1) * 4)
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
            return Err("no W tile of at most 10 k-steps holds the kernel's width".into());
        }
        Ok(())
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        let [_, oh, ow] = spec.output3();
        let kh = spec.kernel3()[1];
        // No wider tile than one that holds the whole row; no taller band than the plane.
        let mut ks = Vec::new();
        for &k in &KSTEPS {
            let tw = Self::tile_width(spec, k as usize);
            if tw >= 4 {
                ks.push(k);
                if tw >= ow {
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
        ]
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        let [_, oh, ow] = spec.output3();
        let kh = spec.kernel3()[1];
        let space = self.space(spec);
        // The tile that wastes fewest columns (k-steps x tiles), fewer tiles on a tie
        // (each tile reloads its band's first KH - 1 rows), at most 8 k-steps (the
        // input rows held take 4 registers a k-step).
        let ks = space[0]
            .values
            .iter()
            .copied()
            .filter(|&k| k <= 8)
            .min_by_key(|&k| {
                let tiles = ow.div_ceil(Self::tile_width(spec, k as usize));
                (tiles * k as usize, tiles)
            })
            .unwrap_or(space[0].values[0]);
        // The band whose row steps, each band's KH - 1 filling rows included, are fewest.
        let bk = space[1]
            .values
            .iter()
            .copied()
            .min_by_key(|&b| {
                let bh = b as usize * kh;
                (
                    oh.div_ceil(bh) * (bh.min(oh) + kh - 1),
                    usize::MAX - b as usize,
                )
            })
            .unwrap_or(1);
        let warps = 4usize;
        // About 4 blocks an SM of a 132-SM H100, each warp with 2 items or more.
        let want = (4 * 132usize).div_ceil(spec.c().max(1));
        let cap = (Self::items(spec, ks as usize, bk as usize) / (2 * warps)).clamp(1, 32);
        let mut splits = 1usize;
        while splits < want && splits * 2 <= cap {
            splits *= 2;
        }
        Config::new(
            self.name(),
            &[
                ("ks", ks),
                ("bk", bk),
                ("ring", 4),
                ("warps", warps as i64),
                ("splits", splits as i64),
            ],
        )
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "wgrad_mma_dwconv<{}, {kd}, {kh}, {kw}, {}, {}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            spec.dilation3()[2],
            p.ks,
            Self::n_tiles(spec),
            p.bk,
            p.ring
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        let p = Params::parse(self, spec, config)?;
        if Self::tile_width(spec, p.ks) < 4 {
            return Err(Error::NotApplicable {
                variant: self.name().into(),
                spec: spec.to_string(),
                reason: format!("{} k-steps hold no W tile", p.ks),
            });
        }
        Ok(Launch {
            grid: (grid_x(self, spec, spec.c())?, p.splits as u32, 1),
            block: (p.warps as u32 * 32, 1, 1),
            shared_bytes: Self::shared_bytes(spec, p.ks, p.ring, p.warps) as u32,
        })
    }
    fn partial_splits(&self, spec: &ConvSpec, config: &Config) -> Result<Option<usize>> {
        Ok(Some(Params::parse(self, spec, config)?.splits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::public_suite;

    #[test]
    fn tiles_cover_the_rows_they_claim() {
        for case in public_suite().unwrap() {
            let s = &case.spec;
            if WgradMma.applies(s).is_err() {
                continue;
            }
            let (kw, dw, pw) = (s.kernel3()[2], s.dilation3()[2], s.pad_before3()[2]);
            for &ks in &WgradMma.space(s)[0].values {
                let tw = WgradMma::tile_width(s, ks as usize);
                assert_eq!(tw % 4, 0);
                // The first column is ow0 - pw rounded down to 4; the last one read is
                // (ow0 + tw - 1) - pw + (kw - 1) dw, inside the 16 ks columns.
                let first = -(pw as i64) - (-(pw as i64)).rem_euclid(4);
                let last = tw as i64 - 1 - pw as i64 + ((kw - 1) * dw) as i64;
                assert!(last - first < 16 * ks, "{} ks={ks}", case.name);
            }
        }
    }

    #[test]
    fn the_seed_takes_one_tile_per_row_and_one_band_per_plane() {
        let seed = crate::spec::ConvParams::seed().validate().unwrap();
        let c = WgradMma.default_config(&seed);
        assert_eq!(
            c.to_string(),
            "wgrad_mma:bk=10,ks=6,ring=4,splits=2,warps=4"
        );
        assert_eq!(WgradMma::items(&seed, 6, 10), 59);
    }
}
