//! Theoretical occupancy from a kernel's resources: how many blocks fit on one SM, what
//! stops the next one, and what it would take to fit it. Same arithmetic as CUDA's
//! occupancy calculator and Nsight Compute's "Block Limit" lines.

use serde::{Deserialize, Serialize};

use crate::cuda::{KernelResources, SmLimits};

/// The resource that stops one more block from fitting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Limiter {
    Registers,
    SharedMemory,
    Warps,
    Blocks,
}

impl std::fmt::Display for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Limiter::Registers => "registers",
            Limiter::SharedMemory => "shared memory",
            Limiter::Warps => "warps per SM",
            Limiter::Blocks => "blocks per SM",
        })
    }
}

/// Blocks per SM as each resource alone allows, the minimum, and its limiters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Occupancy {
    pub threads_per_block: u32,
    pub by_registers: u32,
    pub by_shared: u32,
    pub by_warps: u32,
    pub by_blocks: u32,
    pub blocks_per_sm: u32,
    /// Every resource at the minimum (ties are common: 4 by registers and 4 by shared).
    pub limiters: Vec<Limiter>,
    /// Resident warps / the SM's maximum, in percent.
    pub percent: f64,
    /// Registers per thread at most for one more block (None: registers are not what
    /// stops it, or no register count allows it).
    pub registers_for_next_block: Option<u32>,
    /// Shared bytes per block (static + dynamic) at most for one more block.
    pub shared_for_next_block: Option<u32>,
}

fn round_up(v: u32, unit: u32) -> u32 {
    v.div_ceil(unit) * unit
}

fn blocks_by_registers(sm: &SmLimits, regs_per_thread: u32, warps_per_block: u32) -> u32 {
    if regs_per_thread == 0 {
        return sm.max_blocks;
    }
    let per_warp = round_up(regs_per_thread * 32, sm.register_unit);
    let per_partition = sm.registers / sm.register_partitions;
    let warps = (per_partition / per_warp) * sm.register_partitions;
    warps / warps_per_block
}

fn blocks_by_shared(sm: &SmLimits, shared_per_block: u32) -> u32 {
    if shared_per_block == 0 {
        return sm.max_blocks;
    }
    let per_block = round_up(
        shared_per_block + sm.shared_reserved_per_block,
        sm.shared_unit,
    );
    sm.shared_bytes / per_block
}

