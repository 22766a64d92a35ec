//! The scaled GEMM on a CUDA device: operands uploaded once, B prepacked once for the
//! kernel's tiles (its time reported apart, never inside a launch's), the `GemmKernel`
//! loaded (for wgmma: A's TMA tensor map encoded, split-K's workspace and finalize), each
//! launch timed with CUDA events. What a bench or a test of the GEMM runs; the f64 oracle
//! and the gate check its output (issue 18).

use std::time::Instant;

use cudarc::driver::{CudaSlice, DeviceRepr};

use super::kernel::GemmKernel;
use super::mma::SOURCE as MMA_SOURCE;
use super::pack::PackedB;
use super::reference::{f32_bytes, ScaledMmData};
use super::spec::ScaledMmSpec;
use super::wgmma::{WgmmaConfig, SOURCE as WGMMA_SOURCE, STEP_K};
use crate::cuda::{encode_tiled_map, CudaDevice, KernelResources, LoadedKernel};
use crate::error::{Error, Result};
use crate::tensor::HostTensor;

/// The kernel's argument block (mirrors `ScaledMmArgs` in kernels/gemm/scaled_mm_mma.cu;
/// keep the two in the same order).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct ScaledMmArgs {
    a: u64,
    b_packed: u64,
    d: u64,
    scale_a: u64,
    scale_b: u64,
    bias: u64,
    m: i32,
    n: i32,
    k: i32,
}

// SAFETY: plain old data, laid out as the kernel's struct (repr(C), same field order).
unsafe impl DeviceRepr for ScaledMmArgs {}

/// `ScaledMmWgmmaArgs` of kernels/gemm/scaled_mm_wgmma.cu (same order; the tensor map
/// first, both sides 64-byte aligned, so every offset and the size agree).
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug)]
struct ScaledMmWgmmaArgs {
    a_map: [u64; 16],
    b_packed: u64,
    d: u64,
    scale_a: u64,
    scale_b: u64,
    bias: u64,
    partial: u64,
    m: i32,
    n: i32,
    k: i32,
    steps_per_split: i32,
    splits: i32,
}

// SAFETY: plain old data, laid out as the kernel's struct.
unsafe impl DeviceRepr for ScaledMmWgmmaArgs {}

/// What one launch runs: the kernel with its arguments, and split-K's finalize.
enum Launches {
    Mma(LoadedKernel, ScaledMmArgs),
    Wgmma {
        kernel: LoadedKernel,
        args: Box<ScaledMmWgmmaArgs>,
        finalize: Option<LoadedKernel>,
    },
}

/// A's tensor map for `cfg`: [M, K] bytes, boxes of 128 bytes x BM rows, 128-byte swizzle,
/// zeros past the edges.
fn a_tensor_map(a: u64, spec: &ScaledMmSpec, cfg: &WgmmaConfig) -> Result<[u64; 16]> {
    use cudarc::driver::sys;
    encode_tiled_map(
        sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
        a,
        &[spec.k() as u64, spec.m() as u64],
        &[spec.k() as u64],
        &[STEP_K as u32, cfg.bm() as u32],
        sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
    )
}

/// One scaled GEMM on a device, ready to launch.
pub struct ScaledMmRun<'d> {
    dev: &'d CudaDevice,
    spec: ScaledMmSpec,
    launches: Launches,
    // The buffers `args` points into, alive as long as the run.
    _operands: Vec<CudaSlice<u8>>,
    d: CudaSlice<u8>,
    pack_ms: f64,
}

