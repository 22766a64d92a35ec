//! The CUDA backend: device discovery, buffers, the JIT, kernel launches timed with
//! events, the cuDNN baseline and the device's calibration. Everything is loaded at run
//! time (cudarc's dynamic loading), so the crate builds and its CPU paths run where
//! there is no CUDA at all.

pub mod calibrate;
pub mod cublaslt;
pub mod cudnn;
pub mod cudnn_graph;
pub mod jit;
pub mod libs;
pub mod run;

use std::sync::Arc;

use cudarc::driver::sys::{CUdevice_attribute as Attr, CUfunction_attribute_enum as FnAttr};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, DriverError,
    LaunchConfig, PushKernelArg,
};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::spec::ConvSpec;
use crate::tensor::HostTensor;
use crate::variants::Launch;
use jit::{Compiled, Jit};

/// A CUDA stream handle as a foreign framework hands it over (`CUstream`).
pub type RawStream = cudarc::driver::sys::CUstream;

/// Turns a driver error into ours, with the CUDA error name and the call that failed.
pub(crate) trait CudaContextExt<T>: Sized {
    /// `call` describes the call only when it failed (hot paths format nothing).
    fn cuda_with(self, call: impl FnOnce() -> String) -> Result<T>;
    fn cuda(self, call: &str) -> Result<T> {
        self.cuda_with(|| call.to_string())
    }
}

impl<T> CudaContextExt<T> for std::result::Result<T, cudarc::cublaslt::result::CublasError> {
    fn cuda_with(self, call: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::Cuda {
            call: call(),
            name: format!("{:?}", e.0),
        })
    }
}

impl<T> CudaContextExt<T> for std::result::Result<T, DriverError> {
    fn cuda_with(self, call: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::Cuda {
            call: call(),
            name: e
                .error_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|_| format!("{:?}", e.0)),
        })
    }
}

/// What `evokernel devices` prints and every GPU report records.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: (i32, i32),
    pub sms: u32,
    pub memory_bytes: u64,
    pub l2_bytes: u64,
    pub max_shared_per_block_optin: u32,
    pub sm_clock_mhz: u32,
    /// What one SM offers resident blocks (absent in reports written before it was recorded).
    #[serde(default)]
    pub sm_limits: Option<SmLimits>,
    pub driver_version: String,
    pub nvrtc_version: Option<String>,
    pub cudnn_version: Option<String>,
}

impl GpuInfo {
    /// NVRTC's target for this device, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }
}

/// What one SM offers to resident blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmLimits {
    pub max_threads: u32,
    pub max_blocks: u32,
    pub registers: u32,
    /// The register file is split between this many schedulers; a warp's registers
    /// come from one of them.
    pub register_partitions: u32,
    /// Registers are given to a warp in units of this many.
    pub register_unit: u32,
    /// Shared memory with the largest carveout.
    pub shared_bytes: u32,
    /// Shared memory the driver reserves per block (1 KiB since Ampere).
    pub shared_reserved_per_block: u32,
    /// Shared memory is given to a block in units of this many bytes.
    pub shared_unit: u32,
}

impl SmLimits {
    /// Compute capability 9.0 (H100, H200), as the driver reports it.
    pub const HOPPER: SmLimits = SmLimits {
        max_threads: 2048,
        max_blocks: 32,
        registers: 65536,
        register_partitions: 4,
        register_unit: 256,
        shared_bytes: 233_472,
        shared_reserved_per_block: 1024,
        shared_unit: 128,
    };

    pub fn max_warps(&self) -> u32 {
        self.max_threads / 32
    }
}

/// Why the CUDA backend cannot run here, or `Ok` when a driver with a device is present.
pub fn probe() -> Result<()> {
    // SAFETY: only tries to open the library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::BackendUnavailable {
            backend: "cuda".into(),
            reason: "the NVIDIA driver (libcuda.so) is not installed or not on the loader path; \
                     the CPU backend still works (--backend cpu)"
                .into(),
        });
    }
    let count = CudaContext::device_count().cuda("cuDeviceGetCount")?;
    if count < 1 {
        return Err(Error::BackendUnavailable {
            backend: "cuda".into(),
            reason: "the NVIDIA driver reports no GPU; the CPU backend still works (--backend cpu)"
                .into(),
        });
    }
    Ok(())
}

