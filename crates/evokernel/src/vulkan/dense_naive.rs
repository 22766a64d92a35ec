//! The naive dense/grouped convolution on Vulkan (kernels/vulkan/dense_naive.comp): any
//! spec, one invocation per output; the correctness anchor of the dense ladder. f32, and
//! f16 where the device has 16-bit storage.

use super::device::VulkanDevice;
use super::VulkanRun;
use crate::dense::DenseConvSpec;
use crate::error::Result;
use crate::spec::Layout;
use crate::tensor::HostTensor;

pub const SOURCE: &str = include_str!("../../kernels/vulkan/dense_naive.comp");
const WORKGROUP: usize = 256;

fn i32_of(what: &str, v: usize) -> Result<i32> {
    super::i32_of("dense_naive", what, v)
}

/// The shader prepared on device-local copies of `x` and `w`, to launch and time.
pub fn prepare_dense_naive<'d>(
    dev: &'d VulkanDevice,
    spec: &DenseConvSpec,
    x: &HostTensor,
    w: &HostTensor,
) -> Result<VulkanRun<'d>> {
    let info = dev.info();
    let source = super::source_for("dense_naive", SOURCE, spec.dtype(), info)?;
    x.expect("input", spec.dtype(), spec.input_len())?;
    w.expect("weight", spec.dtype(), spec.weight_len())?;
    // Every index the shader forms is below one of the three lengths.
    i32_of("input length", spec.input_len())?;
    i32_of("weight length", spec.weight_len())?;
    let total = i32_of("output length", spec.output_len())?;
    let g = spec.geometry();
    let mut fields = vec![
        spec.n(),
        spec.in_channels(),
        spec.out_channels(),
        spec.in_per_group(),
        spec.out_per_group(),
    ];
    fields.extend(g.input3());
    fields.extend(g.output3());
    fields.extend(g.kernel3());
    fields.extend(g.stride3());
    fields.extend(g.dilation3());
    fields.extend(g.pad_before3());
    fields.push(usize::from(spec.layout() == Layout::ChannelsLast));
    let mut ints = fields
        .into_iter()
        .map(|v| i32_of("a size", v))
        .collect::<Result<Vec<i32>>>()?;
    ints.push(total);
    // Workgroups stride over the outputs past the device's count along x.
    let groups = spec.output_len().div_ceil(WORKGROUP).clamp(1, 65_535);
    let groups = groups.min(info.max_workgroup_count[0].max(1) as usize) as u32;
    let y = HostTensor::zeros(spec.dtype(), &spec.output_shape());
    VulkanRun::new(
        dev,
        "dense_naive",
        &source,
        &[],
        &super::push_bytes(&ints),
        [groups, 1],
        x,
        w,
        y,
        None,
    )
}
