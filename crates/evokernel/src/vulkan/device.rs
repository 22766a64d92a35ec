//! One Vulkan device: instance, the physical device's limits, a logical device with one
//! compute queue, host-visible buffers and a one-shot compute dispatch.

use std::ffi::CStr;
use std::sync::Arc;

use ash::vk;

use super::vk_err;
use crate::error::{Error, Result};

/// What a Vulkan device reports (the limits the kernels' spaces are pruned by).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct VulkanDeviceInfo {
    pub index: usize,
    pub name: String,
    pub kind: String,
    pub api_version: String,
    pub driver_version: u32,
    /// Shared memory a workgroup may use (bytes).
    pub max_shared_bytes: u32,
    pub max_workgroup_invocations: u32,
    /// Workgroups a dispatch may have along x, y, z.
    #[serde(default)]
    pub max_workgroup_count: [u32; 3],
    /// Whether storage buffers may hold 16-bit values (`storageBuffer16BitAccess`): the
    /// f16 kernels need it.
    #[serde(default)]
    pub storage_f16: bool,
    pub max_push_constant_bytes: u32,
    pub subgroup_size: u32,
    /// The device's multiprocessors (NVIDIA's SMs by `VK_NV_shader_sm_builtins`, AMD's
    /// compute units by `VK_AMD_shader_core_properties`), where the driver says: how many
    /// workgroups make a wave, for the shaders' tile defaults.
    #[serde(default)]
    pub compute_units: Option<u32>,
    pub timestamp_period_ns: f32,
    /// The cooperative-matrix shapes the device offers (`VK_KHR_cooperative_matrix`), e.g.
    /// `16x16x16 f16*f16+f32=f32 subgroup`; empty where it has none (lavapipe).
    #[serde(default)]
    pub cooperative_matrix: Vec<String>,
    /// Whether the cooperative-matrix shader can run: the 16x16x16 f16*f16+f32 subgroup
    /// shape and the features it needs (cooperativeMatrix, vulkanMemoryModel,
    /// shaderFloat16), which `VulkanDevice::open` then enables.
    #[serde(default)]
    pub coopmat_f16: bool,
    /// Workgroup-scope f16 x f16 + f32 matrices of flexible dimensions
    /// (`VK_NV_cooperative_matrix2`), where the device has them with everything the
    /// `dense_coopmat2` shader needs; `VulkanDevice::open` then enables them.
    #[serde(default)]
    pub workgroup_matrices: Option<WorkgroupMatrices>,
}

/// What a device's workgroup-scope cooperative matrices allow (`VK_NV_cooperative_matrix2`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkgroupMatrices {
    /// The workgroup sizes they run at, each with its granularity of M, N and K.
    pub shapes: Vec<WorkgroupShape>,
    /// The largest M, N or K (`cooperativeMatrixFlexibleDimensionsMaxDimension`).
    pub max_dimension: u32,
    /// Shared memory the compiler keeps for its own staging of workgroup-scope matrices
    /// (`cooperativeMatrixWorkgroupScopeReservedSharedMemory`): a shader has the device's
    /// maximum less this.
    pub reserved_shared_bytes: u32,
}

/// One workgroup size of [`WorkgroupMatrices`]: M, N and K must be multiples of `m`, `n`
/// and `k` in a workgroup of `invocations`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkgroupShape {
    pub invocations: u32,
    pub m: u32,
    pub n: u32,
    pub k: u32,
}

impl std::fmt::Display for WorkgroupMatrices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shapes: Vec<String> = self
            .shapes
            .iter()
            .map(|s| {
                format!(
                    "{} invocations (M, N, K multiples of {}, {}, {})",
                    s.invocations, s.m, s.n, s.k
                )
            })
            .collect();
        write!(
            f,
            "f16*f16+f32 workgroup scope: {}; dimensions up to {}, {} B of shared memory reserved",
            shapes.join(", "),
            self.max_dimension,
            self.reserved_shared_bytes
        )
    }
}

/// Limits like lavapipe's (32 KiB shared, subgroup 8, 16-bit storage, no cooperative
/// matrices), for the config spaces' unit tests.
#[cfg(test)]
pub(crate) fn lavapipe_like() -> VulkanDeviceInfo {
    VulkanDeviceInfo {
        index: 0,
        name: "test".into(),
        kind: "cpu".into(),
        api_version: "1.3".into(),
        driver_version: 0,
        max_shared_bytes: 32 * 1024,
        max_workgroup_invocations: 1024,
        max_workgroup_count: [65535, 65535, 65535],
        max_push_constant_bytes: 128,
        subgroup_size: 8,
        compute_units: None,
        timestamp_period_ns: 1.0,
        storage_f16: true,
        cooperative_matrix: Vec::new(),
        coopmat_f16: false,
        workgroup_matrices: None,
    }
}

/// The loader and an instance; dropped in order (instance first).
struct Instance {
    _entry: ash::Entry,
    instance: ash::Instance,
}

impl Drop for Instance {
    fn drop(&mut self) {
        // SAFETY: every object made from the instance was destroyed before (the devices
        // hold an Arc to it).
        unsafe { self.instance.destroy_instance(None) };
    }
}

fn open_instance() -> Result<Arc<Instance>> {
    // SAFETY: loads libvulkan.so.1 with the platform's dynamic loader.
    let entry = unsafe { ash::Entry::load() }.map_err(|e| Error::BackendUnavailable {
        backend: "vulkan".into(),
        reason: format!(
            "no Vulkan loader ({e}); install libvulkan1 and a driver (scripts/install-vulkan.sh \
             installs Mesa's lavapipe)"
        ),
    })?;
    let app = vk::ApplicationInfo::default()
        .application_name(c"evokernel")
        // 1.3: SPIR-V 1.6 for the workgroup-scope matrix shader (the others target SPIR-V
        // 1.3); 1.2's core memory-model and float16 feature structs for the cooperative-
        // matrix shaders. A device below either simply lacks those shaders.
        .api_version(vk::make_api_version(0, 1, 3, 0));
    let info = vk::InstanceCreateInfo::default().application_info(&app);
    // SAFETY: a valid create-info with no extensions or layers.
    let instance =
        unsafe { entry.create_instance(&info, None) }.map_err(vk_err("vkCreateInstance"))?;
    Ok(Arc::new(Instance {
        _entry: entry,
        instance,
    }))
}