/// The kernel-argument block of every variant (kernels/common.cuh, same field order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ConvArgs {
    pub x: u64,
    pub w: u64,
    pub y: u64,
    pub n: i64,
    pub c: i64,
    pub input: [i32; 3],
    pub output: [i32; 3],
    pub kernel: [i32; 3],
    pub stride: [i32; 3],
    pub dilation: [i32; 3],
    pub pad: [i32; 3],
    /// Where tensor-core kernels flag a non-finite output (0: nowhere), and the launch's
    /// number they flag it with (kernels/repair.cu).
    pub flag: u64,
    pub epoch: u32,
}

/// The fused epilogue's operands, every conv kernel's second parameter
/// (kernels/common.cuh, same field order): per-channel bias and residual, 0 for none.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EpiArgs {
    pub bias: u64,
    pub residual: u64,
}

// SAFETY: plain old data, laid out as the CUDA struct.
unsafe impl DeviceRepr for EpiArgs {}

/// TMA tensor maps (`CUtensorMap`) of a 2-byte input and output-shaped tensor as
/// [N*C][D][H][W]: the third parameter of kernels that move their data with the tensor
/// memory accelerator (kernels/common.cuh, `TmaMaps`; depth_reuse.cu, wgrad_mma.cu).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
pub struct TmaMaps {
    pub input: [u64; 16],
    /// Zeroed where the kernel stores from registers instead (its variant says where).
    pub output: [u64; 16],
}

impl TmaMaps {
    /// For a kernel that takes the parameter but whose config does not read it.
    pub const UNUSED: TmaMaps = TmaMaps {
        input: [0; 16],
        output: [0; 16],
    };

    /// The input of `args` in boxes of `input_box` (columns x rows x depths; reads past
    /// the tensor's edges give zeros) and, with `output_box`, the output-shaped tensor at
    /// `output` (args.y, or grad-output for grad-weight kernels; writes past the right
    /// and bottom edges are dropped). A copy's first column must be a multiple of 16
    /// bytes (probed on the H100: docs/results/tma-*-probe-2026-11-26.cu). With
    /// `output_swizzled`, the output box's 128-byte rows are swizzled in shared memory.
    pub fn encode(
        args: &ConvArgs,
        elem_bytes: usize,
        input_box: [u32; 3],
        output: u64,
        output_box: Option<[u32; 3]>,
        output_swizzled: bool,
    ) -> Result<Self> {
        let planes = (args.n * args.c) as u64;
        let input = encode_plane_map(args.x, elem_bytes, args.input, planes, input_box, false)?;
        let output = match output_box {
            Some(b) => {
                encode_plane_map(output, elem_bytes, args.output, planes, b, output_swizzled)?
            }
            None => [0; 16],
        };
        Ok(TmaMaps { input, output })
    }

    /// The channels-last [N][D][H][W][C] input of `args` (elements of `elem_bytes`, 2 or
    /// 4) in boxes of `input_box` (channels x columns x rows x depths of one image; reads
    /// past the edges give zeros) and, with `output_box`, the output-shaped tensor at
    /// `output` the same way. C * `elem_bytes` and a box's channels' bytes must be
    /// multiples of 16. `input_swizzled`: the input's boxes land with the 32-byte swizzle
    /// (a box's channels must be 32 bytes).
    pub fn encode_channels_last(
        args: &ConvArgs,
        elem_bytes: usize,
        input_box: [u32; 4],
        output: u64,
        output_box: Option<[u32; 4]>,
        input_swizzled: bool,
    ) -> Result<Self> {
        let map = |ptr, dhw, b, swizzled| {
            let g = ChannelsLastMap::new(elem_bytes as u64, args.n as u64, args.c as u64, dhw, b);
            encode_channels_last_map(elem_bytes, ptr, g, swizzled)
        };
        let input = map(args.x, args.input, input_box, input_swizzled)?;
        let output = match output_box {
            Some(b) => map(output, args.output, b, false)?,
            None => [0; 16],
        };
        Ok(TmaMaps { input, output })
    }
}

