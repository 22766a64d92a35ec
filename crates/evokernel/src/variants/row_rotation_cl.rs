//! `row_rotation_cl`: channels-last layers of one kernel depth, each input row read once
//! by a block and fed to every output row it reaches from rotating accumulators
//! (kernels/row_rotation_cl.cu).

use super::depth_reuse_fma::{MAX_THREADS, MAX_WEIGHTS};
use super::depth_reuse_fma_cl::{channel_vector_fits, channel_vector_params, chunk_channels};
use super::{
    block_sides, channels_last, cuda_type, default_launches, grid_x, input_cols,
    plane_offsets_fit_i32, whole_chunk_pixels, within_shared, Config, Launch, Param, Variant,
};
use crate::error::Result;
use crate::spec::{ConvSpec, DType};

pub struct RowRotationCl;

/// Accumulators a thread may rotate (live rows x out_w x cv) beside its weights.
const MAX_ACCUMULATORS: usize = 64;

typed_params!(
    /// A config's shape, read once.
    Shape {
        out_w,
        cv,
        lanes,
        tx,
        rows,
        stages,
        minblocks,
    }
);

/// Output rows one input row can feed at once (NA in the kernel).
fn live_rows(spec: &ConvSpec) -> usize {
    let (kh, sh, dh) = (spec.kernel3()[1], spec.stride3()[1], spec.dilation3()[1]);
    ((kh - 1) * dh + 1).div_ceil(sh)
}

/// Whether dispatch should take this kernel ahead of depth_reuse_fma_cl: kernels of 5 and
/// more rows, where each output-row tile's halo rows are most of what it reads (H100,
/// runs 300-301, same calls: efficientnet-k5s2 0.040-0.046 vs 0.057 ms, convnext-t-nhwc
/// 0.050 vs 0.060, convnext-nhwc 0.088 vs 0.088; with 3 rows it loses or ties:
/// mobilenet-s2 0.067 vs 0.061, mobilenet-s1-nhwc 0.032-0.035 vs 0.034). On the H200 it
/// is ahead on 2-D 3-row kernels at unit steps too (mobilenet-s1-nhwc forward 0.029 vs
/// 0.030 and 0.024 vs 0.026 ms, runs 350 and 359; grad-input 0.027 vs 0.029, run 360; each
/// the same call); strided 3-row kernels stay (mobilenet-s2).
pub(crate) fn rotates_rows_by_default(spec: &ConvSpec) -> bool {
    let unit_3_rows = spec.kernel3()[1] == 3
        && spec.output3()[0] == 1
        && spec.stride3() == [1, 1, 1]
        && spec.dilation3() == [1, 1, 1];
    (spec.kernel3()[1] >= 5 || unit_3_rows) && RowRotationCl.applies(spec).is_ok()
}

fn runs(spec: &ConvSpec, out_w: usize) -> usize {
    spec.output3()[2].div_ceil(out_w)
}

impl Shape {
    fn threads(&self) -> usize {
        self.lanes * self.tx
    }
    /// Bytes of one pixel's block channels (PIXB in the kernel).
    fn pixel_bytes(&self, spec: &ConvSpec) -> usize {
        self.lanes * self.cv * spec.dtype().size_bytes()
    }
    /// One ring slot: an input row of the strip's pixels, each run's pixels shifted by
    /// the pixel bytes mod 128 past the run before (mirrors SLOT in the kernel).
    fn slot_bytes(&self, spec: &ConvSpec) -> usize {
        let pixels = input_cols(spec, self.tx * self.out_w);
        let run_pixels = self.out_w * spec.stride3()[2];
        let skew = self.pixel_bytes(spec) % 128;
        (pixels * self.pixel_bytes(spec) + (pixels - 1) / run_pixels * skew).div_ceil(16) * 16
    }
    fn shared_bytes(&self, spec: &ConvSpec) -> usize {
        (self.stages + 1) * self.slot_bytes(spec)
    }
}

