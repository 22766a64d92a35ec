//! `naive`: one thread per output element (kernels/naive.cu). Applies to every spec.

use super::{
    channels_last, cuda_type, grid_stride_launch, grid_stride_space, Config, Launch, Param, Variant,
};
use crate::error::Result;
use crate::spec::ConvSpec;

pub struct Naive;

typed_params!(Params { block, waves });

impl Variant for Naive {
    fn name(&self) -> &'static str {
        "naive"
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/naive.cu")
    }
    fn applies(&self, _spec: &ConvSpec) -> std::result::Result<(), String> {
        Ok(())
    }
    fn space(&self, _spec: &ConvSpec) -> Vec<Param> {
        grid_stride_space()
    }
    fn default_config(&self, _spec: &ConvSpec) -> Config {
        Config::new("naive", &[("block", 256), ("waves", 16)])
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        Ok(format!(
            "naive_dwconv<{}, {}, {kd}, {kh}, {kw}>",
            cuda_type(spec.dtype()),
            channels_last(spec)
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, sms: u32) -> Result<Launch> {
        let p = Params::parse(self, spec, config)?;
        Ok(grid_stride_launch(
            spec.output_len() as u64,
            p.block as u64,
            p.waves as u64,
            sms,
        ))
    }
}
