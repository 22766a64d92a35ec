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

mod cuda_plan;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUstream;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use serde::{Deserialize, Serialize};

use crate::cpu::{conv_cpu_fused, FusedEpilogue, Isa};
use crate::cuda::{ConvArgs, CudaDevice, EpiArgs, KernelResources, LoadedKernel};
use crate::dispatch::{choose, config_for, Choice, Source};
use crate::epilogue::{check_operand, Epilogue};
use crate::error::{Error, Result};
use crate::pass::Pass;
use crate::spec::{ConvSpec, DType};
use crate::tensor::HostTensor;
use crate::tune::{TuneCache, TuneTarget};
use crate::variants::{forced_configs, Config, Variant};
use cuda_plan::CudaPlan;

/// One pass of a depthwise convolution: what a plan computes. The forward may fuse an
/// epilogue; grad-input has none; grad-weight's epilogue may only name a bias, meaning
/// grad-bias is computed too (the caller applies the activation's derivative to
/// grad_output first).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ConvProblem {
    pub spec: ConvSpec,
    #[serde(default)]
    pub epilogue: Epilogue,
    #[serde(default)]
    pub pass: Pass,
}

impl ConvProblem {
    pub fn new(spec: ConvSpec) -> Self {
        ConvProblem {
            spec,
            epilogue: Epilogue::NONE,
            pass: Pass::Forward,
        }
    }

    /// The same spec and epilogue, another pass.
    pub fn with_pass(self, pass: Pass) -> Self {
        ConvProblem { pass, ..self }
    }

    /// `Err` when the epilogue does not fit the pass: grad-input fuses nothing, and
    /// grad-weight only a bias (whose gradient it computes).
    pub fn check(&self) -> Result<()> {
        if self.pass.epilogue(self.epilogue) == self.epilogue {
            return Ok(());
        }
        Err(Error::parse(
            "problem",
            &self.to_string(),
            match self.pass {
                Pass::Dgrad => "grad-input takes no epilogue (apply the activation's derivative to grad_output first)",
                _ => "grad-weight's epilogue may only name a bias (its gradient is computed too); apply the activation's derivative to grad_output first",
            },
        ))
    }

    pub fn with_epilogue(self, epilogue: Epilogue) -> Self {
        ConvProblem { epilogue, ..self }
    }

    /// The spec's key plus the epilogue's suffix: what plans and tune entries are keyed by.
    pub fn key(&self) -> String {
        format!(
            "{}{}{}",
            self.spec.key(),
            self.pass.key_suffix(),
            self.epilogue.key_suffix()
        )
    }

    /// Bytes any implementation must move: the spec's, plus the bias and the residual.
    pub fn min_bytes(&self) -> u64 {
        let e = self.spec.dtype().size_bytes() as u64;
        // Every pass touches each of the three tensors once.
        let mut bytes = self.spec.min_bytes();
        if self.epilogue.bias {
            bytes += self.spec.c() as u64 * e;
        }
        if self.epilogue.residual {
            bytes += self.spec.output_len() as u64 * e;
        }
        bytes
    }

