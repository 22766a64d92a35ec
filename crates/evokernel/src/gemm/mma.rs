//! `scaled_mm_mma` (kernels/gemm/scaled_mm_mma.cu): the scaled GEMM's lower rung and
//! correctness anchor, warp-level `mma.sync.m16n8k32` on e4m3 with B prepacked in tiles
//! of `bn` x `bk` bytes. Typed config: the block tile (`bm`, `bn`), the K step `bk`
//! (the pack's tile_k) and the warp grid (`warps_m` x `warps_n`). It compiles for sm_90
//! in CI; its GPU runner and the cuBLASLt baseline come next (issue 18).

use std::fmt;

use super::spec::{ScaledMmSpec, Scaling};
use crate::spec::DType;
use crate::variants::{cuda_type, within_shared, Launch};

/// The kernel's source (compiled after kernels/common.cuh, like the convolutions').
pub const SOURCE: &str = include_str!("../../kernels/gemm/scaled_mm_mma.cu");
/// Bytes after each A row in shared memory (the kernel's APAD).
const A_PAD: usize = 16;

/// One config of `scaled_mm_mma`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmaConfig {
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    pub warps_m: usize,
    pub warps_n: usize,
}

impl fmt::Display for MmaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "scaled_mm_mma:bm={},bn={},bk={},warps_m={},warps_n={}",
            self.bm, self.bn, self.bk, self.warps_m, self.warps_n
        )
    }
}

impl MmaConfig {
    pub const NAMES: [&'static str; 5] = ["bm", "bn", "bk", "warps_m", "warps_n"];

    /// From a parsed `--config` (every parameter given).
    pub fn from_config(c: &crate::variants::Config) -> crate::error::Result<Self> {
        let get = |k: &str| super::kernel::positive_param(c, k);
        Ok(MmaConfig {
            bm: get("bm")?,
            bn: get("bn")?,
            bk: get("bk")?,
            warps_m: get("warps_m")?,
            warps_n: get("warps_n")?,
        })
    }

    /// Every config of the family: tiles 64-256 x 64-256, K steps of 32-128 bytes, 4 or
    /// 8 warps (those that fit are kept by `fits`).
    pub fn space() -> Vec<MmaConfig> {
        let mut v = Vec::new();
        for bm in [64, 128, 256] {
            for bn in [64, 128, 256] {
                for bk in [32, 64, 128] {
                    for (warps_m, warps_n) in [(2, 2), (4, 2), (2, 4)] {
                        v.push(MmaConfig {
                            bm,
                            bn,
                            bk,
                            warps_m,
                            warps_n,
                        });
                    }
                }
            }
        }
        v
    }

    /// A 128 x 128 tile, 64-byte K steps, 4 x 2 warps (64 accumulators a thread; twice
    /// that for block-wise scaling); 64 rows or columns where the problem has no more.
    pub fn default_for(spec: &ScaledMmSpec) -> MmaConfig {
        let side = |len: usize| if len <= 64 { 64 } else { 128 };
        MmaConfig {
            bm: side(spec.m()),
            bn: side(spec.n()),
            bk: 64,
            warps_m: 4,
            warps_n: 2,
        }
    }

    fn threads(&self) -> usize {
        32 * self.warps_m * self.warps_n
    }

    /// MMA tiles a warp holds (16 x 8 each, 4 f32 accumulators a thread).
    fn warp_tiles(&self) -> (usize, usize) {
        (self.bm / self.warps_m / 16, self.bn / self.warps_n / 8)
    }

    /// Accumulators a thread keeps: the total, and the group's sums under block-wise
    /// scaling.
    fn accumulators(&self, scaling: Scaling) -> usize {
        let (tm, tn) = self.warp_tiles();
        tm * tn * 4 * if scaling == Scaling::BlockWise { 2 } else { 1 }
    }

    pub fn shared_bytes(&self) -> usize {
        2 * (self.bm * (self.bk + A_PAD) + self.bn * self.bk)
    }

    /// `Err(reason)` when this config cannot run `spec`.
    pub fn fits(&self, spec: &ScaledMmSpec) -> Result<(), String> {
        if ![32, 64, 128].contains(&self.bk) {
            return Err(format!(
                "bk {} is not a pack row size (32, 64, 128)",
                self.bk
            ));
        }
        if !self.bm.is_multiple_of(self.warps_m * 16) || !self.bn.is_multiple_of(self.warps_n * 8) {
            return Err(format!(
                "{} x {} is not whole 16 x 8 MMA tiles for {} x {} warps",
                self.bm, self.bn, self.warps_m, self.warps_n
            ));
        }
        // 128 accumulators a thread leave room for fragments and addresses in 255 registers.
        let acc = self.accumulators(spec.scaling());
        if acc > 128 {
            return Err(format!("{acc} accumulators a thread exceed 128"));
        }
        within_shared("two K steps of A and B", self.shared_bytes())
    }

    /// The tiles `PackedB::pack` must use for this config: (tile_n, tile_k).
    pub fn pack_tiles(&self) -> (usize, usize) {
        (self.bn, self.bk)
    }

    /// The NVRTC name expression (with the output type, scaling and bias of `spec`).
    pub fn specialization(&self, spec: &ScaledMmSpec) -> String {
        let scaling = match spec.scaling() {
            Scaling::PerTensor => 0,
            Scaling::RowWise => 1,
            Scaling::BlockWise => 2,
        };
        format!(
            "scaled_mm_mma<{}, {}, {}, {}, {}, {}, {scaling}, {}>",
            cuda_type(spec.out_dtype()),
            self.bm,
            self.bn,
            self.bk,
            self.warps_m,
            self.warps_n,
            spec.has_bias()
        )
    }

    /// Grid (N tiles, M tiles), one block of the warp grid, two K steps of shared memory.
    pub fn launch(&self, spec: &ScaledMmSpec) -> Launch {
        Launch {
            grid: (
                spec.n().div_ceil(self.bn) as u32,
                spec.m().div_ceil(self.bm) as u32,
                1,
            ),
            block: (self.threads() as u32, 1, 1),
            shared_bytes: self.shared_bytes() as u32,
        }
    }
}

/// Output types the kernel writes.
pub const OUT_TYPES: [DType; 3] = [DType::Bf16, DType::F16, DType::F32];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::{gemm_suite, E4m3, PackedB};

