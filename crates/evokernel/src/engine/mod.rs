//! The one runtime path: an [`Engine`] turns a [`ConvProblem`] into a [`Plan`] (the
//! kernel instance chosen forced > tuned > ranked, compiled or taken from the CUBIN
//! cache, loaded once) and a plan runs on the caller's memory and stream. The CLI, the
//! tuner and the Python package all run plans built here.
//!
//! ```
//! use evokernel::{Activation, ConvParams, ConvProblem, Engine, Epilogue, HostTensor};
//!
//! let mut params = ConvParams::seed();
//! params.c = 4;
//! params.input = vec![5, 9, 16]; // a small NCDHW volume, kernel 3x5x5, padding (0, 2, 2)
//! let spec = params.validate()?;
//! let problem = ConvProblem::new(spec.clone()).with_epilogue(Epilogue {
//!     bias: true,
//!     activation: Activation::Silu,
//!     residual: false,
//! });
//! let engine = Engine::cpu();
//! let plan = engine.plan(&problem)?;
//! let x = HostTensor::random_normal(spec.dtype(), &spec.input_shape(), 1);
//! let w = HostTensor::random_normal(spec.dtype(), &spec.weight_shape(), 2);
//! let b = HostTensor::random_normal(spec.dtype(), &[spec.c()], 3);
//! let y = plan.run_host(&x, &w, Some(&b), None)?;
//! assert_eq!(y.shape(), &spec.output_shape()[..]);
//! # Ok::<(), evokernel::Error>(())
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use serde::{Deserialize, Serialize};

use crate::cpu::{conv_cpu_fused, FusedEpilogue, Isa};
use crate::cuda::run::repair_specialization;
use crate::cuda::{ConvArgs, CudaContextExt, CudaDevice, EpiArgs, KernelResources, LoadedKernel};
use crate::dispatch::{choose, config_for, Choice, Source};
use crate::epilogue::{check_operand, Epilogue};
use crate::error::{Error, Result};
use crate::spec::ConvSpec;
use crate::tensor::HostTensor;
use crate::tune::{TuneCache, TuneTarget};
use crate::variants::{find, forced_configs, Config, Instance, Launch, Variant};

/// One depthwise convolution forward with its fused epilogue: what a plan computes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvProblem {
    pub spec: ConvSpec,
    #[serde(default)]
    pub epilogue: Epilogue,
}

impl ConvProblem {
    pub fn new(spec: ConvSpec) -> Self {
        ConvProblem {
            spec,
            epilogue: Epilogue::NONE,
        }
    }

    pub fn with_epilogue(self, epilogue: Epilogue) -> Self {
        ConvProblem { epilogue, ..self }
    }

    /// The spec's key plus the epilogue's suffix: what plans and tune entries are keyed by.
    pub fn key(&self) -> String {
        format!("{}{}", self.spec.key(), self.epilogue.key_suffix())
    }

    /// Bytes any implementation must move: the spec's, plus the bias and the residual.
    pub fn min_bytes(&self) -> u64 {
        let e = self.spec.dtype().size_bytes() as u64;
        let mut bytes = self.spec.min_bytes();
        if self.epilogue.bias {
            bytes += self.spec.c() as u64 * e;
        }
        if self.epilogue.residual {
            bytes += self.spec.output_len() as u64 * e;
        }
        bytes
    }

    pub fn flops(&self) -> u64 {
        self.spec.flops()
    }
}

impl From<ConvSpec> for ConvProblem {
    fn from(spec: ConvSpec) -> Self {
        ConvProblem::new(spec)
    }
}

impl std::fmt::Display for ConvProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.spec)?;
        if !self.epilogue.is_none() {
            write!(f, " {}", self.epilogue.key_suffix())?;
        }
        Ok(())
    }
}

enum EngineBackend {
    Cpu(Isa),
    Cuda(Arc<CudaDevice>),
}

/// The entry point: a backend, the configs forced on it, its tune cache, and the plans
/// built so far (by problem key). `Send + Sync`: share one engine between threads.
pub struct Engine {
    backend: EngineBackend,
    /// Bytes a plan may need (`with_memory_budget`); else what is free when planning.
    memory_budget: Option<u64>,
    forced: Vec<Config>,
    tune: TuneCache,
    plans: Mutex<HashMap<String, Arc<Plan>>>,
}

