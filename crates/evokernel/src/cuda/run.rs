//! Variants as `ConvRun`s: a problem's inputs uploaded once, each kernel with its own
//! outputs, every launch timed by CUDA events.

use cudarc::driver::CudaSlice;

use super::{CudaDevice, KernelResources};
use crate::backend::{ConvRun, ProblemData};
use crate::engine::{ConvPointers, ConvProblem, Engine, Plan};
use crate::error::Result;
use crate::pass::Pass;
use crate::spec::ConvSpec;
use crate::tensor::HostTensor;
use crate::variants::Config;

/// A problem's inputs, weight and epilogue operands on the device.
pub struct DeviceProblem<'d> {
    pub dev: &'d CudaDevice,
    pub spec: ConvSpec,
    pub problem: ConvProblem,
    pub inputs: Vec<CudaSlice<u8>>,
    pub weight: CudaSlice<u8>,
    pub bias: Option<CudaSlice<u8>>,
    pub residuals: Vec<CudaSlice<u8>>,
    /// grad_output per input set (the backward passes).
    pub grad_outputs: Vec<CudaSlice<u8>>,
    /// Elements of what a run writes (ProblemData::result_shape).
    pub result_shape: Vec<usize>,
}

impl<'d> DeviceProblem<'d> {
    pub fn upload(dev: &'d CudaDevice, problem: &ProblemData) -> Result<Self> {
        let all = |ts: &[HostTensor]| ts.iter().map(|t| dev.upload(t)).collect::<Result<_>>();
        Ok(DeviceProblem {
            dev,
            spec: problem.spec.clone(),
            problem: problem.problem(),
            inputs: all(&problem.inputs)?,
            weight: dev.upload(&problem.weight)?,
            bias: problem.bias.as_ref().map(|b| dev.upload(b)).transpose()?,
            residuals: all(&problem.residuals)?,
            grad_outputs: all(&problem.grad_outputs)?,
            result_shape: problem.result_shape(),
        })
    }

    pub fn sets(&self) -> usize {
        self.inputs.len()
    }

    /// One output buffer per input set, poisoned.
    pub fn outputs(&self) -> Result<Vec<CudaSlice<u8>>> {
        let elems: usize = self.result_shape.iter().product();
        self.buffers(elems * self.spec.dtype().size_bytes())
    }

    /// As `outputs`, sized for the output of `spec` (e.g. cuDNN's symmetric twin).
    pub fn outputs_for(&self, spec: &ConvSpec) -> Result<Vec<CudaSlice<u8>>> {
        self.buffers(spec.output_len() * spec.dtype().size_bytes())
    }

    fn buffers(&self, bytes: usize) -> Result<Vec<CudaSlice<u8>>> {
        (0..self.sets())
            .map(|_| {
                let mut b = self.dev.alloc(bytes)?;
                self.dev.poison(&mut b)?;
                Ok(b)
            })
            .collect()
    }

    pub fn download_output(&self, buf: &CudaSlice<u8>) -> Result<HostTensor> {
        let mut y = HostTensor::zeros(self.spec.dtype(), &self.result_shape);
        self.dev.download(buf, &mut y)?;
        Ok(y)
    }
}

/// The weight-flip kernel of grad-input through the forward kernels: name, source and
/// name expression (without the epilogue code).
pub fn flip_specialization(spec: &ConvSpec) -> (&'static str, &'static str, String) {
    (
        "flip_weight",
        include_str!("../../kernels/flip_weight.cu"),
        format!(
            "flip_weight_dwconv<{}, {}>",
            crate::variants::cuda_type(spec.dtype()),
            spec.taps()
        ),
    )
}