/// A channels-last [n][D][H][W][c] tensor of `elem_bytes`-byte elements at `ptr` as a 5-D
/// map of geometry `g` (innermost first, boxes of `[channels, cols, rows, depths]` of one
/// image), with the 32-byte swizzle where `swizzled`.
fn encode_channels_last_map(
    elem_bytes: usize,
    ptr: u64,
    g: ChannelsLastMap,
    swizzled: bool,
) -> Result<[u64; 16]> {
    use cudarc::driver::sys::CUtensorMapSwizzle as Swizzle;
    let data_type = element_type(elem_bytes)?;
    if swizzled && g.boxes[0] as usize * elem_bytes != 32 {
        return Err(Error::NotApplicable {
            variant: "TMA tensor map".into(),
            spec: format!("boxes of {} channels of {elem_bytes} bytes", g.boxes[0]),
            reason: "the 32-byte swizzle needs boxes of 32-byte pixels".into(),
        });
    }
    encode_tiled_map(
        data_type,
        ptr,
        &g.dims,
        &g.strides,
        &g.boxes,
        if swizzled {
            Swizzle::CU_TENSOR_MAP_SWIZZLE_32B
        } else {
            Swizzle::CU_TENSOR_MAP_SWIZZLE_NONE
        },
        cudarc::driver::sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
    )
}

/// The TMA element type of `elem_bytes`-byte elements (bits moved, not interpreted).
fn element_type(elem_bytes: usize) -> Result<cudarc::driver::sys::CUtensorMapDataType> {
    use cudarc::driver::sys::CUtensorMapDataType as T;
    match elem_bytes {
        2 => Ok(T::CU_TENSOR_MAP_DATA_TYPE_UINT16),
        4 => Ok(T::CU_TENSOR_MAP_DATA_TYPE_UINT32),
        other => Err(Error::NotApplicable {
            variant: "TMA tensor map".into(),
            spec: format!("data of {other}-byte elements"),
            reason: "boxes of 2- and 4-byte elements only".into(),
        }),
    }
}

/// The geometry `cuTensorMapEncodeTiled` gets for channels-last data: dims (C, W, H, D,
/// N), byte strides of the four outer dims, boxes of one image.
#[derive(Debug, PartialEq, Eq)]
struct ChannelsLastMap {
    dims: [u64; 5],
    strides: [u64; 4],
    boxes: [u32; 5],
}

impl ChannelsLastMap {
    fn new(
        elem_bytes: u64,
        n: u64,
        c: u64,
        dhw: [i32; 3],
        [channels, cols, rows, depths]: [u32; 4],
    ) -> Self {
        let [d, h, w] = dhw.map(|v| v as u64);
        let pixel = elem_bytes * c;
        ChannelsLastMap {
            dims: [c, w, h, d, n],
            strides: [pixel, pixel * w, pixel * w * h, pixel * w * h * d],
            boxes: [channels, cols, rows, depths, 1],
        }
    }
}

/// A [planes][D][H][W] tensor of `elem_bytes`-byte elements (2 or 4) at `ptr`, in boxes
/// of `cols` x `rows` x `depths`; `swizzled`: rows of 128 bytes, swizzled 128 bytes at a
/// time in shared memory.
fn encode_plane_map(
    ptr: u64,
    elem_bytes: usize,
    dhw: [i32; 3],
    planes: u64,
    [cols, rows, depths]: [u32; 3],
    swizzled: bool,
) -> Result<[u64; 16]> {
    use cudarc::driver::sys;
    let data_type = element_type(elem_bytes)?;
    let [d, h, w] = dhw.map(|v| v as u64);
    let e = elem_bytes as u64;
    encode_tiled_map(
        data_type,
        ptr,
        &[w, h, d, planes],
        &[e * w, e * w * h, e * w * h * d],
        &[cols, rows, depths, 1],
        if swizzled {
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B
        } else {
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE
        },
        sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
    )
}