/// Whether `pd` has the device extension `wanted`.
fn has_extension(inst: &Instance, pd: vk::PhysicalDevice, wanted: &CStr) -> bool {
    // SAFETY: `pd` came from this instance.
    let exts =
        unsafe { inst.instance.enumerate_device_extension_properties(pd) }.unwrap_or_default();
    exts.iter().any(|e| {
        // SAFETY: extension_name is a NUL-terminated array filled by the driver.
        let name = unsafe { CStr::from_ptr(e.extension_name.as_ptr()) };
        name == wanted
    })
}

/// Whether `pd` has `VK_KHR_cooperative_matrix`.
fn has_cooperative_matrix(inst: &Instance, pd: vk::PhysicalDevice) -> bool {
    has_extension(inst, pd, ash::khr::cooperative_matrix::NAME)
}

/// Whether `pd` reports compiled pipelines' statistics (registers, code size:
/// `VK_KHR_pipeline_executable_properties` with `pipelineExecutableInfo`).
fn has_executable_statistics(inst: &Instance, pd: vk::PhysicalDevice) -> bool {
    if !has_extension(inst, pd, ash::khr::pipeline_executable_properties::NAME) {
        return false;
    }
    let mut exec = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
    let mut features2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut exec);
    // SAFETY: `pd` has the extension (checked above).
    unsafe {
        inst.instance
            .get_physical_device_features2(pd, &mut features2)
    };
    exec.pipeline_executable_info == vk::TRUE
}

/// Whether the cooperative-matrix shader's features are there: cooperativeMatrix,
/// vulkanMemoryModel, shaderFloat16 (and a device API of 1.2 for the latter two).
fn coopmat_features(inst: &Instance, pd: vk::PhysicalDevice, api: u32) -> bool {
    if vk::api_version_minor(api) < 2 && vk::api_version_major(api) == 1 {
        return false;
    }
    let mut coop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
    let mut model = vk::PhysicalDeviceVulkanMemoryModelFeatures::default();
    let mut f16 = vk::PhysicalDeviceShaderFloat16Int8Features::default();
    let mut features2 = vk::PhysicalDeviceFeatures2::default()
        .push_next(&mut coop)
        .push_next(&mut model)
        .push_next(&mut f16);
    // SAFETY: `pd` has the extension (checked by the caller) and API 1.2.
    unsafe {
        inst.instance
            .get_physical_device_features2(pd, &mut features2)
    };
    coop.cooperative_matrix == vk::TRUE
        && model.vulkan_memory_model == vk::TRUE
        && f16.shader_float16 == vk::TRUE
}

/// The cooperative-matrix shapes of `pd`, where it has `VK_KHR_cooperative_matrix`.
fn cooperative_shapes(inst: &Instance, pd: vk::PhysicalDevice) -> Vec<String> {
    if !has_cooperative_matrix(inst, pd) {
        return Vec::new();
    }
    let coop = ash::khr::cooperative_matrix::Instance::new(&inst._entry, &inst.instance);
    // SAFETY: the device has the extension; the loader resolved its instance function.
    let props =
        unsafe { coop.get_physical_device_cooperative_matrix_properties(pd) }.unwrap_or_default();
    let ty = |t: vk::ComponentTypeKHR| match t {
        vk::ComponentTypeKHR::FLOAT16 => "f16".to_string(),
        vk::ComponentTypeKHR::FLOAT32 => "f32".to_string(),
        vk::ComponentTypeKHR::SINT8 => "s8".to_string(),
        vk::ComponentTypeKHR::UINT8 => "u8".to_string(),
        vk::ComponentTypeKHR::SINT32 => "s32".to_string(),
        vk::ComponentTypeKHR::UINT32 => "u32".to_string(),
        other => format!("{other:?}").to_lowercase(),
    };
    props
        .iter()
        .map(|p| {
            format!(
                "{}x{}x{} {}*{}+{}={} {}",
                p.m_size,
                p.n_size,
                p.k_size,
                ty(p.a_type),
                ty(p.b_type),
                ty(p.c_type),
                ty(p.result_type),
                if p.scope == vk::ScopeKHR::SUBGROUP {
                    "subgroup".to_string()
                } else {
                    format!("{:?}", p.scope).to_lowercase()
                }
            )
        })
        .collect()
}

