//! `evokernel._evokernel`: the engine's depthwise convolution on memory PyTorch owns.
//! Python hands over data pointers, the device and torch's current stream; this module
//! plans the problem (plans are cached per problem by the engine) and runs it: on a GPU
//! directly on those pointers and that stream, on the CPU through host copies. It holds
//! no logic of its own beyond that marshalling; every error is a Python exception and a
//! Rust panic never crosses into Python.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use evokernel::engine::ConvPointers;
use evokernel::tensor::TensorData;
use evokernel::{
    Activation, ConvParams, ConvProblem, ConvSpec, DType, Engine, Epilogue, Error, HostTensor,
    Layout, Pass,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// Errors a caller can fix (shapes, dtypes, sizes) are ValueError; the rest RuntimeError.
fn to_py(e: Error) -> PyErr {
    if e.is_user_input() {
        PyValueError::new_err(e.to_string())
    } else {
        PyRuntimeError::new_err(e.to_string())
    }
}

fn cpu_engine() -> &'static Engine {
    static CPU: OnceLock<Engine> = OnceLock::new();
    CPU.get_or_init(Engine::cpu)
}

/// One engine per GPU, opened on first use (on the device's primary context, the one
/// PyTorch uses, so its pointers are valid there).
static GPUS: OnceLock<Mutex<HashMap<usize, Arc<Engine>>>> = OnceLock::new();

fn cuda_engine(ordinal: usize) -> Result<Arc<Engine>, Error> {
    let map = GPUS.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = map.get(&ordinal) {
        return Ok(Arc::clone(e));
    }
    let engine = Arc::new(Engine::cuda(ordinal)?.with_forced_from_env(&[])?);
    map.insert(ordinal, Arc::clone(&engine));
    Ok(engine)
}

/// Drops GPU `ordinal`'s engine (its plans and tune cache); the next call opens a new one.
fn forget_cuda_engine(ordinal: usize) {
    if let Some(map) = GPUS.get() {
        map.lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ordinal);
    }
}

/// A host tensor copied from `len` elements of `dtype` at `ptr`.
///
/// # Safety
/// `ptr` must address `len` readable elements of `dtype`.
unsafe fn host_from_ptr(ptr: u64, dtype: DType, shape: &[usize]) -> Result<HostTensor, Error> {
    let len: usize = shape.iter().product();
    let data = match dtype {
        DType::Bf16 => {
            TensorData::Bf16(std::slice::from_raw_parts(ptr as *const half::bf16, len).to_vec())
        }
        DType::F16 => {
            TensorData::F16(std::slice::from_raw_parts(ptr as *const half::f16, len).to_vec())
        }
        DType::F32 => TensorData::F32(std::slice::from_raw_parts(ptr as *const f32, len).to_vec()),
    };
    HostTensor::from_data(shape, data)
}

/// A problem as Python describes it: `(n, c, input, kernel, stride, dilation, padding,
/// channels_last, dtype)`, padding as (before, after) pairs.
#[derive(FromPyObject)]
struct SpecArgs(
    i64,
    i64,
    Vec<i64>,
    Vec<i64>,
    Vec<i64>,
    Vec<i64>,
    Vec<[i64; 2]>,
    bool,
    String,
);

impl SpecArgs {
    fn spec(self) -> Result<ConvSpec, Error> {
        let SpecArgs(n, c, input, kernel, stride, dilation, padding, channels_last, dtype) = self;
        ConvParams {
            n,
            c,
            input,
            kernel,
            stride,
            dilation,
            padding,
            layout: if channels_last {
                Layout::ChannelsLast
            } else {
                Layout::ChannelsFirst
            },
            dtype: dtype.parse::<DType>()?,
        }
        .validate()
    }

    fn problem(self, activation: &str, bias: bool, residual: bool) -> Result<ConvProblem, Error> {
        Ok(ConvProblem::new(self.spec()?).with_epilogue(Epilogue {
            bias,
            activation: activation.parse::<Activation>()?,
            residual,
        }))
    }
}

