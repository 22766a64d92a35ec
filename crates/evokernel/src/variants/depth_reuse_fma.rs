//! `depth_reuse_fma`: depth_reuse's rotation on the FMA pipes (kernels/depth_reuse_fma.cu).
//! Each thread keeps KD rotating rows of `out_w` accumulators, so each input slice is
//! read from shared memory once for every output depth it reaches. Exact in f32 (FFMA),
//! and any dtype where the tensor-core tiles do not fit.

use super::{
    block_sides, channels_last, chunk_fits_without_walk, cuda_type, default_launches,
    depth_chunk_at_most, depth_chunks, fill_table, fma_ring_bytes, grid_x, input_cols, input_rows,
    plane_walk_ring_params, walkable_planes, walked_geometry, within_shared, Config, Launch, Param,
    Variant, DEPTH_CHUNKS,
};
use crate::error::Result;
use crate::spec::{ConvSpec, DType};

pub struct DepthReuseFma;

/// Slices in flight ahead of the one being read; 0: the kernel's `walk_slice_groups`, KD
/// slices behind one barrier and the next KD in flight (2 KD slots), for KD >= 2.
const STAGES: [i64; 4] = [0, 1, 2, 4];

/// The `stages` values offered for `spec`: groups of slices only where there are KD >= 2.
fn stage_choices(spec: &ConvSpec) -> Vec<i64> {
    let groups = spec.kernel3()[0] >= 2;
    STAGES.into_iter().filter(|&s| s > 0 || groups).collect()
}

/// Slices in flight as the ring counts them (the ring holds this + 1, capped at the
/// block's steps): a group walk's 2 KD slots are 2 KD - 1 ahead of one.
fn ring_stages(spec: &ConvSpec, stages: usize) -> usize {
    if stages == 0 {
        2 * spec.kernel3()[0] - 1
    } else {
        stages
    }
}
/// Weights a thread keeps in registers (both FMA rotation kernels), next to its
/// KD x out_w accumulators.
pub(super) const MAX_WEIGHTS: usize = 128;
pub(super) const MAX_THREADS: usize = 1024;

/// Elements per 16-byte chunk (the cp.async and shared-read unit).
fn chunk_elems(spec: &ConvSpec) -> usize {
    spec.dtype().per_16_bytes()
}

/// Bytes an async copy of the slice fill moves (COPY in the kernel): whole 16-byte chunks
/// where input rows are whole chunks, else 4-byte pieces (f32 of any width, 16-bit types
/// of even width), the pieces past a row's end zero-filled.
fn copy_bytes(spec: &ConvSpec) -> usize {
    if whole_chunk_rows(spec) {
        16
    } else {
        4
    }
}

/// Whether input rows are whole 16-byte chunks (the fill's fast copies).
fn whole_chunk_rows(spec: &ConvSpec) -> bool {
    spec.input3()[2].is_multiple_of(chunk_elems(spec))
}

/// The kernel's S: how far the first tap sits past an aligned chunk, (-pw) mod E.
fn lead(spec: &ConvSpec) -> usize {
    let e = chunk_elems(spec);
    (e - spec.pad_before3()[2] % e) % e
}

/// Chunks a slice row fills: the windows of `tx` threads (FILL_CH in the kernel).
fn slice_fill_chunks(spec: &ConvSpec, out_w: usize, tx: usize) -> usize {
    let e = chunk_elems(spec);
    let window = (lead(spec) + input_cols(spec, out_w)).div_ceil(e);
    (tx - 1) * out_w * spec.stride3()[2] / e + window
}

/// Chunks per slice row: the filled ones padded to tx x (chunks between windows) mod 8,
/// so any 8 consecutive threads read distinct banks wherever their row breaks. Mirrors
/// ROW_CH in the kernel.
fn slice_row_chunks(spec: &ConvSpec, out_w: usize, tx: usize) -> usize {
    let step = out_w * spec.stride3()[2] / chunk_elems(spec);
    let fill = slice_fill_chunks(spec, out_w, tx);
    fill + (tx * step + 8 - fill % 8) % 8
}