    /// Each pass does the forward's multiply-adds (grad-input sums w * gy, grad-weight
    /// x * gy, over the same (output, tap) pairs).
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
        if self.pass != Pass::Forward {
            write!(f, " {}", self.pass)?;
        }
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
        problem.check()?;
        self.check_memory(problem)?;
        let choice = self.choose(problem)?;
        let plan = Arc::new(self.build(problem, choice)?);
        Ok(Arc::clone(self.lock_plans()?.entry(key).or_insert(plan)))
    }

    /// Compiles (or finds in the CUBIN cache) every kernel the plans of `items` would
    /// load, on all cores, so building the plans afterwards only loads modules. A GPU
    /// engine only; errors of single items are left for their plans to report.
    pub fn precompile(&self, items: &[(ConvProblem, Config)]) {
        use rayon::prelude::*;
        let EngineBackend::Cuda(dev) = &self.backend else {
            return;
        };
        let sms = dev.info().sms;
        let mut work: Vec<(&'static str, &'static str, String)> = items
            .iter()
            .filter_map(|(p, c)| CudaPlan::kernels(p, c, sms, &|| self.copy_bytes(p)).ok())
            .flatten()
            .map(|(n, s, e, _)| (n, s, e))
            .collect();
        work.sort();
        work.dedup();
        work.par_iter().for_each(|(n, s, e)| {
            let _ = dev.jit().compile(n, s, e);
        });
    }

    /// A plan of one given instance, outside the cache (the measuring CLI's rows and the
    /// tuner's candidates). `config` must be for a variant that applies.
    pub fn plan_instance(&self, problem: &ConvProblem, config: &Config) -> Result<Plan> {
        problem.check()?;
        self.build(
            problem,
            Choice {
                variant: config.variant.clone(),
                config: config.to_string(),
                reason: "given".into(),
            },
        )
    }

    /// The most bytes of channels-first copies a plan of `problem` may hold (asked only
    /// for channels-last grad-weight on a channels-first kernel): `cuda_plan::COPY_BYTES`,
    /// or half of what the memory budget leaves past the problem's tensors, or half the
    /// free device memory, where that is less. Copies are made a chunk of channels at a
    /// time.
    fn copy_bytes(&self, problem: &ConvProblem) -> usize {
        let EngineBackend::Cuda(dev) = &self.backend else {
            return cuda_plan::COPY_BYTES;
        };
        let room = match self.memory_budget {
            Some(b) => Some(b.saturating_sub(crate::memory::tensor_bytes(problem))),
            None => dev.free_memory().ok(),
        };
        room.map_or(cuda_plan::COPY_BYTES, |r| {
            ((r / 2) as usize).min(cuda_plan::COPY_BYTES)
        })
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
                PlanImpl::Cuda(Box::new(CudaPlan::load(dev, problem, &config, &|| {
                    self.copy_bytes(problem)
                })?))
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
/// `data_ptr()`); 0 for an operand the plan's pass does not take. The forward takes x,
/// w, y (and bias, residual as its epilogue says); grad-input grad_output, w and
/// grad_input; grad-weight x, grad_output, grad_weight (and grad_bias when the
/// problem's epilogue has a bias). `workspace`: `Plan::workspace_bytes` of device
/// scratch, or 0 to have the plan allocate it on the call's stream.
#[derive(Clone, Copy, Debug, Default)]
pub struct ConvPointers {
    pub x: u64,
    pub w: u64,
    pub y: u64,
    pub bias: u64,
    pub residual: u64,
    pub grad_output: u64,
    pub grad_input: u64,
    pub grad_weight: u64,
    pub grad_bias: u64,
    pub workspace: u64,
}

impl ConvPointers {
    /// `(name, pointer, wanted)` for every operand: wanted ones must be set, the
    /// others 0.
    fn operands(&self, problem: &ConvProblem) -> [(&'static str, u64, bool); 9] {
        let (f, d, g) = (
            problem.pass == Pass::Forward,
            problem.pass == Pass::Dgrad,
            problem.pass == Pass::Wgrad,
        );
        let e = &problem.epilogue;
        [
            ("input", self.x, f || g),
            ("weight", self.w, f || d),
            ("output", self.y, f),
            ("bias", self.bias, f && e.bias),
            ("residual", self.residual, f && e.residual),
            ("grad_output", self.grad_output, d || g),
            ("grad_input", self.grad_input, d),
            ("grad_weight", self.grad_weight, g),
            ("grad_bias", self.grad_bias, g && e.bias),
        ]
    }
}

/// Device buffers of one call (cudarc slices of bytes); sizes are checked.
pub struct ConvBuffers<'a> {
    pub x: &'a CudaSlice<u8>,
    pub w: &'a CudaSlice<u8>,
    pub y: &'a mut CudaSlice<u8>,
    pub bias: Option<&'a CudaSlice<u8>>,
    pub residual: Option<&'a CudaSlice<u8>>,
}

/// Device buffers of one grad-input call ([`Plan::dgrad`]); sizes are checked. Without
/// a `workspace` (at least [`Plan::workspace_bytes`]) the plan allocates its scratch
/// on the stream.
pub struct DgradBuffers<'a> {
    pub grad_output: &'a CudaSlice<u8>,
    pub w: &'a CudaSlice<u8>,
    pub grad_input: &'a mut CudaSlice<u8>,
    pub workspace: Option<&'a mut CudaSlice<u8>>,
}

