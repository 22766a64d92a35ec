//! The Vulkan backend (issue 19), started: the loader opened at run time (`ash`, no link
//! to libvulkan), devices listed with the limits the kernels must respect (read from the
//! device, never assumed), GLSL compiled to SPIR-V at run time (`shader`), and the
//! portable naive depthwise forward (`naive`) and the tiled one whose config is
//! specialization constants (`tile`), both verified against the oracle. Tested on
//! Mesa's lavapipe (CPU) in CI; not yet on the H100's driver nor on AMD hardware.

mod device;
pub mod naive;
pub mod shader;
pub mod tile;

pub use device::{list_vulkan_devices, VulkanDevice, VulkanDeviceInfo};

use crate::error::Error;

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
