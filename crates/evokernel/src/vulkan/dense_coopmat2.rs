//! The dense convolution as an implicit GEMM on workgroup-scope cooperative matrices
//! (kernels/vulkan/dense_coopmat2.comp; `VK_NV_cooperative_matrix2`): `dense_coopmat`'s
//! gather and packed weights, but the workgroup's whole BM x BN tile is one accumulator and
//! each K step one product, which the driver's compiler splits among the subgroups
//! (`dense_coopmat` splits it by hand into 16 x 16 subgroup tiles). NHWC / NDHWC f16,
//! groups = 1, input and output channels multiples of 8. Its config
//! ([`Coopmat2Config`]): the tile's M, N and K and the workgroup's invocations, pruned by
//! the device's workgroup sizes and granularities for these matrices, its largest
//! dimension and the shared memory the compiler reserves.

use super::device::VulkanDevice;
use super::VulkanDeviceInfo;
use super::VulkanRun;
use crate::dense::DenseConvSpec;
use crate::error::{Error, Result};
use crate::tensor::HostTensor;

pub const SOURCE: &str = include_str!("../../kernels/vulkan/dense_coopmat2.comp");

/// One config of the workgroup-scope shader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Coopmat2Config {
    /// Output pixels (GEMM rows) a workgroup.
    pub bm: u32,
    /// Output channels (GEMM columns) a workgroup.
    pub bn: u32,
    /// K a step (input channels of one tap; Cin is padded to a multiple).
    pub bk: u32,
    /// Invocations a workgroup: one of the sizes the device runs these matrices at.
    pub threads: u32,
    /// Workgroups a tile's K is split across (contiguous ranges of K steps), their f32
    /// partials added in split order by the last to finish: 1, 2, 4 or 8. Tune caches
    /// written before the field read as 1.
    #[serde(default = "one")]
    pub splits: u32,
    /// K steps whose loads are in flight while one multiplies: 1 (the next) or 2 (the next
    /// two, in two register sets). Serialized configs without the field read as 1.
    #[serde(default = "one")]
    pub ahead: u32,
    /// Products a K step is multiplied in (1, 2 or 4, of K = bk / products each, from the
    /// same shared stage): smaller fragments for the compiler to hold (H200 run 411: 96 x
    /// 128 at 134 registers instead of 142, 0.7-1% faster). Serialized configs without the
    /// field read as 1.
    #[serde(default = "one")]
    pub products: u32,
    /// Where a step's loads go out with `ahead` 2: 0 before its multiply, 1 after it (their
    /// address work then issues behind the step's MMAs; H200 run 419: ResNet-50's 56 x 56
    /// at 192 x 64 0.0540 -> 0.0500 ms, its 14 x 14 at 96 x 128 0.0387 -> 0.0486, the
    /// loads waiting on registers the MMAs still read). Serialized configs without the
    /// field read as 0.
    #[serde(default)]
    pub late_loads: u32,
    /// 1: the next step's A and B matrices are read from shared memory into a second
    /// register set before this step's product (stored a barrier earlier), so after each
    /// barrier the MMAs start on operands already in registers (with `ahead` 1, early
    /// loads, 1 or 2 products; with `ahead` 2 it ran slower, run 432). H200 run 429:
    /// ResNet-50's 14 x 14 at 96 x 128 0.0361 -> 0.0344 ms, video-vae-3d at 128 x 128
    /// 0.2907 -> 0.2672 (the loop without branches both sides). Serialized configs without
    /// the field read as 0.
    #[serde(default)]
    pub frags_ahead: u32,
    /// 1: one workgroup an SM (the grid is the device's SM count) takes tiles g, g + the
    /// grid, ...; each next tile's first loads go out before the last one's epilogue
    /// (unsplit K only, on a device that reports its SMs). H200 run 434: VAE decoder 0.354
    /// -> 0.342 ms, video-vae-3d 0.267 -> 0.263, strided with `frags_ahead` 0.0414 ->
    /// 0.0394; slower on layers of one or two waves (14 x 14 0.0344 -> 0.0364: the loop
    /// around the tile costs NVIDIA's code what the overlap saves) and on 56 x 56's late
    /// loads (0.0507 -> 0.0546). The default takes it over `PERSISTENT_WAVES` waves or more.
    /// Serialized configs without the field read as 0.
    #[serde(default)]
    pub persistent: u32,
}

fn one() -> u32 {
    1
}

/// Scratch the split partials may take (beyond it a config with splits is refused: they
/// are for layers whose tiles are too few to fill the GPU, whose partials are small).
const MAX_SCRATCH: usize = 64 << 20;

/// Below this many tiles the default splits K in two where the device does not say how
/// many multiprocessors it has (`default_for`).
const FEW_TILES: usize = 64;

/// The tile rows the default picks among where the device says how many multiprocessors
/// it has (`default_for`). Below 96 rows the tiles ran slower than this model says
/// (ResNet-50's 28 x 28 at 64 x 128: 0.0565 ms where 128 x 128 ran 0.0499, run 400).
const DEFAULT_BMS: [u32; 4] = [96, 128, 160, 192];

/// The default's cost model of a K step, in rows: a 256-invocation tile's step costs
/// about `bm + STEP_ROWS` rows' worth, one workgroup an SM (H200 runs 399-400: 96 x 128
/// 1,078 cycles a step, 128 x 128 1,300).
const STEP_ROWS: f64 = 59.0;