/// Device buffers of one grad-weight call ([`Plan::wgrad`]): `grad_bias` exactly when
/// the plan's problem has a bias; the workspace as for [`DgradBuffers`].
pub struct WgradBuffers<'a> {
    pub x: &'a CudaSlice<u8>,
    pub grad_output: &'a CudaSlice<u8>,
    pub grad_weight: &'a mut CudaSlice<u8>,
    pub grad_bias: Option<&'a mut CudaSlice<u8>>,
    pub workspace: Option<&'a mut CudaSlice<u8>>,
}

/// `Err` unless a buffer of `len` bytes holds `elems` elements of `dtype`.
fn need_bytes(what: &'static str, len: usize, elems: usize, dtype: DType) -> Result<()> {
    let want = elems * dtype.size_bytes();
    if len < want {
        return Err(Error::TensorMismatch {
            what,
            expected: format!("at least {want} bytes ({elems} x {dtype})"),
            got: format!("{len} bytes"),
        });
    }
    Ok(())
}

/// The presence a plan's problem asks of an optional operand, as an error otherwise.
fn presence(what: &'static str, wanted: bool, given: bool, kind: &str) -> Result<()> {
    if wanted == given {
        return Ok(());
    }
    Err(Error::TensorMismatch {
        what,
        expected: format!(
            "{} (as the plan's epilogue says)",
            if wanted { kind } else { "none" }
        ),
        got: if wanted { "none" } else { kind }.into(),
    })
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

    /// The argument block the plan's main kernel gets for `ptrs` (GPU plans; the
    /// repair flag and epoch are filled per launch, the workspace is `ptrs.workspace`).
    pub fn kernel_args(&self, ptrs: &ConvPointers) -> Result<(ConvArgs, EpiArgs)> {
        match &self.imp {
            PlanImpl::Cuda(c) => c.main_args(&self.problem, ptrs, ptrs.workspace),
            PlanImpl::Cpu(_) => Ok((
                ConvArgs::new(&self.problem.spec, ptrs.x, ptrs.w, ptrs.y)?,
                EpiArgs {
                    bias: ptrs.bias,
                    residual: ptrs.residual,
                },
            )),
        }
    }

    /// Device scratch a call needs (0 on the CPU and for most forward plans): pass it
    /// as `ConvPointers::workspace`, or let the plan allocate it on the call's stream.
    pub fn workspace_bytes(&self) -> usize {
        match &self.imp {
            PlanImpl::Cuda(c) => c.workspace_bytes,
            PlanImpl::Cpu(_) => 0,
        }
    }

    /// Milliseconds the kernel took to compile or read from the CUBIN cache, and
    /// whether it came from the cache (GPU plans).
    pub fn compile_ms(&self) -> Option<(f64, bool)> {
        match &self.imp {
            PlanImpl::Cpu(_) => None,
            PlanImpl::Cuda(c) => Some((c.kernel.compiled.millis, c.kernel.compiled.cache_hit)),
        }
    }

    fn expect_pass(&self, pass: Pass, call: &str) -> Result<()> {
        if self.problem.pass != pass {
            return Err(Error::TensorMismatch {
                what: "pass",
                expected: format!("a {pass} plan for {call}"),
                got: format!("a plan of {}", self.problem),
            });
        }
        Ok(())
    }

    /// Runs the forward on host tensors: on the CPU directly, on a GPU through uploads,
    /// the device's stream and a download. For tests and small programs; `run` avoids
    /// the copies.
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
        self.expect_pass(Pass::Forward, "run_host")?;
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
                let dy = dev.alloc(y.size_bytes())?;
                let ptrs = ConvPointers {
                    x: dev.device_ptr(&dx),
                    w: dev.device_ptr(&dw),
                    y: dev.device_ptr(&dy),
                    bias: db.as_ref().map_or(0, |b| dev.device_ptr(b)),
                    residual: dr.as_ref().map_or(0, |r| dev.device_ptr(r)),
                    ..ConvPointers::default()
                };
                // SAFETY: every buffer was sized from the spec above and lives to the
                // download, which synchronizes the stream.
                unsafe { self.run_raw(&ptrs, dev.stream().cu_stream())? };
                dev.download(&dy, y)
            }
        }
    }

    /// grad-input of a dgrad plan on host tensors.
    pub fn dgrad_host(&self, grad_output: &HostTensor, w: &HostTensor) -> Result<HostTensor> {
        let spec = &self.problem.spec;
        let mut gx = HostTensor::zeros(spec.dtype(), &spec.input_shape());
        self.dgrad_host_into(grad_output, w, &mut gx)?;
        Ok(gx)
    }

    /// As [`Plan::dgrad_host`], into a grad_input tensor the caller owns.
    pub fn dgrad_host_into(
        &self,
        grad_output: &HostTensor,
        w: &HostTensor,
        grad_input: &mut HostTensor,
    ) -> Result<()> {
        self.expect_pass(Pass::Dgrad, "dgrad_host")?;
        let spec = &self.problem.spec;
        grad_output.expect("grad_output", spec.dtype(), spec.output_len())?;
        w.expect("weight", spec.dtype(), spec.weight_len())?;
        grad_input.expect("grad_input", spec.dtype(), spec.input_len())?;
        match &self.imp {
            PlanImpl::Cpu(_) => crate::cpu::dgrad_cpu(spec, grad_output, w, grad_input),
            PlanImpl::Cuda(c) => {
                let dev = &c.dev;
                let (dgy, dw) = (dev.upload(grad_output)?, dev.upload(w)?);
                let mut dgx = dev.alloc(grad_input.size_bytes())?;
                self.dgrad(
                    DgradBuffers {
                        grad_output: &dgy,
                        w: &dw,
                        grad_input: &mut dgx,
                        workspace: None,
                    },
                    dev.stream(),
                )?;
                dev.download(&dgx, grad_input)
            }
        }
    }

    /// grad-weight (and grad-bias, when the problem's epilogue has a bias) of a wgrad
    /// plan on host tensors.
    pub fn wgrad_host(
        &self,
        x: &HostTensor,
        grad_output: &HostTensor,
    ) -> Result<(HostTensor, Option<HostTensor>)> {
        let spec = &self.problem.spec;
        let mut gw = HostTensor::zeros(spec.dtype(), &spec.weight_shape());
        let mut gb = self
            .problem
            .epilogue
            .bias
            .then(|| HostTensor::zeros(spec.dtype(), &[spec.c()]));
        self.wgrad_host_into(x, grad_output, &mut gw, gb.as_mut())?;
        Ok((gw, gb))
    }

    /// As [`Plan::wgrad_host`], into tensors the caller owns.
    pub fn wgrad_host_into(
        &self,
        x: &HostTensor,
        grad_output: &HostTensor,
        grad_weight: &mut HostTensor,
        grad_bias: Option<&mut HostTensor>,
    ) -> Result<()> {
        self.expect_pass(Pass::Wgrad, "wgrad_host")?;
        let spec = &self.problem.spec;
        x.expect("input", spec.dtype(), spec.input_len())?;
        grad_output.expect("grad_output", spec.dtype(), spec.output_len())?;
        grad_weight.expect("grad_weight", spec.dtype(), spec.weight_len())?;
        presence(
            "grad_bias",
            self.problem.epilogue.bias,
            grad_bias.is_some(),
            "a tensor",
        )?;
        if let Some(gb) = grad_bias.as_deref() {
            gb.expect("grad_bias", spec.dtype(), spec.c())?;
        }
        match &self.imp {
            PlanImpl::Cpu(_) => {
                crate::cpu::wgrad_cpu(spec, x, grad_output, grad_weight)?;
                if let Some(gb) = grad_bias {
                    crate::cpu::bias_grad_cpu(spec, grad_output, gb)?;
                }
                Ok(())
            }
            PlanImpl::Cuda(c) => {
                let dev = &c.dev;
                let (dx, dgy) = (dev.upload(x)?, dev.upload(grad_output)?);
                let mut dgw = dev.alloc(grad_weight.size_bytes())?;
                let mut dgb = match &grad_bias {
                    Some(gb) => Some(dev.alloc(gb.size_bytes())?),
                    None => None,
                };
                self.wgrad(
                    WgradBuffers {
                        x: &dx,
                        grad_output: &dgy,
                        grad_weight: &mut dgw,
                        grad_bias: dgb.as_mut(),
                        workspace: None,
                    },
                    dev.stream(),
                )?;
                dev.download(&dgw, grad_weight)?;
                if let (Some(gb), Some(d)) = (grad_bias, dgb.as_ref()) {
                    dev.download(d, gb)?;
                }
                Ok(())
            }
        }
    }

    /// Runs the forward on device buffers, enqueued on `stream` (asynchronous, like any
    /// launch).
    pub fn run(&self, bufs: ConvBuffers<'_>, stream: &Arc<CudaStream>) -> Result<()> {
        self.expect_pass(Pass::Forward, "run")?;
        let spec = &self.problem.spec;
        let epi = &self.problem.epilogue;
        let dt = spec.dtype();
        need_bytes("input", bufs.x.len(), spec.input_len(), dt)?;
        need_bytes("weight", bufs.w.len(), spec.weight_len(), dt)?;
        need_bytes("output", bufs.y.len(), spec.output_len(), dt)?;
        let operand = |what: &'static str, wanted: bool, b: Option<&CudaSlice<u8>>, elems| {
            presence(what, wanted, b.is_some(), "a buffer")?;
            match b {
                Some(b) => need_bytes(what, b.len(), elems, dt).map(|_| b.device_ptr(stream).0),
                None => Ok(0),
            }
        };
        let ptrs = ConvPointers {
            bias: operand("bias", epi.bias, bufs.bias, spec.c())?,
            residual: operand("residual", epi.residual, bufs.residual, spec.output_len())?,
            x: bufs.x.device_ptr(stream).0,
            w: bufs.w.device_ptr(stream).0,
            y: bufs.y.device_ptr_mut(stream).0,
            ..ConvPointers::default()
        };
        // SAFETY: every pointer addresses a live buffer of at least the bytes the spec
        // needs (checked above), and they stay borrowed for the call.
        unsafe { self.run_raw(&ptrs, stream.cu_stream()) }
    }

    /// The caller's workspace, checked against the plan's need (0 = the plan allocates).
    fn workspace_ptr(
        &self,
        workspace: Option<&mut CudaSlice<u8>>,
        stream: &Arc<CudaStream>,
    ) -> Result<u64> {
        match workspace {
            None => Ok(0),
            Some(ws) => {
                let want = self.workspace_bytes();
                if ws.len() < want {
                    return Err(Error::TensorMismatch {
                        what: "workspace",
                        expected: format!("at least {want} bytes (Plan::workspace_bytes)"),
                        got: format!("{} bytes", ws.len()),
                    });
                }
                Ok(if want == 0 {
                    0
                } else {
                    ws.device_ptr_mut(stream).0
                })
            }
        }
    }

    /// grad-input of a dgrad plan on device buffers, enqueued on `stream`.
    pub fn dgrad(&self, bufs: DgradBuffers<'_>, stream: &Arc<CudaStream>) -> Result<()> {
        self.expect_pass(Pass::Dgrad, "dgrad")?;
        let spec = &self.problem.spec;
        let dt = spec.dtype();
        need_bytes("grad_output", bufs.grad_output.len(), spec.output_len(), dt)?;
        need_bytes("weight", bufs.w.len(), spec.weight_len(), dt)?;
        need_bytes("grad_input", bufs.grad_input.len(), spec.input_len(), dt)?;
        let ptrs = ConvPointers {
            grad_output: bufs.grad_output.device_ptr(stream).0,
            w: bufs.w.device_ptr(stream).0,
            grad_input: bufs.grad_input.device_ptr_mut(stream).0,
            workspace: self.workspace_ptr(bufs.workspace, stream)?,
            ..ConvPointers::default()
        };
        // SAFETY: every pointer addresses a live buffer of at least the bytes the spec
        // (and the plan, for the workspace) needs, checked above, borrowed for the call.
        unsafe { self.run_raw(&ptrs, stream.cu_stream()) }
    }

    /// grad-weight (and grad-bias, when the problem has a bias) of a wgrad plan on
    /// device buffers, enqueued on `stream`. Deterministic: the same bits every call.
    pub fn wgrad(&self, bufs: WgradBuffers<'_>, stream: &Arc<CudaStream>) -> Result<()> {
        self.expect_pass(Pass::Wgrad, "wgrad")?;
        let spec = &self.problem.spec;
        let dt = spec.dtype();
        need_bytes("input", bufs.x.len(), spec.input_len(), dt)?;
        need_bytes("grad_output", bufs.grad_output.len(), spec.output_len(), dt)?;
        need_bytes("grad_weight", bufs.grad_weight.len(), spec.weight_len(), dt)?;
        presence(
            "grad_bias",
            self.problem.epilogue.bias,
            bufs.grad_bias.is_some(),
            "a buffer",
        )?;
        let grad_bias = match bufs.grad_bias {
            Some(gb) => {
                need_bytes("grad_bias", gb.len(), spec.c(), dt)?;
                gb.device_ptr_mut(stream).0
            }
            None => 0,
        };
        let ptrs = ConvPointers {
            x: bufs.x.device_ptr(stream).0,
            grad_output: bufs.grad_output.device_ptr(stream).0,
            grad_weight: bufs.grad_weight.device_ptr_mut(stream).0,
            grad_bias,
            workspace: self.workspace_ptr(bufs.workspace, stream)?,
            ..ConvPointers::default()
        };
        // SAFETY: as in dgrad.
        unsafe { self.run_raw(&ptrs, stream.cu_stream()) }
    }

    /// Runs on raw device pointers and a foreign stream: the path PyTorch's op takes.
    /// Every pass: the operands `ConvPointers` lists for it, the others 0.
    ///
    /// # Safety
    /// Each pointer must address device memory of this plan's context holding the
    /// tensor the spec and pass say (and the workspace `workspace_bytes`, if given),
    /// valid until the launches complete on `stream`; outputs must not overlap inputs.
    pub unsafe fn run_raw(&self, ptrs: &ConvPointers, stream: CUstream) -> Result<()> {
        match &self.imp {
            PlanImpl::Cpu(_) => Err(Error::BackendUnavailable {
                backend: "cpu".into(),
                reason: "a CPU plan takes host tensors (run_host), not device pointers".into(),
            }),
            PlanImpl::Cuda(c) => {
                for (what, p, wanted) in ptrs.operands(&self.problem) {
                    if wanted != (p != 0) {
                        return Err(Error::TensorMismatch {
                            what,
                            expected: format!(
                                "{} for {}",
                                if wanted { "a device address" } else { "0" },
                                self.problem
                            ),
                            got: format!("{p:#x}"),
                        });
                    }
                    // The kernels move 16-byte vectors of the activations.
                    let vectors = !matches!(what, "weight" | "bias" | "grad_weight" | "grad_bias");
                    if vectors && p % 16 != 0 {
                        return Err(Error::TensorMismatch {
                            what,
                            expected: "a device address aligned to 16 bytes (a fresh or contiguous copy of the tensor)".into(),
                            got: format!("{p:#x}"),
                        });
                    }
                }
                if !ptrs.workspace.is_multiple_of(256) {
                    return Err(Error::TensorMismatch {
                        what: "workspace",
                        expected: "a device address aligned to 256 bytes".into(),
                        got: format!("{:#x}", ptrs.workspace),
                    });
                }
                if ptrs.residual != 0 && ptrs.residual == ptrs.y {
                    return Err(Error::TensorMismatch {
                        what: "residual",
                        expected: "a buffer apart from the output".into(),
                        got: "the output buffer itself".into(),
                    });
                }
                c.launch(&self.problem, ptrs, stream)
            }
        }
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

    /// Backward plans on the CPU against the f64 oracles: a strided, dilated,
    /// asymmetrically padded spec in both layouts.
    #[test]
    fn backward_plans_match_the_oracles() {
        use crate::reference::{bias_grad_reference, dgrad_reference, wgrad_reference};
        let engine = Engine::cpu();
        for layout in [crate::Layout::ChannelsFirst, crate::Layout::ChannelsLast] {
            let spec = ConvParams {
                n: 2,
                c: 3,
                input: vec![5, 9, 11],
                kernel: vec![2, 3, 3],
                stride: vec![1, 2, 1],
                dilation: vec![1, 1, 2],
                padding: vec![[1, 0], [1, 1], [2, 1]],
                layout,
                dtype: crate::DType::F32,
            }
            .validate()
            .unwrap();
            let x = HostTensor::random_normal(spec.dtype(), &spec.input_shape(), 1);
            let w = HostTensor::random_normal(spec.dtype(), &spec.weight_shape(), 2);
            let gy = HostTensor::random_normal(spec.dtype(), &spec.output_shape(), 3);
            let dgrad = engine
                .plan(&ConvProblem::new(spec.clone()).with_pass(Pass::Dgrad))
                .unwrap();
            let gx = dgrad.dgrad_host(&gy, &w).unwrap();
            let want = dgrad_reference(&spec, &gy, &w).unwrap();
            assert!(crate::compare(&gx, &want).unwrap().passes(spec.dtype()));
            let wgrad = engine
                .plan(
                    &ConvProblem::new(spec.clone())
                        .with_pass(Pass::Wgrad)
                        .with_epilogue(Epilogue {
                            bias: true,
                            ..Epilogue::NONE
                        }),
                )
                .unwrap();
            let (gw, gb) = wgrad.wgrad_host(&x, &gy).unwrap();
            let want = wgrad_reference(&spec, &x, &gy).unwrap();
            assert!(crate::compare(&gw, &want).unwrap().passes(spec.dtype()));
            let want = bias_grad_reference(&spec, &gy).unwrap();
            assert!(crate::compare(&gb.unwrap(), &want)
                .unwrap()
                .passes(spec.dtype()));
            // A plan runs only its own pass.
            assert!(dgrad.run_host(&x, &w, None, None).is_err());
            assert!(wgrad.dgrad_host(&gy, &w).is_err());
        }
    }

    #[test]
    fn backward_problems_take_only_the_epilogue_their_pass_has() {
        let spec = small();
        let engine = Engine::cpu();
        let silu = Epilogue {
            activation: Activation::Silu,
            ..Epilogue::NONE
        };
        let bias = Epilogue {
            bias: true,
            ..Epilogue::NONE
        };
        let problem = |pass, e| {
            ConvProblem::new(spec.clone())
                .with_pass(pass)
                .with_epilogue(e)
        };
        for (pass, e, ok) in [
            (Pass::Dgrad, Epilogue::NONE, true),
            (Pass::Dgrad, bias, false),
            (Pass::Wgrad, bias, true),
            (Pass::Wgrad, silu, false),
            (Pass::Forward, silu, true),
        ] {
            let p = problem(pass, e);
            assert_eq!(engine.plan(&p).is_ok(), ok, "{p}");
            if !ok {
                let err = engine.plan(&p).err().unwrap();
                assert!(err.is_user_input(), "{err}");
            }
        }
        let keys: Vec<String> = Pass::ALL
            .iter()
            .map(|&pass| problem(pass, Epilogue::NONE).key())
            .collect();
        assert_eq!(keys[0], spec.key());
        assert!(keys[1].ends_with("+dgrad") && keys[2].ends_with("+wgrad"));
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
