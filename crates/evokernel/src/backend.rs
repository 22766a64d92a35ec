//! Backends and the one interface every implementation of a spec offers to the
//! measurement code: launch on an input set, read the output back, poison it.

use std::str::FromStr;

use serde::Serialize;

use crate::engine::{ConvProblem, Plan};
use crate::epilogue::Epilogue;
use crate::error::{Error, Result};
use crate::pass::Pass;
use crate::spec::ConvSpec;
use crate::tensor::HostTensor;

/// Which backend the user asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// The GPU when there is one, else the CPU.
    Auto,
    Cpu,
    Cuda,
    /// The Vulkan backend: the dense/grouped convolution and the depthwise shaders
    /// (`bench --op dense-conv`), verified by the Vulkan tests, measured on the H100's
    /// driver (docs/perf.md).
    Vulkan,
}

impl FromStr for BackendChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(BackendChoice::Auto),
            "cpu" => Ok(BackendChoice::Cpu),
            "cuda" | "gpu" => Ok(BackendChoice::Cuda),
            "vulkan" | "vk" => Ok(BackendChoice::Vulkan),
            _ => Err(Error::parse(
                "backend",
                s,
                "expected auto, cpu, cuda or vulkan",
            )),
        }
    }
}

/// The inputs of one problem: `sets` input tensors (rotated while timing so that a
/// small problem is not measured out of cache), the weight, and the epilogue's bias
/// and residuals (one per set). Set 0 is the one verified against the oracle.
#[derive(Clone, Debug)]
pub struct ProblemData {
    pub spec: ConvSpec,
    pub epilogue: Epilogue,
    pub seed: u64,
    pub inputs: Vec<HostTensor>,
    pub weight: HostTensor,
    pub bias: Option<HostTensor>,
    /// One per input set when the epilogue adds a residual, else empty.
    pub residuals: Vec<HostTensor>,
    /// The pass; the backward passes read `grad_outputs` (one per input set).
    pub pass: Pass,
    pub grad_outputs: Vec<HostTensor>,
}

impl ProblemData {
    /// Fresh standard-normal inputs and weights for the plain convolution.
    pub fn random(spec: &ConvSpec, seed: u64, sets: usize) -> Self {
        Self::random_fused(&ConvProblem::new(spec.clone()), seed, sets)
    }

    /// The problem with what its epilogue needs; the bias and residuals are normal too.
    pub fn random_fused(problem: &ConvProblem, seed: u64, sets: usize) -> Self {
        let spec = &problem.spec;
        let epilogue = problem.epilogue;
        let forward = problem.pass == Pass::Forward;
        let inputs = (0..sets.max(1))
            .map(|i| {
                HostTensor::random_normal(
                    spec.dtype(),
                    &spec.input_shape(),
                    seed.wrapping_add(i as u64),
                )
            })
            .collect();
        let weight = HostTensor::random_normal(
            spec.dtype(),
            &spec.weight_shape(),
            seed ^ 0x5eed_0f3e_1647_5100,
        );
        let bias = (forward && epilogue.bias)
            .then(|| HostTensor::random_normal(spec.dtype(), &[spec.c()], seed ^ 0xb1a5));
        let grad_outputs = if forward {
            Vec::new()
        } else {
            (0..sets.max(1))
                .map(|i| {
                    HostTensor::random_normal(
                        spec.dtype(),
                        &spec.output_shape(),
                        (seed ^ 0x96ad_0f7e).wrapping_add(i as u64),
                    )
                })
                .collect()
        };
        let residuals = if epilogue.residual {
            (0..sets.max(1))
                .map(|i| {
                    HostTensor::random_normal(
                        spec.dtype(),
                        &spec.output_shape(),
                        (seed ^ 0x7e51_d0a1).wrapping_add(i as u64),
                    )
                })
                .collect()
        } else {
            Vec::new()
        };
        ProblemData {
            spec: spec.clone(),
            epilogue,
            seed,
            inputs,
            weight,
            bias,
            residuals,
            pass: problem.pass,
            grad_outputs,
        }
    }

    /// The shape of what a run of this problem writes: the output, grad_input, or
    /// grad_weight (followed by grad_bias when the epilogue has a bias, flattened).
    pub fn result_shape(&self) -> Vec<usize> {
        let spec = &self.spec;
        match self.pass {
            Pass::Forward => spec.output_shape(),
            Pass::Dgrad => spec.input_shape(),
            Pass::Wgrad if self.epilogue.bias => vec![spec.weight_len() + spec.c()],
            Pass::Wgrad => spec.weight_shape(),
        }
    }