/// The same with `frags_ahead`: a larger part of the step does not grow with its rows
/// (H200 run 429, one wave of 72 steps each on ResNet-50's 14 x 14 layer: 96 x 128 0.0344
/// ms, 128 x 128 0.0387, 1.125x where `STEP_ROWS` says 1.21x; ~3 us of launch and epilogue
/// taken off both).
const FRAGS_STEP_ROWS: f64 = 140.0;

/// What loading after the multiply makes of a step (`late_loads`, on the tiles that load
/// two steps ahead): H200 run 420, 0.90-0.94x on the four tall tiles measured (56 x 56 at
/// 192 x 64 and 128 x 64, 28 x 28 and the VAE decoder at 128 x 128); the larger factor.
const LATE_STEP: f64 = 0.94;

/// The fewest waves of unsplit tiles on which the default takes persistent workgroups
/// (with `frags_ahead`). H200 runs 434 and 436: the VAE decoder (16 waves) 0.351 -> 0.340 ms
/// and video-vae-3d (5 waves) 0.267 -> 0.263 with them; ResNet-50's 14 x 14 (one wave)
/// 0.0344 -> 0.0364 and 28 x 28 (two) 0.0364 -> 0.0383 without (the strided layer, two
/// waves, gained 0.0414 -> 0.0394: its gather's first loads cost more; left to the tuner).
const PERSISTENT_WAVES: usize = 4;

/// What splitting K costs over the same waves of work (its partials' traffic and sum):
/// ResNet-50's 14 x 14 layer ran 0.0485 ms unsplit and 0.0554 split in two at 128 x 128
/// (run 383), where the model counts the same.
const SPLIT_COST: f64 = 1.14;

/// Output pixels a tile (GEMM rows): multiples of 32 (the H200's granularity at 128 and
/// 256 invocations), not only powers of two, so that some height fills the SMs in whole
/// waves (ResNet-50's 14 x 14 layer: 98 tiles of 128 x 128 on 132 SMs, 132 of 96 x 128).
const BMS: [u32; 8] = [32, 64, 96, 128, 160, 192, 224, 256];
/// Output channels a tile (GEMM columns).
const TILES: [u32; 4] = [32, 64, 128, 256];
const BKS: [u32; 3] = [16, 32, 64];
const THREADS: [u32; 3] = [64, 128, 256];
const SPLITS: [u32; 4] = [1, 2, 4, 8];
const AHEAD: [u32; 2] = [1, 2];
const PRODUCTS: [u32; 3] = [1, 2, 4];
const LATE_LOADS: [u32; 2] = [0, 1];
const FRAGS_AHEAD: [u32; 2] = [0, 1];
const PERSISTENT: [u32; 2] = [0, 1];

impl Coopmat2Config {
    /// The variant name configs are forced, tuned and cached under.
    pub const NAME: &'static str = "dense_coopmat2";
    /// The fields, in `values` order.
    pub const NAMES: [&'static str; 10] = [
        "bm",
        "bn",
        "bk",
        "threads",
        "splits",
        "ahead",
        "products",
        "late_loads",
        "frags_ahead",
        "persistent",
    ];

    pub fn values(&self) -> [u32; 10] {
        [
            self.bm,
            self.bn,
            self.bk,
            self.threads,
            self.splits,
            self.ahead,
            self.products,
            self.late_loads,
            self.frags_ahead,
            self.persistent,
        ]
    }

    pub(crate) fn from_values(
        [bm, bn, bk, threads, splits, ahead, products, late_loads, frags_ahead, persistent]: [u32;
            10],
    ) -> Self {
        Coopmat2Config {
            bm,
            bn,
            bk,
            threads,
            splits,
            ahead,
            products,
            late_loads,
            frags_ahead,
            persistent,
        }
    }

    /// The GEMM's tiles on `spec`: along M, along N.
    pub(crate) fn tiles(&self, spec: &DenseConvSpec) -> (usize, usize) {
        let m_total = spec.n() * spec.geometry().output3().iter().product::<usize>();
        (
            m_total.div_ceil(self.bm as usize),
            spec.out_channels().div_ceil(self.bn as usize),
        )
    }

    /// K steps of `spec` at this config's K a step: taps x Cin_pad / bk.
    fn steps(&self, spec: &DenseConvSpec) -> usize {
        let taps: usize = spec.geometry().kernel3().iter().product();
        taps * spec.in_channels().div_ceil(self.bk as usize)
    }

    /// The default's estimate of this config's time on `spec` with `units`
    /// multiprocessors, in row-steps: its workgroups in waves of one an SM, each wave its
    /// workgroups' K steps at `bm + STEP_ROWS` rows a step (times `SPLIT_COST` where K is
    /// split, `LATE_STEP` where the loads go after the multiply; `FRAGS_STEP_ROWS` for
    /// `STEP_ROWS` with `frags_ahead`). Fitted to the H200's times of 256-invocation tiles;
    /// a model for choosing among a few tile heights, not a prediction of milliseconds.
    fn estimate(&self, spec: &DenseConvSpec, units: usize) -> f64 {
        let (tm, tn) = self.tiles(spec);
        let splits = self.splits as usize;
        let waves = (tm * tn * splits).div_ceil(units.max(1));
        let steps = self.steps(spec).div_ceil(splits);
        let split = if splits > 1 { SPLIT_COST } else { 1.0 };
        let late = if self.late_loads == 1 { LATE_STEP } else { 1.0 };
        let fixed = if self.frags_ahead == 1 {
            FRAGS_STEP_ROWS
        } else {
            STEP_ROWS
        };
        waves as f64 * (self.bm as f64 + fixed) * steps as f64 * split * late
    }

