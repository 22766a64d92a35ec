//! The FMA depth rotation on Vulkan (kernels/vulkan/depth_rotate.comp): depth_reuse_fma's
//! method in portable GLSL for depthwise specs with depth stride and dilation 1. A
//! workgroup walks down the depth of a band of output rows, loading each input slice's
//! band into shared memory once and accumulating the KD output depths it feeds in
//! registers, so the input is read once where the tiled shader reads it KD times. Its
//! config ([`RotateConfig`]: invocations, outputs an invocation along W and H, band rows)
//! goes to the shader as specialization constants; the runs an invocation owns follow from it
//! (at most 4, so that their sums stay in registers), and so does each invocation's part
//! of a slice's fill (loaded into registers while the slice before is multiplied, from a
//! second shared band), and the space is pruned by the device's shared memory and
//! invocations. With `direct` there is no band: each invocation reads its windows from
//! the buffer (channels-first; the default on 1-D rows, whose band held no reuse across
//! rows). Runs that divide channels-first rows leave as vectors of 4 or 2, and direct
//! reads of rows that are whole vectors take each window as aligned vectors. f32, and
//! f16 and bf16 where the device has 16-bit storage.

use super::device::VulkanDevice;
use super::tile::{tile_shape, TileConfig};
use super::{VulkanDeviceInfo, VulkanRun};
use crate::error::{Error, Result};
use crate::spec::{ConvSpec, Layout};
use crate::tensor::HostTensor;

pub const SOURCE: &str = include_str!("../../kernels/vulkan/depth_rotate.comp");

/// One config of the rotation shader.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct RotateConfig {
    /// Invocations a workgroup.
    pub workgroup: u32,
    /// Consecutive outputs of a row an invocation computes.
    pub out_w: u32,
    /// Consecutive output rows an invocation's run spans (each band row it reads feeds
    /// every one of them; the band's rows are a multiple).
    #[serde(default = "one")]
    pub out_h: u32,
    /// Output rows a workgroup's band holds.
    pub rows: u32,
    /// 1: no band in shared memory: each invocation reads its windows from the buffer
    /// (channels-first only; no barriers). 2: the same, its windows read as vectors one
    /// slice ahead, into registers ([`Self::ahead_registers`]).
    pub direct: u32,
}

fn one() -> u32 {
    1
}

// The rotation's family: the band shaders' powers of two and the sizes between, so that
// a band's runs (rows x runs a row) can be split evenly over a workgroup's invocations
// (the seed's 80-wide rows in runs of 4 over 8 rows: 160 runs for 128 invocations, the
// second item of each on a quarter of them; in runs of 5, 128 exactly).
const WORKGROUPS: [u32; 7] = [32, 64, 96, 128, 160, 192, 256];
const OUT_WS: [u32; 7] = [1, 2, 3, 4, 5, 6, 8];
const OUT_HS: [u32; 4] = [1, 2, 3, 4];
const ROWS: [u32; 12] = [1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 24, 32];
const DIRECTS: [u32; 3] = [0, 1, 2];
const FAMILY_HINT: &str =
    "workgroup 32-256 in steps of 32 (not 224), out_w 1-6 or 8, out_h 1-4, rows 1-6, 8, \
     9, 12, 16, 24 or 32, direct 0, 1 or 2";

fn in_family(workgroup: u32, out_w: u32, out_h: u32, rows: u32, direct: u32) -> bool {
    WORKGROUPS.contains(&workgroup)
        && OUT_WS.contains(&out_w)
        && OUT_HS.contains(&out_h)
        && ROWS.contains(&rows)
        && DIRECTS.contains(&direct)
}
/// Runs of outputs an invocation may own (their KD x OUT_W sums each in registers).
const MAX_ITEMS: usize = 4;
/// Workgroups a plane walk must leave (a few an SM on the largest GPUs; Vulkan does not
/// report SM counts).
pub const WALK_MIN_GROUPS: usize = 2048;
/// Band elements an invocation may load ahead (each a register and its offset another).
const MAX_FILL: usize = 24;
/// Registers of windows an invocation may hold a slice ahead (`direct` 2).
const MAX_AHEAD_REGISTERS: usize = 32;