/// Computes the depthwise convolution of the tensors at `x`, `w` (and `bias`,
/// `residual`, 0 for none) into `y`. `device` < 0 means host memory; else the CUDA
/// device ordinal, with `stream` the CUstream to enqueue on (the call returns once the
/// work is enqueued, as any CUDA op).
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn conv_forward(
    py: Python<'_>,
    x: u64,
    w: u64,
    y: u64,
    bias: u64,
    residual: u64,
    device: i64,
    stream: u64,
    spec: SpecArgs,
    activation: &str,
) -> PyResult<()> {
    let problem = spec
        .problem(activation, bias != 0, residual != 0)
        .map_err(to_py)?;
    let run = move || -> Result<(), Error> {
        let spec = &problem.spec;
        if device < 0 {
            let plan = cpu_engine().plan(&problem)?;
            // SAFETY: the Python side passes pointers of contiguous tensors of exactly
            // these shapes and this dtype, alive for the call.
            let (xh, wh) = unsafe {
                (
                    host_from_ptr(x, spec.dtype(), &spec.input_shape())?,
                    host_from_ptr(w, spec.dtype(), &spec.weight_shape())?,
                )
            };
            let bh = (bias != 0)
                .then(|| unsafe { host_from_ptr(bias, spec.dtype(), &[spec.c()]) })
                .transpose()?;
            let rh = (residual != 0)
                .then(|| unsafe { host_from_ptr(residual, spec.dtype(), &spec.output_shape()) })
                .transpose()?;
            let out = plan.run_host(&xh, &wh, bh.as_ref(), rh.as_ref())?;
            // SAFETY: `y` addresses an output tensor of exactly these bytes.
            unsafe { store(&out, y) };
            Ok(())
        } else {
            let engine = cuda_engine(device as usize)?;
            let plan = engine.plan(&problem)?;
            let ptrs = ConvPointers {
                x,
                w,
                y,
                bias,
                residual,
                ..ConvPointers::default()
            };
            // SAFETY: the pointers are device tensors of this device, of the shapes the
            // spec says, alive until torch's stream has run the launch.
            unsafe { plan.run_raw(&ptrs, stream as evokernel::cuda::RawStream) }
        }
    };
    detached(py, run)
}

/// Runs `run` with the GIL released, a panic turned into a RuntimeError.
fn detached(py: Python<'_>, run: impl FnOnce() -> Result<(), Error> + Send) -> PyResult<()> {
    py.detach(|| std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)))
        .map_err(|_| {
            PyRuntimeError::new_err("evokernel panicked (a bug); the output is not valid")
        })?
        .map_err(to_py)
}

/// Copies a host tensor's bytes to `ptr`.
///
/// # Safety
/// `ptr` must address a writable buffer of at least the tensor's bytes.
unsafe fn store(t: &HostTensor, ptr: u64) {
    let bytes = t.as_bytes();
    std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr as *mut u8, bytes.len());
}

/// grad-input: the gradient of the forward (no epilogue: the caller applied the
/// activation's derivative) with respect to its input, from `grad_output` and `w` into
/// `grad_input`. Devices and streams as in `conv_forward`; `workspace` (0: none) holds
/// at least `workspace_bytes` for the problem, from the caller's allocator.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn conv_dgrad(
    py: Python<'_>,
    grad_output: u64,
    w: u64,
    grad_input: u64,
    device: i64,
    stream: u64,
    spec: SpecArgs,
    workspace: u64,
) -> PyResult<()> {
    let problem = plain_problem(spec, "dgrad")?;
    detached(py, move || {
        let spec = &problem.spec;
        if device < 0 {
            let plan = cpu_engine().plan(&problem)?;
            // SAFETY: contiguous tensors of exactly these shapes and dtype, alive for the call.
            let (gy, wh) = unsafe {
                (
                    host_from_ptr(grad_output, spec.dtype(), &spec.output_shape())?,
                    host_from_ptr(w, spec.dtype(), &spec.weight_shape())?,
                )
            };
            let gx = plan.dgrad_host(&gy, &wh)?;
            // SAFETY: `grad_input` addresses an input-shaped tensor of this dtype.
            unsafe { store(&gx, grad_input) };
            Ok(())
        } else {
            let plan = cuda_engine(device as usize)?.plan(&problem)?;
            let ptrs = ConvPointers {
                grad_output,
                w,
                grad_input,
                workspace,
                ..ConvPointers::default()
            };
            // SAFETY: device tensors of these shapes, alive until the stream has run.
            unsafe { plan.run_raw(&ptrs, stream as evokernel::cuda::RawStream) }
        }
    })
}

/// grad-weight and grad-bias (deterministic: the same bits every run) from the input
/// `x` and `grad_output` into `grad_weight` and `grad_bias`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn conv_wgrad(
    py: Python<'_>,
    x: u64,
    grad_output: u64,
    grad_weight: u64,
    grad_bias: u64,
    device: i64,
    stream: u64,
    spec: SpecArgs,
    workspace: u64,
) -> PyResult<()> {
    let problem = plain_problem(spec, "wgrad")?;
    detached(py, move || {
        let spec = &problem.spec;
        if device < 0 {
            let plan = cpu_engine().plan(&problem)?;
            // SAFETY: contiguous tensors of exactly these shapes and dtype, alive for the call.
            let (xh, gy) = unsafe {
                (
                    host_from_ptr(x, spec.dtype(), &spec.input_shape())?,
                    host_from_ptr(grad_output, spec.dtype(), &spec.output_shape())?,
                )
            };
            let (gw, gb) = plan.wgrad_host(&xh, &gy)?;
            // SAFETY: weight-shaped and [C] tensors of this dtype.
            unsafe {
                store(&gw, grad_weight);
                if let Some(gb) = gb {
                    store(&gb, grad_bias);
                }
            }
            Ok(())
        } else {
            let plan = cuda_engine(device as usize)?.plan(&problem)?;
            let ptrs = ConvPointers {
                x,
                grad_output,
                grad_weight,
                grad_bias,
                workspace,
                ..ConvPointers::default()
            };
            // SAFETY: device tensors of these shapes, alive until the stream has run.
            unsafe { plan.run_raw(&ptrs, stream as evokernel::cuda::RawStream) }
        }
    })
}