/// A TMA tensor map (`cuTensorMapEncodeTiled`) of the tensor at `ptr`: `dims` innermost
/// first, `strides` in bytes for every dim but the innermost, `boxes` a copy's extent per
/// dim, every element taken, zeros read past the edges. The tensor must be 16-byte
/// aligned and its strides multiples of 16.
pub(crate) fn encode_tiled_map(
    data_type: cudarc::driver::sys::CUtensorMapDataType,
    ptr: u64,
    dims: &[u64],
    strides: &[u64],
    boxes: &[u32],
    swizzle: cudarc::driver::sys::CUtensorMapSwizzle,
    l2: cudarc::driver::sys::CUtensorMapL2promotion,
) -> Result<[u64; 16]> {
    use cudarc::driver::sys;
    let rank = dims.len();
    assert!(
        (1..=5).contains(&rank) && strides.len() == rank - 1 && boxes.len() == rank,
        "a tensor map's dims, strides and boxes disagree on its rank"
    );
    let elem = [1u32; 5];
    // SAFETY: a zeroed CUtensorMap is plain data the encoder overwrites.
    let mut map: sys::CUtensorMap = unsafe { std::mem::zeroed() };
    // SAFETY: every array has the rank's entries (checked above); the caller's `ptr`
    // addresses the tensor the dims and strides describe.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            data_type,
            rank as u32,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            l2,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(Error::Cuda {
            call: format!(
                "cuTensorMapEncodeTiled (dims {dims:?}, byte strides {strides:?}, box {boxes:?}; the tensor must be 16-byte aligned, its strides multiples of 16)"
            ),
            name: format!("{r:?}"),
        });
    }
    Ok(map.opaque)
}

impl ConvArgs {
    /// Fails when a per-dim size does not fit the kernels' 32-bit per-dim indices.
    pub fn new(spec: &ConvSpec, x: u64, w: u64, y: u64) -> Result<Self> {
        let i32s = |what: &str, a: [usize; 3]| -> Result<[i32; 3]> {
            let mut out = [0i32; 3];
            for (o, &v) in out.iter_mut().zip(&a) {
                *o = i32::try_from(v).map_err(|_| Error::NotApplicable {
                    variant: "cuda".into(),
                    spec: spec.to_string(),
                    reason: format!("{what} {v} exceeds 2^31-1"),
                })?;
            }
            Ok(out)
        };
        Ok(ConvArgs {
            x,
            w,
            y,
            n: spec.n() as i64,
            c: spec.c() as i64,
            input: i32s("input size", spec.input3())?,
            output: i32s("output size", spec.output3())?,
            kernel: i32s("kernel size", spec.kernel3())?,
            stride: i32s("stride", spec.stride3())?,
            dilation: i32s("dilation", spec.dilation3())?,
            pad: i32s("padding", spec.pad_before3())?,
            flag: 0,
            epoch: 0,
        })
    }
}

/// Registers, memory and limits of a loaded kernel, from the driver.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct KernelResources {
    pub registers: i32,
    pub static_shared_bytes: i32,
    pub dynamic_shared_bytes: u32,
    /// Per-thread local memory: non-zero means spills or a stack-allocated array.
    pub local_bytes: i32,
    pub max_threads_per_block: i32,
    /// Blocks of this launch that fit on one SM at once.
    pub blocks_per_sm: i32,
    /// The launch's block size (0 in reports written before it was recorded).
    #[serde(default)]
    pub threads_per_block: u32,
}

/// A kernel specialization loaded into the context, with its launch geometry.
pub struct LoadedKernel {
    pub function: CudaFunction,
    pub launch: Launch,
    pub compiled: Compiled,
    pub resources: KernelResources,
}

/// One GPU, its stream and its JIT.
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: GpuInfo,
    jit: Jit,
    /// The L2 sweep `time` launches before each timed launch while it is on
    /// (`set_l2_sweep`): the kernel and its buffer of twice the L2.
    l2_sweep: std::sync::Mutex<Option<(LoadedKernel, CudaSlice<u8>)>>,
}

impl CudaDevice {
    pub fn open(ordinal: usize) -> Result<Self> {
        probe()?;
        let ctx = CudaContext::new(ordinal).cuda("cuCtxCreate")?;
        // One stream, explicit synchronization: no per-buffer event bookkeeping.
        // SAFETY: nothing has been allocated on this context yet.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let info = query_info(&ctx, ordinal)?;
        let jit = Jit::new(&info.arch())?;
        Ok(CudaDevice {
            ctx,
            stream,
            info,
            jit,
            l2_sweep: std::sync::Mutex::new(None),
        })
    }