    /// The problem this data is for.
    pub fn problem(&self) -> ConvProblem {
        ConvProblem::new(self.spec.clone())
            .with_epilogue(self.epilogue)
            .with_pass(self.pass)
    }

    /// The residual of input set `set`, when the epilogue has one.
    pub fn residual(&self, set: usize) -> Option<&HostTensor> {
        self.residuals.get(set)
    }

    pub fn sets(&self) -> usize {
        self.inputs.len()
    }

    /// Puts a NaN, a +Inf and a -Inf at seeded positions of every input set. Edge
    /// tests: like PyTorch, exactly the outputs whose window covers one must be
    /// non-finite (the oracle says which and of what kind).
    pub fn inject_non_finite(&mut self, seed: u64) {
        let mut rng = crate::tensor::SplitMix64::new(seed);
        for x in self.inputs.iter_mut().chain(self.grad_outputs.iter_mut()) {
            for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
                let i = (rng.next_u64() % x.len() as u64) as usize;
                x.set_f64(i, v);
            }
        }
    }
}

/// Input sets to rotate among: enough that input + output of all sets exceed twice the
/// cache, so each launch reads from memory as it would in a network (MEASURE.md).
pub fn rotation_sets(problem: &ConvProblem, cache_bytes: u64) -> usize {
    let working = problem.min_bytes().max(1);
    if working >= 2 * cache_bytes {
        1
    } else {
        ((2 * cache_bytes).div_ceil(working) as usize + 1).min(64)
    }
}

/// One implementation of a spec, inputs already where it runs.
pub trait ConvRun {
    /// Row name in reports, e.g. `cpu`, `naive`, `cudnn`.
    fn name(&self) -> String;
    /// Runs once on input set `set`; returns the elapsed milliseconds of that launch
    /// (wall clock on the CPU, CUDA events on a GPU).
    fn launch(&mut self, set: usize) -> Result<f64>;
    /// Fills the output of set `set` with NaN, so unwritten elements fail verification.
    fn poison(&mut self, set: usize) -> Result<()>;
    /// Copies the output of set `set` to the host.
    fn output(&mut self, set: usize) -> Result<HostTensor>;
}

/// A CPU engine's plan on a problem's host data.
pub struct CpuRun<'a> {
    problem: &'a ProblemData,
    plan: std::sync::Arc<Plan>,
    outputs: Vec<HostTensor>,
}

impl<'a> CpuRun<'a> {
    pub fn new(problem: &'a ProblemData, plan: std::sync::Arc<Plan>) -> Self {
        let outputs = (0..problem.sets())
            .map(|_| HostTensor::nan(problem.spec.dtype(), &problem.result_shape()))
            .collect();
        CpuRun {
            problem,
            plan,
            outputs,
        }
    }
}

impl ConvRun for CpuRun<'_> {
    fn name(&self) -> String {
        self.plan.instance_name()
    }
    fn launch(&mut self, set: usize) -> Result<f64> {
        let p = self.problem;
        let t = std::time::Instant::now();
        let out = &mut self.outputs[set];
        match p.pass {
            Pass::Forward => self.plan.run_host_into(
                &p.inputs[set],
                &p.weight,
                p.bias.as_ref(),
                p.residual(set),
                out,
            )?,
            Pass::Dgrad => self
                .plan
                .dgrad_host_into(&p.grad_outputs[set], &p.weight, out)?,
            Pass::Wgrad => {
                let (gw, gb) = self.plan.wgrad_host(&p.inputs[set], &p.grad_outputs[set])?;
                let elapsed = t.elapsed().as_secs_f64() * 1e3;
                *out = join_grads(&gw, gb.as_ref());
                return Ok(elapsed);
            }
        }
        Ok(t.elapsed().as_secs_f64() * 1e3)
    }
    fn poison(&mut self, set: usize) -> Result<()> {
        self.outputs[set].poison();
        Ok(())
    }
    fn output(&mut self, set: usize) -> Result<HostTensor> {
        Ok(self.outputs[set].clone())
    }
}

/// grad_weight followed by grad_bias, flattened: what a wgrad run's result compares as.
pub fn join_grads(gw: &HostTensor, gb: Option<&HostTensor>) -> HostTensor {
    let Some(gb) = gb else {
        return gw.clone();
    };
    let mut out = HostTensor::zeros(gw.dtype(), &[gw.len() + gb.len()]);
    for i in 0..gw.len() {
        out.set_f64(i, gw.get_f64(i));
    }
    for i in 0..gb.len() {
        out.set_f64(gw.len() + i, gb.get_f64(i));
    }
    out
}
