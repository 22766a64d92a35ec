//! `scaled_mm_wgmma` (kernels/gemm/scaled_mm_wgmma.cu): the scaled GEMM on Hopper's
//! warpgroup MMA, A through TMA and the prepacked B through 1-D bulk copies into a ring of
//! `stages` buffers, one producer and `consumers` MMA warpgroups. Typed config: the tile
//! (BM = 64 x `consumers`, `bn`), the ring depth, the block order (`group_m` tile rows a
//! panel), split-K (`splits`, with a deterministic finalize), persistent blocks and
//! clusters of two blocks sharing B by multicast (`cluster`). It needs sm_90a.

use std::fmt;

use super::spec::{ScaledMmSpec, Scaling};
use crate::variants::{cuda_type, within_shared, Launch};

/// The rung's name: its configs' prefix, the JIT's (and so the CUBIN cache's) source
/// name, the tuner's variant.
pub const NAME: &str = "scaled_mm_wgmma";
/// The kernel's source (compiled after kernels/common.cuh, like the convolutions').
pub const SOURCE: &str = include_str!("../../kernels/gemm/scaled_mm_wgmma.cu");
/// Bytes of K a stage (the 128-byte swizzle span; block-wise scaling's group).
pub const STEP_K: usize = 128;
/// A consumer warpgroup's epilogue staging: 64 rows of 128 bytes padded to 144 (the
/// kernel's EPI_BYTES).
const EPILOGUE_STAGING: usize = 64 * (128 + 16);

/// One config of `scaled_mm_wgmma`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WgmmaConfig {
    pub bn: usize,
    pub consumers: usize,
    pub stages: usize,
    pub group_m: usize,
    pub splits: usize,
    /// 1: one block a SM looping over tiles (the same kernel; only the grid differs).
    pub persistent: usize,
    /// Blocks a cluster (1 or 2): two take vertically adjacent tiles and each loads half
    /// of their common B stage into both (TMA multicast).
    pub cluster: usize,
    /// Block-wise scaling's partial sets a consumer warpgroup keeps (1 elsewhere): 1 waits
    /// for each stage's MMAs before folding them into the total; 2 folds stage k while
    /// stage k + 1's MMAs run.
    pub fold: usize,
}

impl fmt::Display for WgmmaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{NAME}:")?;
        for (i, (name, v)) in Self::NAMES.iter().zip(self.values()).enumerate() {
            let sep = if i == 0 { "" } else { "," };
            write!(f, "{sep}{name}={v}")?;
        }
        Ok(())
    }
}

impl WgmmaConfig {
    pub const NAMES: [&'static str; 8] = [
        "bn",
        "consumers",
        "stages",
        "group_m",
        "splits",
        "persistent",
        "cluster",
        "fold",
    ];

    /// The values in `NAMES`' order (the tuner's config).
    pub fn values(&self) -> [usize; 8] {
        [
            self.bn,
            self.consumers,
            self.stages,
            self.group_m,
            self.splits,
            self.persistent,
            self.cluster,
            self.fold,
        ]
    }

    /// From a parsed `--config` (every parameter given).
    pub fn from_config(c: &crate::variants::Config) -> crate::error::Result<Self> {
        let get = |k: &str| super::kernel::positive_param(c, k);
        let flag = |k: &str, max: usize, says: &str| {
            usize::try_from(c.param(k)?)
                .ok()
                .filter(|&v| v <= max)
                .ok_or_else(|| crate::Error::parse("config", &c.to_string(), says))
        };
        Ok(WgmmaConfig {
            bn: get("bn")?,
            consumers: get("consumers")?,
            stages: get("stages")?,
            group_m: get("group_m")?,
            splits: get("splits")?,
            persistent: flag("persistent", 1, "persistent is 0 or 1")?,
            cluster: get("cluster")?,
            fold: get("fold")?,
        })
    }

