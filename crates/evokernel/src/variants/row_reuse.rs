//! `row_reuse`: any spec, `out_h` outputs down one column per thread, loads shared where
//! output rows and kernel rows land on the same input row (kernels/row_reuse.cu).

use super::{channels_last, cuda_type, grid_stride_launch, Config, Launch, Param, Variant};
use crate::error::Result;
use crate::spec::ConvSpec;

pub struct RowReuse;

typed_params!(Params {
    block,
    waves,
    out_h
});

/// Largest stride or dilation along H compiled in (each value is its own specialization,
/// and a thread unrolls over (out_h - 1) x stride + (KH - 1) x dilation + 1 input rows).
const MAX_H_STEP: usize = 8;

impl Variant for RowReuse {
    fn name(&self) -> &'static str {
        "row_reuse"
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/row_reuse.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        let (sh, dh) = (spec.stride3()[1], spec.dilation3()[1]);
        if sh > MAX_H_STEP || dh > MAX_H_STEP {
            return Err(format!(
                "stride {sh} and dilation {dh} along H: at most {MAX_H_STEP} are compiled in"
            ));
        }
        Ok(())
    }
    fn space(&self, _spec: &ConvSpec) -> Vec<Param> {
        vec![
            Param {
                name: "block",
                values: vec![128, 256],
            },
            // Blocks per SM in the grid-stride loop's grid.
            Param {
                name: "waves",
                values: vec![8, 16, 32],
            },
            // Output rows per thread.
            Param {
                name: "out_h",
                values: vec![2, 4, 8],
            },
        ]
    }
    fn default_config(&self, _spec: &ConvSpec) -> Config {
        Config::new("row_reuse", &[("block", 256), ("waves", 16), ("out_h", 4)])
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        let p = Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "row_reuse_dwconv<{}, {}, {kd}, {kh}, {kw}, {}, {}, {}>",
            cuda_type(spec.dtype()),
            channels_last(spec),
            spec.stride3()[1],
            spec.dilation3()[1],
            p.out_h
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, sms: u32) -> Result<Launch> {
        let Params {
            block,
            waves,
            out_h,
        } = Params::parse(self, spec, config)?;
        let [_, oh, ow] = spec.output3();
        let columns = (spec.output_len() / (oh * ow).max(1)) as u64;
        let threads = columns * oh.div_ceil(out_h) as u64 * ow as u64;
        Ok(grid_stride_launch(threads, block as u64, waves as u64, sms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::public_case;

    #[test]
    fn one_thread_per_out_h_outputs_down_a_column() {
        let odd = public_case("odd-dilated");
        let cfg = Config::new("row_reuse", &[("block", 128), ("waves", 32), ("out_h", 4)]);
        let l = RowReuse.launch(&odd, &cfg, 132).unwrap();
        // 2 x 77 x 9 planes of 17 x 47 outputs: 5 groups of 4 rows per column.
        let threads: u32 = 2 * 77 * 9 * 5 * 47;
        assert_eq!(l.grid.0, threads.div_ceil(128).min(132 * 32));
        // Stride 2 and dilation 2 along H are compiled in.
        assert!(RowReuse
            .specialization(&odd, &cfg)
            .unwrap()
            .ends_with(", 3, 7, 3, 2, 2, 4>"));
    }
}