    pub fn info(&self) -> &GpuInfo {
        &self.info
    }
    pub fn jit(&self) -> &Jit {
        &self.jit
    }
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Free device memory now (cuMemGetInfo).
    pub fn free_memory(&self) -> Result<u64> {
        self.bind().cuda("cuCtxSetCurrent")?;
        let (free, _total) = cudarc::driver::result::mem_get_info().cuda("cuMemGetInfo")?;
        Ok(free as u64)
    }

    pub fn alloc(&self, bytes: usize) -> Result<CudaSlice<u8>> {
        self.stream
            .alloc_zeros::<u8>(bytes.max(1))
            .cuda("cuMemAlloc")
    }

    pub fn upload(&self, t: &HostTensor) -> Result<CudaSlice<u8>> {
        self.upload_bytes(t.as_bytes())
    }

    /// Raw bytes (fp8 operands, a packed B, f32 scales) into a new device buffer.
    pub fn upload_bytes(&self, bytes: &[u8]) -> Result<CudaSlice<u8>> {
        self.stream.clone_htod(bytes).cuda("cuMemcpyHtoD")
    }

    /// Copies a device buffer into a host tensor of the same byte size.
    pub fn download(&self, src: &CudaSlice<u8>, dst: &mut HostTensor) -> Result<()> {
        let bytes = dst.as_bytes_mut();
        let n = bytes.len();
        self.stream
            .memcpy_dtoh(&src.slice(0..n), bytes)
            .cuda("cuMemcpyDtoH")?;
        self.stream.synchronize().cuda("cuStreamSynchronize")
    }

    /// Fills a buffer with 0xFF bytes: NaN in bf16, f16 and f32.
    pub fn poison(&self, buf: &mut CudaSlice<u8>) -> Result<()> {
        let (ptr, _sync) = buf.device_ptr(&self.stream);
        // SAFETY: ptr addresses `buf.len()` bytes owned by `buf` on this stream.
        unsafe {
            cudarc::driver::result::memset_d8_async(ptr, 0xff, buf.len(), self.stream.cu_stream())
        }
        .cuda("cuMemsetD8Async")
    }

    pub fn device_ptr(&self, buf: &CudaSlice<u8>) -> u64 {
        buf.device_ptr(&self.stream).0
    }

    /// Compiles (or takes from the cache) and loads one specialization.
    pub fn load(
        &self,
        name: &str,
        source: &str,
        expr: &str,
        launch: Launch,
    ) -> Result<LoadedKernel> {
        self.load_for(name, source, expr, launch, false)
    }