    /// Scratch bytes (binding 3): the split partials and a counter a tile (a few bytes
    /// where K is not split: the shader declares the binding either way).
    pub fn scratch_bytes(&self, spec: &DenseConvSpec) -> usize {
        if self.splits == 1 {
            return 16;
        }
        let (tm, tn) = self.tiles(spec);
        let tiles = tm * tn;
        4 * (tiles * self.splits as usize * (self.bm * self.bn) as usize + tiles)
    }

    /// Shared memory a workgroup needs (the shader's SMEM of 16-byte pieces): two stages
    /// of A and B tiles (rows padded by 16 bytes), or the epilogue's staging where larger.
    pub fn shared_bytes(&self) -> usize {
        let (bm, bn, bk) = (self.bm as usize, self.bn as usize, self.bk as usize);
        let stage = bm * (bk / 8 + 1) + bk * (bn / 8 + 1);
        16 * (2 * stage).max(bm * (bn / 8 + 1))
    }

    /// Why the shader cannot run `spec` on a device with `info`, whatever the config.
    pub fn applies(
        info: &VulkanDeviceInfo,
        spec: &DenseConvSpec,
    ) -> std::result::Result<(), String> {
        if info.workgroup_matrices.is_none() {
            return Err(format!(
                "{} has no workgroup-scope f16*f16+f32 cooperative matrices of flexible \
                 dimensions (VK_NV_cooperative_matrix2 with cooperativeMatrixWorkgroupScope \
                 and cooperativeMatrixFlexibleDimensions, on a Vulkan 1.3 device)",
                info.name
            ));
        }
        super::dense_coopmat::gemm_applies(spec)
    }

    /// Why the load forms this config combines are not one the shader has (the device
    /// aside): late loads only with two steps ahead; matrices read ahead only with one,
    /// early loads and at most two products; persistent workgroups only with K unsplit.
    /// `family` and `fits` both hold to it.
    fn forms_agree(&self) -> std::result::Result<(), String> {
        if !LATE_LOADS.contains(&self.late_loads) || (self.late_loads == 1 && self.ahead != 2) {
            return Err(format!(
                "late_loads {} with ahead {} (0, or 1 with ahead 2: loaded one step ahead, \
                 loads after the multiply would wait for it)",
                self.late_loads, self.ahead
            ));
        }
        if !FRAGS_AHEAD.contains(&self.frags_ahead)
            || (self.frags_ahead == 1
                && (self.ahead != 1 || self.late_loads != 0 || self.products > 2))
        {
            return Err(format!(
                "frags_ahead {} with ahead {}, late_loads {}, {} products (0, or 1 with ahead \
                 1, early loads and 1 or 2 products: the shader's one form of it)",
                self.frags_ahead, self.ahead, self.late_loads, self.products
            ));
        }
        if !PERSISTENT.contains(&self.persistent) || (self.persistent == 1 && self.splits != 1) {
            return Err(format!(
                "persistent {} with {} splits (0, or 1 with K unsplit)",
                self.persistent, self.splits
            ));
        }
        Ok(())
    }

    /// Why this config cannot run `spec` on a device with `info`, if it cannot.
    pub fn fits(
        &self,
        info: &VulkanDeviceInfo,
        spec: &DenseConvSpec,
    ) -> std::result::Result<(), String> {
        Self::applies(info, spec)?;
        let wm = info
            .workgroup_matrices
            .as_ref()
            .expect("checked by applies");
        let (bm, bn, bk, threads) = (self.bm, self.bn, self.bk, self.threads);
        if !BMS.contains(&bm) || !TILES.contains(&bn) || !BKS.contains(&bk) {
            return Err(format!(
                "tile {bm} x {bn} x {bk} (bm 32-256, a multiple of 32; bn 32-256, a power of \
                 two; bk 16, 32 or 64)"
            ));
        }

        let Some(shape) = wm.shapes.iter().find(|s| {
            s.invocations == threads
                && bm.is_multiple_of(s.m.max(1))
                && bn.is_multiple_of(s.n.max(1))
                && bk.is_multiple_of(s.k.max(1))
        }) else {
            return Err(format!(
                "{threads} invocations with a {bm} x {bn} x {bk} tile: the device runs these \
                 matrices at {wm}"
            ));
        };
        if !AHEAD.contains(&self.ahead) {
            return Err(format!("ahead {} (1 or 2)", self.ahead));
        }
        self.forms_agree()?;
        if !PRODUCTS.contains(&self.products)
            || !(bk / self.products).is_multiple_of(shape.k.max(8))
        {
            return Err(format!(
                "a K step of {bk} in {} products (1, 2 or 4, each a multiple of the device's \
                 K granularity {})",
                self.products, shape.k
            ));
        }
        if !SPLITS.contains(&self.splits) {
            return Err(format!("splits {} (1, 2, 4 or 8)", self.splits));
        }
        if self.persistent == 1 && info.compute_units.is_none() {
            return Err(format!(
                "persistent 1: {} does not report its multiprocessors (the grid is one \
                 workgroup each)",
                info.name
            ));
        }
        if self.splits as usize > self.steps(spec) {
            return Err(format!(
                "{} splits of {} K steps (at least one a split)",
                self.splits,
                self.steps(spec)
            ));
        }
        if self.splits > 1 && self.scratch_bytes(spec) > MAX_SCRATCH {
            return Err(format!(
                "{} splits need {} bytes of partials (at most {MAX_SCRATCH}: splits are for \
                 layers with few tiles)",
                self.splits,
                self.scratch_bytes(spec)
            ));
        }
        if bm.max(bn).max(bk) > wm.max_dimension {
            return Err(format!(
                "a dimension of {} (the device's largest is {})",
                bm.max(bn).max(bk),
                wm.max_dimension
            ));
        }
        let threads = shape.invocations as usize;
        let (bn, bk) = (bn as usize, bk as usize);
        // Every invocation loads whole 16-byte pieces of B a step (of A the last round's
        // may have none).
        if !(bk * bn / 8).is_multiple_of(threads) {
            return Err(format!(
                "{threads} invocations do not split a {bk} x {bn} tile into whole 16-byte \
                 pieces each"
            ));
        }
        let bytes = self.shared_bytes();
        let room =
            (info.max_shared_bytes as usize).saturating_sub(wm.reserved_shared_bytes as usize);
        if bytes > room {
            return Err(format!(
                "{bytes} bytes of shared memory, more than the device's {} less the {} its \
                 compiler reserves",
                info.max_shared_bytes, wm.reserved_shared_bytes
            ));
        }
        if bn > spec.out_channels().next_power_of_two().max(32) {
            return Err(format!(
                "{bn} output channels a tile, the spec has {}",
                spec.out_channels()
            ));
        }
        Ok(())
    }