/// The workgroup-scope f16 x f16 + f32 matrices of `pd` where it has
/// `VK_NV_cooperative_matrix2` with workgroup scope and flexible dimensions, is a Vulkan
/// 1.3 device (SPIR-V 1.6) and has what the subgroup-scope shader needs (`coopmat_f16`:
/// the memory model, float16).
fn workgroup_matrices(
    inst: &Instance,
    pd: vk::PhysicalDevice,
    api: u32,
    coopmat_f16: bool,
) -> Option<WorkgroupMatrices> {
    if !coopmat_f16
        || (vk::api_version_major(api), vk::api_version_minor(api)) < (1, 3)
        || !has_extension(inst, pd, super::nv_coopmat2::NAME)
    {
        return None;
    }
    let mut features = super::nv_coopmat2::Features::default();
    let mut features2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut features);
    // SAFETY: `pd` has the extension (checked above).
    unsafe {
        inst.instance
            .get_physical_device_features2(pd, &mut features2)
    };
    if features.workgroup_scope != vk::TRUE || features.flexible_dimensions != vk::TRUE {
        return None;
    }
    let mut props = super::nv_coopmat2::Properties::default();
    extension_properties(inst, pd, &mut props);
    let mut shapes: Vec<WorkgroupShape> =
        super::nv_coopmat2::flexible_dimensions(&inst._entry, &inst.instance, pd)
            .into_iter()
            .filter(|f| {
                f.scope == vk::ScopeKHR::WORKGROUP
                    && f.a_type == vk::ComponentTypeKHR::FLOAT16
                    && f.b_type == vk::ComponentTypeKHR::FLOAT16
                    && f.c_type == vk::ComponentTypeKHR::FLOAT32
                    && f.result_type == vk::ComponentTypeKHR::FLOAT32
                    && f.saturating_accumulation == vk::FALSE
                    && f.workgroup_invocations <= props.workgroup_scope_max_workgroup_size
            })
            .map(|f| WorkgroupShape {
                invocations: f.workgroup_invocations,
                m: f.m_granularity,
                n: f.n_granularity,
                k: f.k_granularity,
            })
            .collect();
    shapes.sort_by_key(|s| (s.invocations, s.m, s.n, s.k));
    shapes.dedup();
    (!shapes.is_empty()).then_some(WorkgroupMatrices {
        shapes,
        max_dimension: props.flexible_dimensions_max_dimension,
        reserved_shared_bytes: props.workgroup_scope_reserved_shared_memory,
    })
}

/// Fills the extension's properties struct `ext` of `pd` (the caller checked that `pd`
/// has the extension).
fn extension_properties<T: vk::ExtendsPhysicalDeviceProperties2>(
    inst: &Instance,
    pd: vk::PhysicalDevice,
    ext: &mut T,
) {
    let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(ext);
    // SAFETY: `pd` belongs to this instance and has the struct's extension.
    unsafe {
        inst.instance
            .get_physical_device_properties2(pd, &mut props2)
    };
}

/// The multiprocessors of `pd` where its driver reports them: NVIDIA's SMs
/// (`VK_NV_shader_sm_builtins`), AMD's compute units (`VK_AMD_shader_core_properties`).
fn compute_units(inst: &Instance, pd: vk::PhysicalDevice) -> Option<u32> {
    let count = if has_extension(inst, pd, ash::nv::shader_sm_builtins::NAME) {
        let mut sm = vk::PhysicalDeviceShaderSMBuiltinsPropertiesNV::default();
        extension_properties(inst, pd, &mut sm);
        sm.shader_sm_count
    } else if has_extension(inst, pd, ash::amd::shader_core_properties::NAME) {
        let mut core = vk::PhysicalDeviceShaderCorePropertiesAMD::default();
        extension_properties(inst, pd, &mut core);
        core.shader_engine_count
            .saturating_mul(core.shader_arrays_per_engine_count)
            .saturating_mul(core.compute_units_per_shader_array)
    } else {
        0
    };
    (count > 0).then_some(count)
}

fn describe(instance: &Instance, index: usize, pd: vk::PhysicalDevice) -> VulkanDeviceInfo {
    let inst = &instance.instance;
    let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
    let mut props2 = vk::PhysicalDeviceProperties2::default().push_next(&mut subgroup);
    // SAFETY: `pd` came from this instance; Vulkan 1.1 has the properties2 query.
    unsafe { inst.get_physical_device_properties2(pd, &mut props2) };
    let p = props2.properties;
    let subgroup_size = subgroup.subgroup_size;
    let mut storage16 = vk::PhysicalDevice16BitStorageFeatures::default();
    let mut features2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut storage16);
    // SAFETY: as above; Vulkan 1.1 has the features2 query.
    unsafe { inst.get_physical_device_features2(pd, &mut features2) };
    let storage_f16 = storage16.storage_buffer16_bit_access == vk::TRUE;
    // SAFETY: device_name is a NUL-terminated array filled by the driver.
    let name = unsafe { CStr::from_ptr(p.device_name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    let v = p.api_version;
    let cooperative_matrix = cooperative_shapes(instance, pd);
    let coopmat_f16 = cooperative_matrix
        .iter()
        .any(|s| s == super::dense_coopmat::SHAPE)
        && coopmat_features(instance, pd, v);
    let workgroup_matrices = workgroup_matrices(instance, pd, v, coopmat_f16);
    VulkanDeviceInfo {
        index,
        name,
        kind: format!("{:?}", p.device_type),
        api_version: format!(
            "{}.{}.{}",
            vk::api_version_major(v),
            vk::api_version_minor(v),
            vk::api_version_patch(v)
        ),
        driver_version: p.driver_version,
        max_shared_bytes: p.limits.max_compute_shared_memory_size,
        max_workgroup_invocations: p.limits.max_compute_work_group_invocations,
        max_workgroup_count: p.limits.max_compute_work_group_count,
        max_push_constant_bytes: p.limits.max_push_constants_size,
        subgroup_size,
        compute_units: compute_units(instance, pd),
        timestamp_period_ns: p.limits.timestamp_period,
        storage_f16,
        cooperative_matrix,
        coopmat_f16,
        workgroup_matrices,
    }
}

/// Every Vulkan device the loader finds (none, not an error, where there is a loader
/// but no driver).
pub fn list_vulkan_devices() -> Result<Vec<VulkanDeviceInfo>> {
    let inst = open_instance()?;
    // SAFETY: a live instance.
    let pds = unsafe { inst.instance.enumerate_physical_devices() }
        .map_err(vk_err("vkEnumeratePhysicalDevices"))?;
    Ok(pds
        .into_iter()
        .enumerate()
        .map(|(i, pd)| describe(&inst, i, pd))
        .collect())
}

/// A logical device with one compute queue.
pub struct VulkanDevice {
    info: VulkanDeviceInfo,
    memory: vk::PhysicalDeviceMemoryProperties,
    queue: vk::Queue,
    family: u32,
    /// The compute queue writes timestamps (its family's timestamp_valid_bits > 0).
    timestamps: bool,
    /// Pipelines are created capturing the driver's statistics (registers, code size),
    /// where the device reports them.
    statistics: Option<ash::khr::pipeline_executable_properties::Device>,
    device: ash::Device,
    /// Kept alive past the device (dropped after it).
    _instance: Arc<Instance>,
}

impl Drop for VulkanDevice {
    fn drop(&mut self) {
        // SAFETY: callers' objects (buffers, pipelines) are destroyed when their calls
        // end; the queue is idle after every dispatch (fence waited).
        unsafe { self.device.destroy_device(None) };
    }
}

/// A host-visible, coherent storage buffer, mapped for its whole life.
pub(crate) struct HostBuffer<'d> {
    dev: &'d VulkanDevice,
    pub(crate) buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    ptr: *mut u8,
    pub(crate) bytes: usize,
}