impl Engine {
    /// The CPU backend (AVX-512, AVX2 or portable loops, detected at run time).
    pub fn cpu() -> Self {
        Self::with_backend(EngineBackend::Cpu(Isa::detect()))
    }

    /// GPU `ordinal`; an error says what is missing (driver, GPU, NVRTC).
    pub fn cuda(ordinal: usize) -> Result<Self> {
        Ok(Self::on_device(Arc::new(CudaDevice::open(ordinal)?)))
    }

    /// An engine on an already opened device (the session shares its device this way).
    pub fn on_device(dev: Arc<CudaDevice>) -> Self {
        Self::with_backend(EngineBackend::Cuda(dev))
    }

    /// The first GPU when one works, else the CPU.
    pub fn auto() -> Self {
        match crate::cuda::probe().and_then(|_| Self::cuda(0)) {
            Ok(e) => e,
            Err(_) => Self::cpu(),
        }
    }

    fn with_backend(backend: EngineBackend) -> Self {
        Engine {
            backend,
            memory_budget: None,
            forced: Vec::new(),
            tune: TuneCache::open_default(),
            plans: Mutex::new(HashMap::new()),
        }
    }

    /// Configs or instance names that win over tuning and ranking for their variant
    /// (what `--config` and `EVOKERNEL_CONFIG` give). Clears the plan cache.
    pub fn with_forced(mut self, forced: Vec<Config>) -> Self {
        self.forced = forced;
        self.plans = Mutex::new(HashMap::new());
        self
    }

    /// The forced configs.
    pub fn forced(&self) -> &[Config] {
        &self.forced
    }

    /// Replaces the forced configs; plans built before are dropped.
    pub fn set_forced(&mut self, forced: Vec<Config>) {
        self.forced = forced;
        self.plans = Mutex::new(HashMap::new());
    }

    /// The config variant `v` would run `problem` with here, and where it comes from.
    pub fn config_for(&self, v: &dyn Variant, problem: &ConvProblem) -> (Config, Source) {
        config_for(v, problem, &self.tune_target(), &self.tune, &self.forced)
    }

    /// What this engine's tuned results are for: device, driver and NVRTC version.
    pub fn tune_target(&self) -> TuneTarget {
        match &self.backend {
            EngineBackend::Cuda(dev) => {
                let i = dev.info();
                TuneTarget::new(
                    &i.name,
                    &i.driver_version,
                    i.nvrtc_version.as_deref().unwrap_or("-"),
                )
            }
            EngineBackend::Cpu(isa) => TuneTarget::new(&format!("cpu-{}", isa.name()), "-", "-"),
        }
    }

    /// Caps the memory a plan may need (its tensors, and the CPU's scratch); without a
    /// cap, what the host (CPU) or the device (GPU) has free when the plan is built.
    pub fn with_memory_budget(mut self, bytes: u64) -> Self {
        self.memory_budget = Some(bytes);
        self
    }

    /// `Ok` when `problem`'s tensors (and the CPU backend's scratch) fit the budget:
    /// a plan that can never run is refused when it is built, not when it allocates.
    pub fn check_memory(&self, problem: &ConvProblem) -> Result<()> {
        let tensors = crate::memory::tensor_bytes(problem);
        let (needed, place, free) = match &self.backend {
            EngineBackend::Cpu(_) => (
                tensors + crate::memory::cpu_scratch_bytes(problem, rayon::current_num_threads()),
                "host",
                self.memory_budget.or_else(crate::memory::host_available),
            ),
            EngineBackend::Cuda(dev) => (
                tensors,
                "device",
                match self.memory_budget {
                    Some(b) => Some(b),
                    None => Some(dev.free_memory()?),
                },
            ),
        };
        crate::memory::check(&format!("a plan of {problem}"), place, needed, free)
    }

