//! The device's own ceilings, measured once per run (MEASURE.md): device-to-device copy
//! bandwidth, FP32 FMA rate and bf16 tensor-core (mma.sync) rate.

use cudarc::driver::DeviceRepr;

use super::{CudaContextExt, CudaDevice};
use crate::bench::Ceilings;
use crate::error::Result;
use crate::variants::Launch;

const SOURCE: &str = include_str!("../../kernels/calibrate.cu");
const ITERS: usize = 4096;

#[repr(C)]
#[derive(Clone, Copy)]
struct CalArgs {
    out: u64,
    seed: u32,
}
// SAFETY: plain old data matching `struct CalArgs` in calibrate.cu.
unsafe impl DeviceRepr for CalArgs {}

/// The specializations calibration compiles (also compiled by the CI kernel test).
pub fn specializations() -> Vec<(&'static str, &'static str, String)> {
    vec![
        ("calibrate", SOURCE, format!("fma_rate<{ITERS}>")),
        ("calibrate", SOURCE, format!("mma_rate<{ITERS}>")),
    ]
}

/// Best of five: a ceiling is the most the device was seen to do.
fn best(dev: &CudaDevice, mut once: impl FnMut() -> Result<()>) -> Result<f64> {
    once()?; // warm-up
    let mut ms = f64::MAX;
    for _ in 0..5 {
        ms = ms.min(dev.time(&mut once)?);
    }
    Ok(ms)
}

pub fn calibrate(dev: &CudaDevice) -> Result<Ceilings> {
    let bytes = 1usize << 30;
    let src = dev.alloc(bytes)?;
    let dst = dev.alloc(bytes)?;
    let (s, d) = (dev.device_ptr(&src), dev.device_ptr(&dst));
    let copy_ms = best(dev, || {
        // SAFETY: both buffers hold `bytes` bytes.
        unsafe { cudarc::driver::result::memcpy_dtod_async(d, s, bytes, dev.stream().cu_stream()) }
            .cuda("cuMemcpyDtoDAsync")
    })?;

    let sms = dev.info().sms;
    let launch = Launch {
        grid: (sms * 8, 1, 1),
        block: (256, 1, 1),
        shared_bytes: 0,
    };
    let threads = (launch.grid.0 * launch.block.0) as usize;
    let out = dev.alloc(threads * 4)?;
    let args = CalArgs {
        out: dev.device_ptr(&out),
        seed: 7,
    };
    let specs = specializations();
    let fma = dev.load(specs[0].0, specs[0].1, &specs[0].2, launch)?;
    let fma_ms = best(dev, || dev.launch(&fma, &args))?;
    let mma = dev.load(specs[1].0, specs[1].1, &specs[1].2, launch)?;
    let mma_ms = best(dev, || dev.launch(&mma, &args))?;
    let chains = 8.0;
    let fma_flops = 2.0 * threads as f64 * ITERS as f64 * chains;
    let warps = threads as f64 / 32.0;
    let mma_flops = warps * ITERS as f64 * chains * (2.0 * 16.0 * 8.0 * 16.0);
    Ok(Ceilings {
        copy_gbps: 2.0 * bytes as f64 / (copy_ms * 1e6),
        fma_gflops: fma_flops / (fma_ms * 1e6),
        tensor_gflops: Some(mma_flops / (mma_ms * 1e6)),
    })
}