impl HostBuffer<'_> {
    pub(crate) fn write(&mut self, data: &[u8]) {
        assert!(data.len() <= self.bytes);
        // SAFETY: the mapping covers `bytes` bytes; no dispatch is running.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr, data.len()) };
    }
    pub(crate) fn read(&self, out: &mut [u8]) {
        assert!(out.len() <= self.bytes);
        // SAFETY: as in write; coherent memory, the fence was waited.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, out.as_mut_ptr(), out.len()) };
    }
}

impl Drop for HostBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: no dispatch uses the buffer any more (each waits on its fence).
        unsafe {
            self.dev.device.unmap_memory(self.memory);
            self.dev.device.destroy_buffer(self.buffer, None);
            self.dev.device.free_memory(self.memory, None);
        }
    }
}

impl VulkanDevice {
    /// Opens device `index` of [`list_vulkan_devices`].
    pub fn open(index: usize) -> Result<Self> {
        let instance = open_instance()?;
        let inst = &instance.instance;
        // SAFETY: a live instance.
        let pds = unsafe { inst.enumerate_physical_devices() }
            .map_err(vk_err("vkEnumeratePhysicalDevices"))?;
        let pd = *pds.get(index).ok_or_else(|| Error::BackendUnavailable {
            backend: "vulkan".into(),
            reason: format!("no Vulkan device {index} ({} found)", pds.len()),
        })?;
        let info = describe(&instance, index, pd);
        // SAFETY: `pd` belongs to `inst`.
        let families = unsafe { inst.get_physical_device_queue_family_properties(pd) };
        let family = families
            .iter()
            .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
            .ok_or_else(|| Error::BackendUnavailable {
                backend: "vulkan".into(),
                reason: format!("{} has no compute queue", info.name),
            })? as u32;
        let timestamps = families[family as usize].timestamp_valid_bits > 0;
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(family)
            .queue_priorities(&priorities)];
        // 16-bit storage where the device has it (the f16 kernels read and write halves).
        let mut storage16 = vk::PhysicalDevice16BitStorageFeatures::default()
            .storage_buffer16_bit_access(info.storage_f16);
        // The cooperative-matrix shader's extension and features, where it can run.
        let mut coop =
            vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
        let mut model =
            vk::PhysicalDeviceVulkanMemoryModelFeatures::default().vulkan_memory_model(true);
        let mut f16 = vk::PhysicalDeviceShaderFloat16Int8Features::default().shader_float16(true);
        let with_statistics = has_executable_statistics(&instance, pd);
        let mut exec = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default()
            .pipeline_executable_info(true);
        // The workgroup-scope matrices' extension and the two features their shader uses.
        let mut coop2 = super::nv_coopmat2::Features::default();
        coop2.workgroup_scope = vk::TRUE;
        coop2.flexible_dimensions = vk::TRUE;
        let mut extensions = Vec::new();
        let mut create = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .push_next(&mut storage16);
        if info.coopmat_f16 {
            extensions.push(ash::khr::cooperative_matrix::NAME.as_ptr());
            create = create
                .push_next(&mut coop)
                .push_next(&mut model)
                .push_next(&mut f16);
        }
        if info.workgroup_matrices.is_some() {
            extensions.push(super::nv_coopmat2::NAME.as_ptr());
            create = create.push_next(&mut coop2);
        }
        if with_statistics {
            extensions.push(ash::khr::pipeline_executable_properties::NAME.as_ptr());
            create = create.push_next(&mut exec);
        }
        create = create.enabled_extension_names(&extensions);
        // SAFETY: valid create-info for a queue family the device has.
        let device =
            unsafe { inst.create_device(pd, &create, None) }.map_err(vk_err("vkCreateDevice"))?;
        // SAFETY: queue 0 of a family created above.
        let queue = unsafe { device.get_device_queue(family, 0) };
        // SAFETY: `pd` belongs to `inst`.
        let memory = unsafe { inst.get_physical_device_memory_properties(pd) };
        let statistics = with_statistics
            .then(|| ash::khr::pipeline_executable_properties::Device::new(inst, &device));
        Ok(VulkanDevice {
            info,
            memory,
            queue,
            family,
            timestamps,
            statistics,
            device,
            _instance: instance,
        })
    }

    pub fn info(&self) -> &VulkanDeviceInfo {
        &self.info
    }

    /// A storage buffer of `size` bytes bound to new memory of the first type `pick`
    /// accepts (given the types the buffer allows), or `none` when no type fits; on any
    /// failure nothing is left allocated.
    fn bound_buffer(
        &self,
        size: u64,
        pick: impl Fn(u32) -> Option<u32>,
        none: impl FnOnce() -> Error,
    ) -> Result<(vk::Buffer, vk::DeviceMemory)> {
        let info = vk::BufferCreateInfo::default()
            .size(size)
            .usage(
                vk::BufferUsageFlags::STORAGE_BUFFER
                    | vk::BufferUsageFlags::TRANSFER_SRC
                    | vk::BufferUsageFlags::TRANSFER_DST,
            )
            .sharing_mode(vk::SharingMode::EXCLUSIVE);
        let d = &self.device;
        // SAFETY: valid create-info; the buffer and memory are the caller's to destroy
        // once bound, and destroyed here on every failure.
        unsafe {
            let buffer = d
                .create_buffer(&info, None)
                .map_err(vk_err("vkCreateBuffer"))?;
            let req = d.get_buffer_memory_requirements(buffer);
            let Some(kind) = pick(req.memory_type_bits) else {
                d.destroy_buffer(buffer, None);
                return Err(none());
            };
            let alloc = vk::MemoryAllocateInfo::default()
                .allocation_size(req.size)
                .memory_type_index(kind);
            let memory = match d.allocate_memory(&alloc, None) {
                Ok(m) => m,
                Err(e) => {
                    d.destroy_buffer(buffer, None);
                    return Err(vk_err("vkAllocateMemory")(e));
                }
            };
            if let Err(e) = d.bind_buffer_memory(buffer, memory, 0) {
                d.destroy_buffer(buffer, None);
                d.free_memory(memory, None);
                return Err(vk_err("vkBindBufferMemory")(e));
            }
            Ok((buffer, memory))
        }
    }

    /// The first memory type among `allowed` (a requirements bit mask) with `flags`.
    fn memory_type(&self, allowed: u32, flags: vk::MemoryPropertyFlags) -> Option<u32> {
        (0..self.memory.memory_type_count).find(|&i| {
            allowed & (1 << i) != 0
                && self.memory.memory_types[i as usize]
                    .property_flags
                    .contains(flags)
        })
    }

    /// A host-visible coherent storage buffer of `bytes` (at least 4).
    pub(crate) fn host_buffer(&self, bytes: usize) -> Result<HostBuffer<'_>> {
        let size = bytes.max(4) as u64;
        let want = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
        let (buffer, memory) = self.bound_buffer(
            size,
            |allowed| self.memory_type(allowed, want),
            || Error::BackendUnavailable {
                backend: "vulkan".into(),
                reason: format!("{} has no host-visible coherent memory", self.info.name),
            },
        )?;
        let d = &self.device;
        // SAFETY: memory bound above, host-visible; on failure both are destroyed here,
        // else by HostBuffer's drop.
        unsafe {
            match d.map_memory(memory, 0, size, vk::MemoryMapFlags::empty()) {
                Ok(ptr) => Ok(HostBuffer {
                    dev: self,
                    buffer,
                    memory,
                    ptr: ptr.cast(),
                    bytes: size as usize,
                }),
                Err(e) => {
                    d.destroy_buffer(buffer, None);
                    d.free_memory(memory, None);
                    Err(vk_err("vkMapMemory")(e))
                }
            }
        }
    }

    /// A device-local storage buffer of `bytes` (at least 4), filled by `upload` and read
    /// by `download` through a host-visible staging copy: what a timed kernel reads and
    /// writes (host-visible memory on a discrete GPU would be read across PCIe). Any
    /// memory type where the device has no device-local one (lavapipe's are all both).
    pub(crate) fn device_buffer(&self, bytes: usize) -> Result<DeviceBuffer<'_>> {
        let size = bytes.max(4) as u64;
        let (buffer, memory) = self.bound_buffer(
            size,
            |allowed| {
                self.memory_type(allowed, vk::MemoryPropertyFlags::DEVICE_LOCAL)
                    .or_else(|| self.memory_type(allowed, vk::MemoryPropertyFlags::empty()))
            },
            || Error::BackendUnavailable {
                backend: "vulkan".into(),
                reason: format!("{} has no memory type for a storage buffer", self.info.name),
            },
        )?;
        Ok(DeviceBuffer {
            dev: self,
            buffer,
            memory,
            bytes: size as usize,
        })
    }

    /// Copies `data` into `dst` (through a staging buffer; waits).
    pub(crate) fn upload(&self, dst: &DeviceBuffer<'_>, data: &[u8]) -> Result<()> {
        if data.len() > dst.bytes {
            return Err(Error::BackendUnavailable {
                backend: "vulkan".into(),
                reason: format!("{} bytes into a buffer of {}", data.len(), dst.bytes),
            });
        }
        let mut staging = self.host_buffer(data.len())?;
        staging.write(data);
        self.copy(staging.buffer, dst.buffer, data.len())
    }

    /// Copies the first `out.len()` bytes of `src` into `out` (through a staging buffer).
    pub(crate) fn download(&self, src: &DeviceBuffer<'_>, out: &mut [u8]) -> Result<()> {
        let staging = self.host_buffer(out.len())?;
        self.copy(src.buffer, staging.buffer, out.len())?;
        staging.read(out);
        Ok(())
    }

    /// One buffer-to-buffer copy, submitted and waited for (host reads after it see it).
    fn copy(&self, src: vk::Buffer, dst: vk::Buffer, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let d = &self.device;
        let mut cleanup = Cleanup {
            d: Some(d),
            ..Cleanup::default()
        };
        // SAFETY: objects from valid create-infos, destroyed by `cleanup` after the wait.
        unsafe {
            let (cmd_pool, cmd) = self.command_buffer()?;
            cleanup.cmd_pool = cmd_pool;
            let region = [vk::BufferCopy::default().size(bytes as u64)];
            d.cmd_copy_buffer(cmd, src, dst, &region);
            memory_barrier(
                d,
                cmd,
                (
                    vk::PipelineStageFlags::TRANSFER,
                    vk::AccessFlags::TRANSFER_WRITE,
                ),
                (
                    vk::PipelineStageFlags::HOST | vk::PipelineStageFlags::COMPUTE_SHADER,
                    vk::AccessFlags::HOST_READ | vk::AccessFlags::SHADER_READ,
                ),
            );
            cleanup.fence = self.submit_and_wait(cmd)?;
        }
        Ok(())
    }

    /// A command pool and one primary command buffer of it, begun for one submission.
    ///
    /// # Safety
    /// The caller destroys the pool (with the buffer) once the submission is done.
    unsafe fn command_buffer(&self) -> Result<(vk::CommandPool, vk::CommandBuffer)> {
        let d = &self.device;
        let cmd_pool = d
            .create_command_pool(
                &vk::CommandPoolCreateInfo::default().queue_family_index(self.family),
                None,
            )
            .map_err(vk_err("vkCreateCommandPool"))?;
        let cmd = match d.allocate_command_buffers(
            &vk::CommandBufferAllocateInfo::default()
                .command_pool(cmd_pool)
                .level(vk::CommandBufferLevel::PRIMARY)
                .command_buffer_count(1),
        ) {
            Ok(c) => c[0],
            Err(e) => {
                d.destroy_command_pool(cmd_pool, None);
                return Err(vk_err("vkAllocateCommandBuffers")(e));
            }
        };
        if let Err(e) = d.begin_command_buffer(
            cmd,
            &vk::CommandBufferBeginInfo::default()
                .flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT),
        ) {
            d.destroy_command_pool(cmd_pool, None);
            return Err(vk_err("vkBeginCommandBuffer")(e));
        }
        Ok((cmd_pool, cmd))
    }

    /// Ends `cmd`, submits it and waits; returns the fence for the caller to destroy.
    ///
    /// # Safety
    /// `cmd` is a recording command buffer of this device.
    unsafe fn submit_and_wait(&self, cmd: vk::CommandBuffer) -> Result<vk::Fence> {
        let d = &self.device;
        d.end_command_buffer(cmd)
            .map_err(vk_err("vkEndCommandBuffer"))?;
        let fence = d
            .create_fence(&vk::FenceCreateInfo::default(), None)
            .map_err(vk_err("vkCreateFence"))?;
        let cmds = [cmd];
        let waited = d
            .queue_submit(
                self.queue,
                &[vk::SubmitInfo::default().command_buffers(&cmds)],
                fence,
            )
            .map_err(vk_err("vkQueueSubmit"))
            .and_then(|_| {
                d.wait_for_fences(&[fence], true, u64::MAX)
                    .map_err(vk_err("vkWaitForFences"))
            });
        match waited {
            Ok(()) => Ok(fence),
            Err(e) => {
                // A failed submit or wait: the device may be lost; waiting for idle before
                // the caller frees the command pool keeps it from freeing work in flight.
                let _ = d.device_wait_idle();
                d.destroy_fence(fence, None);
                Err(e)
            }
        }
    }

    /// A compute pipeline of `spirv` with `constants`, its descriptor set bound to
    /// `buffers` (bindings 0.. of set 0), taking `push_len` bytes of push constants:
    /// created once, launched as often as a timing needs.
    pub(crate) fn kernel(
        &self,
        spirv: &[u32],
        constants: &[(u32, u32)],
        buffers: &[vk::Buffer],
        push_len: usize,
    ) -> Result<ComputeKernel<'_>> {
        let entries: Vec<vk::SpecializationMapEntry> = constants
            .iter()
            .enumerate()
            .map(|(i, &(id, _))| {
                vk::SpecializationMapEntry::default()
                    .constant_id(id)
                    .offset(4 * i as u32)
                    .size(4)
            })
            .collect();
        let data: Vec<u8> = constants.iter().flat_map(|c| c.1.to_le_bytes()).collect();
        let specialization = vk::SpecializationInfo::default()
            .map_entries(&entries)
            .data(&data);
        let d = &self.device;
        let mut k = ComputeKernel {
            dev: self,
            objects: Cleanup {
                d: Some(d),
                ..Cleanup::default()
            },
            set: vk::DescriptorSet::null(),
        };
        // SAFETY: each object is created from valid create-infos and destroyed by the
        // kernel's `objects` when it drops (or on an error path here).
        unsafe {
            let module = d
                .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(spirv), None)
                .map_err(vk_err("vkCreateShaderModule"))?;
            k.objects.module = module;
            let bindings: Vec<_> = (0..buffers.len() as u32)
                .map(|b| {
                    vk::DescriptorSetLayoutBinding::default()
                        .binding(b)
                        .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                        .descriptor_count(1)
                        .stage_flags(vk::ShaderStageFlags::COMPUTE)
                })
                .collect();
            let set_layout = d
                .create_descriptor_set_layout(
                    &vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings),
                    None,
                )
                .map_err(vk_err("vkCreateDescriptorSetLayout"))?;
            k.objects.set_layout = set_layout;
            let ranges = [vk::PushConstantRange::default()
                .stage_flags(vk::ShaderStageFlags::COMPUTE)
                .size(push_len as u32)];
            let layouts = [set_layout];
            let layout = d
                .create_pipeline_layout(
                    &vk::PipelineLayoutCreateInfo::default()
                        .set_layouts(&layouts)
                        .push_constant_ranges(&ranges),
                    None,
                )
                .map_err(vk_err("vkCreatePipelineLayout"))?;
            k.objects.layout = layout;
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(module)
                .name(c"main")
                .specialization_info(&specialization);
            let flags = if self.statistics.is_some() {
                vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
            } else {
                vk::PipelineCreateFlags::empty()
            };
            let pipeline = d
                .create_compute_pipelines(
                    vk::PipelineCache::null(),
                    &[vk::ComputePipelineCreateInfo::default()
                        .flags(flags)
                        .stage(stage)
                        .layout(layout)],
                    None,
                )
                .map_err(|(_, e)| vk_err("vkCreateComputePipelines")(e))?[0];
            k.objects.pipeline = pipeline;
            let sizes = [vk::DescriptorPoolSize::default()
                .ty(vk::DescriptorType::STORAGE_BUFFER)
                .descriptor_count(buffers.len() as u32)];
            let pool = d
                .create_descriptor_pool(
                    &vk::DescriptorPoolCreateInfo::default()
                        .max_sets(1)
                        .pool_sizes(&sizes),
                    None,
                )
                .map_err(vk_err("vkCreateDescriptorPool"))?;
            k.objects.pool = pool;
            k.set = d
                .allocate_descriptor_sets(
                    &vk::DescriptorSetAllocateInfo::default()
                        .descriptor_pool(pool)
                        .set_layouts(&layouts),
                )
                .map_err(vk_err("vkAllocateDescriptorSets"))?[0];
            let infos: Vec<[vk::DescriptorBufferInfo; 1]> = buffers
                .iter()
                .map(|&b| {
                    [vk::DescriptorBufferInfo::default()
                        .buffer(b)
                        .range(vk::WHOLE_SIZE)]
                })
                .collect();
            let writes: Vec<_> = infos
                .iter()
                .enumerate()
                .map(|(i, info)| {
                    vk::WriteDescriptorSet::default()
                        .dst_set(k.set)
                        .dst_binding(i as u32)
                        .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                        .buffer_info(info)
                })
                .collect();
            d.update_descriptor_sets(&writes, &[]);
            if self.timestamps {
                k.objects.queries = d
                    .create_query_pool(
                        &vk::QueryPoolCreateInfo::default()
                            .query_type(vk::QueryType::TIMESTAMP)
                            .query_count(2),
                        None,
                    )
                    .map_err(vk_err("vkCreateQueryPool"))?;
            }
        }
        Ok(k)
    }
}

