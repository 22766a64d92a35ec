//! B prepacked once into the layout a Hopper fp8 kernel consumes: wgmma takes fp8 B
//! only K-major (the transpose option is f16/bf16 only), so B[K, N] becomes N x K tiles
//! of `tile_n` rows of `tile_k` bytes, each row's 16-byte chunks swizzled by the row
//! (chunk c of row r stored at c ^ (r % chunks)), the pattern of TMA's 128-byte swizzle
//! for 128-byte rows, which keeps ldmatrix-free shared-memory reads conflict-free.
//! Tiles are stored n-tile major, then k-tile; edges are padded with zeros (e4m3 +0).

use rayon::prelude::*;

use super::fp8::E4m3;
use crate::error::{Error, Result};

/// Bytes of one swizzle chunk (a 16-byte vector).
const CHUNK: usize = 16;

/// B[K, N] as tiles of N x K, K-major, swizzled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackedB {
    k: usize,
    n: usize,
    tile_n: usize,
    tile_k: usize,
    bytes: Vec<u8>,
}

impl PackedB {
    /// Packs row-major `b` ([K, N], one byte per e4m3). `tile_k` is 32, 64 or 128 bytes
    /// (the swizzle spans the row); `tile_n` a multiple of 8.
    pub fn pack(b: &[E4m3], k: usize, n: usize, tile_n: usize, tile_k: usize) -> Result<Self> {
        if b.len() != k * n {
            return Err(Error::TensorMismatch {
                what: "B",
                expected: format!("{k} x {n} = {} elements", k * n),
                got: format!("{} elements", b.len()),
            });
        }
        if ![32, 64, 128].contains(&tile_k) || tile_n == 0 || !tile_n.is_multiple_of(8) {
            return Err(Error::InvalidSpec {
                field: "B tile".into(),
                value: format!("{tile_n} x {tile_k}"),
                expected: "tile_n a multiple of 8, tile_k 32, 64 or 128 bytes".into(),
            });
        }
        let mut p = PackedB {
            k,
            n,
            tile_n,
            tile_k,
            bytes: Vec::new(),
        };
        // Tile by tile in parallel (each tile a contiguous run of the buffer), every
        // element placed by `offset`, the one addressing rule.
        let tile_bytes = tile_n * tile_k;
        let k_tiles = p.k_tiles();
        let mut bytes = vec![0u8; p.n_tiles() * k_tiles * tile_bytes];
        bytes
            .par_chunks_mut(tile_bytes)
            .enumerate()
            .for_each(|(t, tile)| {
                let (tn, tk) = (t / k_tiles, t % k_tiles);
                for kk in tk * tile_k..((tk + 1) * tile_k).min(k) {
                    for j in tn * tile_n..((tn + 1) * tile_n).min(n) {
                        tile[p.offset(kk, j) - t * tile_bytes] = b[kk * n + j].0;
                    }
                }
            });
        p.bytes = bytes;
        Ok(p)
    }

    fn n_tiles(&self) -> usize {
        self.n.div_ceil(self.tile_n)
    }

    fn k_tiles(&self) -> usize {
        self.k.div_ceil(self.tile_k)
    }

    /// Byte offset of B[k, n] in the packed buffer (the kernel's addressing, in one place).
    pub fn offset(&self, k: usize, n: usize) -> usize {
        let (tn, tk) = (n / self.tile_n, k / self.tile_k);
        let (r, c) = (n % self.tile_n, k % self.tile_k);
        let chunks = self.tile_k / CHUNK;
        let chunk = (c / CHUNK) ^ (r % chunks);
        let tile = (tn * self.k_tiles() + tk) * self.tile_n * self.tile_k;
        tile + r * self.tile_k + chunk * CHUNK + c % CHUNK
    }

    /// B[K, N] row-major again.
    pub fn unpack(&self) -> Vec<E4m3> {
        let mut b = vec![E4m3(0); self.k * self.n];
        for kk in 0..self.k {
            for j in 0..self.n {
                b[kk * self.n + j] = E4m3(self.bytes[self.offset(kk, j)]);
            }
        }
        b
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// (K, N, tile_n, tile_k).
    pub fn geometry(&self) -> (usize, usize, usize, usize) {
        (self.k, self.n, self.tile_n, self.tile_k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_b(k: usize, n: usize, seed: u64) -> Vec<E4m3> {
        let mut rng = crate::tensor::SplitMix64::new(seed);
        (0..k * n)
            .map(|_| E4m3((rng.next_u64() % 0x7e) as u8))
            .collect()
    }

    #[test]
    fn packing_round_trips_at_every_tile_and_edge() {
        for (k, n) in [(16, 8), (128, 256), (144, 40), (48, 1), (256, 137)] {
            for tile_k in [32, 64, 128] {
                for tile_n in [8, 64, 128] {
                    let b = random_b(k, n, (k * n + tile_k) as u64);
                    let p = PackedB::pack(&b, k, n, tile_n, tile_k).unwrap();
                    assert_eq!(p.unpack(), b, "{k}x{n} tile {tile_n}x{tile_k}");
                    // Every element has its own byte; padding stays zero.
                    let mut seen = std::collections::HashSet::new();
                    for kk in 0..k {
                        for j in 0..n {
                            assert!(seen.insert(p.offset(kk, j)));
                        }
                    }
                    let used: std::collections::HashSet<usize> = seen;
                    assert!(p
                        .bytes()
                        .iter()
                        .enumerate()
                        .all(|(i, &v)| used.contains(&i) || v == 0));
                }
            }
        }
    }

    /// Within a tile, the 8 rows' chunk 0 land in 8 different 16-byte bank groups: the
    /// swizzle spreads a column of chunks over the banks.
    #[test]
    fn a_chunk_column_spreads_over_the_banks() {
        let b = random_b(128, 8, 1);
        let p = PackedB::pack(&b, 128, 8, 8, 128).unwrap();
        let groups: std::collections::HashSet<usize> =
            (0..8).map(|r| (p.offset(0, r) % 128) / 16).collect();
        assert_eq!(groups.len(), 8);
    }

    #[test]
    fn bad_shapes_are_refused() {
        assert!(PackedB::pack(&random_b(16, 8, 2), 16, 9, 8, 128).is_err());
        assert!(PackedB::pack(&random_b(16, 8, 2), 16, 8, 12, 128).is_err());
        assert!(PackedB::pack(&random_b(16, 8, 2), 16, 8, 8, 48).is_err());
    }
}