    /// Every config of the family (the field combinations `forms_agree` allows).
    pub fn family() -> Vec<Coopmat2Config> {
        super::combinations([
            &BMS,
            &TILES,
            &BKS,
            &THREADS,
            &SPLITS,
            &AHEAD,
            &PRODUCTS,
            &LATE_LOADS,
            &FRAGS_AHEAD,
            &PERSISTENT,
        ])
        .into_iter()
        .map(Self::from_values)
        .filter(|c| c.forms_agree().is_ok())
        .collect()
    }

    /// Every config that fits `spec` on the device.
    pub fn space(info: &VulkanDeviceInfo, spec: &DenseConvSpec) -> Vec<Coopmat2Config> {
        Self::family()
            .into_iter()
            .filter(|c| c.fits(info, spec).is_ok())
            .collect()
    }

    /// The default: 128 x 128 tiles, K steps of 32, 256 invocations, or the fitting config
    /// nearest to it: the exhaustive search's pick on ResNet-50's 28 x 28 layer (run 380).
    /// Where the device says how many multiprocessors it has, the tile's height (of
    /// `DEFAULT_BMS`) and whether K is split in two are the ones whose waves of tiles
    /// `estimate` finds shortest: ResNet-50's 14 x 14 layer fills 132 SMs with 96-row tiles
    /// (132 of them; 98 of 128 rows), 28 x 28 and the strided layer take two waves of 96
    /// rows where 128 took two of which one was half empty (H200 run 400: 0.0473 -> 0.0391,
    /// 0.0499 -> 0.0412, 0.0524 -> 0.0430 ms), 56 x 56 four of 192 x 64 (0.0630 -> 0.0539),
    /// 7 x 7 keeps 128 rows split in two. Elsewhere K is split in two where that leaves
    /// fewer than `FEW_TILES` tiles: ResNet-50's 7 x 7 layer (52 tiles) ran 0.092 -> 0.050
    /// ms split in two, its 14 x 14 (98 tiles) 0.0485 -> 0.0554 (run 383, H200: a threshold
    /// between two measured points). Unsplit tiles of 128 rows and more load two steps
    /// ahead (run 394: 28 x 28 0.0513 -> 0.0500 ms, 14 x 14 0.0488 -> 0.0476, strided
    /// 0.0545 -> 0.0526, VAE decoder 0.427 -> 0.407); split, or shorter, one (7 x 7
    /// split: 0.0503 with one, 0.0535 with two; 96 rows 0.5-1.8% faster with one, run 400):
    /// one rule on both paths. Unsplit tiles under 128 rows multiply a step in two products
    /// (run 411, two rounds: 14 x 14 0.0387 -> 0.0384 ms, 28 x 28 0.0411 -> 0.0408, strided
    /// 0.0434 -> 0.0430; 128 x 128 split or ahead 2, and 192 x 64, 0.6-2.3% slower so).
    /// Tiles that load two steps ahead load after the multiply (run 420, two rounds: 56 x
    /// 56 at 192 x 64 0.0539 -> 0.0499 ms, 128 x 64 0.0631 -> 0.0568, VAE decoder at 128 x
    /// 128 0.4070 -> 0.3841, 28 x 28 at 128 x 128 0.0500 -> 0.0470; 96 x 128 ran slower so,
    /// run 419: 0.0388 -> 0.0486, and takes one step ahead). Tiles 128 wide read the next
    /// step's matrices ahead (`frags_ahead`; run 430, two rounds: 14 x 14 0.0388 -> 0.0347
    /// ms, 7 x 7 0.0521 -> 0.0452, VAE decoder 0.3845 -> 0.3508, video-vae-3d 0.3161 ->
    /// 0.266), in two products at 128 rows unsplit and one else; 56 x 56's 64-wide tile
    /// ran 0.0515-0.0522 so (run 429) and keeps late loads. K is split only where the
    /// unsplit tiles are fewer than the SMs. Tiles that read the matrices ahead over at
    /// least `PERSISTENT_WAVES` waves take persistent workgroups.
    pub fn default_for(info: &VulkanDeviceInfo, spec: &DenseConvSpec) -> Result<Coopmat2Config> {
        Self::applies(info, spec).map_err(|reason| Error::NotApplicable {
            variant: "vulkan dense_coopmat2".into(),
            spec: spec.to_string(),
            reason,
        })?;
        let want = [128u32, 128, 32, 256, 1, 2, 1, 0, 0, 0];
        let space = Self::space(info, spec);
        let nearest = space
            .iter()
            .filter(|c| c.splits == 1)
            .min_by_key(|c| super::log2_distance(&c.values(), &want))
            .copied();
        // `nearest` with this height and split, loading as far ahead and multiplying a step
        // in as many products as the rules say, where the space has it (else in one).
        let shaped = |n: Coopmat2Config, bm: u32, splits: u32| {
            let frags = n.bn >= 128;
            let tall = !frags && splits == 1 && bm >= 128;
            // Two products on unsplit tiles: of 128 rows and more with the matrices read
            // ahead, under 128 rows without.
            let products = if splits == 1 && frags == (bm >= 128) {
                2
            } else {
                1
            };
            let c = Coopmat2Config {
                bm,
                splits,
                ahead: if tall { 2 } else { 1 },
                products,
                late_loads: u32::from(tall),
                frags_ahead: u32::from(frags),
                ..n
            };
            let one = Coopmat2Config { products: 1, ..c };
            [c, one].into_iter().find(|c| space.contains(c))
        };
        if let (Some(units), Some(n)) = (info.compute_units, nearest) {
            // Ties go to the taller tile (fewer workgroups), then unsplit.
            let best = DEFAULT_BMS
                .iter()
                .flat_map(|&bm| [1, 2].map(|splits| shaped(n, bm, splits)))
                .flatten()
                .filter(|c| {
                    // K split only where the unsplit tiles leave SMs idle: 28 x 28 at 128 x
                    // 128 (196 tiles) split in two ran 0.0551 ms against 96 x 128's 0.0366
                    // unsplit (run 430), where the waves said 3% the other way.
                    let (tm, tn) = c.tiles(spec);
                    c.splits == 1 || tm * tn < units as usize
                })
                .map(|c| (c.estimate(spec, units as usize), c))
                .min_by(|(ea, a), (eb, b)| {
                    ea.total_cmp(eb)
                        .then(b.bm.cmp(&a.bm))
                        .then(a.splits.cmp(&b.splits))
                });
            if let Some((_, best)) = best {
                // Persistent where the matrices are read ahead over many waves: the next
                // tile's loads under the last one's epilogue save a part of each wave that
                // outgrows the loop's own cost (`PERSISTENT_WAVES`).
                let (tm, tn) = best.tiles(spec);
                let waves = (tm * tn).div_ceil(units as usize);
                let persistent = Coopmat2Config {
                    persistent: 1,
                    ..best
                };
                if best.frags_ahead == 1 && waves >= PERSISTENT_WAVES && space.contains(&persistent)
                {
                    return Ok(persistent);
                }
                return Ok(best);
            }
        }
        nearest
            .map(|n| {
                let (tm, tn) = n.tiles(spec);
                let split = (tm * tn < FEW_TILES).then(|| shaped(n, n.bm, 2)).flatten();
                split.or_else(|| shaped(n, n.bm, 1)).unwrap_or(n)
            })
            .ok_or_else(|| Error::NotApplicable {
                variant: "vulkan dense_coopmat2".into(),
                spec: spec.to_string(),
                reason: format!(
                    "no config fits the device's {} bytes of shared memory and its \
                     workgroup-scope matrices",
                    info.max_shared_bytes
                ),
            })
    }
}