impl<'d> ScaledMmRun<'d> {
    /// Packs B for `kernel`, uploads every operand and loads the kernel. `Err` when the
    /// config does not fit the spec, the operands do not match it, or CUDA fails.
    pub fn new(
        dev: &'d CudaDevice,
        spec: &ScaledMmSpec,
        data: &ScaledMmData,
        kernel: GemmKernel,
    ) -> Result<Self> {
        kernel.fits(spec).map_err(|reason| Error::NotApplicable {
            variant: kernel.variant().into(),
            spec: spec.to_string(),
            reason,
        })?;
        data.check(spec)?;
        let (tile_n, tile_k) = kernel.pack_tiles();
        let t0 = Instant::now();
        let packed = PackedB::pack(&data.b, spec.k(), spec.n(), tile_n, tile_k)?;
        let pack_ms = t0.elapsed().as_secs_f64() * 1e3;
        let mut operands = vec![
            dev.upload_bytes(&data.a_bytes())?,
            dev.upload_bytes(packed.bytes())?,
            dev.upload_bytes(&f32_bytes(data.scale_a.iter().copied()))?,
            dev.upload_bytes(&f32_bytes(data.scale_b.iter().copied()))?,
        ];
        if let Some(bias) = &data.bias {
            operands.push(dev.upload_bytes(&f32_bytes(bias.iter().copied()))?);
        }
        let d = dev.alloc(spec.m() * spec.n() * spec.out_dtype().size_bytes())?;
        if let GemmKernel::Wgmma(cfg) = kernel {
            let ws = cfg.workspace_bytes(spec);
            if ws > 0 {
                operands.push(dev.alloc(ws)?);
            }
        }
        let ptr = |i: usize| dev.device_ptr(&operands[i]);
        let bias = if data.bias.is_some() { ptr(4) } else { 0 };
        let (m, n, k) = (spec.m() as i32, spec.n() as i32, spec.k() as i32);
        let launches = match kernel {
            GemmKernel::Mma(cfg) => Launches::Mma(
                dev.load(
                    "scaled_mm_mma",
                    MMA_SOURCE,
                    &cfg.specialization(spec),
                    cfg.launch(spec),
                )?,
                ScaledMmArgs {
                    a: ptr(0),
                    b_packed: ptr(1),
                    d: dev.device_ptr(&d),
                    scale_a: ptr(2),
                    scale_b: ptr(3),
                    bias,
                    m,
                    n,
                    k,
                },
            ),
            GemmKernel::Wgmma(cfg) => {
                let ws = cfg.workspace_bytes(spec);
                let partial = if ws > 0 {
                    dev.device_ptr(&operands[operands.len() - 1])
                } else {
                    0
                };
                let args = ScaledMmWgmmaArgs {
                    a_map: a_tensor_map(ptr(0), spec, &cfg)?,
                    b_packed: ptr(1),
                    d: dev.device_ptr(&d),
                    scale_a: ptr(2),
                    scale_b: ptr(3),
                    bias,
                    partial,
                    m,
                    n,
                    k,
                    steps_per_split: cfg.steps_per_split(spec) as i32,
                    splits: cfg.live_splits(spec) as i32,
                };
                let kernel = dev.load_for(
                    super::wgmma::NAME,
                    WGMMA_SOURCE,
                    &cfg.specialization(spec),
                    cfg.launch(spec, dev.info().sms as usize),
                    true,
                )?;
                let finalize = if ws > 0 {
                    Some(dev.load_for(
                        super::wgmma::NAME,
                        WGMMA_SOURCE,
                        &cfg.finalize_specialization(spec),
                        cfg.finalize_launch(spec),
                        true,
                    )?)
                } else {
                    None
                };
                Launches::Wgmma {
                    kernel,
                    args: Box::new(args),
                    finalize,
                }
            }
        };
        Ok(ScaledMmRun {
            dev,
            spec: spec.clone(),
            launches,
            _operands: operands,
            d,
            pack_ms,
        })
    }

    /// One launch, timed with CUDA events (milliseconds).
    pub fn launch(&mut self) -> Result<f64> {
        let dev = self.dev;
        match &self.launches {
            Launches::Mma(kernel, args) => dev.time(|| dev.launch(kernel, args)),
            Launches::Wgmma {
                kernel,
                args,
                finalize,
            } => dev.time(|| {
                dev.launch(kernel, args.as_ref())?;
                if let Some(fin) = finalize {
                    dev.launch(fin, args.as_ref())?;
                }
                Ok(())
            }),
        }
    }

    /// D as a host tensor of the spec's output type, [M, N].
    pub fn output(&self) -> Result<HostTensor> {
        let mut d = HostTensor::zeros(self.spec.out_dtype(), &[self.spec.m(), self.spec.n()]);
        self.dev.download(&self.d, &mut d)?;
        Ok(d)
    }

    /// Registers, shared memory and local bytes of the main kernel (not split-K's finalize).
    pub fn resources(&self) -> KernelResources {
        match &self.launches {
            Launches::Mma(kernel, _) | Launches::Wgmma { kernel, .. } => kernel.resources,
        }
    }

    /// Milliseconds the host spent packing B (once, outside every launch).
    pub fn pack_ms(&self) -> f64 {
        self.pack_ms
    }
}