    /// The kernel's `smm_b_offset` (row r, byte c of a tile), in Rust.
    fn kernel_b_offset(bk: usize, r: usize, c: usize) -> usize {
        let chunks = bk / 16;
        r * bk + (((c >> 4) ^ (r % chunks)) << 4) + (c & 15)
    }

    #[test]
    fn kernel_b_addressing_is_the_packs() {
        // A B of 3 x 2 tiles with ragged edges: every element where the kernel reads it.
        let (k, n) = (150, 200);
        let b: Vec<E4m3> = (0..k * n).map(|i| E4m3((i % 251) as u8)).collect();
        for bk in [32, 64, 128] {
            let cfg = MmaConfig {
                bm: 64,
                bn: 64,
                bk,
                warps_m: 2,
                warps_n: 2,
            };
            let (tn, tk) = cfg.pack_tiles();
            let packed = PackedB::pack(&b, k, n, tn, tk).unwrap();
            let k_tiles = k.div_ceil(bk);
            for kk in 0..k {
                for j in 0..n {
                    let tile = ((j / tn) * k_tiles + kk / bk) * tn * bk;
                    let at = tile + kernel_b_offset(bk, j % tn, kk % bk);
                    assert_eq!(packed.bytes()[at], b[kk * n + j].0, "bk {bk} k {kk} n {j}");
                }
            }
        }
    }

    #[test]
    fn defaults_fit_every_suite_case_and_scaling() {
        for scaling in [Scaling::PerTensor, Scaling::RowWise, Scaling::BlockWise] {
            for (name, spec) in gemm_suite(scaling, DType::Bf16).unwrap() {
                let cfg = MmaConfig::default_for(&spec);
                cfg.fits(&spec).unwrap_or_else(|e| panic!("{name}: {e}"));
                let l = cfg.launch(&spec);
                assert_eq!(l.grid.0 as usize, spec.n().div_ceil(cfg.bn), "{name}");
                assert_eq!(l.grid.1 as usize, spec.m().div_ceil(cfg.bm), "{name}");
                assert_eq!(l.block.0 as usize, 32 * cfg.warps_m * cfg.warps_n, "{name}");
            }
        }
    }

    #[test]
    fn oversized_configs_are_refused_with_the_reason() {
        let spec =
            ScaledMmSpec::new(256, 256, 256, Scaling::BlockWise, DType::Bf16, false).unwrap();
        let big = MmaConfig {
            bm: 256,
            bn: 256,
            bk: 64,
            warps_m: 2,
            warps_n: 2,
        };
        assert!(big.fits(&spec).unwrap_err().contains("accumulators"));
        let ragged = MmaConfig {
            bm: 64,
            bn: 64,
            bk: 48,
            warps_m: 2,
            warps_n: 2,
        };
        assert!(ragged.fits(&spec).unwrap_err().contains("bk 48"));
        assert!(MmaConfig::space().iter().any(|c| c.fits(&spec).is_ok()));
    }
}