config_text!(
    Coopmat2Config,
    "a dense_coopmat2 config",
    "bm 32-256, a multiple of 32; bn 32, 64, 128 or 256; bk 16, 32 or 64; threads 64, 128 or \
     256; splits 1, 2, 4 or 8; ahead 1 or 2; products 1, 2 or 4; late_loads 0 or 1 (1 with \
     ahead 2); frags_ahead 0 or 1 (1 with ahead 1, late_loads 0, products 1 or 2); persistent 0 \
     or 1 (1 with splits 1)",
    |v: [u32; 10]| Some(Coopmat2Config::from_values(v))
        .filter(|c| Coopmat2Config::family().contains(c))
);

/// The shader with `config` (None: the device's default) prepared on device-local
/// copies of `x` and the packed `w` (`dense_coopmat`'s packing), to launch and time.
pub fn prepare_dense_coopmat2<'d>(
    dev: &'d VulkanDevice,
    spec: &DenseConvSpec,
    x: &HostTensor,
    w: &HostTensor,
    config: Option<Coopmat2Config>,
) -> Result<VulkanRun<'d>> {
    let info = dev.info();
    x.expect("input", spec.dtype(), spec.input_len())?;
    let config = super::resolve_config(
        "vulkan dense_coopmat2",
        spec,
        config,
        || Coopmat2Config::default_for(info, spec),
        |c| c.fits(info, spec),
    )?;
    let gemm = GemmStage::new(info, spec, &config, &[])?;
    let packed = super::dense_coopmat::pack_weights(spec, w, config.bk as usize)?;
    let y = HostTensor::zeros(spec.dtype(), &spec.output_shape());
    VulkanRun::new(
        dev,
        "dense_coopmat2",
        &gemm.source,
        &gemm.constants,
        &gemm.push,
        gemm.grid,
        x,
        &packed,
        y,
        Some(config.scratch_bytes(spec)),
    )
    .map(|r| r.with_config(&config))
}