    /// Forced configs from `EVOKERNEL_CONFIG` (and `flags`), validated.
    pub fn with_forced_from_env(self, flags: &[String]) -> Result<Self> {
        Ok(self.with_forced(forced_configs(flags)?))
    }

    /// Another tune cache than the default file (tests, `tune`).
    pub fn with_tune_cache(mut self, tune: TuneCache) -> Self {
        self.tune = tune;
        self.plans = Mutex::new(HashMap::new());
        self
    }

    /// Re-reads the default tune cache (after tuning) and drops the plans built before.
    pub fn reload_tune_cache(&mut self) {
        self.tune = TuneCache::open(self.tune.path());
        self.plans = Mutex::new(HashMap::new());
    }

    pub fn tune_cache(&self) -> &TuneCache {
        &self.tune
    }

    /// `cpu` or `cuda`.
    pub fn backend_name(&self) -> &'static str {
        match self.backend {
            EngineBackend::Cpu(_) => "cpu",
            EngineBackend::Cuda(_) => "cuda",
        }
    }

    /// The GPU, on the CUDA backend.
    pub fn device(&self) -> Option<&Arc<CudaDevice>> {
        match &self.backend {
            EngineBackend::Cuda(d) => Some(d),
            EngineBackend::Cpu(_) => None,
        }
    }

    /// Plans built so far.
    pub fn cached_plans(&self) -> usize {
        self.plans.lock().map(|p| p.len()).unwrap_or(0)
    }

    /// Which instance would run `problem` here and why (forced > tuned > ranked),
    /// without compiling anything.
    pub fn choose(&self, problem: &ConvProblem) -> Result<Choice> {
        match &self.backend {
            EngineBackend::Cpu(isa) => Ok(Choice {
                variant: format!("cpu-{}", isa.name()),
                config: format!("cpu-{}", isa.name()),
                reason: "the CPU backend".into(),
            }),
            EngineBackend::Cuda(_) => {
                crate::variants::check_forced(&self.forced, &problem.spec)?;
                choose(problem, &self.tune_target(), &self.tune, &self.forced).map_err(|reason| {
                    Error::NotApplicable {
                        variant: "cuda".into(),
                        spec: problem.to_string(),
                        reason,
                    }
                })
            }
        }
    }

    /// The plan for `problem`: built on first use, then taken from the engine's cache.
    pub fn plan(&self, problem: &ConvProblem) -> Result<Arc<Plan>> {
        let key = problem.key();
        if let Some(p) = self.lock_plans()?.get(&key) {
            return Ok(Arc::clone(p));
        }
        // Built outside the lock (compiling takes a while); a racing thread's plan for
        // the same key is equally good, the first one stored wins.
        self.check_memory(problem)?;
        let choice = self.choose(problem)?;
        let plan = Arc::new(self.build(problem, choice)?);
        Ok(Arc::clone(self.lock_plans()?.entry(key).or_insert(plan)))
    }

    /// A plan of one given instance, outside the cache (the measuring CLI's rows and the
    /// tuner's candidates). `config` must be for a variant that applies.
    pub fn plan_instance(&self, problem: &ConvProblem, config: &Config) -> Result<Plan> {
        self.build(
            problem,
            Choice {
                variant: config.variant.clone(),
                config: config.to_string(),
                reason: "given".into(),
            },
        )
    }

    fn lock_plans(&self) -> Result<std::sync::MutexGuard<'_, HashMap<String, Arc<Plan>>>> {
        // A thread that panicked while holding the lock left a map that is still valid.
        Ok(self.plans.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn build(&self, problem: &ConvProblem, choice: Choice) -> Result<Plan> {
        let imp = match &self.backend {
            EngineBackend::Cpu(isa) => PlanImpl::Cpu(*isa),
            EngineBackend::Cuda(dev) => {
                let config: Config = choice.config.parse()?;
                PlanImpl::Cuda(Box::new(CudaPlan::load(dev, problem, &config)?))
            }
        };
        Ok(Plan {
            problem: problem.clone(),
            choice,
            imp,
        })
    }
}