/// The chunk table and the ring of slices of `ty` output rows' input rows (walking
/// planes, each slot with its plane's weights as f32). Mirrors slot_bytes in the kernel.
fn shared_bytes(spec: &ConvSpec, config: &Shape) -> usize {
    let rows = input_rows(spec, config.ty);
    let weights = if config.planes == 1 {
        (spec.taps() * 4).div_ceil(16) * 16
    } else {
        0
    };
    fma_ring_bytes(
        &config.walked(spec),
        config.dchunk,
        ring_stages(spec, config.stages),
        rows * slice_fill_chunks(spec, config.out_w, config.tx),
        rows * slice_row_chunks(spec, config.out_w, config.tx) * 16 + weights,
    )
}

/// Whether the default walks planes: where it may and a block would otherwise have one
/// slice (one output depth). H100, run 247, walked (8 planes a block) / one slice a
/// block: conformer-k31 0.029 / 0.043 ms, causal-conv1d 0.056 / 0.089, lfm-shortconv-k3
/// 0.105 / 0.167, convnext-7x7 0.104 / 0.162 (there depth_reuse's walk on tensor cores
/// takes 0.058). With several depths a block already walks a chunk of them.
pub(crate) fn walks_planes_by_default(spec: &ConvSpec) -> bool {
    spec.output3()[0] == 1 && walked_planes(spec).is_some()
}

/// The N x C x D planes of a channels-first tensor as one image's depths, where they
/// can be walked (the kernel gives each plane its own channel's weights).
fn walked_planes(spec: &ConvSpec) -> Option<ConvSpec> {
    walkable_planes(spec.channel_planes_as_depths())
}

/// The default block: whole rows where a row has at most 32 runs (of the widest
/// output run), about 256 threads in near-equal bands (seed: 10 x 23).
fn default_block(spec: &ConvSpec) -> (usize, usize) {
    let [_, oh, _] = spec.output3();
    let out_w = out_widths(spec).last().copied().unwrap_or(8);
    let groups = column_groups(spec, out_w as usize);
    let tx = groups.div_ceil(groups.div_ceil(32));
    let ty_cap = (256 / tx).max(1);
    (tx, oh.div_ceil(oh.div_ceil(ty_cap)))
}

typed_params!(
    /// A config's numbers, read once.
    Shape {
        out_w,
        tx,
        ty,
        dchunk,
        stages,
        minblocks,
        planes,
    }
);

impl Shape {
    /// The geometry the kernel walks: with `planes`, every plane as one image's depths.
    fn walked(&self, spec: &ConvSpec) -> ConvSpec {
        walked_geometry(spec, self.planes, walked_planes(spec))
    }
}

/// Output columns in groups of `out_w` (one thread's run).
fn column_groups(spec: &ConvSpec, out_w: usize) -> usize {
    spec.output3()[2].div_ceil(out_w)
}

/// Widths of `out_w` the kernel can take: windows must start on 16-byte chunks.
fn out_widths(spec: &ConvSpec) -> Vec<i64> {
    let (e, sw) = (chunk_elems(spec), spec.stride3()[2]);
    [4i64, 8]
        .into_iter()
        .filter(|&w| (w as usize * sw).is_multiple_of(e))
        .collect()
}

/// What both FMA rotation kernels need of a spec whatever its layout: unit depth steps
/// (the rotation), W stride and dilation compiled in (at most 3), weights in registers.
pub(super) fn fma_rotation_applies(spec: &ConvSpec) -> std::result::Result<(), String> {
    if spec.stride3()[0] != 1 || spec.dilation3()[0] != 1 {
        return Err("needs stride 1 and dilation 1 along depth (the rotation)".into());
    }
    let (sw, dw) = (spec.stride3()[2], spec.dilation3()[2]);
    if sw > 3 || dw > 3 {
        return Err(format!(
            "stride {sw} and dilation {dw} along W: at most 3 each (compiled into the kernel)"
        ));
    }
    if spec.taps() > MAX_WEIGHTS {
        return Err(format!(
            "{} taps do not fit the register budget ({MAX_WEIGHTS})",
            spec.taps()
        ));
    }
    Ok(())
}