/// The copy of `chunk` channels of a channels-last tensor of `spec` (its input, or with
/// `output_shaped` its grad-output) into channels-first order (kernels/to_channels_first.cu):
/// name, source and name expression (without the epilogue code), and its launch.
pub fn to_channels_first_specialization(
    spec: &ConvSpec,
    chunk: usize,
    output_shaped: bool,
    sms: u32,
) -> (&'static str, &'static str, String, crate::variants::Launch) {
    // The kernel's channel tile: the largest of 64, 32, 16, 8 dividing the chunk (64 with
    // a ragged last tile otherwise).
    let tc = [64, 32, 16, 8]
        .into_iter()
        .find(|t| chunk.is_multiple_of(*t))
        .unwrap_or(64);
    let positions: usize = if output_shaped {
        spec.output3().iter().product()
    } else {
        spec.input3().iter().product()
    };
    let tiles = (spec.n() * positions.div_ceil(64)) as u64;
    let launch = crate::variants::Launch {
        // Tiles of a chunk are few per channel tile; a few blocks an SM hide the loads.
        grid: (
            tiles.min(sms as u64 * 8).max(1) as u32,
            chunk.div_ceil(tc) as u32,
            1,
        ),
        block: (256, 1, 1),
        shared_bytes: 0,
    };
    (
        "to_channels_first",
        include_str!("../../kernels/to_channels_first.cu"),
        format!(
            "to_channels_first<{}, {chunk}, {tc}, {output_shaped}>",
            crate::variants::cuda_type(spec.dtype())
        ),
        launch,
    )
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

/// One kernel instance, planned by the engine for a problem and bound to its device data.
pub struct KernelRun<'p, 'd> {
    problem: &'p DeviceProblem<'d>,
    plan: Plan,
    outputs: Vec<CudaSlice<u8>>,
    ptrs: Vec<ConvPointers>,
    /// The plan's scratch, allocated once so launches time the kernels alone.
    _workspace: Option<CudaSlice<u8>>,
}

impl<'p, 'd> KernelRun<'p, 'd> {
    /// `engine` must run on the problem's device.
    pub fn new(problem: &'p DeviceProblem<'d>, engine: &Engine, config: &Config) -> Result<Self> {
        let plan = engine.plan_instance(&problem.problem, config)?;
        Self::with_plan(problem, plan)
    }

    pub fn with_plan(problem: &'p DeviceProblem<'d>, plan: Plan) -> Result<Self> {
        let dev = problem.dev;
        let outputs = problem.outputs()?;
        let w = dev.device_ptr(&problem.weight);
        let bias = problem.bias.as_ref().map_or(0, |b| dev.device_ptr(b));
        let spec = &problem.spec;
        let workspace = match plan.workspace_bytes() {
            0 => None,
            bytes => Some(dev.alloc(bytes)?),
        };
        let ws = workspace.as_ref().map_or(0, |b| dev.device_ptr(b));
        let e = spec.dtype().size_bytes() as u64;
        let ptrs = (0..problem.sets())
            .map(|i| {
                let out = dev.device_ptr(&outputs[i]);
                let x = dev.device_ptr(&problem.inputs[i]);
                let gy = problem.grad_outputs.get(i).map_or(0, |g| dev.device_ptr(g));
                match problem.problem.pass {
                    Pass::Forward => ConvPointers {
                        x,
                        w,
                        y: out,
                        bias,
                        residual: problem.residuals.get(i).map_or(0, |r| dev.device_ptr(r)),
                        workspace: ws,
                        ..ConvPointers::default()
                    },
                    Pass::Dgrad => ConvPointers {
                        grad_output: gy,
                        w,
                        grad_input: out,
                        workspace: ws,
                        ..ConvPointers::default()
                    },
                    // grad_bias follows grad_weight in the one result buffer.
                    Pass::Wgrad => ConvPointers {
                        x,
                        grad_output: gy,
                        grad_weight: out,
                        grad_bias: if problem.problem.epilogue.bias {
                            out + spec.weight_len() as u64 * e
                        } else {
                            0
                        },
                        workspace: ws,
                        ..ConvPointers::default()
                    },
                }
            })
            .collect();
        Ok(KernelRun {
            problem,
            plan,
            outputs,
            ptrs,
            _workspace: workspace,
        })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }
    pub fn resources(&self) -> Option<KernelResources> {
        self.plan.resources()
    }
    pub fn compile_ms(&self) -> (f64, bool) {
        self.plan.compile_ms().unwrap_or((0.0, false))
    }
}

impl ConvRun for KernelRun<'_, '_> {
    fn name(&self) -> String {
        self.plan.choice().variant.clone()
    }
    /// Times the plan's launches: the kernel and, for tensor-core variants, the repair
    /// launch after it (a few microseconds when nothing was flagged).
    fn launch(&mut self, set: usize) -> Result<f64> {
        let dev = self.problem.dev;
        let (plan, ptrs) = (&self.plan, &self.ptrs[set]);
        // SAFETY: the pointers address this problem's live buffers, sized for its spec.
        dev.time(|| unsafe { plan.run_raw(ptrs, dev.stream().cu_stream()) })
    }
    fn poison(&mut self, set: usize) -> Result<()> {
        self.problem.dev.poison(&mut self.outputs[set])
    }
    fn output(&mut self, set: usize) -> Result<HostTensor> {
        self.problem.download_output(&self.outputs[set])
    }
}