/// A problem bound to one implementation, loaded and ready: run it as often as needed,
/// from any thread. Calls on different streams may overlap, with one caveat for the
/// tensor-core plans (those with a repair launch): they share the plan's flag, so two
/// overlapping calls that both meet NaN/Inf inputs can miss a repair; use one plan per
/// stream there when inputs may be non-finite.
pub struct Plan {
    problem: ConvProblem,
    choice: Choice,
    imp: PlanImpl,
}

enum PlanImpl {
    Cpu(Isa),
    Cuda(Box<CudaPlan>),
}

/// Device pointers of one call, as a foreign framework hands them over (PyTorch's
/// `data_ptr()`): 0 for an absent bias or residual.
#[derive(Clone, Copy, Debug, Default)]
pub struct ConvPointers {
    pub x: u64,
    pub w: u64,
    pub y: u64,
    pub bias: u64,
    pub residual: u64,
}

/// Device buffers of one call (cudarc slices of bytes); sizes are checked.
pub struct ConvBuffers<'a> {
    pub x: &'a CudaSlice<u8>,
    pub w: &'a CudaSlice<u8>,
    pub y: &'a mut CudaSlice<u8>,
    pub bias: Option<&'a CudaSlice<u8>>,
    pub residual: Option<&'a CudaSlice<u8>>,
}

impl Plan {
    pub fn problem(&self) -> &ConvProblem {
        &self.problem
    }

    /// The variant and config that run, and why they were chosen.
    pub fn choice(&self) -> &Choice {
        &self.choice
    }

    /// The kernel instance's canonical name (`cpu-avx512` on the CPU).
    pub fn instance_name(&self) -> String {
        match &self.imp {
            PlanImpl::Cpu(isa) => format!("cpu-{}", isa.name()),
            PlanImpl::Cuda(c) => c.instance.to_string(),
        }
    }

    /// Registers, shared memory and occupancy of the loaded kernel (GPU plans).
    pub fn resources(&self) -> Option<KernelResources> {
        match &self.imp {
            PlanImpl::Cpu(_) => None,
            PlanImpl::Cuda(c) => Some(c.kernel.resources),
        }
    }

    /// The loaded kernel of a GPU plan (for profilers and launch-overhead comparisons).
    pub fn cuda_kernel(&self) -> Option<&LoadedKernel> {
        match &self.imp {
            PlanImpl::Cpu(_) => None,
            PlanImpl::Cuda(c) => Some(&c.kernel),
        }
    }

    /// The argument block the plan's kernel gets for `ptrs` (GPU plans; the repair
    /// flag and epoch are filled per launch).
    pub fn kernel_args(&self, ptrs: &ConvPointers) -> Result<(ConvArgs, EpiArgs)> {
        let args = ConvArgs::new(&self.problem.spec, ptrs.x, ptrs.w, ptrs.y)?;
        let epi = EpiArgs {
            bias: ptrs.bias,
            residual: ptrs.residual,
        };
        Ok((args, epi))
    }

    /// Milliseconds the kernel took to compile or read from the CUBIN cache, and
    /// whether it came from the cache (GPU plans).
    pub fn compile_ms(&self) -> Option<(f64, bool)> {
        match &self.imp {
            PlanImpl::Cpu(_) => None,
            PlanImpl::Cuda(c) => Some((c.kernel.compiled.millis, c.kernel.compiled.cache_hit)),
        }
    }

    /// Runs on host tensors: on the CPU directly, on a GPU through uploads, the device's
    /// stream and a download. For tests and small programs; `run` avoids the copies.
    pub fn run_host(
        &self,
        x: &HostTensor,
        w: &HostTensor,
        bias: Option<&HostTensor>,
        residual: Option<&HostTensor>,
    ) -> Result<HostTensor> {
        let spec = &self.problem.spec;
        let mut y = HostTensor::zeros(spec.dtype(), &spec.output_shape());
        self.run_host_into(x, w, bias, residual, &mut y)?;
        Ok(y)
    }