    /// `load`, compiled for the arch-specific target when `arch_specific` (sm_90a).
    pub fn load_for(
        &self,
        name: &str,
        source: &str,
        expr: &str,
        launch: Launch,
        arch_specific: bool,
    ) -> Result<LoadedKernel> {
        let compiled = self.jit.compile_for(name, source, expr, arch_specific)?;
        let module = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(compiled.cubin.clone()))
            .cuda("cuModuleLoadData")?;
        let function = module
            .load_function(&compiled.symbol)
            .cuda("cuModuleGetFunction")?;
        // Past 48 KiB of static and dynamic shared memory together a launch needs the
        // opt-in (a TMA kernel's barriers are static: 49152 dynamic bytes plus 16 static
        // failed with CUDA_ERROR_INVALID_VALUE, run 198).
        let static_shared = function.shared_size_bytes().cuda("cuFuncGetAttribute")?;
        if launch.shared_bytes as usize + static_shared as usize > 48 * 1024 {
            function
                .set_attribute(
                    FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    launch.shared_bytes as i32,
                )
                .cuda("cuFuncSetAttribute")?;
        }
        let threads = launch.block.0 * launch.block.1 * launch.block.2;
        let resources = KernelResources {
            registers: function.num_regs().cuda("cuFuncGetAttribute")?,
            static_shared_bytes: static_shared,
            dynamic_shared_bytes: launch.shared_bytes,
            local_bytes: function.local_size_bytes().cuda("cuFuncGetAttribute")?,
            max_threads_per_block: function
                .max_threads_per_block()
                .cuda("cuFuncGetAttribute")?,
            blocks_per_sm: function
                .occupancy_max_active_blocks_per_multiprocessor(
                    threads,
                    launch.shared_bytes as usize,
                    None,
                )
                .cuda("cuOccupancyMaxActiveBlocksPerMultiprocessor")?
                as i32,
            threads_per_block: threads,
        };
        Ok(LoadedKernel {
            function,
            launch,
            compiled,
            resources,
        })
    }

    /// Makes this device's context current on the calling thread (a foreign thread, e.g.
    /// PyTorch's, may call a plan).
    pub fn bind(&self) -> std::result::Result<(), DriverError> {
        self.ctx.bind_to_thread()
    }

    /// Launches a conv kernel (parameters `args`, `epi`) on a foreign stream.
    ///
    /// # Safety
    /// `stream` must be a live stream of this device's context, current on this thread,
    /// and every pointer in `args` and `epi` must address device memory the kernel may
    /// access.
    pub unsafe fn launch_on(
        &self,
        kernel: &LoadedKernel,
        args: &ConvArgs,
        epi: &EpiArgs,
        maps: Option<&TmaMaps>,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<()> {
        let l = kernel.launch;
        let mut params = vec![
            args as *const ConvArgs as *mut std::ffi::c_void,
            epi as *const EpiArgs as *mut std::ffi::c_void,
        ];
        if let Some(m) = maps {
            params.push(m as *const TmaMaps as *mut std::ffi::c_void);
        }
        // SAFETY: the parameters match the kernel's (ConvArgs, EpiArgs and, for kernels
        // that take them, the tensor maps) and outlive the call (the driver copies
        // them at launch); the caller vouches for the rest.
        unsafe {
            cudarc::driver::result::launch_kernel(
                kernel.function.cu_function(),
                l.grid,
                l.block,
                l.shared_bytes,
                stream,
                &mut params,
            )
        }
        // The geometry says which launch a setting was out of range for.
        .cuda_with(|| {
            format!(
                "cuLaunchKernel (grid {:?}, block {:?}, {} bytes of shared memory)",
                l.grid, l.block, l.shared_bytes
            )
        })
    }

    /// Launches a second kernel of a plan (grad-weight's finalize) on `stream` as a
    /// programmatic dependent of the kernel before it where the device has them (sm_90
    /// and later): its blocks may launch while the first kernel's last blocks finish, and
    /// its `griddepcontrol.wait` holds them until that kernel has completed and its
    /// writes are visible. Elsewhere a plain launch.
    ///
    /// # Safety
    /// As `launch_on`; the kernel must wait (`griddepcontrol.wait`) before it reads what
    /// the kernel before it wrote.
    pub unsafe fn launch_dependent_on(
        &self,
        kernel: &LoadedKernel,
        args: &ConvArgs,
        epi: &EpiArgs,
        stream: cudarc::driver::sys::CUstream,
    ) -> Result<()> {
        use cudarc::driver::sys;
        if self.info.compute_capability.0 < 9 {
            // SAFETY: the caller's promises are launch_on's.
            return unsafe { self.launch_on(kernel, args, epi, None, stream) };
        }
        let l = kernel.launch;
        let mut params = [
            args as *const ConvArgs as *mut std::ffi::c_void,
            epi as *const EpiArgs as *mut std::ffi::c_void,
        ];
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue { pad: [0; 64] },
        };
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: l.grid.0,
            gridDimY: l.grid.1,
            gridDimZ: l.grid.2,
            blockDimX: l.block.0,
            blockDimY: l.block.1,
            blockDimZ: l.block.2,
            sharedMemBytes: l.shared_bytes,
            hStream: stream,
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: the parameters match the kernel's (ConvArgs, EpiArgs) and outlive the
        // call (the driver copies them); `config` and `attr` live across it; the caller
        // vouches for the stream and the pointers.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                kernel.function.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .cuda_with(|| {
            format!(
                "cuLaunchKernelEx (programmatic dependent; grid {:?}, block {:?})",
                l.grid, l.block
            )
        })
    }

    /// Launches a kernel whose only parameter is `args`.
    pub fn launch<A: DeviceRepr>(&self, kernel: &LoadedKernel, args: &A) -> Result<()> {
        let l = kernel.launch;
        let cfg = LaunchConfig {
            grid_dim: l.grid,
            block_dim: l.block,
            shared_mem_bytes: l.shared_bytes,
        };
        let mut b = self.stream.launch_builder(&kernel.function);
        b.arg(args);
        // SAFETY: `args` matches the kernel's single parameter (ConvArgs or a calibration
        // argument), and every pointer in it addresses a live buffer of the right size.
        unsafe { b.launch(cfg) }.cuda("cuLaunchKernel")?;
        Ok(())
    }

    /// Times `work` on the stream with a pair of CUDA events, in milliseconds.
    pub fn time(&self, work: impl FnOnce() -> Result<()>) -> Result<f64> {
        self.sweep_l2()?;
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.stream.record_event(flags).cuda("cuEventRecord")?;
        work()?;
        let end = self.stream.record_event(flags).cuda("cuEventRecord")?;
        end.synchronize().cuda("cuEventSynchronize")?;
        Ok(start.elapsed_ms(&end).cuda("cuEventElapsedTime")? as f64)
    }
}