impl RotateConfig {
    pub const NAME: &'static str = "depth_rotate";
    /// The fields, in `values` order.
    pub const NAMES: [&'static str; 5] = ["workgroup", "out_w", "out_h", "rows", "direct"];

    pub fn values(&self) -> [u32; 5] {
        [
            self.workgroup,
            self.out_w,
            self.out_h,
            self.rows,
            self.direct,
        ]
    }

    /// The config of `values` (in `NAMES` order), family or not.
    fn from_values([workgroup, out_w, out_h, rows, direct]: [u32; 5]) -> Self {
        RotateConfig {
            workgroup,
            out_w,
            out_h,
            rows,
            direct,
        }
    }

    fn as_tile(&self) -> TileConfig {
        TileConfig {
            workgroup: self.workgroup,
            out_w: self.out_w,
            rows: self.rows,
        }
    }

    /// The shared band's rows and floats a row (one slice; 1 x 1 where it reads directly).
    pub fn band(&self, spec: &ConvSpec) -> (usize, usize) {
        if self.direct != 0 {
            return (1, 1);
        }
        tile_shape(spec, &self.as_tile())
    }

    /// Shared memory a workgroup needs (two f32 slice bands: the one multiplied and the
    /// next; unpadded: a pad float every 32, against the 4-way bank conflicts of runs of
    /// 4, ran 1.1-1.3x slower on the H100, run 271).
    pub fn shared_bytes(&self, spec: &ConvSpec) -> usize {
        let (hs, ws) = self.band(spec);
        2 * 4 * hs * ws
    }

    /// Elements of a slice band each invocation loads (the shader's FILL_K: each held in
    /// a register, with its source offset, while the slice before is multiplied).
    pub fn fill_per_invocation(&self, spec: &ConvSpec) -> usize {
        let (hs, ws) = self.band(spec);
        (hs * ws).div_ceil(self.workgroup as usize)
    }

    /// Outputs a vector store of a run holds (the shader's CV), if its runs leave as
    /// vectors: channels-first data, runs that divide the output rows (so each starts
    /// aligned), 4 where the run is a multiple of 4, else 2 where it is even.
    pub fn store_vector(&self, spec: &ConvSpec) -> Option<usize> {
        let out_w = self.out_w as usize;
        if spec.layout() != Layout::ChannelsFirst || !spec.output3()[2].is_multiple_of(out_w) {
            return None;
        }
        [4, 2].into_iter().find(|cv| out_w.is_multiple_of(*cv))
    }

    /// Where each run's window is read as aligned vectors of the stored run's width
    /// (the shader's VOFF: elements of the first vector before the window): reading
    /// directly from channels-first rows whose length is a whole number of vectors, at
    /// W stride and dilation 1.
    pub fn load_vector_offset(&self, spec: &ConvSpec) -> Option<usize> {
        let cv = self.store_vector(spec)?;
        (self.direct != 0
            && spec.stride3()[2] == 1
            && spec.dilation3()[2] == 1
            && spec.input3()[2].is_multiple_of(cv))
        .then(|| (cv - spec.pad_before3()[2] % cv) % cv)
    }

    /// With `direct` 2, the 32-bit registers that hold an invocation's windows of the next
    /// slice (its runs' input rows, each the aligned vectors its window spans); None
    /// where the windows are not read as vectors.
    pub fn ahead_registers(&self, spec: &ConvSpec) -> Option<usize> {
        let voff = self.load_vector_offset(spec)?;
        let cv = self.store_vector(spec)?;
        let [_, kh, kw] = spec.kernel3();
        let [_, sh, _] = spec.stride3();
        let [_, dh, dw] = spec.dilation3();
        let win = (self.out_w as usize - 1) + (kw - 1) * dw + 1;
        let rin = (self.out_h as usize - 1) * sh + (kh - 1) * dh + 1;
        let vectors = (voff + win).div_ceil(cv);
        Some(self.items(spec) * rin * vectors * (cv * spec.dtype().size_bytes()).div_ceil(4))
    }

    /// Runs (OUT_H x OUT_W outputs) each invocation owns: the band's runs over the
    /// invocations.
    pub fn items(&self, spec: &ConvSpec) -> usize {
        let ow = spec.output3()[2];
        let runs = (self.rows / self.out_h) as usize * ow.div_ceil(self.out_w as usize);
        runs.div_ceil(self.workgroup as usize)
    }

    /// Slices a workgroup walks across planes (the shader's WALK; 0: it walks one plane's
    /// depth). On channels-first data with one kernel depth and no depth padding the
    /// N x C x D planes are independent slices, so a workgroup can take several in turn,
    /// loading the next under the current one's FMAs: 8 (or 4, 2) where that still leaves
    /// at least [`WALK_MIN_GROUPS`] workgroups.
    pub fn walk(&self, spec: &ConvSpec) -> usize {
        let [kd, _, _] = spec.kernel3();
        let pd = spec.pad_before3()[0] + spec.pad_after3()[0];
        if spec.layout() != Layout::ChannelsFirst || kd != 1 || pd != 0 {
            return 0;
        }
        [8, 4, 2]
            .into_iter()
            .find(|&w| self.workgroups_walking(spec, w) >= WALK_MIN_GROUPS)
            .unwrap_or(0)
    }

    /// Workgroups a launch has: a band of rows of one (n, c) plane each, or with the
    /// plane walk a band of `walk` consecutive N x C x D planes each.
    pub fn workgroups(&self, spec: &ConvSpec) -> usize {
        self.workgroups_walking(spec, self.walk(spec))
    }

    fn workgroups_walking(&self, spec: &ConvSpec, walk: usize) -> usize {
        let bands = spec.output3()[1].div_ceil(self.rows as usize);
        let planes = spec.n() * spec.c();
        if walk > 0 {
            bands * (planes * spec.input3()[0]).div_ceil(walk)
        } else {
            bands * planes
        }
    }

    /// The share of the invocations' output slots (runs x OUT_W, over every band) that
    /// hold an output: what an uneven split of the runs, a short last band or a short
    /// last run of a row leaves idle.
    pub fn run_use(&self, spec: &ConvSpec) -> f64 {
        let [_, oh, ow] = spec.output3();
        let slots = oh.div_ceil(self.rows as usize)
            * self.items(spec)
            * self.workgroup as usize
            * self.out_w as usize
            * self.out_h as usize;
        (oh * ow) as f64 / slots as f64
    }

    /// Why the rotation does not apply to `spec`, if it does not.
    pub fn applies(spec: &ConvSpec) -> std::result::Result<(), String> {
        if spec.stride3()[0] != 1 || spec.dilation3()[0] != 1 {
            return Err(format!(
                "the depth rotation takes depth stride and dilation 1 (this spec: {} and {})",
                spec.stride3()[0],
                spec.dilation3()[0]
            ));
        }
        Ok(())
    }

    /// Why this config cannot run `spec` on a device with `info`'s limits, if it cannot.
    pub fn fits(
        &self,
        info: &VulkanDeviceInfo,
        spec: &ConvSpec,
    ) -> std::result::Result<(), String> {
        Self::applies(spec)?;
        if self.direct != 0 && spec.layout() != Layout::ChannelsFirst {
            return Err(
                "reading windows directly takes channels-first data (a warp's \
                        lanes along W)"
                    .into(),
            );
        }
        if self.workgroup > info.max_workgroup_invocations {
            return Err(format!(
                "{} invocations a workgroup, more than the device's {}",
                self.workgroup, info.max_workgroup_invocations
            ));
        }
        let bytes = self.shared_bytes(spec);
        if bytes > info.max_shared_bytes as usize {
            return Err(format!(
                "a band of {bytes} bytes, more than the device's {} of shared memory",
                info.max_shared_bytes
            ));
        }
        if self.rows as usize > spec.output3()[1].next_power_of_two() {
            return Err(format!(
                "{} rows a band for {} output rows",
                self.rows,
                spec.output3()[1]
            ));
        }
        if self.direct == 2 {
            let Some(regs) = self.ahead_registers(spec) else {
                return Err("reading windows a slice ahead takes them as vectors: \
                            channels-first rows that are whole vectors, runs of 2, 4, 6 or \
                            8 that divide the output rows, W stride and dilation 1"
                    .into());
            };
            if regs > MAX_AHEAD_REGISTERS {
                return Err(format!(
                    "{regs} registers of windows an invocation loads a slice ahead (at most \
                     {MAX_AHEAD_REGISTERS})"
                ));
            }
        }
        let fill = self.fill_per_invocation(spec);
        if fill > MAX_FILL {
            return Err(format!(
                "{fill} band elements an invocation loads ahead (at most {MAX_FILL} in registers)"
            ));
        }
        if !self.rows.is_multiple_of(self.out_h) {
            return Err(format!(
                "{} rows a band in runs {} rows tall: the band must hold whole runs",
                self.rows, self.out_h
            ));
        }
        let items = self.items(spec);
        let sums = items * spec.kernel3()[0] * (self.out_w * self.out_h) as usize;
        if items > MAX_ITEMS || sums > 64 {
            return Err(format!(
                "{items} runs of {} x {} outputs an invocation over {} depths: more sums \
                 than registers hold (at most {MAX_ITEMS} runs, 64 sums)",
                self.out_h,
                self.out_w,
                spec.kernel3()[0]
            ));
        }
        Ok(())
    }

    /// Every config that fits `spec` on the device.
    pub fn space(info: &VulkanDeviceInfo, spec: &ConvSpec) -> Vec<RotateConfig> {
        super::combinations([&WORKGROUPS, &OUT_WS, &OUT_HS, &ROWS, &DIRECTS])
            .into_iter()
            .map(Self::from_values)
            .filter(|c| c.fits(info, spec).is_ok())
            .collect()
    }

    /// The default: 64-256 invocations (at most the device's), runs of 2-6 outputs on
    /// rows of 16 or more (1 on shorter ones), at most two runs an invocation; of those,
    /// one run an invocation where that uses >= 90% of the output slots
    /// ([`Self::run_use`]), then the fewest idle slots, then the tallest band (fewer
    /// halo rows read twice), then the one nearest 128 invocations. (The H100's tuned
    /// picks, run 267, all hold one run an invocation: seed 128 x 5 x 8 rows, x3d
    /// 160 x 3 x 8, video-vae 256 x 2 x 4, convnext 160 x 6 x 16; a default of two runs an
    /// invocation of 256 ran the video-vae case 2x slower than its tuned pick.) On planes
    /// of one slice and many taps: runs of 4 x 2 rows, the tallest band of at most 16
    /// rows whose runs the fewest invocations hold one each (H200 run 386, convnext-7x7:
    /// 128 x 4 x 2 rows x 16 0.140 ms, the best single-row runs 0.168). Elsewhere, where
    /// runs of 8 read a slice ahead fit the registers (`direct` 2, channels-first rows
    /// that are whole vectors): those, one run an invocation, the most slots used, the
    /// smallest workgroup of at least 64 (H200 runs 405-407).
    pub fn default_for(info: &VulkanDeviceInfo, spec: &ConvSpec) -> Result<RotateConfig> {
        let refused = |reason: String| Error::NotApplicable {
            variant: Self::NAME.into(),
            spec: spec.to_string(),
            reason,
        };
        Self::applies(spec).map_err(refused)?;
        let space = Self::space(info, spec);
        let wide = spec.output3()[2] >= 16;
        // Vector stores (runs of 4 or 2 that divide the rows) and bands of 4, 8 or 16 rows
        // first (run 281: seed-bf16 0.814 -> 0.709 ms, seed-f32 0.761 -> 0.595, x3d 0.213 ->
        // 0.149, video-vae-causal 0.316 -> 0.272, causal-conv1d 0.143 -> 0.129), except on
        // planes of one slice and many taps, where they measured slower (convnext-7x7: the
        // best such 0.159 ms, the first of this rule 0.206, the old default's 0.178).
        let taps = spec.taps();
        // Short rows of one kernel row (1-D layers) read their windows directly: a band
        // gives them no reuse across rows and cost 16 KB of shared memory a workgroup
        // (causal-conv1d 0.130 -> 0.071 ms, run 284; on 2-D and 3-D kernels direct reads
        // measured 1.06x faster to 1.4x slower, so the band stays there). Long rows
        // (conformer's 31 taps, not measured) keep the band: each input is read once a
        // window from it either way, and shared memory serves those reads cheaper than L1.
        let direct = u32::from(
            spec.kernel3()[1] == 1 && taps <= 9 && spec.layout() == Layout::ChannelsFirst,
        );
        let plane = super::one_slice_planes_of_many_taps(spec);
        let key = |c: &RotateConfig| {
            let used = c.run_use(spec);
            (
                // (Runs stored as one vector each: what run 281 measured.)
                c.store_vector(spec) == Some(c.out_w as usize) && !plane,
                used >= 0.9 && c.items(spec) == 1,
                c.rows.is_power_of_two() && !plane,
                (used * 1000.0).round() as i64,
                c.rows,
                -(c.workgroup as i64 - 128).abs(),
                c.out_w,
            )
        };
        let tall_runs = if plane {
            space
                .iter()
                .copied()
                .filter(|c| {
                    (c.out_w, c.out_h, c.direct) == (4, 2, 0) && c.rows <= 16 && c.items(spec) == 1
                })
                .max_by_key(|c| (c.rows, -(c.workgroup as i64)))
        } else {
            None
        };
        // Windows read a slice ahead as vectors in runs of 8 (`direct` 2), where runs of 8
        // fit its registers: H200 runs 405-407, x3d 0.138 -> 0.119 ms, video-vae-causal
        // 0.255 -> 0.182, causal-conv1d 0.061 -> 0.0495 (the best forced configs were these
        // picks: one run an invocation, the most slots used, the smallest workgroup of at
        // least 64). The seed's 5 x 5 rows would need 40 registers in runs of 8; its runs of
        // 4 read ahead ran 1.12x slower than its band, so it keeps the band; so do planes of
        // one slice and many taps (conformer's 31-tap rows: not measured read ahead).
        let ahead = space
            .iter()
            .copied()
            .filter(|c| {
                !plane
                    && (c.direct, c.out_w, c.out_h) == (2, 8, 1)
                    && c.items(spec) == 1
                    && c.workgroup >= 64
            })
            .max_by_key(|c| {
                (
                    (c.run_use(spec) * 1000.0).round() as i64,
                    -(c.workgroup as i64),
                )
            });
        let general = space
            .iter()
            .copied()
            .filter(|c| {
                (64..=256).contains(&c.workgroup)
                    && c.out_h == 1
                    && c.direct == direct
                    && c.items(spec) <= 2
                    && if wide {
                        (2..=6).contains(&c.out_w)
                    } else {
                        c.out_w == 1
                    }
            })
            .max_by_key(key);
        tall_runs
            .or(ahead)
            .or(general)
            .or_else(|| space.first().copied())
            .ok_or_else(|| {
                refused(format!(
                    "no config fits: even one output row's band exceeds the device's {} bytes \
                     of shared memory, or its runs the registers",
                    info.max_shared_bytes
                ))
            })
    }
}

config_text!(
    RotateConfig,
    "a depth_rotate config",
    FAMILY_HINT,
    |v: [u32; 5]| {
        let [workgroup, out_w, out_h, rows, direct] = v;
        in_family(workgroup, out_w, out_h, rows, direct).then(|| RotateConfig::from_values(v))
    }
);

fn i32_of(what: &str, v: usize) -> Result<i32> {
    super::i32_of("depth_rotate", what, v)
}

/// The shader with `config` (None: the device's default) prepared on device-local
/// copies of `x` and `w`, to launch and time.
pub fn prepare_depth_rotate<'d>(
    dev: &'d VulkanDevice,
    spec: &ConvSpec,
    x: &HostTensor,
    w: &HostTensor,
    config: Option<RotateConfig>,
) -> Result<VulkanRun<'d>> {
    let info = dev.info();
    let source = super::source_for("depth_rotate", SOURCE, spec.dtype(), info)?;
    x.expect("input", spec.dtype(), spec.input_len())?;
    w.expect("weight", spec.dtype(), spec.weight_len())?;
    let config = super::resolve_config(
        RotateConfig::NAME,
        spec,
        config,
        || RotateConfig::default_for(info, spec),
        |c| c.fits(info, spec),
    )?;
    let source = match config.store_vector(spec) {
        Some(cv) => super::shader::with_defines(&source, &[("CV", cv)]),
        None => source,
    };
    i32_of("input length", spec.input_len())?;
    i32_of("output length", spec.output_len())?;
    let [id, ih, iw] = spec.input3();
    let [od, oh, ow] = spec.output3();
    let walk = config.walk(spec);
    let groups = config.workgroups(spec);
    let grid = super::grid_for(info, groups)?;
    let (st, dl, pb) = (spec.stride3(), spec.dilation3(), spec.pad_before3());
    let ints = [
        spec.n(),
        spec.c(),
        id,
        ih,
        iw,
        od,
        oh,
        ow,
        pb[0],
        pb[1],
        pb[2],
        usize::from(spec.layout() == Layout::ChannelsLast),
        groups,
    ]
    .into_iter()
    .map(|v| i32_of("a size", v))
    .collect::<Result<Vec<i32>>>()?;
    let (hs, ws) = config.band(spec);
    let [kd, kh, kw] = spec.kernel3();
    let mut constants = super::spec_constants(&[
        config.workgroup as usize,
        kd,
        kh,
        kw,
        config.out_w as usize,
        config.rows as usize,
        st[2],
        dl[2],
        hs,
        ws,
        config.items(spec),
        config.fill_per_invocation(spec),
        walk,
        config.direct as usize,
        st[1],
        dl[1],
        config.out_h as usize,
    ]);
    // VOFF (id 17): -1 for scalar loads, as the constant's 32 bits.
    let voff = config.load_vector_offset(spec).map_or(-1, |v| v as i32);
    constants.push((constants.len() as u32, voff as u32));
    let y = HostTensor::zeros(spec.dtype(), &spec.output_shape());
    VulkanRun::new(
        dev,
        "depth_rotate",
        &source,
        &constants,
        &super::push_bytes(&ints),
        grid,
        x,
        w,
        y,
        None,
    )
    .map(|r| r.with_config(&config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::ConvParams;

    #[test]
    fn defaults_use_most_run_slots_on_the_public_suite() {
        let mut info = crate::vulkan::device::lavapipe_like();
        info.max_shared_bytes = 48 * 1024;
        info.max_workgroup_invocations = 1024;
        for case in crate::suite::public_suite().unwrap() {
            let spec = case.spec;
            if RotateConfig::applies(&spec).is_err() {
                continue;
            }
            let d = RotateConfig::default_for(&info, &spec).unwrap();
            let best = RotateConfig::space(&info, &spec)
                .iter()
                .map(|c| c.run_use(&spec))
                .fold(0.0, f64::max);
            eprintln!(
                "{}: {d} uses {:.3} (best {best:.3})",
                case.name,
                d.run_use(&spec)
            );
            assert!(d.fits(&info, &spec).is_ok());
            // The plane walk: channels-first rows of one kernel depth, no depth padding.
            let walks = matches!(case.name.as_str(), "causal-conv1d" | "convnext-7x7");
            assert_eq!(d.walk(&spec) > 0, walks, "{}: {d}", case.name);
            // Vector stores everywhere they fit (the plane of 49 taps in runs of 4 x 2
            // rows) but where no run width divides the rows.
            let vector = matches!(
                case.name.as_str(),
                "seed-bf16"
                    | "seed-f16"
                    | "seed-f32"
                    | "x3d-3x3x3"
                    | "video-vae-causal"
                    | "causal-conv1d"
                    | "convnext-7x7"
            );
            assert_eq!(
                d.out_h == 2,
                case.name == "convnext-7x7",
                "{}: {d}",
                case.name
            );
            assert_eq!(
                d.store_vector(&spec).is_some(),
                vector,
                "{}: {d}",
                case.name
            );
            // Windows read a slice ahead in runs of 8 where those fit the registers (not
            // the seed's 5 x 5 rows; not odd-dilated's 47-wide rows, which are no vectors).
            assert_eq!(
                d.direct == 2,
                matches!(
                    case.name.as_str(),
                    "x3d-3x3x3" | "video-vae-causal" | "causal-conv1d"
                ),
                "{}: {d}",
                case.name
            );
            if d.direct == 2 {
                assert_eq!((d.out_w, d.items(&spec)), (8, 1), "{}: {d}", case.name);
            }
            assert!(d.run_use(&spec) >= 0.8 * best, "{}: {d}", case.name);
        }
    }

    #[test]
    fn short_one_row_kernels_read_windows_directly() {
        let mut info = crate::vulkan::device::lavapipe_like();
        info.max_shared_bytes = 48 * 1024;
        let row = |k: i64, layout: Layout| {
            ConvParams {
                n: 4,
                c: 64,
                input: vec![1024],
                kernel: vec![k],
                stride: vec![1],
                dilation: vec![1],
                padding: vec![[k - 1, 0]],
                layout,
                dtype: crate::spec::DType::Bf16,
            }
            .validate()
            .unwrap()
        };
        let direct = |spec: &ConvSpec| RotateConfig::default_for(&info, spec).unwrap().direct;
        assert_eq!(direct(&row(3, Layout::ChannelsFirst)), 2);
        // Conformer's 31 taps keep the band; channels-last data has no direct form.
        assert_eq!(direct(&row(31, Layout::ChannelsFirst)), 0);
        assert_eq!(direct(&row(4, Layout::ChannelsLast)), 0);
        let cl = row(4, Layout::ChannelsLast);
        let forced = RotateConfig {
            workgroup: 64,
            out_w: 4,
            out_h: 1,
            rows: 1,
            direct: 1,
        };
        assert!(forced.fits(&info, &cl).is_err());
        assert!(forced.fits(&info, &row(4, Layout::ChannelsFirst)).is_ok());
    }

    #[test]
    fn the_space_covers_every_output_and_is_pruned() {
        let info = crate::vulkan::device::lavapipe_like();
        let seed = ConvParams::seed().validate().unwrap();
        let space = RotateConfig::space(&info, &seed);
        assert!(!space.is_empty());
        for c in &space {
            assert!(c.shared_bytes(&seed) <= 32 * 1024);
            assert!(c.fill_per_invocation(&seed) <= MAX_FILL);
            // Every run of the band has an owner.
            assert!(
                c.items(&seed) * (c.workgroup * c.out_w * c.out_h) as usize >= c.rows as usize * 80
            );
        }
        let d = RotateConfig::default_for(&info, &seed).unwrap();
        assert!(d.fits(&info, &seed).is_ok() && d.items(&seed) <= 2, "{d}");
        // The seed's default splits its band's runs evenly (runs of 4 over 8 rows left a
        // quarter of the invocations a second run: 62.5% of the run slots used).
        let mut h100 = info.clone();
        h100.max_shared_bytes = 48 * 1024;
        h100.max_workgroup_invocations = 1024;
        let d = RotateConfig::default_for(&h100, &seed).unwrap();
        assert!(d.run_use(&seed) >= 0.9, "{d}: {:.3}", d.run_use(&seed));
        let mut strided = ConvParams::seed();
        strided.stride = vec![2, 1, 1];
        let strided = strided.validate().unwrap();
        assert!(RotateConfig::space(&info, &strided).is_empty());
        assert!(RotateConfig::default_for(&info, &strided).is_err());
    }
}
