//! `dgrad_gather`: grad-input by a direct gather, one thread per grad_input element
//! (kernels/dgrad_gather.cu). Applies to every spec; strided specs need it (unit-stride
//! specs also run as the forward of the flipped kernel, which is faster).

use super::{
    channels_last, cuda_type, grid_stride_launch, grid_stride_space, Config, Launch, Param, Variant,
};
use crate::error::Result;
use crate::pass::Pass;
use crate::spec::ConvSpec;

pub struct DgradGather;

typed_params!(Params { block, waves });

impl Variant for DgradGather {
    fn name(&self) -> &'static str {
        "dgrad_gather"
    }
    fn pass(&self) -> Pass {
        Pass::Dgrad
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/dgrad_gather.cu")
    }
    fn applies(&self, _spec: &ConvSpec) -> std::result::Result<(), String> {
        Ok(())
    }
    fn space(&self, _spec: &ConvSpec) -> Vec<Param> {
        grid_stride_space()
    }
    fn default_config(&self, _spec: &ConvSpec) -> Config {
        Config::new(self.name(), &[("block", 256), ("waves", 16)])
    }
    fn specialization(&self, spec: &ConvSpec, config: &Config) -> Result<String> {
        Params::parse(self, spec, config)?;
        let [kd, kh, kw] = spec.kernel3();
        let [sd, sh, sw] = spec.stride3();
        Ok(format!(
            "dgrad_gather_dwconv<{}, {}, {kd}, {kh}, {kw}, {sd}, {sh}, {sw}>",
            cuda_type(spec.dtype()),
            channels_last(spec),
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, sms: u32) -> Result<Launch> {
        let p = Params::parse(self, spec, config)?;
        Ok(grid_stride_launch(
            spec.input_len() as u64,
            p.block as u64,
            p.waves as u64,
            sms,
        ))
    }
}
