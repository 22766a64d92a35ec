//! `wgrad_mma_cl`: `wgrad_mma`'s grad-weight on tensor cores for channels-last data
//! (kernels/wgrad_mma_cl.cu over kernels/wgrad_mma.cu's body), without the channels-first
//! copies the engine otherwise makes for it. A block takes `channels` (8 or 16)
//! consecutive channels, a warp each, on the same work items; one TMA box a tensor a slot
//! brings their rows in as pixels, and the block's warps transpose each slot into the
//! channels-first layout the MMA rows read. Parameters: `ks` k-steps of 16 columns per W
//! tile, `bk` output rows per work item in units of KH, `ring` staging slots (boxes in
//! flight + 1), `channels` per block, `splits` slices of each channel group's items,
//! `rows` output rows a slot (more than 1 where one tile is the whole row), `groups` of 8
//! channels' warps that transpose and meet at barriers of their own (2 with 16 channels:
//! one group runs its MMA rows while the other transposes), `minblocks` blocks an SM the
//! register allocation must allow. bf16 and f16, unit H/W strides and H
//! dilation, C a multiple of 8 (the boxes' 16-byte pixels); Hopper's TMA (off Hopper the
//! same staging by 16-byte loads).

use super::wgrad_mma::{WgradMma, BANDS, KSTEPS, MAX_KW, MAX_TAP_ROWS};
use super::{cuda_type, grid_x, within_shared, Config, Launch, Param, TensorMaps, Variant};
use crate::error::Result;
use crate::pass::Pass;
use crate::spec::{ConvSpec, DType, Layout};

pub struct WgradMmaCl;

typed_params!(Params {
    ks,
    bk,
    ring,
    channels,
    splits,
    rows,
    groups,
    minblocks
});

const fn up64(v: usize) -> usize {
    v.div_ceil(64) * 64
}

impl WgradMmaCl {
    /// Outputs of a W tile (TMA alignment: multiples of 8).
    fn tile_width(spec: &ConvSpec, ks: usize) -> usize {
        WgradMma::tile_width(spec, ks, true)
    }

    /// Columns of a slot's grad-output box: whole rows past the tile (the next row's left
    /// margin) where a slot holds several, else the tile (the kernel's WgradMmaRing::GYBOX).
    fn gy_box(spec: &ConvSpec, ks: usize, rows: usize) -> usize {
        if rows > 1 {
            WgradMma::gy_row(spec, ks)
        } else {
            Self::tile_width(spec, ks)
        }
    }

    /// Shared bytes of a block (mirrors the kernel's layout): each warp's slot (8
    /// elements apart for the transposes' banks), the staging ring 128-byte aligned, the
    /// warps' f32 sums, a barrier a staging slot (two with groups: full and empty).
    fn shared_bytes(spec: &ConvSpec, p: &Params) -> usize {
        let warps = p.channels;
        let tslot = WgradMma::slot(spec, p.ks, p.rows, true, 1) + 8;
        let sg = up64(p.rows * Self::gy_box(spec, p.ks, p.rows) * p.channels);
        let stg = up64(sg + spec.kernel3()[0] * p.rows * 16 * p.ks * p.channels);
        let elems = up64(warps * tslot) + p.ring * stg;
        let sums = elems * 2 + warps * (spec.taps() + 1) * 4;
        let barriers = if p.groups > 1 { 2 } else { 1 };
        sums.div_ceil(8) * 8 + p.ring * 8 * barriers
    }
}

