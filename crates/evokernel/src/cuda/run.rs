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

/// One variant at one config, compiled, loaded and bound to a problem.
pub struct KernelRun<'p, 'd> {
    problem: &'p DeviceProblem<'d>,
    config: Config,
    kernel: LoadedKernel,
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
        let w = dev.device_ptr(&problem.weight);
        let args = problem
            .inputs
            .iter()
            .zip(&outputs)
            .map(|(x, y)| ConvArgs::new(spec, dev.device_ptr(x), w, dev.device_ptr(y)))
            .collect::<Result<_>>()?;
        Ok(KernelRun {
            problem,
            config: config.clone(),
            kernel,
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
    fn launch(&mut self, set: usize) -> Result<f64> {
        let dev = self.problem.dev;
        let (kernel, args) = (&self.kernel, &self.args[set]);
        dev.time(|| dev.launch(kernel, args))
    }
    fn poison(&mut self, set: usize) -> Result<()> {
        self.problem.dev.poison(&mut self.outputs[set])
    }
    fn output(&mut self, set: usize) -> Result<HostTensor> {
        self.problem.download_output(&self.outputs[set])
    }
}
