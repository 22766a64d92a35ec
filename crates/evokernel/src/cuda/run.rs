//! Variants as `ConvRun`s: a problem's inputs uploaded once, each kernel with its own
//! outputs, every launch timed by CUDA events.

use cudarc::driver::CudaSlice;

use super::{ConvArgs, CudaDevice, KernelResources, LoadedKernel};
use crate::backend::{ConvRun, Problem};
use crate::error::{Error, Result};
use crate::spec::ConvSpec;
use crate::tensor::HostTensor;
use crate::variants::{Config, Variant};

/// A problem's inputs and weight on the device.
pub struct DeviceProblem<'d> {
    pub dev: &'d CudaDevice,
    pub spec: ConvSpec,
    pub inputs: Vec<CudaSlice<u8>>,
    pub weight: CudaSlice<u8>,
}

impl<'d> DeviceProblem<'d> {
    pub fn upload(dev: &'d CudaDevice, problem: &Problem) -> Result<Self> {
        Ok(DeviceProblem {
            dev,
            spec: problem.spec.clone(),
            inputs: problem
                .inputs
                .iter()
                .map(|t| dev.upload(t))
                .collect::<Result<_>>()?,
            weight: dev.upload(&problem.weight)?,
        })
    }

    pub fn sets(&self) -> usize {
        self.inputs.len()
    }

    /// One output buffer per input set, poisoned.
    pub fn outputs(&self) -> Result<Vec<CudaSlice<u8>>> {
        self.outputs_for(&self.spec)
    }

    /// As `outputs`, sized for the output of `spec` (e.g. cuDNN's symmetric twin).
    pub fn outputs_for(&self, spec: &ConvSpec) -> Result<Vec<CudaSlice<u8>>> {
        let bytes = spec.output_len() * spec.dtype().size_bytes();
        (0..self.sets())
            .map(|_| {
                let mut b = self.dev.alloc(bytes)?;
                self.dev.poison(&mut b)?;
                Ok(b)
            })
            .collect()
    }

    pub fn download_output(&self, buf: &CudaSlice<u8>) -> Result<HostTensor> {
        let mut y = HostTensor::zeros(self.spec.dtype(), &self.spec.output_shape());
        self.dev.download(buf, &mut y)?;
        Ok(y)
    }
}

/// The kernel that recomputes the non-finite outputs a tensor-core kernel flagged
/// (kernels/repair.cu): its name, source and specialization for `spec`.
pub fn repair_specialization(spec: &ConvSpec) -> (&'static str, &'static str, String) {
    let [kd, kh, kw] = spec.kernel3();
    (
        "repair",
        include_str!("../../kernels/repair.cu"),
        format!(
            "repair_dwconv<{}, {}, {kd}, {kh}, {kw}>",
            crate::variants::cuda_type(spec.dtype()),
            spec.layout() == crate::spec::Layout::ChannelsLast
        ),
    )
}

/// One variant at one config, compiled, loaded and bound to a problem.
pub struct KernelRun<'p, 'd> {
    problem: &'p DeviceProblem<'d>,
    config: Config,
    kernel: LoadedKernel,
    /// repair.cu after the kernel, with the flag it reads, for variants that need it.
    repair: Option<(LoadedKernel, CudaSlice<u8>)>,
    epoch: u32,
    outputs: Vec<CudaSlice<u8>>,
    args: Vec<ConvArgs>,
}

impl<'p, 'd> KernelRun<'p, 'd> {
    pub fn new(
        problem: &'p DeviceProblem<'d>,
        variant: &dyn Variant,
        config: &Config,
    ) -> Result<Self> {
        let spec = &problem.spec;
        variant
            .applies(spec)
            .map_err(|reason| Error::NotApplicable {
                variant: variant.name().into(),
                spec: spec.to_string(),
                reason,
            })?;
        let dev = problem.dev;
        let expr = variant.specialization(spec, config)?;
        let launch = variant.launch(spec, config, dev.info().sms)?;
        let kernel = dev.load(variant.name(), variant.source(), &expr, launch)?;
        let outputs = problem.outputs()?;
        let repair = if variant.needs_repair() {
            let (name, source, expr) = repair_specialization(spec);
            let planes = (spec.n() * spec.c() * spec.output3()[0]) as u64;
            let launch = crate::variants::Launch {
                // Small: without a flag every block just reads it and leaves.
                grid: (planes.min(dev.info().sms as u64).max(1) as u32, 1, 1),
                block: (256, 1, 1),
                shared_bytes: 0,
            };
            Some((dev.load(name, source, &expr, launch)?, dev.alloc(4)?))
        } else {
            None
        };
        let flag = repair.as_ref().map_or(0, |(_, f)| dev.device_ptr(f));
        let w = dev.device_ptr(&problem.weight);
        let args = problem
            .inputs
            .iter()
            .zip(&outputs)
            .map(|(x, y)| {
                let mut a = ConvArgs::new(spec, dev.device_ptr(x), w, dev.device_ptr(y))?;
                a.flag = flag;
                Ok(a)
            })
            .collect::<Result<_>>()?;
        Ok(KernelRun {
            problem,
            config: config.clone(),
            kernel,
            repair,
            epoch: 0,
            outputs,
            args,
        })
    }

    pub fn resources(&self) -> KernelResources {
        self.kernel.resources
    }
    pub fn compile_ms(&self) -> (f64, bool) {
        (self.kernel.compiled.millis, self.kernel.compiled.cache_hit)
    }
}

impl ConvRun for KernelRun<'_, '_> {
    fn name(&self) -> String {
        self.config.variant.clone()
    }
    /// Times the kernel and, for tensor-core variants, the repair launch after it (a few
    /// microseconds when nothing was flagged).
    fn launch(&mut self, set: usize) -> Result<f64> {
        let dev = self.problem.dev;
        // A fresh number per launch, so a flag left by an earlier launch means nothing.
        self.epoch = self.epoch.wrapping_add(1).max(1);
        self.args[set].epoch = self.epoch;
        let (kernel, args, repair) = (&self.kernel, &self.args[set], &self.repair);
        dev.time(|| {
            dev.launch(kernel, args)?;
            if let Some((r, _)) = repair {
                dev.launch(r, args)?;
            }
            Ok(())
        })
    }
    fn poison(&mut self, set: usize) -> Result<()> {
        self.problem.dev.poison(&mut self.outputs[set])
    }
    fn output(&mut self, set: usize) -> Result<HostTensor> {
        self.problem.download_output(&self.outputs[set])
    }
}