impl Variant for RowRotationCl {
    fn name(&self) -> &'static str {
        "row_rotation_cl"
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/row_rotation_cl.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        if !channels_last(spec) {
            return Err("needs a channels-last layout".into());
        }
        if spec.kernel3()[0] != 1 {
            return Err("needs one kernel depth (it walks the rows of one input plane)".into());
        }
        let (sw, dw) = (spec.stride3()[2], spec.dilation3()[2]);
        let (sh, dh) = (spec.stride3()[1], spec.dilation3()[1]);
        if sw > 3 || dw > 3 || sh > 3 || dh > 3 {
            return Err(format!(
                "stride {sh}x{sw} and dilation {dh}x{dw} along H x W: at most 3 each (compiled into the kernel)"
            ));
        }
        if spec.taps() > MAX_WEIGHTS {
            return Err(format!(
                "{} taps do not fit the register budget ({MAX_WEIGHTS})",
                spec.taps()
            ));
        }
        plane_offsets_fit_i32(spec)?;
        whole_chunk_pixels(spec)?;
        if live_rows(spec) > MAX_ACCUMULATORS {
            return Err(format!(
                "{} output rows live at once: over the {MAX_ACCUMULATORS} accumulators a thread rotates",
                live_rows(spec)
            ));
        }
        default_launches(self, spec)
    }
    fn space(&self, spec: &ConvSpec) -> Vec<Param> {
        let oh = spec.output3()[1];
        let [cv, lanes] = channel_vector_params();
        vec![
            // Consecutive outputs along W per thread.
            Param {
                name: "out_w",
                values: vec![2, 4, 7, 8],
            },
            // Channels per thread (one shared load per pixel) and lanes per run.
            cv,
            lanes,
            // Runs along W per block.
            Param {
                name: "tx",
                values: block_sides(runs(spec, 2), 16),
            },
            // Output rows per block (balanced chunks of at most this many).
            Param {
                name: "rows",
                values: block_sides(oh, 64),
            },
            // Input rows in flight ahead of the one being read.
            Param {
                name: "stages",
                values: vec![1, 2, 4, 8],
            },
            // Blocks per SM its registers are capped for.
            Param {
                name: "minblocks",
                values: vec![2, 4, 6, 8],
            },
        ]
    }
    fn default_config(&self, spec: &ConvSpec) -> Config {
        // Two channels a lane where the weights fit (16-bit data: one 4-byte shared load
        // per pixel), 16 lanes; runs of 4 outputs over the whole output row up to 8 runs;
        // 4 rows in flight. Chunks of up to 28 output rows (H100, runs 300-301, against 8:
        // efficientnet-k5s2 0.040-0.044 vs 0.044-0.046 ms, convnext-t-nhwc 0.050 vs 0.068,
        // convnext-nhwc 0.088 vs 0.117): each chunk re-reads (KH - 1) DH halo rows, and
        // fewer, longer blocks fit the GPU in one wave.
        let cv = if spec.dtype() != DType::F32 && spec.taps() * 2 <= 50 {
            2
        } else {
            1
        };
        let out_w = 4;
        let space = self.space(spec);
        let pick = |name: &str, want: usize| {
            let values = &space.iter().find(|p| p.name == name).unwrap().values;
            values
                .iter()
                .copied()
                .filter(|&v| v as usize <= want)
                .max()
                .unwrap_or(values[0])
        };
        let lanes = 16.max(chunk_channels(spec) / cv);
        Config::new(
            self.name(),
            &[
                ("out_w", out_w as i64),
                ("cv", cv as i64),
                ("lanes", lanes as i64),
                ("tx", pick("tx", runs(spec, out_w).min(8))),
                ("rows", pick("rows", 28)),
                ("stages", 4),
                ("minblocks", 4),
            ],
        )
    }
    fn fits(&self, spec: &ConvSpec, config: &Config) -> std::result::Result<(), String> {
        let s = Shape::read(config).map_err(|e| e.to_string())?;
        channel_vector_fits(spec, s.lanes, s.cv)?;
        let accumulators = live_rows(spec) * s.out_w * s.cv;
        if accumulators > MAX_ACCUMULATORS {
            return Err(format!(
                "{} live rows x out_w x cv = {accumulators} accumulators, over {MAX_ACCUMULATORS}",
                live_rows(spec)
            ));
        }
        if s.threads() > MAX_THREADS {
            return Err(format!(
                "lanes x tx = {} threads, more than a block's {MAX_THREADS}",
                s.threads()
            ));
        }
        if (s.tx - 1) * s.out_w >= spec.output3()[2] {
            return Err(format!(
                "tx = {} runs of {} outputs: the last starts past the {} output columns",
                s.tx,
                s.out_w,
                spec.output3()[2]
            ));
        }
        within_shared(
            &format!("a ring of {} input rows", s.stages + 1),
            s.shared_bytes(spec),
        )
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let s = Shape::parse(self, spec, config)?;
        let [_, kh, kw] = spec.kernel3();
        let [_, sh, sw] = spec.stride3();
        let [_, dh, dw] = spec.dilation3();
        Ok(format!(
            "row_rotation_cl_dwconv<{}, {kh}, {kw}, {sh}, {dh}, {sw}, {dw}, {}, {}, {}, {}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            s.out_w,
            s.cv,
            s.lanes,
            s.tx,
            s.rows,
            s.stages,
            s.minblocks,
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, _sms: u32) -> Result<Launch> {
        let s = Shape::parse(self, spec, config)?;
        let [od, oh, ow] = spec.output3();
        let chunks = oh.div_ceil(s.rows);
        let strips = ow.div_ceil(s.tx * s.out_w);
        let groups = spec.c().div_ceil(s.lanes * s.cv);
        let blocks = spec.n() * od * groups * strips * chunks;
        Ok(Launch {
            grid: (grid_x(self, spec, blocks)?, 1, 1),
            block: (s.threads() as u32, 1, 1),
            shared_bytes: s.shared_bytes(spec) as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::{channels_last_case, models_case, public_case};
    use crate::variants::valid_configs;

    #[test]
    fn defaults_fit_and_the_ring_is_rows_of_the_strip() {
        let v = RowRotationCl;
        let eff = models_case("efficientnet-k5s2");
        v.applies(&eff).unwrap();
        let d = v.default_config(&eff);
        assert!(valid_configs(&v, &eff).contains(&d));
        let s = Shape::read(&d).unwrap();
        // 5 rows at stride 2: three output rows live; f16, two channels a lane, 16 lanes.
        assert_eq!(live_rows(&eff), 3);
        assert_eq!((s.cv, s.lanes, s.out_w, s.tx), (2, 16, 4, 7));
        // 28 outputs of 4 in 7 runs read 59 pixels of 64 bytes; runs 8 pixels apart,
        // each shifted 64 bytes: 59 x 64 + 7 x 64, five slots.
        assert_eq!(s.slot_bytes(&eff), 59 * 64 + 7 * 64);
        let l = v.launch(&eff, &d, 132).unwrap();
        assert_eq!(l.shared_bytes as usize, 5 * (59 * 64 + 7 * 64));
        assert_eq!(l.block.0, 16 * 7);
        // 64 images x 5 channel groups (144 = 4.5 x 32) x 1 strip x 1 chunk of 28 rows.
        assert_eq!(l.grid.0, 64 * 5);
        assert!(v
            .specialization(&eff, &d)
            .unwrap()
            .starts_with("row_rotation_cl_dwconv<__half, 5, 5, 2, 1, 2, 1, 4, 2, 16, 7, 28, 4, 4"));
        // 56 output rows: two chunks of 28.
        let mb = channels_last_case("mobilenet-s1-nhwc");
        assert_eq!(v.default_config(&mb).get("rows"), Some(28));
        for spec in [
            channels_last_case("convnext-nhwc"),
            channels_last_case("mobilenet-s1-nhwc"),
            public_case("mobilenet-s2"),
            models_case("convnext-t-nhwc"),
        ] {
            v.applies(&spec).unwrap();
            assert!(valid_configs(&v, &spec).contains(&v.default_config(&spec)));
        }
        // 7 rows at stride 1 are 7 live rows: two channels a lane would be 98 weights and
        // 56 accumulators at out_w 4, one channel is the default.
        let convnext = channels_last_case("convnext-nhwc");
        assert_eq!(v.default_config(&convnext).get("cv"), Some(1));
        assert!(v.applies(&public_case("seed-bf16")).is_err());
        assert!(v.applies(&public_case("seed-bf16-ndhwc")).is_err());
    }
}