/// Tunes a problem's kernels on GPU `device` (each pass in `passes`: forward, dgrad,
/// wgrad), recording the best configs in the tune cache the CLI shares (`tune.json`);
/// the plans built afterwards use them. Returns the reports as JSON.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn tune(
    py: Python<'_>,
    device: i64,
    spec: SpecArgs,
    activation: &str,
    bias: bool,
    residual: bool,
    passes: Vec<String>,
    search: &str,
    max_seconds: f64,
) -> PyResult<String> {
    if device < 0 {
        return Err(PyValueError::new_err(
            "tuning needs a CUDA device: the CPU backend has no kernel configs to tune",
        ));
    }
    let problem = spec.problem(activation, bias, residual).map_err(to_py)?;
    let passes = passes
        .iter()
        .map(|p| p.parse::<Pass>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(to_py)?;
    let plan = evokernel::session::TunePlan {
        search: search.parse().map_err(to_py)?,
        max_seconds,
        ..Default::default()
    };
    let out = std::sync::Mutex::new(String::new());
    detached(py, || {
        let mut session = evokernel::session::Session::open_cuda(device as usize)?;
        let mut reports = Vec::new();
        for pass in passes {
            let opts = evokernel::session::Options {
                epilogue: problem.epilogue,
                pass,
                ..Default::default()
            };
            let name = format!("{} {pass}", problem.spec);
            reports.push(session.tune(&name, &problem.spec, &opts, &plan, &mut |_| {})?);
        }
        *out.lock().unwrap_or_else(|e| e.into_inner()) =
            serde_json::to_string(&reports).unwrap_or_default();
        // Plans built from now on read the new tune results.
        forget_cuda_engine(device as usize);
        Ok(())
    })?;
    Ok(out.into_inner().unwrap_or_default())
}

/// The instance the engine picks for a problem on a device (-1: the CPU), as its name.
#[pyfunction]
fn plan_name(
    device: i64,
    spec: SpecArgs,
    activation: &str,
    bias: bool,
    residual: bool,
) -> PyResult<String> {
    let problem = spec.problem(activation, bias, residual).map_err(to_py)?;
    let name = if device < 0 {
        cpu_engine().plan(&problem).map(|p| p.instance_name())
    } else {
        cuda_engine(device as usize).and_then(|e| e.plan(&problem).map(|p| p.instance_name()))
    };
    name.map_err(to_py)
}

/// Why no GPU kernel can compute `pass` of a plain problem on `device`, or None when
/// one can (dispatch only: nothing is compiled). The CPU backend takes every problem.
#[pyfunction]
fn unsupported(device: i64, spec: SpecArgs, pass: &str) -> PyResult<Option<String>> {
    let problem = plain_problem(spec, pass)?;
    if device < 0 {
        return Ok(None);
    }
    let engine = cuda_engine(device as usize).map_err(to_py)?;
    Ok(engine.choose(&problem).err().map(|e| e.to_string()))
}

/// The problem of `pass` (forward, dgrad, wgrad) with no epilogue but grad-bias for
/// grad-weight: what the backward ops compute.
fn plain_problem(spec: SpecArgs, pass: &str) -> PyResult<ConvProblem> {
    let pass = pass.parse::<Pass>().map_err(to_py)?;
    Ok(spec
        .problem("none", pass == Pass::Wgrad, false)
        .map_err(to_py)?
        .with_pass(pass))
}

/// Device scratch bytes a backward call of `pass` needs on GPU `device` (0 on the CPU),
/// for the caller to allocate with its own allocator (torch's caching allocator, whose
/// pools CUDA graph capture knows) rather than the plan's stream-ordered allocation.
#[pyfunction]
fn workspace_bytes(py: Python<'_>, device: i64, spec: SpecArgs, pass: &str) -> PyResult<usize> {
    let problem = plain_problem(spec, pass)?;
    if device < 0 {
        return Ok(0);
    }
    let mut bytes = 0;
    detached(py, || {
        bytes = cuda_engine(device as usize)?
            .plan(&problem)?
            .workspace_bytes();
        Ok(())
    })?;
    Ok(bytes)
}

/// The output's spatial sizes of a problem, or the ValueError its validation gives (the
/// Python side asks before it allocates anything).
#[pyfunction]
fn output_dims(spec: SpecArgs) -> PyResult<Vec<usize>> {
    Ok(spec.spec().map_err(to_py)?.output_dims().to_vec())
}

#[pymodule]
fn _evokernel(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(conv_forward, m)?)?;
    m.add_function(wrap_pyfunction!(plan_name, m)?)?;
    m.add_function(wrap_pyfunction!(conv_dgrad, m)?)?;
    m.add_function(wrap_pyfunction!(conv_wgrad, m)?)?;
    m.add_function(wrap_pyfunction!(tune, m)?)?;
    m.add_function(wrap_pyfunction!(unsupported, m)?)?;
    m.add_function(wrap_pyfunction!(workspace_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(output_dims, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
