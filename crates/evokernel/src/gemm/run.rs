//! The scaled GEMM on a CUDA device: operands uploaded once, B prepacked once for the
//! config's tiles (its time reported apart, never inside a launch's), the kernel of
//! `MmaConfig` loaded, each launch timed with CUDA events. What a bench or a test of the
//! GEMM runs; the f64 oracle and the gate check its output (issue 18).

use std::time::Instant;

use cudarc::driver::{CudaSlice, DeviceRepr};

use super::mma::{MmaConfig, SOURCE};
use super::pack::PackedB;
use super::reference::ScaledMmData;
use super::spec::ScaledMmSpec;
use crate::cuda::{CudaDevice, LoadedKernel};
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

/// One scaled GEMM on a device, ready to launch.
pub struct ScaledMmRun<'d> {
    dev: &'d CudaDevice,
    spec: ScaledMmSpec,
    kernel: LoadedKernel,
    args: ScaledMmArgs,
    // The buffers `args` points into, alive as long as the run.
    _operands: Vec<CudaSlice<u8>>,
    d: CudaSlice<u8>,
    pack_ms: f64,
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl<'d> ScaledMmRun<'d> {
    /// Packs B for `config`, uploads every operand and loads the kernel. `Err` when the
    /// config does not fit the spec, the operands do not match it, or CUDA fails.
    pub fn new(
        dev: &'d CudaDevice,
        spec: &ScaledMmSpec,
        data: &ScaledMmData,
        config: MmaConfig,
    ) -> Result<Self> {
        config.fits(spec).map_err(|reason| Error::NotApplicable {
            variant: "scaled_mm_mma".into(),
            spec: spec.to_string(),
            reason,
        })?;
        data.check(spec)?;
        let (tile_n, tile_k) = config.pack_tiles();
        let t0 = Instant::now();
        let packed = PackedB::pack(&data.b, spec.k(), spec.n(), tile_n, tile_k)?;
        let pack_ms = t0.elapsed().as_secs_f64() * 1e3;
        let a: Vec<u8> = data.a.iter().map(|e| e.0).collect();
        let mut operands = vec![
            dev.upload_bytes(&a)?,
            dev.upload_bytes(packed.bytes())?,
            dev.upload_bytes(&f32_bytes(&data.scale_a))?,
            dev.upload_bytes(&f32_bytes(&data.scale_b))?,
        ];
        if let Some(bias) = &data.bias {
            operands.push(dev.upload_bytes(&f32_bytes(bias))?);
        }
        let d = dev.alloc(spec.m() * spec.n() * spec.out_dtype().size_bytes())?;
        let ptr = |i: usize| dev.device_ptr(&operands[i]);
        let args = ScaledMmArgs {
            a: ptr(0),
            b_packed: ptr(1),
            d: dev.device_ptr(&d),
            scale_a: ptr(2),
            scale_b: ptr(3),
            bias: if data.bias.is_some() { ptr(4) } else { 0 },
            m: spec.m() as i32,
            n: spec.n() as i32,
            k: spec.k() as i32,
        };
        let kernel = dev.load(
            "scaled_mm_mma",
            SOURCE,
            &config.specialization(spec),
            config.launch(spec),
        )?;
        Ok(ScaledMmRun {
            dev,
            spec: spec.clone(),
            kernel,
            args,
            _operands: operands,
            d,
            pack_ms,
        })
    }

    /// One launch, timed with CUDA events (milliseconds).
    pub fn launch(&mut self) -> Result<f64> {
        let (dev, kernel, args) = (self.dev, &self.kernel, &self.args);
        dev.time(|| dev.launch(kernel, args))
    }

    /// D as a host tensor of the spec's output type, [M, N].
    pub fn output(&self) -> Result<HostTensor> {
        let mut d = HostTensor::zeros(self.spec.out_dtype(), &[self.spec.m(), self.spec.n()]);
        self.dev.download(&self.d, &mut d)?;
        Ok(d)
    }

    /// Milliseconds the host spent packing B (once, outside every launch).
    pub fn pack_ms(&self) -> f64 {
        self.pack_ms
    }
}
