//! `direct`: any spec, `out_w` neighbouring outputs along W per thread sharing each tap's
//! weight and address arithmetic, per-tap bounds tests only at the W borders
//! (kernels/direct.cu).

use super::{channels_last, check_config, cuda_type, Config, Launch, Param, Variant};
use crate::error::Result;
use crate::spec::ConvSpec;

pub struct Direct;

impl Variant for Direct {
    fn name(&self) -> &'static str {
        "direct"
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/direct.cu")
    }
    fn applies(&self, _spec: &ConvSpec) -> std::result::Result<(), String> {
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
                values: vec![4, 8, 16, 32],
            },
            // Neighbouring outputs along W per thread.
            Param {
                name: "out_w",
                values: vec![2, 4, 8],
            },
        ]
    }
    fn default_config(&self, _spec: &ConvSpec) -> Config {
        Config::new("direct", &[("block", 256), ("waves", 16), ("out_w", 4)])
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        check_config(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "direct_dwconv<{}, {}, {kd}, {kh}, {kw}, {}>",
            cuda_type(spec.dtype()),
            channels_last(spec),
            config.param("out_w")?
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, sms: u32) -> Result<Launch> {
        check_config(self, spec, config)?;
        let block = config.param("block")? as u64;
        let waves = config.param("waves")? as u64;
        let out_w = config.param("out_w")? as usize;
        let ow = spec.output3()[2];
        let threads = (spec.output_len() / ow.max(1)) as u64 * ow.div_ceil(out_w) as u64;
        let grid = threads
            .div_ceil(block)
            .min(sms.max(1) as u64 * waves)
            .max(1) as u32;
        Ok(Launch {
            grid: (grid, 1, 1),
            block: (block as u32, 1, 1),
            shared_bytes: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::public_suite;

    #[test]
    fn one_thread_per_out_w_outputs_along_w() {
        let odd = public_suite()
            .unwrap()
            .into_iter()
            .find(|c| c.name == "odd-dilated")
            .unwrap()
            .spec;
        // 2 x 77 x 9 x 17 rows of 47 outputs: 12 groups of 4 per row.
        let cfg = Config::new("direct", &[("block", 128), ("waves", 1000), ("out_w", 4)])
            .to_string()
            .parse::<Config>()
            .unwrap();
        assert!(
            Direct.launch(&odd, &cfg, 132).is_err(),
            "waves=1000 is not in the space"
        );
        let cfg = Config::new("direct", &[("block", 128), ("waves", 32), ("out_w", 4)]);
        let l = Direct.launch(&odd, &cfg, 132).unwrap();
        let threads = 2 * 77 * 9 * 17 * 12;
        assert_eq!(l.grid.0, (threads as u32).div_ceil(128).min(132 * 32));
        assert!(Direct
            .specialization(&odd, &cfg)
            .unwrap()
            .ends_with(", 3, 7, 3, 4>"));
    }
}