impl CudaDevice {
    /// With `on`, `time` first reads a buffer of twice the L2 on the stream, outside the
    /// timing, so every timed launch starts with an L2 holding only clean lines
    /// (kernels/l2_sweep.cu says why); without, it does not (and the buffer is freed).
    /// The timing protocol's `sweep_l2` says which, per bench or tune.
    pub fn set_l2_sweep(&self, on: bool) -> Result<()> {
        let mut sweep = self.l2_sweep.lock().unwrap_or_else(|e| e.into_inner());
        if !on {
            *sweep = None;
        } else if sweep.is_none() {
            let bytes = (2 * self.info.l2_bytes.max(1 << 20) as usize).next_multiple_of(16);
            let launch =
                crate::variants::grid_stride_launch(bytes as u64 / 16, 256, 4, self.info.sms);
            let (name, source, expr) = l2_sweep_specialization();
            let kernel = self.load(name, source, expr, launch)?;
            // Zeros (`alloc` clears), plus a word the kernel would write to.
            *sweep = Some((kernel, self.alloc(bytes + 16)?));
        }
        Ok(())
    }

    fn sweep_l2(&self) -> Result<()> {
        let sweep = self.l2_sweep.lock().unwrap_or_else(|e| e.into_inner());
        let Some((kernel, buffer)) = sweep.as_ref() else {
            return Ok(());
        };
        self.bind().cuda("cuCtxSetCurrent")?;
        let at = self.device_ptr(buffer);
        let vectors = (buffer.len() - 16) / 16;
        let args = ConvArgs {
            x: at,
            y: at + (vectors * 16) as u64,
            n: vectors as i64,
            ..ConvArgs::default()
        };
        let epi = EpiArgs::default();
        // SAFETY: the kernel reads `vectors` 16-byte vectors of `buffer` and may write one
        // word past them, inside it; the stream is this device's.
        unsafe { self.launch_on(kernel, &args, &epi, None, self.stream.cu_stream()) }
    }
}

/// The L2 sweep kernel (kernels/l2_sweep.cu): name, source, name expression.
pub fn l2_sweep_specialization() -> (&'static str, &'static str, &'static str) {
    (
        "l2_sweep",
        include_str!("../../kernels/l2_sweep.cu"),
        "l2_sweep<0>",
    )
}

fn query_info(ctx: &Arc<CudaContext>, ordinal: usize) -> Result<GpuInfo> {
    let attr = |a: Attr| ctx.attribute(a).cuda("cuDeviceGetAttribute");
    let mut driver = 0i32;
    // SAFETY: the driver is loaded (probe) and the pointer is valid.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) }
        .result()
        .cuda("cuDriverGetVersion")?;
    let nvrtc = libs::nvrtc_version().ok();
    let cudnn = cudnn::version();
    let cc = ctx.compute_capability().cuda("cuDeviceGetAttribute")?;
    Ok(GpuInfo {
        ordinal,
        name: ctx.name().cuda("cuDeviceGetName")?,
        compute_capability: cc,
        sms: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
        memory_bytes: ctx.total_mem().cuda("cuDeviceTotalMem")? as u64,
        l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as u64,
        max_shared_per_block_optin: attr(
            Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
        )? as u32,
        sm_clock_mhz: (attr(Attr::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)? / 1000) as u32,
        sm_limits: Some(SmLimits {
            max_threads: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)? as u32,
            max_blocks: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR)? as u32,
            registers: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)? as u32,
            shared_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?
                as u32,
            shared_reserved_per_block: attr(
                Attr::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK,
            )? as u32,
            // Not driver attributes; the same on every architecture since Volta.
            ..SmLimits::HOPPER
        }),
        driver_version: format!("{}.{}", driver / 1000, (driver % 1000) / 10),
        nvrtc_version: nvrtc.map(|(a, b)| format!("{a}.{b}")),
        cudnn_version: cudnn,
    })
}