/// Occupancy of a launch with `resources` (its block size included).
pub fn occupancy(sm: &SmLimits, resources: &KernelResources) -> Occupancy {
    let threads_per_block = resources.threads_per_block;
    let warps_per_block = threads_per_block.div_ceil(32).max(1);
    let regs = resources.registers.max(0) as u32;
    let shared = resources.static_shared_bytes.max(0) as u32 + resources.dynamic_shared_bytes;
    let by_registers = blocks_by_registers(sm, regs, warps_per_block);
    let by_shared = blocks_by_shared(sm, shared);
    let by_warps = sm.max_warps() / warps_per_block;
    let by_blocks = sm.max_blocks;
    let blocks = by_registers.min(by_shared).min(by_warps).min(by_blocks);
    let limiters = [
        (Limiter::Registers, by_registers),
        (Limiter::SharedMemory, by_shared),
        (Limiter::Warps, by_warps),
        (Limiter::Blocks, by_blocks),
    ]
    .into_iter()
    // An unused resource reports the block limit (as ncu does) but never limits.
    .filter(|&(l, b)| b == blocks && !(l == Limiter::SharedMemory && shared == 0))
    .map(|(l, _)| l)
    .collect::<Vec<_>>();
    let next = blocks + 1;
    let structural = next > by_warps || next > by_blocks;
    let registers_for_next_block = (!structural && by_registers < next)
        .then(|| {
            (1..regs)
                .rev()
                .find(|&r| blocks_by_registers(sm, r, warps_per_block) >= next)
        })
        .flatten();
    let shared_for_next_block = (!structural && by_shared < next)
        .then(|| {
            let per_block = sm.shared_bytes / next / sm.shared_unit * sm.shared_unit;
            per_block.checked_sub(sm.shared_reserved_per_block)
        })
        .flatten();
    Occupancy {
        threads_per_block,
        by_registers,
        by_shared,
        by_warps,
        by_blocks,
        blocks_per_sm: blocks,
        limiters,
        percent: 100.0 * (blocks * warps_per_block) as f64 / sm.max_warps() as f64,
        registers_for_next_block,
        shared_for_next_block,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(registers: i32, dynamic_shared_bytes: u32, threads_per_block: u32) -> KernelResources {
        KernelResources {
            registers,
            static_shared_bytes: 0,
            dynamic_shared_bytes,
            local_bytes: 0,
            max_threads_per_block: 1024,
            blocks_per_sm: 0,
            threads_per_block,
        }
    }

    // Expected numbers are Nsight Compute's "Block Limit" lines on an H100 for our kernels
    // (tests/data/ncu-raw-*-h100.csv and docs/perf.md).
    #[test]
    fn streaming_seed_is_shared_memory_limited_like_ncu_says() {
        let o = occupancy(&SmLimits::HOPPER, &res(66, 43_264, 128));
        assert_eq!(
            (o.by_registers, o.by_shared, o.by_warps, o.by_blocks),
            (7, 5, 16, 32)
        );
        assert_eq!(o.blocks_per_sm, 5);
        assert_eq!(o.limiters, vec![Limiter::SharedMemory]);
        assert!((o.percent - 31.25).abs() < 1e-9);
        // 233472 / 6 = 38912 per block, less the driver's 1 KiB.
        assert_eq!(o.shared_for_next_block, Some(37_888));
        assert_eq!(o.registers_for_next_block, None);
        assert_eq!(
            occupancy(&SmLimits::HOPPER, &res(66, 37_888, 128)).blocks_per_sm,
            6
        );
        assert_eq!(
            occupancy(&SmLimits::HOPPER, &res(66, 37_889, 128)).blocks_per_sm,
            5
        );
    }

    #[test]
    fn smem_tile_ties_registers_and_shared() {
        let o = occupancy(&SmLimits::HOPPER, &res(64, 49_392, 256));
        assert_eq!((o.by_registers, o.by_shared, o.by_warps), (4, 4, 8));
        assert_eq!(o.limiters, vec![Limiter::Registers, Limiter::SharedMemory]);
        assert!((o.percent - 50.0).abs() < 1e-9);
        // 5 blocks x 8 warps = 40 warps = 10 per scheduler: 16384 / 10 / 32 -> 51, in units of 8 -> 48.
        assert_eq!(o.registers_for_next_block, Some(48));
        assert_eq!(
            occupancy(&SmLimits::HOPPER, &res(48, 40_000, 256)).blocks_per_sm,
            5
        );
    }

    #[test]
    fn naive_and_channels_last_match_ncu() {
        let naive = occupancy(&SmLimits::HOPPER, &res(32, 0, 256));
        assert_eq!(
            (naive.by_registers, naive.by_shared, naive.by_warps),
            (8, 32, 8)
        );
        assert_eq!(naive.blocks_per_sm, 8);
        assert_eq!(naive.limiters, vec![Limiter::Registers, Limiter::Warps]);
        assert!((naive.percent - 100.0).abs() < 1e-9);
        assert_eq!(naive.registers_for_next_block, None);
        let cl = occupancy(&SmLimits::HOPPER, &res(60, 19_200, 256));
        assert_eq!((cl.by_registers, cl.blocks_per_sm), (4, 4));
        assert_eq!(cl.limiters, vec![Limiter::Registers]);
        assert!((cl.percent - 50.0).abs() < 1e-9);
    }

    #[test]
    fn tiny_blocks_hit_the_block_limit() {
        let o = occupancy(&SmLimits::HOPPER, &res(16, 0, 32));
        assert_eq!(o.blocks_per_sm, 32);
        assert_eq!(o.limiters, vec![Limiter::Blocks]);
        assert!((o.percent - 50.0).abs() < 1e-9);
    }
}