/// A compute pipeline bound to its buffers (`VulkanDevice::kernel`).
pub(crate) struct ComputeKernel<'d> {
    dev: &'d VulkanDevice,
    objects: Cleanup<'d>,
    set: vk::DescriptorSet,
}

impl ComputeKernel<'_> {
    /// The driver's statistics of the compiled pipeline (e.g. NVIDIA's register count and
    /// code size), `name value` each; empty where the device reports none.
    pub(crate) fn statistics(&self) -> Result<Vec<String>> {
        let Some(ext) = &self.dev.statistics else {
            return Ok(Vec::new());
        };
        let pipeline = vk::PipelineInfoKHR::default().pipeline(self.objects.pipeline);
        // SAFETY: the pipeline is live and was created capturing statistics.
        let executables = unsafe { ext.get_pipeline_executable_properties(&pipeline) }
            .map_err(vk_err("vkGetPipelineExecutablePropertiesKHR"))?;
        let mut out = Vec::new();
        for index in 0..executables.len() as u32 {
            let info = vk::PipelineExecutableInfoKHR::default()
                .pipeline(self.objects.pipeline)
                .executable_index(index);
            // SAFETY: as above; `index` is one of the pipeline's executables.
            let stats = unsafe { ext.get_pipeline_executable_statistics(&info) }
                .map_err(vk_err("vkGetPipelineExecutableStatisticsKHR"))?;
            for s in &stats {
                // SAFETY: the driver fills `name` NUL-terminated; the union member read is
                // the one `format` names.
                let name = unsafe { CStr::from_ptr(s.name.as_ptr()) }.to_string_lossy();
                let value = unsafe {
                    match s.format {
                        vk::PipelineExecutableStatisticFormatKHR::BOOL32 => {
                            (s.value.b32 != 0).to_string()
                        }
                        vk::PipelineExecutableStatisticFormatKHR::INT64 => s.value.i64.to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::UINT64 => s.value.u64.to_string(),
                        vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => {
                            s.value.f64.to_string()
                        }
                        _ => "?".into(),
                    }
                };
                out.push(format!("{name} {value}"));
            }
        }
        Ok(out)
    }
}