/// What a launch of the shader with `config` on `spec` takes, the weights aside (packed
/// by the caller: `dense_coopmat`'s packing, or blocks of it with `B_BLOCK_ROWS`): its
/// source with the config's defines and `extra` ones, specialization constants, push
/// constants and workgroups.
pub(crate) struct GemmStage {
    pub source: String,
    pub constants: Vec<(u32, u32)>,
    pub push: Vec<u8>,
    pub grid: [u32; 2],
}

impl GemmStage {
    pub(crate) fn new(
        info: &VulkanDeviceInfo,
        spec: &DenseConvSpec,
        config: &Coopmat2Config,
        extra: &[(&str, usize)],
    ) -> Result<Self> {
        let bk = config.bk as usize;
        let g = spec.geometry();
        let (tiles_m, tiles_n) = config.tiles(spec);
        let groups = tiles_m * tiles_n * config.splits as usize;
        let (bm, bn) = (config.bm as usize, config.bn as usize);
        // Persistent: a workgroup an SM (`fits` refused it where the count is unknown).
        let workgroups = match (config.persistent, info.compute_units) {
            (1, Some(units)) => groups.min(units as usize),
            _ => groups,
        };
        let grid = super::grid_for(info, workgroups)?;
        let push = super::dense_coopmat::gemm_push("dense_coopmat2", spec, bk, tiles_n, groups)?;
        let [kd, kh, kw] = g.kernel3();
        let constants = super::spec_constants(&[
            config.threads as usize,
            bm,
            bn,
            config.threads as usize,
            kd,
            kh,
            kw,
            g.stride3()[1],
            g.stride3()[2],
            g.dilation3()[1],
            g.dilation3()[2],
            config.shared_bytes() / 16,
            bk,
            config.splits as usize,
            config.ahead as usize,
        ]);
        // Products a step, late loads and matrices read ahead: defines (written out in the
        // shader), none at one product, early loads and matrices read where multiplied.
        let mut defines = Vec::new();
        if config.products != 1 {
            defines.push(("PRODUCTS", config.products as usize));
        }
        if config.late_loads == 1 {
            defines.push(("LATE_LOADS", 1));
        }
        if config.frags_ahead == 1 {
            defines.push(("FRAGS_AHEAD", 1));
        }
        if config.persistent == 1 {
            defines.push(("PERSISTENT", 1));
        }
        defines.extend_from_slice(extra);
        let source = if defines.is_empty() {
            SOURCE.to_string()
        } else {
            super::shader::with_defines(SOURCE, &defines)
        };
        Ok(GemmStage {
            source,
            constants,
            push,
            grid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ConvParams, DType, Layout};
    use crate::vulkan::{WorkgroupMatrices, WorkgroupShape};

    /// A device like the H200's NVIDIA driver is assumed to be (not read from it yet):
    /// 48 KiB of shared memory, workgroup-scope matrices at 128 and 256 invocations.
    fn nvidia_like() -> VulkanDeviceInfo {
        let mut i = crate::vulkan::device::lavapipe_like();
        i.subgroup_size = 32;
        i.max_shared_bytes = 48 * 1024;
        i.coopmat_f16 = true;
        i.workgroup_matrices = Some(WorkgroupMatrices {
            shapes: [128, 256]
                .map(|invocations| WorkgroupShape {
                    invocations,
                    m: 16,
                    n: 16,
                    k: 16,
                })
                .to_vec(),
            max_dimension: 256,
            reserved_shared_bytes: 1024,
        });
        i
    }

    use crate::vulkan::dense_coopmat::tests::spec;

    /// The H200's driver as `evokernel devices` read it (run 399): 132 SMs, 48 KiB of
    /// shared memory less 8 KiB reserved, granularities by workgroup size.
    fn h200() -> VulkanDeviceInfo {
        let mut i = nvidia_like();
        i.compute_units = Some(132);
        i.workgroup_matrices = Some(WorkgroupMatrices {
            shapes: [(32, 16, 16), (64, 16, 16), (128, 32, 16), (256, 32, 32)]
                .map(|(invocations, m, n)| WorkgroupShape {
                    invocations,
                    m,
                    n,
                    k: 16,
                })
                .to_vec(),
            max_dimension: 1024,
            reserved_shared_bytes: 8192,
        });
        i
    }

    #[test]
    fn the_default_fills_the_multiprocessors_in_whole_waves() {
        let info = h200();
        let picks: Vec<(String, [u32; 10])> = crate::dense::dense_suite()
            .unwrap()
            .into_iter()
            .filter(|c| Coopmat2Config::applies(&info, &c.spec).is_ok())
            .map(|c| {
                let d = Coopmat2Config::default_for(&info, &c.spec).unwrap();
                assert!(d.fits(&info, &c.spec).is_ok(), "{} {d}", c.name);
                (c.name, d.values())
            })
            .collect();
        let pick = |name: &str| picks.iter().find(|p| p.0 == name).unwrap().1;
        // bm, bn, bk, threads, splits, ahead, products, late_loads, frags_ahead, persistent:
        // the H200's measured best (runs 399-400, 411, 420, 429-436): tiles 128 wide read
        // the next step's matrices ahead; 56 x 56's 64-wide tile loads two steps ahead,
        // after the multiply. video-vae-3d: 128 rows (5 waves of 544 tiles) over 96 (6 of
        // 726): with the matrices read ahead the step's fixed part is larger
        // (`FRAGS_STEP_ROWS`; run 429: 0.2672 ms at 128 rows, 0.2898 at 96). It and the VAE
        // decoder (5 and 16 waves) take persistent workgroups (runs 434, 436); the one- and
        // two-wave layers do not.
        for (name, want) in [
            ("resnet50-3x3-14", [96, 128, 32, 256, 1, 1, 1, 0, 1, 0]),
            ("resnet50-3x3-28", [96, 128, 32, 256, 1, 1, 1, 0, 1, 0]),
            ("resnet50-3x3-s2", [96, 128, 32, 256, 1, 1, 1, 0, 1, 0]),
            ("resnet50-3x3-56", [192, 64, 32, 256, 1, 2, 1, 1, 0, 0]),
            ("resnet50-3x3-7", [128, 128, 32, 256, 2, 1, 1, 0, 1, 0]),
            ("video-vae-3d", [128, 128, 32, 256, 1, 1, 2, 0, 1, 1]),
            ("vae-decoder-512", [128, 128, 32, 256, 1, 1, 2, 0, 1, 1]),
        ] {
            assert_eq!(pick(name), want, "{name}");
        }
        // Without the multiprocessors' count: the nearest to 128 x 128, split below
        // FEW_TILES tiles.
        let mut unknown = info.clone();
        unknown.compute_units = None;
        let fourteen = crate::dense::dense_suite()
            .unwrap()
            .into_iter()
            .find(|c| c.name == "resnet50-3x3-14")
            .unwrap();
        let d = Coopmat2Config::default_for(&unknown, &fourteen.spec).unwrap();
        assert_eq!(d.values(), [128, 128, 32, 256, 1, 1, 2, 0, 1, 0]);
    }

    #[test]
    fn the_shader_compiles_to_spirv_16() {
        assert!(super::super::shader::needs_spirv16(SOURCE));
        let words = super::super::shader::compile_compute("dense_coopmat2", SOURCE).unwrap();
        assert_eq!(words[0], super::super::shader::SPIRV_MAGIC);
        // SPIR-V 1.6 in the header's version word.
        assert_eq!(words[1], 0x0001_0600);
        // The step in two or four products, the late loads: the shader's other texts.
        for defines in [
            &[("PRODUCTS", 2)][..],
            &[("PRODUCTS", 4)],
            &[("LATE_LOADS", 1)],
            &[("PRODUCTS", 2), ("LATE_LOADS", 1)],
            &[("FRAGS_AHEAD", 1)],
            &[("PRODUCTS", 2), ("FRAGS_AHEAD", 1)],
            &[("PERSISTENT", 1)],
            &[("FRAGS_AHEAD", 1), ("PERSISTENT", 1)],
            &[("LATE_LOADS", 1), ("PERSISTENT", 1)],
        ] {
            let source = super::super::shader::with_defines(SOURCE, defines);
            let words = super::super::shader::compile_compute("dense_coopmat2", &source).unwrap();
            assert_eq!(words[0], super::super::shader::SPIRV_MAGIC);
        }
    }

    #[test]
    fn the_space_is_pruned_by_the_workgroup_matrices() {
        let info = nvidia_like();
        let s = spec(128, 128, 1, DType::F16);
        let space = Coopmat2Config::space(&info, &s);
        assert!(space.len() >= 8, "{space:?}");
        let room = 48 * 1024 - 1024;
        assert!(space
            .iter()
            .all(|c| c.shared_bytes() <= room && [128, 256].contains(&c.threads) && c.bn <= 128));
        // 2 tiles of 128 x 128 here (fewer than FEW_TILES): the default splits K in two.
        let d = Coopmat2Config::default_for(&info, &s).unwrap();
        assert_eq!(
            (d.bm, d.bn, d.bk, d.threads, d.splits, d.ahead),
            (128, 128, 32, 256, 2, 1)
        );
        // Both load depths are in the space.
        let ahead2 = Coopmat2Config {
            ahead: 2,
            frags_ahead: 0,
            ..d
        };
        assert!(space.contains(&ahead2));
        assert_eq!(ahead2.shared_bytes(), d.shared_bytes());
        // 2 x 64 x 64 outputs: 64 tiles, no split.
        let p = ConvParams {
            n: 2,
            c: 128,
            input: vec![64, 64],
            kernel: vec![3, 3],
            stride: vec![1, 1],
            dilation: vec![1, 1],
            padding: vec![[1, 1], [1, 1]],
            layout: Layout::ChannelsLast,
            dtype: DType::F16,
        };
        let many = DenseConvSpec::from_params(&p, 128, 1).unwrap();
        let unsplit = Coopmat2Config::default_for(&info, &many).unwrap();
        assert_eq!(
            (unsplit.splits, unsplit.ahead, unsplit.frags_ahead),
            (1, 1, 1)
        );
        // Splits: at most one a K step (9 taps x 128 / 32 = 36 steps here), partials
        // within the scratch cap.
        let mut split = d;
        split.splits = 8;
        assert!(split.fits(&info, &s).is_ok());
        assert!(space.contains(&split));
        assert_eq!(split.scratch_bytes(&s), 4 * (2 * 8 * 128 * 128 + 2));
        let few = spec(8, 128, 1, DType::F16); // 9 steps of 32
        assert!(split.fits(&info, &few).is_ok());
        split.splits = 16;
        assert!(split.fits(&info, &few).is_err());
        assert_eq!(d.to_string().parse::<Coopmat2Config>().unwrap(), d);
        // A K step in products of at least the device's K granularity (16 here).
        let halves = Coopmat2Config { products: 2, ..d };
        assert!(halves.fits(&info, &s).is_ok() && space.contains(&halves));
        let e = Coopmat2Config { products: 4, ..d }
            .fits(&info, &s)
            .unwrap_err();
        assert!(e.contains("4 products"), "{e}");
        // Late loads only with two steps in flight.
        let late = Coopmat2Config {
            ahead: 2,
            late_loads: 1,
            frags_ahead: 0,
            ..d
        };
        assert!(late.fits(&info, &s).is_ok() && space.contains(&late));
        let e = Coopmat2Config { ahead: 1, ..late }
            .fits(&info, &s)
            .unwrap_err();
        assert!(e.contains("late_loads 1 with ahead 1"), "{e}");
        // Matrices read ahead: with one step of loads in flight, early, 1 or 2 products.
        let frags = Coopmat2Config {
            ahead: 1,
            late_loads: 0,
            frags_ahead: 1,
            products: 2,
            ..d
        };
        assert!(frags.fits(&info, &s).is_ok() && space.contains(&frags));
        for bad in [
            Coopmat2Config { ahead: 2, ..frags },
            Coopmat2Config {
                ahead: 2,
                late_loads: 1,
                ..frags
            },
            Coopmat2Config {
                products: 4,
                bk: 64,
                ..frags
            },
        ] {
            let e = bad.fits(&info, &s).unwrap_err();
            assert!(e.contains("frags_ahead 1"), "{e}");
            assert!(!space.contains(&bad));
        }
        // Persistent workgroups: K unsplit, on a device that reports its SMs.
        let persistent = Coopmat2Config {
            persistent: 1,
            splits: 1,
            ..d
        };
        let counted = h200();
        assert!(persistent.fits(&counted, &s).is_ok());
        assert!(Coopmat2Config::space(&counted, &s).contains(&persistent));
        let e = Coopmat2Config {
            splits: 2,
            ..persistent
        }
        .fits(&counted, &s)
        .unwrap_err();
        assert!(e.contains("persistent 1 with 2 splits"), "{e}");
        assert!(info.compute_units.is_none());
        let e = persistent.fits(&info, &s).unwrap_err();
        assert!(e.contains("multiprocessors"), "{e}");
        // 64 invocations: not a size this device lists.
        let c = Coopmat2Config {
            bm: 64,
            bn: 64,
            bk: 32,
            threads: 64,
            splits: 1,
            ahead: 1,
            products: 1,
            late_loads: 0,
            frags_ahead: 0,
            persistent: 0,
        };
        let e = c.fits(&info, &s).unwrap_err();
        assert!(e.contains("64 invocations"), "{e}");
        // A granularity of 64 along M rules out 32-row tiles.
        let mut coarse = info.clone();
        coarse.workgroup_matrices.as_mut().unwrap().shapes[0].m = 64;
        let c = Coopmat2Config {
            bm: 32,
            threads: 128,
            ..c
        };
        assert!(c.fits(&info, &s).is_ok());
        assert!(c.fits(&coarse, &s).is_err());
        for bad in [
            "dense_coopmat2:bm=128",
            "dense_coopmat2:bm=128,bn=128,bk=32,threads=128,splits=1",
            "dense_coopmat2:bm=88,bn=128,bk=32,threads=128,splits=1,ahead=1,products=1,late_loads=0,frags_ahead=0,persistent=0",
            "dense_coopmat2:bm=128,bn=96,bk=32,threads=128,splits=1,ahead=1,products=1,late_loads=0,frags_ahead=0,persistent=0",
            "dense_coopmat2:bm=128,bn=128,bk=48,threads=128,splits=1,ahead=1,products=1,late_loads=0,frags_ahead=0,persistent=0",
            "dense_coopmat2:bm=128,bn=128,bk=32,threads=96,splits=1,ahead=1,products=1,late_loads=0,frags_ahead=0,persistent=0",
            "dense_coopmat2:bm=128,bn=128,bk=32,threads=128,splits=3,ahead=1,products=1,late_loads=0,frags_ahead=0,persistent=0",
            "dense_coopmat2:bm=128,bn=128,bk=32,threads=128,splits=1,ahead=3,products=1,late_loads=0,frags_ahead=0,persistent=0",
            "dense_coopmat2:bm=128,bn=128,bk=32,threads=128,splits=1,ahead=1,products=3,late_loads=0,frags_ahead=0,persistent=0",
            "dense_coopmat2:bm=128,bn=128,bk=32,threads=128,splits=1,ahead=1,products=1,late_loads=2,frags_ahead=0,persistent=0",
            "dense_coopmat2:bm=128,bn=128,bk=32,threads=128,splits=1,ahead=1,products=1,late_loads=1,frags_ahead=0,persistent=0",
            "dense_coopmat:bm=128,bn=128,bk=32,threads=128,splits=1,ahead=1,products=1,late_loads=0,frags_ahead=0,persistent=0",
        ] {
            assert!(bad.parse::<Coopmat2Config>().is_err(), "{bad}");
        }
        // Refusals say why: without the extension; grouped, f32, odd channel counts.
        let e = Coopmat2Config::default_for(&crate::vulkan::device::lavapipe_like(), &s)
            .unwrap_err()
            .to_string();
        assert!(e.contains("VK_NV_cooperative_matrix2"), "{e}");
        for (s, says) in [
            (spec(64, 64, 2, DType::F16), "groups = 1"),
            (spec(64, 64, 1, DType::F32), "f16"),
            (spec(12, 64, 1, DType::F16), "multiples of 8"),
        ] {
            let e = Coopmat2Config::applies(&info, &s).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }
}