impl Variant for DepthReuseFma {
    fn name(&self) -> &'static str {
        "depth_reuse_fma"
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/depth_reuse_fma.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        if channels_last(spec) {
            return Err("needs a channels-first layout".into());
        }
        fma_rotation_applies(spec)?;
        let [_, ih, iw] = spec.input3();
        if !(iw * spec.dtype().size_bytes()).is_multiple_of(4) {
            return Err(format!(
                "an input row of {iw} {} elements is not a multiple of 4 bytes (the slice fill's \
                 smallest async copy); an even width takes this kernel",
                spec.dtype()
            ));
        }
        if ih * iw > i32::MAX as usize {
            return Err(format!(
                "an input depth plane of {ih} x {iw} elements: the kernel's in-plane offsets are 32-bit"
            ));
        }
        if out_widths(spec).is_empty() {
            return Err(
                "no output run of 4 or 8 starts on a 16-byte chunk at this W stride".into(),
            );
        }
        default_launches(self, spec)
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        let [_, oh, _] = spec.output3();
        let widths = out_widths(spec);
        let narrowest = widths.first().copied().unwrap_or(4) as usize;
        // The default's block shape is always in the space (e.g. 20 x 12 on a 160 x 90
        // output, which the near-equal splits alone miss).
        let (tx, ty) = default_block(spec);
        let with = |mut v: Vec<i64>, x: usize| {
            v.push(x as i64);
            v.sort_unstable();
            v.dedup();
            v
        };
        let mut params = vec![
            // Consecutive outputs of one row per thread.
            Param {
                name: "out_w",
                values: widths,
            },
            // Threads along W (each out_w columns) and along H (one row each).
            Param {
                name: "tx",
                values: with(block_sides(column_groups(spec, narrowest), 64), tx),
            },
            Param {
                name: "ty",
                values: with(block_sides(oh, 64), ty),
            },
        ];
        params.extend(plane_walk_ring_params(
            spec,
            walked_planes(spec),
            &stage_choices(spec),
        ));
        params
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        // From the H100 sweeps (docs/perf.md, run 48). Runs of 8 outputs (seed-f32 0.531
        // ms vs 0.612 with 4). A block spans whole rows where a row has at most 32 runs,
        // with about 256 threads in near-equal bands (seed: 10 x 23). Registers capped for
        // four blocks per SM where the weights are few (run 289, A/B against three: x3d
        // 0.113 -> 0.105 ms forward, 0.117 -> 0.110 grad-input, video-vae 0.140 -> 0.133;
        // three had beaten two in run 48), two where they are many (75 taps: seed-f32
        // 0.508 -> 0.83 at four, run 288).
        let out_w = out_widths(spec).last().copied().unwrap_or(8);
        let (tx, ty) = default_block(spec);
        let walk = walks_planes_by_default(spec);
        // Walking, 8 planes a block (conformer-k31 0.029 ms vs 0.030 at 4, 0.034 at 16).
        let geometry = walked_geometry(spec, walk.into(), walked_planes(spec));
        let dchunk = depth_chunk_at_most(
            &depth_chunks(&geometry, &DEPTH_CHUNKS),
            if walk { 8 } else { 64 },
        );
        let minblocks = if spec.taps() <= 32 { 4 } else { 2 };
        let config = |stages: i64| {
            Config::new(
                self.name(),
                &[
                    ("out_w", out_w),
                    ("tx", tx as i64),
                    ("ty", ty as i64),
                    ("dchunk", dchunk),
                    ("stages", stages),
                    ("minblocks", minblocks),
                    ("planes", walk as i64),
                ],
            )
        };
        // KD slices behind one barrier (stages 0) where there are kernel depths and few
        // 16-bit taps, when the 2 KD slots fit (run 291, A/B against stages 2: x3d 0.963x
        // forward, 0.971x grad-input, video-vae-causal 0.972x / 0.989x; seed-f32, 75
        // taps, 1.01x).
        let grouped = config(0);
        if spec.kernel3()[0] >= 2
            && minblocks == 4
            && spec.dtype() != DType::F32
            && self.fits(spec, &grouped).is_ok()
        {
            grouped
        } else {
            config(2)
        }
    }
    fn fits(&self, spec: &ConvSpec, config: &Config) -> std::result::Result<(), String> {
        let shape = Shape::read(config).map_err(|e| e.to_string())?;
        chunk_fits_without_walk(spec, shape.planes, shape.dchunk)?;
        if shape.tx * shape.ty > MAX_THREADS {
            return Err(format!(
                "tx x ty = {} threads, more than a block's {MAX_THREADS}",
                shape.tx * shape.ty
            ));
        }
        within_shared(
            &format!("a ring of {} slices", ring_stages(spec, shape.stages) + 1),
            shared_bytes(spec, &shape),
        )
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let s = Shape::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "depth_reuse_fma_dwconv<{}, {kd}, {kh}, {kw}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            s.out_w,
            spec.stride3()[2],
            spec.dilation3()[2],
            lead(spec),
            copy_bytes(spec),
            s.tx,
            s.ty,
            s.dchunk,
            s.stages,
            s.minblocks,
            fill_table(&s.walked(spec), s.dchunk),
            s.planes
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        let shape = Shape::parse(self, spec, config)?;
        let walked = shape.walked(spec);
        let [od, oh, _] = walked.output3();
        let regions = oh.div_ceil(shape.ty) * column_groups(spec, shape.out_w).div_ceil(shape.tx);
        let blocks = walked.n() * walked.c() * od.div_ceil(shape.dchunk) * regions;
        Ok(Launch {
            grid: (grid_x(self, spec, blocks)?, 1, 1),
            block: ((shape.tx * shape.ty) as u32, 1, 1),
            shared_bytes: shared_bytes(spec, &shape) as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::public_case;
    use crate::variants::valid_configs;

    #[test]
    fn slice_groups_hold_two_kernel_depths_of_slices() {
        let v = DepthReuseFma;
        let x3d = public_case("x3d-3x3x3");
        let bytes = |stages: i64| {
            let mut c = v.default_config(&x3d);
            c.values.insert("stages".into(), stages);
            shared_bytes(&x3d, &Shape::read(&c).unwrap())
        };
        let slice = bytes(2) - bytes(1);
        // Groups of KD = 3: six slots, three more than stages 2's ring (the table alike).
        assert_eq!(bytes(0), bytes(2) + 3 * slice);
        let mut c = v.default_config(&x3d);
        c.values.insert("stages".into(), 0);
        assert!(valid_configs(&v, &x3d).contains(&c));
        // Not offered without kernel depths to group (2-D, 1-D).
        let convnext = public_case("convnext-7x7");
        assert!(!valid_configs(&v, &convnext)
            .iter()
            .any(|c| c.get("stages") == Some(0)));
    }

    #[test]
    fn the_seed_in_f32_gets_whole_rows_in_two_bands() {
        let v = DepthReuseFma;
        let seed = public_case("seed-f32");
        v.applies(&seed).unwrap();
        assert_eq!(lead(&seed), 2, "pw = 2: taps start 2 past a float4");
        let d = v.default_config(&seed);
        assert_eq!(
            (d.get("out_w"), d.get("tx"), d.get("ty"), d.get("dchunk")),
            (Some(8), Some(10), Some(23), Some(64))
        );
        // 20 windows of 3 float4s, 4 apart: 22 chunks, padded to 28 (28 mod 8 = 4).
        assert_eq!(slice_row_chunks(&seed, 4, 20), 28);
        // 10 windows of 4 float4s, 8 apart: 22 chunks again.
        assert_eq!(slice_row_chunks(&seed, 8, 10), 28);
        let l = v.launch(&seed, &d, 132).unwrap();
        assert_eq!(l.block.0, 230);
        assert_eq!(l.grid.0 as usize, 512 * 2);
        // A table of 27 x 22 chunk offsets (to 16 bytes), then 3 slices of 22 + 4 rows.
        assert_eq!(l.shared_bytes as usize, 2384 + 3 * 27 * 28 * 16);
        assert!(v.specialization(&seed, &d).unwrap().ends_with(", true, 0>"));
        // One depth (2-D) without the walk: no table, and a ring of one slice.
        let convnext = public_case("convnext-7x7");
        let mut c = v.default_config(&convnext);
        assert_eq!((c.get("planes"), c.get("dchunk")), (Some(1), Some(8)));
        c.values.insert("planes".into(), 0);
        c.values.insert("dchunk".into(), 4);
        let spec = v.specialization(&convnext, &c).unwrap();
        assert!(spec.ends_with(", false, 0>"), "{spec}");
        let s = Shape::read(&c).unwrap();
        assert_eq!(
            shared_bytes(&convnext, &s),
            input_rows(&convnext, s.ty) * slice_row_chunks(&convnext, s.out_w, s.tx) * 16
        );
        // Walking its 16 x 384 planes, 8 a block: a table, a ring of three slots of a
        // slice and 49 f32 weights (196 bytes, to 208), an eighth of the blocks.
        let walk = Shape {
            planes: 1,
            dchunk: 8,
            ..s
        };
        let wc = walk.config(v.name());
        assert!(v
            .specialization(&convnext, &wc)
            .unwrap()
            .ends_with(", true, 1>"));
        let slot = input_rows(&convnext, s.ty) * slice_row_chunks(&convnext, s.out_w, s.tx) * 16;
        let table = (input_rows(&convnext, s.ty) * slice_fill_chunks(&convnext, s.out_w, s.tx) * 4)
            .div_ceil(16)
            * 16;
        assert_eq!(shared_bytes(&convnext, &walk), table + 3 * (slot + 208));
        assert_eq!(
            v.launch(&convnext, &wc, 132).unwrap().grid.0 * 8,
            v.launch(&convnext, &c, 132).unwrap().grid.0
        );
        // Not walked: the seed (three kernel depths), nor dchunk > 1 without the walk.
        assert!(!valid_configs(&v, &seed)
            .iter()
            .any(|c| c.get("planes") == Some(1)));
        let mut eight = c.clone();
        eight.values.insert("dchunk".into(), 8);
        assert!(v.fits(&convnext, &eight).is_err());
        assert_eq!(d.get("minblocks"), Some(2));
        assert_eq!(
            v.default_config(&public_case("x3d-3x3x3")).get("minblocks"),
            Some(4)
        );
        assert!(valid_configs(&v, &seed).contains(&d));
    }

    #[test]
    fn one_depth_layers_walk_their_planes_by_default() {
        let v = DepthReuseFma;
        let conformer = crate::suite::models_case("conformer-k31");
        let d = v.default_config(&conformer);
        assert_eq!((d.get("planes"), d.get("dchunk")), (Some(1), Some(8)));
        // 16 x 512 rows of 1024, 8 a block, each row in four runs of 32 x 8 outputs.
        let l = v.launch(&conformer, &d, 132).unwrap();
        assert_eq!(l.grid.0 as usize, 16 * 512 / 8 * 4);
        assert!(valid_configs(&v, &conformer).contains(&d));
        // Several output depths: a block already walks a chunk of them.
        for name in ["seed-f32", "x3d-3x3x3", "video-vae-causal"] {
            assert_eq!(
                v.default_config(&public_case(name)).get("planes"),
                Some(0),
                "{name}"
            );
        }
    }

    #[test]
    fn rows_that_are_not_whole_chunks_are_copied_in_4_byte_pieces() {
        let v = DepthReuseFma;
        let x3d_m = crate::suite::models_case("x3d-m-res4");
        // 14 bf16 a row: 28 bytes, 4-byte pieces; the seed's 80: whole chunks.
        v.applies(&x3d_m).unwrap();
        assert_eq!(copy_bytes(&x3d_m), 4);
        assert_eq!(copy_bytes(&public_case("seed-bf16")), 16);
        let d = v.default_config(&x3d_m);
        let spec = v.specialization(&x3d_m, &d).unwrap();
        assert!(
            spec.starts_with("depth_reuse_fma_dwconv<__nv_bfloat16, 3, 3, 3, 8, 1, 1, 7, 4,"),
            "{spec}"
        );
        assert!(valid_configs(&v, &x3d_m).contains(&d));
        // f32 rows of any width: 4-byte pieces where not a multiple of 4 floats.
        let mut p = crate::spec::ConvParams::seed();
        p.dtype = DType::F32;
        p.input = vec![5, 9, 13];
        let odd = p.validate().unwrap();
        v.applies(&odd).unwrap();
        assert_eq!(copy_bytes(&odd), 4);
    }

    #[test]
    fn two_byte_types_take_runs_of_eight_and_strided_depth_is_refused() {
        let v = DepthReuseFma;
        let bf16 = public_case("seed-bf16");
        assert_eq!(v.space(&bf16)[0].values, vec![8]);
        assert_eq!(v.default_config(&bf16).get("out_w"), Some(8));
        v.applies(&bf16).unwrap();
        // odd-dilated: rows of 47 halves, 94 bytes: not even 4-byte pieces.
        assert!(v
            .applies(&public_case("odd-dilated"))
            .unwrap_err()
            .contains("4 bytes"));
        assert!(v.applies(&public_case("seed-bf16-ndhwc")).is_err());
        let mut p = crate::spec::ConvParams::seed();
        p.stride = vec![2, 1, 1];
        assert!(v
            .applies(&p.validate().unwrap())
            .unwrap_err()
            .contains("depth"));
    }
}
