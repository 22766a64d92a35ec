//! `VK_NV_cooperative_matrix2`, which the `ash` the project links (Vulkan 1.3.281)
//! predates: its feature and property structs and the flexible-dimensions query, declared
//! from the Vulkan registry (extension 594: structure types 1000593000-1000593002).

use std::ffi::{c_void, CStr};

use ash::vk;

pub const NAME: &CStr = c"VK_NV_cooperative_matrix2";

/// `VkPhysicalDeviceCooperativeMatrix2FeaturesNV`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Features {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    pub workgroup_scope: vk::Bool32,
    pub flexible_dimensions: vk::Bool32,
    pub reductions: vk::Bool32,
    pub conversions: vk::Bool32,
    pub per_element_operations: vk::Bool32,
    pub tensor_addressing: vk::Bool32,
    pub block_loads: vk::Bool32,
}

impl Default for Features {
    fn default() -> Self {
        Features {
            s_type: vk::StructureType::from_raw(1_000_593_000),
            p_next: std::ptr::null_mut(),
            workgroup_scope: vk::FALSE,
            flexible_dimensions: vk::FALSE,
            reductions: vk::FALSE,
            conversions: vk::FALSE,
            per_element_operations: vk::FALSE,
            tensor_addressing: vk::FALSE,
            block_loads: vk::FALSE,
        }
    }
}

// SAFETY: a Vulkan structure (sType, pNext first) that the registry lets extend both.
unsafe impl vk::ExtendsPhysicalDeviceFeatures2 for Features {}
// SAFETY: as above.
unsafe impl vk::ExtendsDeviceCreateInfo for Features {}

/// `VkPhysicalDeviceCooperativeMatrix2PropertiesNV`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Properties {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    pub workgroup_scope_max_workgroup_size: u32,
    pub flexible_dimensions_max_dimension: u32,
    pub workgroup_scope_reserved_shared_memory: u32,
}

impl Default for Properties {
    fn default() -> Self {
        Properties {
            s_type: vk::StructureType::from_raw(1_000_593_002),
            p_next: std::ptr::null_mut(),
            workgroup_scope_max_workgroup_size: 0,
            flexible_dimensions_max_dimension: 0,
            workgroup_scope_reserved_shared_memory: 0,
        }
    }
}

// SAFETY: a Vulkan structure (sType, pNext first) that the registry lets extend it.
unsafe impl vk::ExtendsPhysicalDeviceProperties2 for Properties {}

/// `VkCooperativeMatrixFlexibleDimensionsPropertiesNV`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlexibleDimensions {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    pub m_granularity: u32,
    pub n_granularity: u32,
    pub k_granularity: u32,
    pub a_type: vk::ComponentTypeKHR,
    pub b_type: vk::ComponentTypeKHR,
    pub c_type: vk::ComponentTypeKHR,
    pub result_type: vk::ComponentTypeKHR,
    pub saturating_accumulation: vk::Bool32,
    pub scope: vk::ScopeKHR,
    pub workgroup_invocations: u32,
}

impl Default for FlexibleDimensions {
    fn default() -> Self {
        FlexibleDimensions {
            s_type: vk::StructureType::from_raw(1_000_593_001),
            p_next: std::ptr::null_mut(),
            m_granularity: 0,
            n_granularity: 0,
            k_granularity: 0,
            a_type: vk::ComponentTypeKHR::FLOAT16,
            b_type: vk::ComponentTypeKHR::FLOAT16,
            c_type: vk::ComponentTypeKHR::FLOAT32,
            result_type: vk::ComponentTypeKHR::FLOAT32,
            saturating_accumulation: vk::FALSE,
            scope: vk::ScopeKHR::SUBGROUP,
            workgroup_invocations: 0,
        }
    }
}

type GetFlexibleDimensions =
    unsafe extern "system" fn(vk::PhysicalDevice, *mut u32, *mut FlexibleDimensions) -> vk::Result;

/// The device's flexible-dimension matrix types
/// (`vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV`); empty where the
/// loader does not resolve the function.
pub(crate) fn flexible_dimensions(
    entry: &ash::Entry,
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
) -> Vec<FlexibleDimensions> {
    // SAFETY: a live instance and a NUL-terminated name; the pointer, where the loader
    // has it, is the registry's function of that name, whose signature is declared above.
    let f: GetFlexibleDimensions = match unsafe {
        entry.get_instance_proc_addr(
            instance.handle(),
            c"vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV".as_ptr(),
        )
    } {
        Some(f) => unsafe {
            std::mem::transmute::<unsafe extern "system" fn(), GetFlexibleDimensions>(f)
        },
        None => return Vec::new(),
    };
    let mut count = 0u32;
    // SAFETY: the two-call idiom: a count first, then that many structs with sType set.
    if unsafe { f(pd, &mut count, std::ptr::null_mut()) } != vk::Result::SUCCESS {
        return Vec::new();
    }
    let mut props = vec![FlexibleDimensions::default(); count as usize];
    // SAFETY: as above; `props` holds `count` initialized structs.
    match unsafe { f(pd, &mut count, props.as_mut_ptr()) } {
        vk::Result::SUCCESS | vk::Result::INCOMPLETE => {
            props.truncate(count as usize);
            props
        }
        _ => Vec::new(),
    }
}