/// `reps` runs back to back in one submission of `stages` (kernels of one device, each
/// with its push constants and workgroups) in order, a barrier between every two
/// dispatches (a stage reads what the one before it wrote, a run rewrites what the last
/// one read), waited for; the device time a run in ms, from the first stage's timestamp
/// queries around the whole, where the queue has timestamps. Repeated runs keep the GPU
/// busy, so its clocks are those of steady work, not of an idle GPU woken by one dispatch
/// whose submission and fence wait take longer than the kernel.
pub(crate) fn launch_chain(
    stages: &[(&ComputeKernel<'_>, &[u8], [u32; 2])],
    reps: usize,
) -> Result<Option<f64>> {
    Ok(launch_chain_timed(stages, reps, false)?.map(|t| t.0))
}

/// `launch_chain`, and where `per_stage` (and there are two stages or more), the last
/// run's time in each stage (ms; from the end of the stage before, its barrier's wait
/// included). The second stage's queries hold the last run's start and the first stage's
/// end, each later stage's the end of the one before it.
pub(crate) fn launch_chain_timed(
    stages: &[(&ComputeKernel<'_>, &[u8], [u32; 2])],
    reps: usize,
    per_stage: bool,
) -> Result<Option<(f64, Vec<f64>)>> {
    let reps = reps.max(1);
    let Some(first) = stages.first() else {
        return Ok(None);
    };
    let dev = first.0.dev;
    let max = dev.info.max_workgroup_count;
    for (_, _, groups) in stages {
        if groups[0] > max[0] || groups[1] > max[1] {
            return Err(Error::BackendUnavailable {
                backend: "vulkan".into(),
                reason: format!("{groups:?} workgroups exceed the device's {:?}", &max[..2]),
            });
        }
    }
    let d = &dev.device;
    let queries = first.0.objects.queries;
    let mut once = Cleanup {
        d: Some(d),
        ..Cleanup::default()
    };
    // SAFETY: the pipelines, layouts, sets and query pool live as long as the kernels;
    // the command pool and fence are destroyed by `once` after the wait.
    unsafe {
        let (cmd_pool, cmd) = dev.command_buffer()?;
        once.cmd_pool = cmd_pool;
        let timed = queries != vk::QueryPool::null();
        if timed {
            d.cmd_reset_query_pool(cmd, queries, 0, 2);
            if per_stage {
                for (k, _, _) in &stages[1..] {
                    d.cmd_reset_query_pool(cmd, k.objects.queries, 0, 2);
                }
            }
            d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::TOP_OF_PIPE, queries, 0);
        }
        let compute = vk::PipelineStageFlags::COMPUTE_SHADER;
        for r in 0..reps {
            for (i, (k, push, groups)) in stages.iter().enumerate() {
                if r > 0 || i > 0 {
                    // After the dispatch before: its writes are this one's input, or what
                    // it read this one rewrites.
                    memory_barrier(
                        d,
                        cmd,
                        (compute, vk::AccessFlags::SHADER_WRITE),
                        (
                            compute,
                            vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE,
                        ),
                    );
                }
                // Bound again only where the stage changes (one stage: once a submission).
                if r == 0 || stages.len() > 1 {
                    let o = &k.objects;
                    d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, o.pipeline);
                    d.cmd_bind_descriptor_sets(
                        cmd,
                        vk::PipelineBindPoint::COMPUTE,
                        o.layout,
                        0,
                        &[k.set],
                        &[],
                    );
                    d.cmd_push_constants(cmd, o.layout, vk::ShaderStageFlags::COMPUTE, 0, push);
                }
                let staged = timed && per_stage && r + 1 == reps && stages.len() > 1;
                if staged && i == 0 {
                    // The last run starts where the work before it ends.
                    let pool = stages[1].0.objects.queries;
                    d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::BOTTOM_OF_PIPE, pool, 1);
                }
                d.cmd_dispatch(cmd, groups[0], groups[1], 1);
                if staged && i + 1 < stages.len() {
                    let pool = stages[i + 1].0.objects.queries;
                    d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::BOTTOM_OF_PIPE, pool, 0);
                }
            }
        }
        if timed {
            d.cmd_write_timestamp(cmd, vk::PipelineStageFlags::BOTTOM_OF_PIPE, queries, 1);
        }
        // Shader writes visible to host reads and to the download's copy.
        memory_barrier(
            d,
            cmd,
            (compute, vk::AccessFlags::SHADER_WRITE),
            (
                vk::PipelineStageFlags::HOST | vk::PipelineStageFlags::TRANSFER,
                vk::AccessFlags::HOST_READ | vk::AccessFlags::TRANSFER_READ,
            ),
        );
        once.fence = dev.submit_and_wait(cmd)?;
        if !timed {
            return Ok(None);
        }
        // Query `at` of `pool` (one written this submission: waiting on one that was not
        // would never return).
        let read = |pool: vk::QueryPool, at: u32| -> Result<u64> {
            let mut ticks = [0u64; 1];
            d.get_query_pool_results(
                pool,
                at,
                &mut ticks,
                vk::QueryResultFlags::TYPE_64 | vk::QueryResultFlags::WAIT,
            )
            .map_err(vk_err("vkGetQueryPoolResults"))?;
            Ok(ticks[0])
        };
        let ms = |ticks: u64| ticks as f64 * dev.info.timestamp_period_ns as f64 * 1e-6;
        let whole = [read(queries, 0)?, read(queries, 1)?];
        let mut stage_ms = Vec::new();
        if per_stage && stages.len() > 1 {
            let mut marks = vec![read(stages[1].0.objects.queries, 1)?];
            for (k, _, _) in &stages[1..] {
                marks.push(read(k.objects.queries, 0)?);
            }
            marks.push(whole[1]);
            stage_ms = marks
                .windows(2)
                .map(|w| ms(w[1].saturating_sub(w[0])))
                .collect();
        }
        Ok(Some((
            ms(whole[1].saturating_sub(whole[0])) / reps as f64,
            stage_ms,
        )))
    }
}

