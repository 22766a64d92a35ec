//! The Vulkan backend (issue 19), started: the loader opened at run time (`ash`, no link
//! to libvulkan), devices listed with the limits the kernels must respect (read from the
//! device, never assumed), GLSL compiled to SPIR-V at run time (`shader`), and the
//! portable naive depthwise forward (`naive`) and the tiled one whose config is
//! specialization constants (`tile`), both verified against the oracle. Tested on
//! Mesa's lavapipe (CPU) in CI; not yet on the H100's driver nor on AMD hardware.

pub mod dense_direct;
pub mod dense_naive;
mod device;
pub mod naive;
pub mod shader;
pub mod tile;

pub use device::{list_vulkan_devices, VulkanDevice, VulkanDeviceInfo};

use crate::error::{Error, Result};
use crate::spec::DType;
use crate::tensor::HostTensor;

/// `source` for buffers of `dtype`: f32 as is, f16 where the device has 16-bit storage
/// (`storageBuffer16BitAccess`); anything else is an error naming the shader and device.
pub(crate) fn source_for(
    shader: &str,
    source: &str,
    dtype: DType,
    info: &VulkanDeviceInfo,
) -> Result<String> {
    match dtype {
        DType::F32 => Ok(source.to_string()),
        DType::F16 if info.storage_f16 => Ok(shader::with_f16(source)),
        d => Err(Error::BackendUnavailable {
            backend: "vulkan".into(),
            reason: format!(
                "the {shader} Vulkan shader takes f32, and f16 where the device has 16-bit \
                 storage ({} has {}); not {d}",
                info.name,
                if info.storage_f16 { "it" } else { "none" }
            ),
        }),
    }
}

/// One dispatch of the shader `source` (compiled and cached as `name`) over an input `x`,
/// a weight `w` and an output `y` (bindings 0, 1, 2), returning `y` and the dispatch's
/// device time in ms where the queue has timestamps.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_xwy(
    dev: &VulkanDevice,
    name: &str,
    source: &str,
    constants: &[(u32, u32)],
    push: &[u8],
    grid: [u32; 2],
    x: &HostTensor,
    w: &HostTensor,
    mut y: HostTensor,
) -> Result<(HostTensor, Option<f64>)> {
    let (spirv, _) = shader::compile_compute_cached(name, source)?;
    let mut bx = dev.host_buffer(x.size_bytes())?;
    let mut bw = dev.host_buffer(w.size_bytes())?;
    let by = dev.host_buffer(y.size_bytes())?;
    bx.write(x.as_bytes());
    bw.write(w.as_bytes());
    let ms = dev.dispatch_specialized(&spirv, constants, &[&bx, &bw, &by], push, grid)?;
    by.read(y.as_bytes_mut());
    Ok((y, ms))
}

/// Little-endian bytes of 4-byte push-constant fields, in order.
pub(crate) fn push_bytes(fields: &[i32]) -> Vec<u8> {
    fields.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A workgroup count as a grid within the device's limits along x (y takes the rest).
pub(crate) fn grid_for(info: &VulkanDeviceInfo, groups: usize) -> Result<[u32; 2]> {
    let g = u32::try_from(groups).map_err(|_| Error::BackendUnavailable {
        backend: "vulkan".into(),
        reason: format!("{groups} workgroups exceed 32 bits"),
    })?;
    let gx = g.clamp(1, info.max_workgroup_count[0].max(1));
    Ok([gx, g.div_ceil(gx).max(1)])
}

/// `v` as a shader's 32-bit index, or an error naming the shader and the size.
pub(crate) fn i32_of(shader: &str, what: &str, v: usize) -> crate::error::Result<i32> {
    i32::try_from(v).map_err(|_| Error::BackendUnavailable {
        backend: "vulkan".into(),
        reason: format!("{what} {v} exceeds the {shader} shader's 32-bit indices"),
    })
}

/// A failed Vulkan call as an error naming the call and the VkResult.
pub(crate) fn vk_err(call: &'static str) -> impl Fn(ash::vk::Result) -> Error {
    move |r| Error::Vulkan {
        call,
        result: format!("{r:?}"),
    }
}
