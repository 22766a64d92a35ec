//! The naive depthwise forward on Vulkan (kernels/vulkan/naive.comp): any spec, f32,
//! one invocation per output. The correctness anchor of the Vulkan ladder.

use super::device::VulkanDevice;
use crate::error::{Error, Result};
use crate::spec::{ConvSpec, DType, Layout};
use crate::tensor::HostTensor;

pub const SOURCE: &str = include_str!("../../kernels/vulkan/naive.comp");
const WORKGROUP: u32 = 256;

/// The shader's push constants, in its order.
#[repr(C)]
#[derive(Clone, Copy)]
struct Push {
    n: i32,
    c: i32,
    input: [i32; 3],
    output: [i32; 3],
    kernel: [i32; 3],
    stride: [i32; 3],
    dilation: [i32; 3],
    pad: [i32; 3],
    channels_last: i32,
    total: u32,
}

impl Push {
    fn bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(std::mem::size_of::<Self>());
        let ints = [self.n, self.c]
            .into_iter()
            .chain(self.input)
            .chain(self.output)
            .chain(self.kernel)
            .chain(self.stride)
            .chain(self.dilation)
            .chain(self.pad)
            .chain([self.channels_last]);
        for i in ints {
            v.extend_from_slice(&i.to_le_bytes());
        }
        v.extend_from_slice(&self.total.to_le_bytes());
        v
    }
}

fn i32_of(what: &str, v: usize) -> Result<i32> {
    super::i32_of("naive", what, v)
}

/// The forward of `spec` (f32) on `dev`: `x` and `w` host tensors, the output returned.
pub fn conv_vulkan_naive(
    dev: &VulkanDevice,
    spec: &ConvSpec,
    x: &HostTensor,
    w: &HostTensor,
) -> Result<HostTensor> {
    conv_vulkan_naive_timed(dev, spec, x, w).map(|(y, _)| y)
}

/// As [`conv_vulkan_naive`], with the dispatch's device time in ms (timestamps around
/// it; None where the device's compute queue has none).
pub fn conv_vulkan_naive_timed(
    dev: &VulkanDevice,
    spec: &ConvSpec,
    x: &HostTensor,
    w: &HostTensor,
) -> Result<(HostTensor, Option<f64>)> {
    if spec.dtype() != DType::F32 {
        return Err(Error::BackendUnavailable {
            backend: "vulkan".into(),
            reason: format!("the naive Vulkan shader takes f32, not {}", spec.dtype()),
        });
    }
    x.expect("input", spec.dtype(), spec.input_len())?;
    w.expect("weight", spec.dtype(), spec.weight_len())?;
    // Every index the shader forms is below the input's or output's length.
    i32_of("input length", spec.input_len())?;
    let total = i32_of("output length", spec.output_len())? as u32;
    let three = |a: [usize; 3], what| -> Result<[i32; 3]> {
        Ok([
            i32_of(what, a[0])?,
            i32_of(what, a[1])?,
            i32_of(what, a[2])?,
        ])
    };
    let push = Push {
        n: i32_of("batch", spec.n())?,
        c: i32_of("channels", spec.c())?,
        input: three(spec.input3(), "input size")?,
        output: three(spec.output3(), "output size")?,
        kernel: three(spec.kernel3(), "kernel size")?,
        stride: three(spec.stride3(), "stride")?,
        dilation: three(spec.dilation3(), "dilation")?,
        pad: three(spec.pad_before3(), "padding")?,
        channels_last: (spec.layout() == Layout::ChannelsLast) as i32,
        total,
    };
    let groups = total.div_ceil(WORKGROUP).clamp(1, 65_535);
    let y = HostTensor::zeros(spec.dtype(), &spec.output_shape());
    super::run_once(super::VulkanRun::new(
        dev,
        "naive",
        SOURCE,
        &[],
        &push.bytes(),
        [groups, 1],
        x,
        w,
        y,
        None,
    )?)
}