/// A global memory barrier in `cmd`: the `before` stage's accesses made available to the
/// `after` stage's.
///
/// # Safety
/// `cmd` is a command buffer of `d` in the recording state.
unsafe fn memory_barrier(
    d: &ash::Device,
    cmd: vk::CommandBuffer,
    before: (vk::PipelineStageFlags, vk::AccessFlags),
    after: (vk::PipelineStageFlags, vk::AccessFlags),
) {
    let barrier = vk::MemoryBarrier::default()
        .src_access_mask(before.1)
        .dst_access_mask(after.1);
    // SAFETY: the caller's.
    unsafe {
        d.cmd_pipeline_barrier(
            cmd,
            before.0,
            after.0,
            vk::DependencyFlags::empty(),
            &[barrier],
            &[],
            &[],
        )
    };
}

/// A device-local storage buffer (`VulkanDevice::device_buffer`).
pub(crate) struct DeviceBuffer<'d> {
    dev: &'d VulkanDevice,
    pub(crate) buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    pub(crate) bytes: usize,
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        // SAFETY: no submission uses the buffer any more (each waits on its fence).
        unsafe {
            self.dev.device.destroy_buffer(self.buffer, None);
            self.dev.device.free_memory(self.memory, None);
        }
    }
}

/// Destroys a dispatch's objects (null handles are skipped) when it ends, errors included.
#[derive(Default)]
struct Cleanup<'d> {
    d: Option<&'d ash::Device>,
    module: vk::ShaderModule,
    set_layout: vk::DescriptorSetLayout,
    layout: vk::PipelineLayout,
    pipeline: vk::Pipeline,
    pool: vk::DescriptorPool,
    cmd_pool: vk::CommandPool,
    fence: vk::Fence,
    queries: vk::QueryPool,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        let Some(d) = self.d else { return };
        // SAFETY: the objects were made by `d` and, past the fence wait (or before any
        // submit), are no longer in use; destroying a null handle is a no-op.
        unsafe {
            d.destroy_query_pool(self.queries, None);
            d.destroy_fence(self.fence, None);
            d.destroy_command_pool(self.cmd_pool, None);
            d.destroy_descriptor_pool(self.pool, None);
            d.destroy_pipeline(self.pipeline, None);
            d.destroy_pipeline_layout(self.layout, None);
            d.destroy_descriptor_set_layout(self.set_layout, None);
            d.destroy_shader_module(self.module, None);
        }
    }
}