    /// The family: N tiles of 64, 128, 192 or 256, one to three consumer warpgroups, 3-6 stages, panels
    /// of 1-16 tile rows, split-K up to 16, persistent or not, clusters of 1 or 2 (those
    /// that fit are kept by `fits`).
    pub fn space() -> Vec<WgmmaConfig> {
        let mut v = Vec::new();
        for bn in [64, 128, 192, 256] {
            for consumers in [1, 2, 3] {
                for stages in [3, 4, 5, 6] {
                    for group_m in [1, 8, 16] {
                        for splits in [1, 2, 4, 8, 16] {
                            for persistent in [0, 1] {
                                for cluster in [1, 2] {
                                    for fold in [1, 2] {
                                        v.push(WgmmaConfig {
                                            bn,
                                            consumers,
                                            stages,
                                            group_m,
                                            splits,
                                            persistent,
                                            cluster,
                                            fold,
                                        });
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        v
    }

    /// A 128 x 256 tile (two consumers; 128 x 128 where that leaves SMs idle), four
    /// stages, panels of 8 tile rows; with 128 x 256 tiles, persistent clusters of two
    /// sharing B (run 128: 8192^3 0.862 ms vs 0.904 for one block a tile, 4096^3 0.115 vs
    /// 0.119, M = 16384 N = 14336 1.549 vs 1.604). Block-wise scaling where its tiles fill
    /// the SMs: 192 x 128 tiles of three consumers, persistent (run 139: 8192^3 1.104 ms vs
    /// 1.248 for two consumers in clusters), in clusters of two where the tile rows pair up
    /// evenly (run 159). Where
    /// the tiles fill less than half the GPU's 132 SMs (decode-sized M and N), split-K up
    /// to filling it (run 7: at M = 128, N = 14336 one split beat two, 0.95x vs 0.72x).
    pub fn default_for(spec: &ScaledMmSpec) -> WgmmaConfig {
        let consumers = if spec.m() <= 64 { 1 } else { 2 };
        // 128 x 256 where those tiles still fill the SMs (run 8: 8192^3 1.083 ms vs 1.140
        // at 128 x 128; at M = 128, N = 14336, 0.85x vs 0.95x of cuBLASLt, too few tiles).
        let wide = spec.scaling() != Scaling::BlockWise
            && spec.m().div_ceil(64 * consumers) * spec.n().div_ceil(256) >= 132;
        let bn = if wide { 256 } else { 128 };
        let tiles = spec.m().div_ceil(64 * consumers) * spec.n().div_ceil(bn);
        let steps = spec.k().div_ceil(STEP_K);
        let mut splits = 1;
        while tiles * splits * 2 <= 132 && splits * 2 <= 16 && steps >= splits * 2 * 4 {
            splits *= 2;
        }
        // Block-wise 192-row tiles where they fill the SMs (split-K is then off) and M
        // exceeds two of them (a short M would pad much of the MMA work; measured at
        // 8192^3 only, run 139), on a ring of three stages in panels of 16 tile rows
        // (8192^3, runs 142-143, six interleaved pairs: 1.088 ms vs 1.104 for 3 stages
        // in panels of 8, 1.108 for 4 stages).
        let tall = spec.scaling() == Scaling::BlockWise
            && spec.m().div_ceil(192) * spec.n().div_ceil(bn) >= 132
            && spec.m() > 2 * 192;
        // Those tiles in clusters of two (sharing B, 4 stages, panels of 8) where the tile
        // rows pair up evenly: a pair past M pads a whole 192-row tile of MMAs. Run 159,
        // A/B on the H100: 4096^3 (22 rows) 0.1398 vs 0.1451 ms, M = 16384 (86) -6%, 6144^3
        // (32) even; odd counts lose: 8192^3 (43) +5%, M = 2048 (11) +11%.
        let paired = tall && spec.m().div_ceil(192).is_multiple_of(2);
        WgmmaConfig {
            bn,
            consumers: if tall { 3 } else { consumers },
            stages: if tall && !paired { 3 } else { 4 },
            group_m: if tall && !paired { 16 } else { 8 },
            splits,
            persistent: usize::from(wide || tall),
            cluster: if wide || paired { 2 } else { 1 },
            fold: 1,
        }
    }

    pub fn bm(&self) -> usize {
        64 * self.consumers
    }

    fn stage_bytes(&self) -> usize {
        (self.bm() + self.bn) * STEP_K
    }

    /// The ring, the epilogue's staging, 1024 bytes of alignment slack and the barriers.
    pub fn shared_bytes(&self) -> usize {
        self.stages * self.stage_bytes()
            + self.consumers * EPILOGUE_STAGING
            + 1024
            + 16 * self.stages
    }

    /// K steps each split takes (every split gets at least one).
    pub fn steps_per_split(&self, spec: &ScaledMmSpec) -> usize {
        spec.k().div_ceil(STEP_K).div_ceil(self.splits)
    }

    /// Splits that actually get K steps.
    pub fn live_splits(&self, spec: &ScaledMmSpec) -> usize {
        spec.k()
            .div_ceil(STEP_K)
            .div_ceil(self.steps_per_split(spec))
    }

    /// `Err(reason)` when this config cannot run `spec`.
    pub fn fits(&self, spec: &ScaledMmSpec) -> Result<(), String> {
        if ![64, 128, 192, 256].contains(&self.bn) {
            return Err(format!(
                "bn {} is not a wgmma N of the family (64, 128, 192, 256)",
                self.bn
            ));
        }
        if !(1..=3).contains(&self.consumers) {
            return Err(format!("{} consumer warpgroups (1 to 3)", self.consumers));
        }
        if self.consumers == 3 && (self.bn > 128 || self.fold > 1) {
            return Err(format!(
                "three consumer warpgroups get 160 registers a thread: bn <= 128 and fold 1 \
                 (not bn {}, fold {})",
                self.bn, self.fold
            ));
        }
        if !(2..=8).contains(&self.stages) {
            return Err(format!("{} stages (2 to 8)", self.stages));
        }
        if self.persistent > 1 {
            return Err(format!("persistent {} (0 or 1)", self.persistent));
        }
        if !(1..=2).contains(&self.cluster) {
            return Err(format!("clusters of {} blocks (1 or 2)", self.cluster));
        }
        if self.cluster > 1 && spec.m() <= self.bm() {
            return Err(format!(
                "a cluster of {} stacks tiles in M, and M = {} is one {}-row tile",
                self.cluster,
                spec.m(),
                self.bm()
            ));
        }
        if !(1..=64).contains(&self.group_m) {
            return Err(format!("group_m {} (1 to 64)", self.group_m));
        }
        if spec.scaling() == Scaling::BlockWise && self.bn > 192 {
            return Err(
                "block-wise scaling keeps a partial set beside the total: bn <= 192 (232 registers)"
                    .into(),
            );
        }
        if !(1..=2).contains(&self.fold) {
            return Err(format!("fold {} (1 or 2 partial sets)", self.fold));
        }
        if self.fold > 1 && self.bn > 128 {
            return Err(format!(
                "fold {} keeps two partial sets beside the total: bn <= 128 (not {})",
                self.fold, self.bn
            ));
        }
        if self.fold > 1 && spec.scaling() != Scaling::BlockWise {
            return Err(format!(
                "fold {} overlaps block-wise scaling's per-stage folds; {} scaling has none (fold=1)",
                self.fold,
                spec.scaling().name()
            ));
        }
        let steps = spec.k().div_ceil(STEP_K);
        if !(1..=steps.min(64)).contains(&self.splits) {
            return Err(format!(
                "{} splits of {steps} K steps (1 to {})",
                self.splits,
                steps.min(64)
            ));
        }
        within_shared("the stage ring", self.shared_bytes())
    }

    /// The tiles `PackedB::pack` must use for this config: (tile_n, tile_k).
    pub fn pack_tiles(&self) -> (usize, usize) {
        (self.bn, STEP_K)
    }

    /// The NVRTC name expression (with the output type, scaling and bias of `spec`).
    pub fn specialization(&self, spec: &ScaledMmSpec) -> String {
        format!(
            "{NAME}<{}, {}, {}, {}, {}, {}, {}, {}, {}, {}>",
            cuda_type(spec.out_dtype()),
            self.bn,
            self.consumers,
            self.stages,
            self.group_m,
            scaling_code(spec.scaling()),
            spec.has_bias(),
            self.splits > 1,
            self.cluster,
            self.fold
        )
    }

    /// The split-K finalize's name expression.
    pub fn finalize_specialization(&self, spec: &ScaledMmSpec) -> String {
        format!(
            "scaled_mm_splitk_finalize<{}, {}>",
            cuda_type(spec.out_dtype()),
            spec.has_bias()
        )
    }

    /// One cluster a cluster tile (`cluster` tiles stacked in M; panel order inside), or
    /// one block a SM of `sms` when persistent; grid.z the splits.
    pub fn launch(&self, spec: &ScaledMmSpec, sms: usize) -> Launch {
        let cluster_tiles =
            spec.m().div_ceil(self.bm() * self.cluster) * spec.n().div_ceil(self.bn);
        let clusters = if self.persistent == 1 {
            cluster_tiles.min((sms / self.cluster).max(1))
        } else {
            cluster_tiles
        };
        Launch {
            grid: (
                (clusters * self.cluster) as u32,
                1,
                self.live_splits(spec) as u32,
            ),
            block: (128 * (self.consumers as u32 + 1), 1, 1),
            shared_bytes: self.shared_bytes() as u32,
        }
    }

    /// The finalize: a grid-stride loop over D.
    pub fn finalize_launch(&self, spec: &ScaledMmSpec) -> Launch {
        let blocks = (spec.m() * spec.n()).div_ceil(256).min(132 * 8);
        Launch {
            grid: (blocks as u32, 1, 1),
            block: (256, 1, 1),
            shared_bytes: 0,
        }
    }

    /// Bytes of f32 partial sums split-K needs ([splits, M, N]); 0 without split-K.
    pub fn workspace_bytes(&self, spec: &ScaledMmSpec) -> usize {
        if self.splits > 1 {
            4 * self.live_splits(spec) * spec.m() * spec.n()
        } else {
            0
        }
    }
}

pub(crate) fn scaling_code(s: Scaling) -> i32 {
    match s {
        Scaling::PerTensor => 0,
        Scaling::RowWise => 1,
        Scaling::BlockWise => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::gemm_suite;
    use crate::DType;

    #[test]
    fn block_wise_tiles_pair_in_clusters_only_where_the_rows_pair_evenly() {
        let cfg = |m, n, k| {
            WgmmaConfig::default_for(
                &ScaledMmSpec::new(m, n, k, Scaling::BlockWise, DType::Bf16, false).unwrap(),
            )
        };
        // 4096 rows: 22 tiles of 192, 11 pairs; 8192: 43 tiles, a pair would pad one.
        let even = cfg(4096, 4096, 4096);
        assert_eq!((even.consumers, even.cluster, even.stages), (3, 2, 4));
        let odd = cfg(8192, 8192, 8192);
        assert_eq!(
            (odd.consumers, odd.cluster, odd.stages, odd.group_m),
            (3, 1, 3, 16)
        );
        assert_eq!(cfg(2048, 4096, 4096).cluster, 1);
        assert_eq!(cfg(16384, 4096, 4096).cluster, 2);
    }

    #[test]
    fn defaults_fit_the_suite_and_split_decode_shapes() {
        for scaling in [Scaling::PerTensor, Scaling::RowWise, Scaling::BlockWise] {
            for (name, spec) in gemm_suite(scaling, DType::Bf16).unwrap() {
                let cfg = WgmmaConfig::default_for(&spec);
                cfg.fits(&spec).unwrap_or_else(|e| panic!("{name}: {e}"));
                let l = cfg.launch(&spec, 132);
                assert_eq!(l.block.0, 128 * (cfg.consumers as u32 + 1), "{name}");
                assert_eq!(l.grid.2 as usize, cfg.live_splits(&spec), "{name}");
                // Every split takes at least one K step, and they cover K.
                let steps = spec.k().div_ceil(STEP_K);
                assert!((l.grid.2 as usize - 1) * cfg.steps_per_split(&spec) < steps);
                assert!(l.grid.2 as usize * cfg.steps_per_split(&spec) >= steps);
                // Fewer tiles than half the SMs: split until they fill it.
                if l.grid.0 * 2 <= 132 {
                    assert!(cfg.splits > 1, "{name}: {cfg}");
                }
                assert!(
                    l.grid.0 * l.grid.2 <= 132 || cfg.splits == 1,
                    "{name}: {cfg}"
                );
                if spec.m() >= 2048 {
                    assert_eq!(cfg.splits, 1, "{name}");
                }
            }
        }
    }

    #[test]
    fn unfit_configs_say_why() {
        let spec =
            ScaledMmSpec::new(256, 256, 256, Scaling::BlockWise, DType::Bf16, false).unwrap();
        let base = WgmmaConfig::default_for(&spec);
        for (cfg, says) in [
            (WgmmaConfig { bn: 96, ..base }, "wgmma N"),
            (WgmmaConfig { bn: 256, ..base }, "bn <= 192"),
            (
                WgmmaConfig {
                    bn: 192,
                    consumers: 2,
                    fold: 2,
                    ..base
                },
                "bn <= 128 (not 192)",
            ),
            (WgmmaConfig { splits: 3, ..base }, "3 splits of 2 K steps"),
            (WgmmaConfig { stages: 1, ..base }, "1 stages"),
            (WgmmaConfig { fold: 3, ..base }, "fold 3"),
            (
                WgmmaConfig {
                    bn: 128,
                    stages: 8,
                    ..base
                },
                "shared",
            ),
        ] {
            let e = cfg.fits(&spec).unwrap_err();
            assert!(e.contains(says), "{cfg}: {e}");
        }
        assert!(
            WgmmaConfig::space()
                .iter()
                .filter(|c| c.fits(&spec).is_ok())
                .count()
                > 20
        );
        // A cluster stacks tiles in M: one tile row leaves the second block nothing.
        let decode =
            ScaledMmSpec::new(128, 4096, 256, Scaling::PerTensor, DType::Bf16, false).unwrap();
        let pair = WgmmaConfig {
            cluster: 2,
            ..WgmmaConfig::default_for(&decode)
        };
        assert_eq!(pair.consumers, 2);
        let e = pair.fits(&decode).unwrap_err();
        assert!(e.contains("stacks tiles in M"), "{e}");
        assert!(WgmmaConfig {
            consumers: 1,
            ..pair
        }
        .fits(&decode)
        .is_ok());
    }
}