    /// As [`Plan::run_host`], into an output tensor the caller owns.
    pub fn run_host_into(
        &self,
        x: &HostTensor,
        w: &HostTensor,
        bias: Option<&HostTensor>,
        residual: Option<&HostTensor>,
        y: &mut HostTensor,
    ) -> Result<()> {
        let spec = &self.problem.spec;
        let epi = &self.problem.epilogue;
        x.expect("input", spec.dtype(), spec.input_len())?;
        w.expect("weight", spec.dtype(), spec.weight_len())?;
        y.expect("output", spec.dtype(), spec.output_len())?;
        let bias = check_operand("bias", epi.bias, bias, spec.dtype(), spec.c())?;
        let residual = check_operand(
            "residual",
            epi.residual,
            residual,
            spec.dtype(),
            spec.output_len(),
        )?;
        match &self.imp {
            PlanImpl::Cpu(_) => {
                let fused = FusedEpilogue::new(spec, epi, bias, residual)?;
                conv_cpu_fused(spec, &fused, x, w, y)
            }
            PlanImpl::Cuda(c) => {
                let dev = &c.dev;
                let (dx, dw) = (dev.upload(x)?, dev.upload(w)?);
                let db = bias.map(|b| dev.upload(b)).transpose()?;
                let dr = residual.map(|r| dev.upload(r)).transpose()?;
                let mut dy = dev.alloc(y.size_bytes())?;
                let bufs = ConvBuffers {
                    x: &dx,
                    w: &dw,
                    y: &mut dy,
                    bias: db.as_ref(),
                    residual: dr.as_ref(),
                };
                self.run(bufs, dev.stream())?;
                dev.download(&dy, y)
            }
        }
    }

    /// Runs on device buffers, enqueued on `stream` (asynchronous, like any launch).
    pub fn run(&self, bufs: ConvBuffers<'_>, stream: &Arc<CudaStream>) -> Result<()> {
        let spec = &self.problem.spec;
        let epi = &self.problem.epilogue;
        let e = spec.dtype().size_bytes();
        let need = |what: &'static str, len: usize, elems: usize| -> Result<()> {
            if len < elems * e {
                return Err(Error::TensorMismatch {
                    what,
                    expected: format!("at least {} bytes ({elems} x {})", elems * e, spec.dtype()),
                    got: format!("{len} bytes"),
                });
            }
            Ok(())
        };
        need("input", bufs.x.len(), spec.input_len())?;
        need("weight", bufs.w.len(), spec.weight_len())?;
        need("output", bufs.y.len(), spec.output_len())?;
        let operand = |what: &'static str, wanted: bool, b: Option<&CudaSlice<u8>>, elems| match (
            wanted, b,
        ) {
            (true, Some(b)) => need(what, b.len(), elems).map(|_| b.device_ptr(stream).0),
            (false, None) => Ok(0),
            _ => Err(Error::TensorMismatch {
                what,
                expected: format!(
                    "{} (as the plan's epilogue says)",
                    if wanted { "a buffer" } else { "none" }
                ),
                got: if wanted { "none" } else { "a buffer" }.into(),
            }),
        };
        let ptrs = ConvPointers {
            bias: operand("bias", epi.bias, bufs.bias, spec.c())?,
            residual: operand("residual", epi.residual, bufs.residual, spec.output_len())?,
            x: bufs.x.device_ptr(stream).0,
            w: bufs.w.device_ptr(stream).0,
            y: bufs.y.device_ptr_mut(stream).0,
        };
        // SAFETY: every pointer addresses a live buffer of at least the bytes the spec
        // needs (checked above), and they stay borrowed for the call.
        unsafe { self.run_raw(&ptrs, stream.cu_stream()) }
    }

    /// Runs on raw device pointers and a foreign stream: the path PyTorch's op takes.
    ///
    /// # Safety
    /// Each pointer must address device memory of this plan's context holding the
    /// tensor the spec says (input, weight, output; bias and residual when the epilogue
    /// has them, else 0), valid until the launch completes on `stream`; the output must
    /// not overlap the inputs.
    pub unsafe fn run_raw(&self, ptrs: &ConvPointers, stream: CUstream) -> Result<()> {
        match &self.imp {
            PlanImpl::Cpu(_) => Err(Error::BackendUnavailable {
                backend: "cpu".into(),
                reason: "a CPU plan takes host tensors (run_host), not device pointers".into(),
            }),
            PlanImpl::Cuda(c) => {
                let epi = &self.problem.epilogue;
                if (epi.bias != (ptrs.bias != 0)) || (epi.residual != (ptrs.residual != 0)) {
                    return Err(Error::TensorMismatch {
                        what: "epilogue operands",
                        expected: format!("bias and residual as the plan's epilogue ({epi}) says"),
                        got: format!("bias {:#x}, residual {:#x}", ptrs.bias, ptrs.residual),
                    });
                }
                // The kernels move 16-byte vectors of input, output and residual.
                for (what, p) in [
                    ("input", ptrs.x),
                    ("output", ptrs.y),
                    ("residual", ptrs.residual),
                ] {
                    if p % 16 != 0 {
                        return Err(Error::TensorMismatch {
                            what,
                            expected: "a device address aligned to 16 bytes (a fresh or contiguous copy of the tensor)".into(),
                            got: format!("{p:#x}"),
                        });
                    }
                }
                if ptrs.residual != 0 && ptrs.residual == ptrs.y {
                    return Err(Error::TensorMismatch {
                        what: "residual",
                        expected: "a buffer apart from the output".into(),
                        got: "the output buffer itself".into(),
                    });
                }
                let (args, epi) = self.kernel_args(ptrs)?;
                c.launch(args, &epi, stream)
            }
        }
    }
}