impl Variant for WgradMmaCl {
    fn name(&self) -> &'static str {
        "wgrad_mma_cl"
    }
    fn pass(&self) -> Pass {
        Pass::Wgrad
    }
    fn source(&self) -> &'static str {
        concat!(
            include_str!("../../kernels/wgrad_mma.cu"),
            include_str!("../../kernels/wgrad_mma_cl.cu")
        )
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        if spec.dtype() == DType::F32 {
            return Err("f32 has no tensor-core path (bf16 and f16 only)".into());
        }
        if spec.layout() != Layout::ChannelsLast {
            return Err("channels-last data only (wgrad_mma takes channels-first)".into());
        }
        if !spec.c().is_multiple_of(8) {
            return Err(format!(
                "{} channels: the TMA boxes need a multiple of 8 (16-byte pixels)",
                spec.c()
            ));
        }
        let ([_, sh, sw], [dd, dh, _]) = (spec.stride3(), spec.dilation3());
        if sh != 1 || sw != 1 || dh != 1 {
            return Err("unit strides along H and W and unit dilation along H only".into());
        }
        let [kd, kh, kw] = spec.kernel3();
        if dd != 1 && kd > 1 {
            return Err("a slot's input depths are one box: unit dilation along D".into());
        }
        if kd * kh > MAX_TAP_ROWS {
            return Err(format!(
                "{} tap rows (KD x KH) exceed one {MAX_TAP_ROWS}-row MMA tile",
                kd * kh
            ));
        }
        if kw > MAX_KW {
            return Err(format!("a kernel {kw} wide exceeds {MAX_KW} taps per row"));
        }
        if WgradMma::left(spec, true) > 64 {
            return Err("the grad-output rows' left margin exceeds 64 columns".into());
        }
        if self.space(spec)[0].values.is_empty() {
            return Err("no W tile of at most 12 k-steps holds the kernel's width".into());
        }
        Ok(())
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        let [_, oh, ow] = spec.output3();
        let kh = spec.kernel3()[1];
        let mut ks = Vec::new();
        for &k in &KSTEPS {
            let tw = Self::tile_width(spec, k as usize);
            if tw >= 8 {
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
        let channels = if spec.c() >= 16 { vec![8, 16] } else { vec![8] };
        let param = |name, values| Param { name, values };
        vec![
            param("ks", ks),
            param("bk", bk),
            param("ring", vec![2, 4]),
            param("channels", channels),
            param("splits", vec![1, 2, 4, 8, 16, 32, 64]),
            param("rows", WgradMma::rows_choices(spec)),
            param("groups", vec![1, 2]),
            param("minblocks", vec![1, 2]),
        ]
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        let space = self.space(spec);
        // wgrad_mma's choice of tile and band (its runs 184 and 204).
        let (ks, bk, whole_rows) =
            WgradMma::tile_and_band(spec, &space[0].values, &space[1].values, true);
        let rows = if whole_rows {
            WgradMma::whole_row_slot(spec)
        } else {
            1
        };
        // 16 channels a block (one a SM: 16 warps) on kernel rows of >= 5 taps: the NDHWC
        // seeds 0.545-0.551 ms against 8 channels' 0.558-0.560 at two blocks an SM (H100
        // runs 345 and 347, three rounds); 8 on 3-wide rows (x3d-ndhwc 0.232 vs 16's 0.267).
        let channels = if spec.c() >= 16 && spec.kernel3()[2] >= 5 {
            16
        } else {
            8
        };
        let mut p = Params {
            ks: ks as usize,
            bk: bk as usize,
            ring: 2,
            channels,
            splits: 1,
            rows: rows as usize,
            // 16 channels in two groups of 8: one group's MMA rows overlap the other's
            // transposes (NDHWC seeds 0.554 -> 0.486 ms, 0.878x, H200 run 351, two rounds).
            groups: if channels == 16 { 2 } else { 1 },
            minblocks: 1,
        };
        // As many blocks an SM as shared memory holds, within 16 warps an SM (128
        // registers a thread).
        p.minblocks = (super::MAX_SHARED / Self::shared_bytes(spec, &p)).clamp(1, 16 / channels);
        // About 4 waves of blocks over a 132-SM H100, each block with an item or more.
        let groups = spec.c().div_ceil(p.channels);
        let want = (4 * 132 * p.minblocks).div_ceil(groups.max(1));
        let cap = WgradMma::items(spec, p.ks, p.bk, true, 1).clamp(1, 64);
        while p.splits < want && p.splits * 2 <= cap {
            p.splits *= 2;
        }
        p.config(self.name())
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "wgrad_mma_cl_dwconv<{}, {kd}, {kh}, {kw}, {}, {}, {}, {}, {}, {}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            spec.dilation3()[2],
            p.ks,
            WgradMma::n_tiles(spec),
            p.bk,
            p.ring,
            p.rows,
            p.channels,
            p.groups,
            p.minblocks
        ))
    }
    fn tensor_maps(&self, spec: &ConvSpec, config: &Config) -> Option<TensorMaps> {
        let p = Params::read(config).ok()?;
        let ch = p.channels as u32;
        Some(TensorMaps::ChannelsLast {
            input: [
                ch,
                16 * p.ks as u32,
                p.rows as u32,
                spec.kernel3()[0] as u32,
            ],
            output: Some([
                ch,
                Self::gy_box(spec, p.ks, p.rows) as u32,
                p.rows as u32,
                1,
            ]),
            input_swizzled: false,
        })
    }
    fn fits(&self, spec: &ConvSpec, config: &Config) -> std::result::Result<(), String> {
        let p = Params::read(config).map_err(|e| e.to_string())?;
        let tw = Self::tile_width(spec, p.ks);
        if tw < 8 {
            return Err(format!("{} k-steps hold no W tile", p.ks));
        }
        if p.rows > 1 && tw < spec.output3()[2] {
            return Err(format!(
                "{} rows a slot need a tile that is the whole row ({tw} of {} outputs)",
                p.rows,
                spec.output3()[2]
            ));
        }
        if p.groups > 1 && p.channels != 16 {
            return Err(format!(
                "{} groups need 16 channels (groups of 8), not {}",
                p.groups, p.channels
            ));
        }
        if p.channels * p.minblocks > 16 {
            // More than 512 threads x blocks leaves under 128 registers a thread: the MMA
            // rows' fragments spill (16 channels at 2 blocks: 64 registers, 144 bytes).
            return Err(format!(
                "{} channels (warps) x {} blocks an SM exceed 16 warps",
                p.channels, p.minblocks
            ));
        }
        within_shared(
            "a block's slots and staging ring",
            Self::shared_bytes(spec, &p),
        )
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        let p = Params::parse(self, spec, config)?;
        Ok(Launch {
            grid: (
                grid_x(self, spec, spec.c().div_ceil(p.channels))?,
                p.splits as u32,
                1,
            ),
            block: (p.channels as u32 * 32, 1, 1),
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

    #[test]
    fn the_ndhwc_seed_takes_whole_row_slots_of_sixteen_channels() {
        let cl = crate::suite::channels_last_suite().unwrap();
        let mut seed = crate::spec::ConvParams::seed();
        seed.layout = Layout::ChannelsLast;
        let seed = seed.validate().unwrap();
        let c = WgradMmaCl.default_config(&seed);
        // 80-wide rows in one tile of 6 k-steps, slots of KH = 5 rows, 45 rows in one band.
        assert_eq!(
            c.to_string(),
            "wgrad_mma_cl:bk=10,channels=16,groups=2,ks=6,minblocks=1,ring=2,rows=5,splits=32"
        );
        // Slot: GY 64 + 5 rows of 104 -> 640, + 3 depths x 5 rows x 96 = 2080, to 64:
        // 2112 elements; staging 4160 + 11520 elements a slot.
        let p = Params::read(&c).unwrap();
        assert_eq!(WgradMma::slot(&seed, 6, 5, true, 1), 2112);
        // 16 channels: staging 8320 + 23040 elements a slot, one block an SM; a full and
        // an empty barrier a staging slot (two groups).
        let bytes = WgradMmaCl::shared_bytes(&seed, &p);
        assert_eq!(
            bytes,
            2 * (up64(16 * 2120) + 2 * 31360) + 16 * 76 * 4 + 2 * 16
        );
        assert!(bytes <= crate::variants::MAX_SHARED);
        // 8 channels: two blocks an SM.
        let eight = Params {
            channels: 8,
            groups: 1,
            minblocks: 2,
            ..p
        };
        let bytes = WgradMmaCl::shared_bytes(&seed, &eight);
        assert_eq!(bytes, 2 * (up64(8 * 2120) + 2 * 15680) + 8 * 76 * 4 + 16);
        assert!(2 * bytes <= 228 * 1024);
        // One group of 16 channels: no empty barriers; 8 channels cannot be split.
        let one = Params { groups: 1, ..p };
        assert_eq!(
            WgradMmaCl::shared_bytes(&seed, &one) + 16,
            WgradMmaCl::shared_bytes(&seed, &p)
        );
        let grouped = p;
        let grouped = grouped.config("wgrad_mma_cl");
        assert!(WgradMmaCl.fits(&seed, &grouped).is_ok());
        let eight_grouped = Params { groups: 2, ..eight }.config("wgrad_mma_cl");
        assert!(WgradMmaCl
            .fits(&seed, &eight_grouped)
            .unwrap_err()
            .contains("need 16 channels"));
        // Every channels-last suite case it takes has a default that fits.
        for case in cl {
            if WgradMmaCl.applies(&case.spec).is_ok() {
                let c = WgradMmaCl.default_config(&case.spec);
                crate::variants::check_config(&WgradMmaCl, &case.spec, &c)
                    .unwrap_or_else(|e| panic!("{}: {e}", case.name));
            }
        }
    }

    #[test]
    fn applies_where_the_boxes_can_carry_the_data() {
        let mut p = crate::spec::ConvParams::seed();
        p.layout = Layout::ChannelsLast;
        assert!(WgradMmaCl.applies(&p.clone().validate().unwrap()).is_ok());
        let mut odd = p.clone();
        odd.c = 12;
        assert!(WgradMmaCl
            .applies(&odd.validate().unwrap())
            .unwrap_err()
            .contains("multiple of 8"));
        let mut cf = p.clone();
        cf.layout = Layout::ChannelsFirst;
        assert!(WgradMmaCl.applies(&cf.validate().unwrap()).is_err());
        let mut f32 = p;
        f32.dtype = DType::F32;
        assert!(WgradMmaCl.applies(&f32.validate().unwrap()).is_err());
    }
}