/// What `evokernel devices` reports: the GPUs (none is a valid answer), why there are
/// none, and the libraries found.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Survey {
    pub gpus: Vec<GpuInfo>,
    /// Why the CUDA backend cannot run, when it cannot.
    pub cuda_unavailable: Option<String>,
    pub nvrtc_version: Option<String>,
    pub cudnn_version: Option<String>,
    /// The CPU backend's instruction set (it always works).
    pub cpu_backend: String,
    /// Vulkan devices (the Vulkan backend, started: issue 19).
    #[cfg(feature = "vulkan")]
    pub vulkan: Vec<crate::vulkan::VulkanDeviceInfo>,
    /// Why there is no Vulkan, when there is none.
    pub vulkan_unavailable: Option<String>,
}

/// Looks for GPUs and libraries; never fails (what is missing is in the answer).
pub fn survey() -> Survey {
    let (gpus, cuda_unavailable) = match list_devices() {
        Ok(g) => (g, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    #[cfg(feature = "vulkan")]
    let (vulkan, vulkan_unavailable) = match crate::vulkan::list_vulkan_devices() {
        Ok(v) if v.is_empty() => (v, Some("a Vulkan loader but no device".into())),
        Ok(v) => (v, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    #[cfg(not(feature = "vulkan"))]
    let vulkan_unavailable = Some("built without the vulkan feature".to_string());
    Survey {
        gpus,
        cuda_unavailable,
        nvrtc_version: libs::nvrtc_version().ok().map(|(a, b)| format!("{a}.{b}")),
        cudnn_version: cudnn::version(),
        cpu_backend: format!("cpu-{}", crate::cpu::Isa::detect().name()),
        #[cfg(feature = "vulkan")]
        vulkan,
        vulkan_unavailable,
    }
}

/// Every CUDA device with its properties; an error saying what is missing when the
/// driver is absent (the CPU backend still works).
pub fn list_devices() -> Result<Vec<GpuInfo>> {
    probe()?;
    let count = CudaContext::device_count().cuda("cuDeviceGetCount")?.max(0) as usize;
    (0..count)
        .map(|i| query_info(&CudaContext::new(i).cuda("cuCtxCreate")?, i))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn channels_last_maps_step_a_pixel_then_a_row_then_a_plane_then_an_image() {
        // mobilenet-s2's input: 32 x 112 x 112 x 144 f16, a 9 x 17 window of 144 channels.
        let g = super::ChannelsLastMap::new(2, 32, 144, [1, 112, 112], [144, 17, 9, 1]);
        assert_eq!(g.dims, [144, 112, 112, 1, 32]);
        assert_eq!(
            g.strides,
            [288, 288 * 112, 288 * 112 * 112, 288 * 112 * 112]
        );
        assert_eq!(g.boxes, [144, 17, 9, 1, 1]);
        // TMA wants every stride a multiple of 16 bytes: a pixel of 144 f16 channels is.
        assert!(g.strides.iter().all(|s| s % 16 == 0));
        // A 3-D box: 3 depths of the NDHWC seed, 32 f32 channels.
        let g = super::ChannelsLastMap::new(4, 1, 512, [61, 45, 80], [32, 12, 12, 3]);
        assert_eq!(g.dims, [512, 80, 45, 61, 1]);
        assert_eq!(g.strides[0], 2048);
        assert_eq!(g.strides[3], 2048 * 80 * 45 * 61);
        assert_eq!(g.boxes, [32, 12, 12, 3, 1]);
    }

    #[test]
    fn the_32_byte_swizzle_is_refused_for_other_pixel_boxes() {
        // 8 bf16 channels a pixel (16 bytes): refused before any driver call.
        let g = super::ChannelsLastMap::new(2, 1, 512, [61, 45, 80], [8, 16, 20, 1]);
        let err = super::encode_channels_last_map(2, 0, g, true).unwrap_err();
        assert!(err.to_string().contains("32-byte pixels"), "{err}");
    }
}