/// A GPU plan: the loaded kernel instance and, for the tensor-core variants, the
/// repair kernel with its flag.
pub(crate) struct CudaPlan {
    dev: Arc<CudaDevice>,
    instance: Instance,
    pub(crate) kernel: LoadedKernel,
    repair: Option<(LoadedKernel, CudaSlice<u8>)>,
    /// A fresh number per launch, so a flag left by an earlier launch means nothing.
    epoch: AtomicU32,
}

impl CudaPlan {
    fn load(dev: &Arc<CudaDevice>, problem: &ConvProblem, config: &Config) -> Result<Self> {
        let spec = &problem.spec;
        let variant = find(&config.variant)?;
        variant
            .applies(spec)
            .map_err(|reason| Error::NotApplicable {
                variant: variant.name().into(),
                spec: spec.to_string(),
                reason,
            })?;
        ConvArgs::new(spec, 0, 0, 0)?;
        let instance = Instance::new(spec, config.clone());
        let expr = variant.specialization(spec, config)?;
        let expr = with_epilogue(&expr, &problem.epilogue);
        let launch = variant.launch(spec, config, dev.info().sms)?;
        let kernel = dev.load(variant.name(), variant.source(), &expr, launch)?;
        let repair = if variant.needs_repair() {
            let (name, source, expr) = repair_specialization(spec);
            let expr = with_epilogue(&expr, &problem.epilogue);
            let planes = (spec.n() * spec.c() * spec.output3()[0]) as u64;
            let launch = Launch {
                // Small: without a flag every block just reads it and leaves.
                grid: (planes.min(dev.info().sms as u64).max(1) as u32, 1, 1),
                block: (256, 1, 1),
                shared_bytes: 0,
            };
            Some((dev.load(name, source, &expr, launch)?, dev.alloc(4)?))
        } else {
            None
        };
        Ok(CudaPlan {
            dev: Arc::clone(dev),
            instance,
            kernel,
            repair,
            epoch: AtomicU32::new(0),
        })
    }

    /// The kernel (and repair) launches of one call on `stream`.
    fn launch(&self, mut args: ConvArgs, epi: &EpiArgs, stream: CUstream) -> Result<()> {
        if let Some((_, flag)) = &self.repair {
            args.flag = self.dev.device_ptr(flag);
            let e = self.epoch.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            args.epoch = e.max(1);
        }
        self.dev.bind().cuda("cuCtxSetCurrent")?;
        // SAFETY: run_raw's caller vouches for the stream and the pointers in `args`;
        // the flag is this plan's own buffer.
        unsafe {
            self.dev.launch_on(&self.kernel, &args, epi, stream)?;
            if let Some((r, _)) = &self.repair {
                self.dev.launch_on(r, &args, epi, stream)?;
            }
        }
        Ok(())
    }
}

