//! `dgrad_gather_cl`: grad-input by a gather on channels-last data, a thread per 16 bytes
//! of channels at one grad_input position (kernels/dgrad_gather_cl.cu). For the strided
//! channels-last specs the flipped-forward path cannot take; needs C a multiple of the
//! 16-byte vector (8 halves, 4 floats).

use super::{cuda_type, grid_stride_launch, grid_stride_space, Config, Launch, Param, Variant};
use crate::error::Result;
use crate::pass::Pass;
use crate::spec::{ConvSpec, Layout};

pub struct DgradGatherCl;

typed_params!(Params { block, waves });

/// Shared memory for the weight as f32 [taps][C], where it fits beside the default
/// 48 KiB a block may have without opting in; else the kernel reads it from global
/// memory (`dgrad_cell_cl` alike).
pub(super) fn weight_smem_bytes(spec: &ConvSpec) -> Option<u32> {
    let bytes = spec.c() * spec.taps() * 4;
    (bytes <= 48 * 1024).then_some(bytes as u32)
}

/// What both channels-last grad-input gathers need: channels-last data in whole 16-byte
/// vectors of channels.
pub(super) fn takes_channel_vectors(spec: &ConvSpec) -> std::result::Result<(), String> {
    if spec.layout() != Layout::ChannelsLast {
        return Err("needs channels-last data".into());
    }
    let v = spec.dtype().per_16_bytes();
    if !spec.c().is_multiple_of(v) {
        return Err(format!(
            "needs channels in multiples of {v} (16-byte vectors); got {}",
            spec.c()
        ));
    }
    Ok(())
}

impl Variant for DgradGatherCl {
    fn name(&self) -> &'static str {
        "dgrad_gather_cl"
    }
    fn pass(&self) -> Pass {
        Pass::Dgrad
    }
    fn source(&self) -> &'static str {
        include_str!("../../kernels/dgrad_gather_cl.cu")
    }
    fn applies(&self, spec: &ConvSpec) -> std::result::Result<(), String> {
        takes_channel_vectors(spec)
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
            "dgrad_gather_cl_dwconv<{}, {}, {kd}, {kh}, {kw}, {sd}, {sh}, {sw}>",
            cuda_type(spec.dtype()),
            weight_smem_bytes(spec).is_some(),
        ))
    }
    fn launch(&self, spec: &ConvSpec, config: &Config, sms: u32) -> Result<Launch> {
        let p = Params::parse(self, spec, config)?;
        let mut launch = grid_stride_launch(
            (spec.input_len() / spec.dtype().per_16_bytes()) as u64,
            p.block as u64,
            p.waves as u64,
            sms,
        );
        launch.shared_bytes = weight_smem_bytes(spec).unwrap_or(0);
        Ok(launch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ConvParams, DType};

    #[test]
    fn takes_channels_last_in_whole_vectors_only() {
        let mut p = ConvParams::seed();
        p.layout = Layout::ChannelsLast;
        p.c = 24;
        assert!(DgradGatherCl
            .applies(&p.clone().validate().unwrap())
            .is_ok());
        p.c = 20; // 2.5 vectors of bf16
        assert!(DgradGatherCl
            .applies(&p.clone().validate().unwrap())
            .is_err());
        p.dtype = DType::F32; // 5 vectors of f32
        assert!(DgradGatherCl
            .applies(&p.clone().validate().unwrap())
            .is_ok());
        p.layout = Layout::ChannelsFirst;
        assert!(DgradGatherCl.applies(&p.validate().unwrap()).is_err());
    }
}