/// A kernel's name expression with the epilogue code as its last template argument
/// (every kernel template ends with `int EPI`; kernels/common.cuh, `epilogue`).
pub fn with_epilogue(expr: &str, epilogue: &Epilogue) -> String {
    let body = expr.trim_end().strip_suffix('>').unwrap_or(expr);
    format!("{body}, {}>", epilogue.kernel_code())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::epilogue::Activation;
    use crate::spec::ConvParams;

    fn small() -> ConvSpec {
        let mut p = ConvParams::seed();
        p.c = 3;
        p.input = vec![4, 6, 9];
        p.validate().unwrap()
    }

    #[test]
    fn engine_and_plan_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Engine>();
        check::<Plan>();
    }

    #[test]
    fn plans_are_cached_by_problem_key() {
        let engine = Engine::cpu();
        let p = ConvProblem::new(small());
        let a = engine.plan(&p).unwrap();
        let b = engine.plan(&p).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(engine.cached_plans(), 1);
        let fused = p.clone().with_epilogue(Epilogue {
            bias: true,
            activation: Activation::Relu,
            residual: false,
        });
        let c = engine.plan(&fused).unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(engine.cached_plans(), 2);
        assert_ne!(p.key(), fused.key());
    }

    /// A plan whose tensors exceed the engine's memory budget is refused with both
    /// numbers, before anything is allocated.
    #[test]
    fn plans_past_the_memory_budget_are_refused() {
        let engine = Engine::cpu().with_memory_budget(1 << 20);
        let big = ConvProblem::new(ConvParams::seed().validate().unwrap());
        let err = engine.plan(&big).err().unwrap();
        assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
        assert!(err.to_string().contains("1.0 MiB"), "{err}");
        assert_eq!(engine.cached_plans(), 0);
        assert!(engine.plan(&ConvProblem::new(small())).is_ok());
        // Without a budget: 2^39 elements never fit this machine's memory.
        let mut p = ConvParams::seed();
        p.input = vec![1024, 1024, 1024];
        p.kernel = vec![3, 3, 3];
        p.padding = vec![];
        let huge = ConvProblem::new(p.validate().unwrap());
        assert!(matches!(
            Engine::cpu().plan(&huge),
            Err(Error::OutOfMemory { .. })
        ));
    }

    #[test]
    fn epilogue_expression_appends_the_code() {
        let e = Epilogue {
            bias: true,
            activation: Activation::Silu,
            residual: true,
        };
        assert_eq!(
            with_epilogue("naive_dwconv<float, false, 3, 3, 3>", &e),
            "naive_dwconv<float, false, 3, 3, 3, 14>"
        );
        assert_eq!(with_epilogue("k<1>", &Epilogue::NONE), "k<1, 0>");
    }

    #[test]
    fn operands_must_match_the_epilogue() {
        let spec = small();
        let engine = Engine::cpu();
        let x = HostTensor::random_normal(spec.dtype(), &spec.input_shape(), 1);
        let w = HostTensor::random_normal(spec.dtype(), &spec.weight_shape(), 2);
        let b = HostTensor::random_normal(spec.dtype(), &[spec.c()], 3);
        let plain = engine.plan(&ConvProblem::new(spec.clone())).unwrap();
        let err = plain
            .run_host(&x, &w, Some(&b), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("bias"), "{err}");
        let fused = engine
            .plan(&ConvProblem::new(spec.clone()).with_epilogue(Epilogue {
                bias: true,
                ..Epilogue::NONE
            }))
            .unwrap();
        assert!(fused.run_host(&x, &w, None, None).is_err());
        let short = HostTensor::random_normal(spec.dtype(), &[spec.c() + 1], 3);
        assert!(fused.run_host(&x, &w, Some(&short), None).is_err());
        assert!(fused.run_host(&x, &w, Some(&b), None).is_ok());
        // A CPU plan refuses device pointers instead of dereferencing them.
        // SAFETY: the CPU plan never touches the pointers.
        assert!(unsafe { plain.run_raw(&ConvPointers::default(), std::ptr::null_mut()) }.is_err());
    }
}
