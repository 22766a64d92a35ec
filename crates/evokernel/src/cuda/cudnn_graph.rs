//! cuDNN at its best, in process: the backend (graph) API with the engine search that
//! PyTorch's benchmark mode does. The candidates are the engine configs of the three
//! heuristic modes (A, B, fallback) and every engine of the operation graph with its
//! default knobs; each that builds into an execution plan is run and timed here, and the
//! fastest is the `cudnn` row of reports (the legacy API's search is `cudnn-legacy`).
//!
//! Any pass: forward, grad-input (backward data) and grad-weight (backward filter).
//! Asymmetric padding goes to cuDNN as pre/post paddings; when no engine takes that, a
//! forward falls back to the symmetric twin plus a crop (as the legacy baseline does).
//!
//! The winner (engine index and knob choices) is cached per cuDNN version, GPU, pass and
//! spec in `cudnn-engines.json` of the cache folder, so a suite measured again skips the
//! search; the report says when a choice came from the cache.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::path::PathBuf;

use cudarc::cudnn::sys::{
    self, cudnnBackendAttributeName_t as Attr, cudnnBackendAttributeType_t as Ty,
    cudnnBackendDescriptorType_t as Kind,
};
use cudarc::driver::CudaSlice;
use serde::{Deserialize, Serialize};

use super::cudnn::{
    activation, check, crop, data_type, symmetric_equivalent, version, AlgoTime, Handle,
};
use super::run::DeviceProblem;
use crate::backend::ConvRun;
use crate::cache::{cache_dir, write_atomic};
use crate::error::{Error, Result};
use crate::pass::Pass;
use crate::spec::{ConvSpec, DType};
use crate::tensor::HostTensor;

/// Unique ids of the three tensors in the graph and the variant pack.
const UID_X: i64 = 1;
const UID_W: i64 = 2;
const UID_Y: i64 = 3;
/// Wall time the search may spend on one problem: candidates come in the heuristics'
/// order, so what is left untried when it runs out is the long tail of engines with
/// default knobs (the report lists them as not tried).
const SEARCH_BUDGET: std::time::Duration = std::time::Duration::from_secs(20);
/// Workspace an engine may ask for (PyTorch caps its search by free memory; a fixed
/// cap keeps the search's allocations bounded on any GPU).
const MAX_WORKSPACE: usize = 4 << 30;

/// A backend descriptor, destroyed once.
struct Desc(sys::cudnnBackendDescriptor_t);

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnBackendCreateDescriptor, destroyed once.
        unsafe {
            sys::cudnnBackendDestroyDescriptor(self.0);
        }
    }
}

impl Desc {
    fn new(kind: Kind) -> Result<Self> {
        let mut raw: sys::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: out-pointer to a fresh descriptor.
        check("cudnnBackendCreateDescriptor", unsafe {
            sys::cudnnBackendCreateDescriptor(kind, &mut raw)
        })?;
        Ok(Desc(raw))
    }

    /// Sets an attribute to `values`, whose element type `ty` names.
    fn set<V>(&self, name: Attr, ty: Ty, values: &[V]) -> Result<&Self> {
        // SAFETY: `values` holds `len` elements of the type `ty` describes.
        check("cudnnBackendSetAttribute", unsafe {
            sys::cudnnBackendSetAttribute(
                self.0,
                name,
                ty,
                values.len() as i64,
                values.as_ptr() as *const c_void,
            )
        })
        .map_err(|e| with_call(e, &format!("cudnnBackendSetAttribute({name:?})")))?;
        Ok(self)
    }

    fn set_descs(&self, name: Attr, descs: &[&Desc]) -> Result<&Self> {
        let raw: Vec<_> = descs.iter().map(|d| d.0).collect();
        self.set(name, Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw)
    }

    fn finalize(self, what: &str) -> Result<Self> {
        // SAFETY: a live descriptor with its attributes set.
        check(what, unsafe { sys::cudnnBackendFinalize(self.0) })?;
        Ok(self)
    }

    /// Reads up to `out.len()` elements of an attribute; returns how many the attribute
    /// has (which may be more than `out` took).
    fn get<V>(&self, name: Attr, ty: Ty, out: &mut [V]) -> Result<usize> {
        let mut count = 0i64;
        // SAFETY: `out` has room for the requested count of `ty` elements.
        check("cudnnBackendGetAttribute", unsafe {
            sys::cudnnBackendGetAttribute(
                self.0,
                name,
                ty,
                out.len() as i64,
                &mut count,
                // A count-only read passes no array, as the frontend does.
                if out.is_empty() {
                    std::ptr::null_mut()
                } else {
                    out.as_mut_ptr() as *mut c_void
                },
            )
        })
        .map_err(|e| with_call(e, &format!("cudnnBackendGetAttribute({name:?})")))?;
        Ok(count.max(0) as usize)
    }

    fn get_i64(&self, name: Attr) -> Result<i64> {
        let mut v = [0i64];
        self.get(name, Ty::CUDNN_TYPE_INT64, &mut v)?;
        Ok(v[0])
    }

    /// Reads a descriptor-valued attribute into fresh descriptors of `kind`.
    fn get_descs(&self, name: Attr, kind: Kind, max: usize) -> Result<Vec<Desc>> {
        let descs = (0..max)
            .map(|_| Desc::new(kind))
            .collect::<Result<Vec<_>>>()?;
        let mut raw: Vec<_> = descs.iter().map(|d| d.0).collect();
        let n = self.get(name, Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR, &mut raw)?;
        Ok(descs.into_iter().take(n).collect())
    }
}

fn with_call(e: Error, call: &str) -> Error {
    match e {
        Error::Cuda { name, .. } => Error::Cuda {
            call: call.to_string(),
            name,
        },
        e => e,
    }
}

/// An engine and its knob settings: what the cache keeps and plans are rebuilt from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineChoice {
    /// cuDNN's global engine index for the operation graph.
    pub engine: i64,
    /// (knob type, value) pairs; empty means the engine's defaults.
    pub knobs: Vec<(u32, i64)>,
}

impl EngineChoice {
    /// `eng12`, or `eng12 k3=1 k7=0` with knobs (cudnnBackendKnobType_t values).
    pub fn name(&self) -> String {
        let mut s = format!("eng{}", self.engine);
        for (k, v) in &self.knobs {
            s.push_str(&format!(" k{k}={v}"));
        }
        s
    }
}

/// The convolution cuDNN is given (the problem's spec, or for a forward its symmetric
/// twin), and where the wanted output starts in its output.
struct Geometry {
    spec: ConvSpec,
    crop: [usize; 3],
}

/// The operation graph of one pass of one spec, with what it refers to kept alive.
struct Graph {
    graph: Desc,
    _parts: Vec<Desc>,
}

fn tensor(uid: i64, dtype: DType, dims: [i64; 5], strides: [i64; 5]) -> Result<Desc> {
    let t = Desc::new(Kind::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    t.set(
        Attr::CUDNN_ATTR_TENSOR_DATA_TYPE,
        Ty::CUDNN_TYPE_DATA_TYPE,
        &[data_type(dtype)],
    )?
    .set(
        Attr::CUDNN_ATTR_TENSOR_DIMENSIONS,
        Ty::CUDNN_TYPE_INT64,
        &dims,
    )?
    .set(
        Attr::CUDNN_ATTR_TENSOR_STRIDES,
        Ty::CUDNN_TYPE_INT64,
        &strides,
    )?
    .set(
        Attr::CUDNN_ATTR_TENSOR_UNIQUE_ID,
        Ty::CUDNN_TYPE_INT64,
        &[uid],
    )?
    .set(
        Attr::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
        Ty::CUDNN_TYPE_INT64,
        &[16i64],
    )?;
    t.finalize("cudnnBackendFinalize(tensor)")
}

fn build_graph(handle: &Handle, spec: &ConvSpec, pass: Pass) -> Result<Graph> {
    let dtype = spec.dtype();
    let (xd, xs) = activation(spec, spec.input3());
    let (yd, ys) = activation(spec, spec.output3());
    // One input channel per group: cuDNN reads the group count off the filter's dims.
    let [kd, kh, kw] = spec.kernel3().map(|v| v as i64);
    let (wd, ws) = (
        [spec.c() as i64, 1, kd, kh, kw],
        [kd * kh * kw, 1, kh * kw, kw, 1],
    );
    let x = tensor(UID_X, dtype, xd, xs)?;
    let w = tensor(UID_W, dtype, wd, ws)?;
    let y = tensor(UID_Y, dtype, yd, ys)?;
    let i64s = |a: [usize; 3]| a.map(|v| v as i64);
    let conv = Desc::new(Kind::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
    conv.set(
        Attr::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
        Ty::CUDNN_TYPE_DATA_TYPE,
        &[sys::cudnnDataType_t::CUDNN_DATA_FLOAT],
    )?
    .set(
        Attr::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
        Ty::CUDNN_TYPE_CONVOLUTION_MODE,
        &[sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION],
    )?
    .set(
        Attr::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS,
        Ty::CUDNN_TYPE_INT64,
        &[3i64],
    )?
    .set(
        Attr::CUDNN_ATTR_CONVOLUTION_DILATIONS,
        Ty::CUDNN_TYPE_INT64,
        &i64s(spec.dilation3()),
    )?
    .set(
        Attr::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES,
        Ty::CUDNN_TYPE_INT64,
        &i64s(spec.stride3()),
    )?
    .set(
        Attr::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS,
        Ty::CUDNN_TYPE_INT64,
        &i64s(spec.pad_before3()),
    )?
    .set(
        Attr::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS,
        Ty::CUDNN_TYPE_INT64,
        &i64s(spec.pad_after3()),
    )?;
    let conv = conv.finalize("cudnnBackendFinalize(convolution)")?;
    let (kind, alpha, beta, cd, xa, wa, ya) = match pass {
        Pass::Forward => (
            Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
        ),
        Pass::Dgrad => (
            Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
        ),
        Pass::Wgrad => (
            Kind::CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
            Attr::CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
        ),
    };
    let op = Desc::new(kind)?;
    op.set(alpha, Ty::CUDNN_TYPE_FLOAT, &[1.0f32])?
        .set(beta, Ty::CUDNN_TYPE_FLOAT, &[0.0f32])?
        .set_descs(cd, &[&conv])?
        .set_descs(xa, &[&x])?
        .set_descs(wa, &[&w])?
        .set_descs(ya, &[&y])?;
    let op = op.finalize("cudnnBackendFinalize(convolution operation)")?;
    let graph = Desc::new(Kind::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    graph
        .set(
            Attr::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
            Ty::CUDNN_TYPE_HANDLE,
            &[handle.0],
        )?
        .set_descs(Attr::CUDNN_ATTR_OPERATIONGRAPH_OPS, &[&op])?;
    let graph = graph.finalize("cudnnBackendFinalize(operation graph)")?;
    Ok(Graph {
        graph,
        _parts: vec![x, w, y, conv, op],
    })
}

/// An engine config built from a choice, with the descriptors it refers to.
struct Config {
    cfg: Desc,
    engine: Desc,
    _knobs: Vec<Desc>,
}

fn build_config(graph: &Graph, choice: &EngineChoice) -> Result<Config> {
    let engine = Desc::new(Kind::CUDNN_BACKEND_ENGINE_DESCRIPTOR)?;
    engine
        .set_descs(Attr::CUDNN_ATTR_ENGINE_OPERATION_GRAPH, &[&graph.graph])?
        .set(
            Attr::CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
            Ty::CUDNN_TYPE_INT64,
            &[choice.engine],
        )?;
    let engine = engine.finalize("cudnnBackendFinalize(engine)")?;
    let mut knobs = Vec::new();
    for &(ty, value) in &choice.knobs {
        let k = Desc::new(Kind::CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR)?;
        // The knob type is a cudnnBackendKnobType_t passed as its 32-bit value.
        k.set(
            Attr::CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
            Ty::CUDNN_TYPE_KNOB_TYPE,
            &[ty],
        )?
        .set(
            Attr::CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE,
            Ty::CUDNN_TYPE_INT64,
            &[value],
        )?;
        knobs.push(k.finalize("cudnnBackendFinalize(knob choice)")?);
    }
    let cfg = Desc::new(Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR)?;
    cfg.set_descs(Attr::CUDNN_ATTR_ENGINECFG_ENGINE, &[&engine])?;
    if !knobs.is_empty() {
        cfg.set_descs(
            Attr::CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
            &knobs.iter().collect::<Vec<_>>(),
        )?;
    }
    let cfg = cfg.finalize("cudnnBackendFinalize(engine config)")?;
    Ok(Config {
        cfg,
        engine,
        _knobs: knobs,
    })
}

/// The engine and knobs of an engine config the heuristics returned.
fn choice_of(cfg: &Desc) -> Result<EngineChoice> {
    let engines = cfg.get_descs(
        Attr::CUDNN_ATTR_ENGINECFG_ENGINE,
        Kind::CUDNN_BACKEND_ENGINE_DESCRIPTOR,
        1,
    )?;
    let engine = engines
        .first()
        .ok_or_else(|| Error::Cuda {
            call: "cudnnBackendGetAttribute(CUDNN_ATTR_ENGINECFG_ENGINE)".into(),
            name: "no engine in the config".into(),
        })?
        .get_i64(Attr::CUDNN_ATTR_ENGINE_GLOBAL_INDEX)?;
    let knob_descs = cfg.get_descs(
        Attr::CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
        Kind::CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR,
        sys::cudnnBackendKnobType_t::CUDNN_KNOB_TYPE_COUNTS as usize,
    )?;
    let mut knobs = Vec::new();
    for k in &knob_descs {
        // Read as the raw 32-bit value: a newer cuDNN may name types this binding lacks.
        let mut ty = [0u32];
        k.get(
            Attr::CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
            Ty::CUDNN_TYPE_KNOB_TYPE,
            &mut ty,
        )?;
        knobs.push((ty[0], k.get_i64(Attr::CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE)?));
    }
    knobs.sort_unstable();
    Ok(EngineChoice { engine, knobs })
}

/// The config's engine's numerical notes, as raw cudnnBackendNumericalNote_t values.
fn notes_of(config: &Config) -> Result<Vec<u32>> {
    let mut notes = [0u32; 32];
    let n = config.engine.get(
        Attr::CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
        Ty::CUDNN_TYPE_NUMERICAL_NOTE,
        &mut notes,
    )?;
    Ok(notes[..n.min(notes.len())].to_vec())
}

/// Why an engine with these notes is not a fair baseline for `dtype`, if it is not: in
/// f32 our kernels are exact, so TF32 tensor cores and down-converted inputs are out.
fn excluded(dtype: DType, notes: &[u32]) -> Option<&'static str> {
    use sys::cudnnBackendNumericalNote_t as N;
    let has = |n: N| notes.contains(&(n as u32));
    (dtype == DType::F32
        && (has(N::CUDNN_NUMERICAL_NOTE_TENSOR_CORE)
            || has(N::CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)))
    .then_some("TF32 or down-converted inputs (inexact in f32)")
}

struct BuiltPlan {
    plan: Desc,
    workspace_bytes: usize,
    _config: Config,
}

fn build_plan(handle: &Handle, config: Config) -> Result<BuiltPlan> {
    let plan = Desc::new(Kind::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
    plan.set(
        Attr::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
        Ty::CUDNN_TYPE_HANDLE,
        &[handle.0],
    )?
    .set_descs(
        Attr::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
        &[&config.cfg],
    )?;
    let plan = plan.finalize("cudnnBackendFinalize(execution plan)")?;
    let workspace_bytes = plan.get_i64(Attr::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)?;
    Ok(BuiltPlan {
        plan,
        workspace_bytes: workspace_bytes.max(0) as usize,
        _config: config,
    })
}

fn variant_pack(ptrs: [u64; 3], workspace: u64) -> Result<Desc> {
    let vp = Desc::new(Kind::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
    let data: [*mut c_void; 3] = ptrs.map(|p| p as *mut c_void);
    vp.set(
        Attr::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
        Ty::CUDNN_TYPE_INT64,
        &[UID_X, UID_W, UID_Y],
    )?
    .set(
        Attr::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
        Ty::CUDNN_TYPE_VOID_PTR,
        &data,
    )?
    .set(
        Attr::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
        Ty::CUDNN_TYPE_VOID_PTR,
        &[workspace as *mut c_void],
    )?;
    vp.finalize("cudnnBackendFinalize(variant pack)")
}

fn execute(handle: &Handle, plan: &Desc, pack: &Desc) -> Result<()> {
    // SAFETY: the plan and pack are finalized; the pack's pointers address live buffers
    // of the sizes the graph's tensors describe.
    check("cudnnBackendExecute", unsafe {
        sys::cudnnBackendExecute(handle.0, plan.0, pack.0)
    })
}

/// What the cache keeps for one (cuDNN, GPU, pass, spec).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct CachedSearch {
    choice: EngineChoice,
    /// The search as it was measured (fastest first), shown again in reports.
    search: Vec<AlgoTime>,
    twin: bool,
}

fn cache_path() -> PathBuf {
    cache_dir().join("cudnn-engines.json")
}

fn load_cache() -> BTreeMap<String, CachedSearch> {
    std::fs::read(cache_path())
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn store_cache(key: &str, entry: &CachedSearch) {
    let mut all = load_cache();
    all.insert(key.to_string(), entry.clone());
    // A cache that cannot be written costs a search next time, nothing else.
    if let Ok(bytes) = serde_json::to_vec_pretty(&all) {
        let _ = write_atomic(&cache_path(), &bytes);
    }
}

/// One pass of cuDNN's best engine as a `ConvRun`.
pub struct CudnnGraphRun<'p, 'd> {
    problem: &'p DeviceProblem<'d>,
    handle: Handle,
    plan: BuiltPlan,
    packs: Vec<Desc>,
    outputs: Vec<CudaSlice<u8>>,
    _workspace: CudaSlice<u8>,
    _graph: Graph,
    geometry: Geometry,
    choice: EngineChoice,
    search: Vec<AlgoTime>,
    cached: bool,
}

impl<'p, 'd> CudnnGraphRun<'p, 'd> {
    /// Builds the graph of the problem's pass, then takes the cached engine choice or
    /// runs the search (every candidate verified to execute, then timed).
    pub fn new(problem: &'p DeviceProblem<'d>) -> Result<Self> {
        let spec = &problem.spec;
        let pass = problem.problem.pass;
        let unavailable = |reason: String| Error::NotApplicable {
            variant: "cudnn".into(),
            spec: spec.to_string(),
            reason,
        };
        let Some(cudnn) = version() else {
            return Err(Error::BackendUnavailable {
                backend: "cudnn".into(),
                reason:
                    "libcudnn.so.9 is not on the loader path; reports go on without the cuDNN rows"
                        .into(),
            });
        };
        if !problem.problem.epilogue.is_none() {
            return Err(unavailable("cuDNN's baseline has no fused epilogue".into()));
        }
        let handle = Handle::new()?;
        let dev = problem.dev;
        // SAFETY: the handle is live; the stream belongs to the same context.
        check("cudnnSetStream", unsafe {
            sys::cudnnSetStream(handle.0, dev.stream().cu_stream() as sys::cudaStream_t)
        })?;
        let key = format!("cudnn {cudnn} | {} | {pass} | {spec}", dev.info().name);
        let mut geometries = vec![Geometry {
            spec: spec.clone(),
            crop: [0; 3],
        }];
        if pass == Pass::Forward && spec.pad_before3() != spec.pad_after3() {
            if let Ok((sym, crop)) = symmetric_equivalent(spec) {
                geometries.push(Geometry { spec: sym, crop });
            }
        }
        let cached = load_cache().remove(&key);
        let mut reasons = Vec::new();
        for geometry in geometries {
            let twin = geometry.spec != *spec;
            let graph = match build_graph(&handle, &geometry.spec, pass) {
                Ok(g) => g,
                Err(e) => {
                    reasons.push(format!("{}: {e}", geometry.spec));
                    continue;
                }
            };
            let outputs = if pass == Pass::Forward {
                problem.outputs_for(&geometry.spec)?
            } else {
                problem.outputs()?
            };
            let state = Partial {
                problem,
                handle: &handle,
                graph: &graph,
                outputs,
            };
            // The cached choice when it still builds and binds, else a search.
            let reuse = cached.as_ref().filter(|c| c.twin == twin).and_then(|c| {
                let plan = build_plan(&handle, build_config(&graph, &c.choice).ok()?).ok()?;
                let bound = state.bind(&plan).ok()?;
                Some((plan, bound, c.choice.clone(), c.search.clone(), true))
            });
            let (plan, (workspace, packs), choice, search, cached) = match reuse {
                Some(r) => r,
                None => {
                    let (search, best) = state.search()?;
                    let Some(choice) = best else {
                        reasons.push(format!(
                            "{}: no engine built and ran ({} tried)",
                            geometry.spec,
                            search.len()
                        ));
                        continue;
                    };
                    let plan = build_plan(&handle, build_config(&graph, &choice)?)?;
                    let bound = state.bind(&plan)?;
                    store_cache(
                        &key,
                        &CachedSearch {
                            choice: choice.clone(),
                            search: search.clone(),
                            twin,
                        },
                    );
                    (plan, bound, choice, search, false)
                }
            };
            let outputs = state.outputs;
            return Ok(CudnnGraphRun {
                problem,
                handle,
                plan,
                packs,
                outputs,
                _workspace: workspace,
                _graph: graph,
                geometry,
                choice,
                search,
                cached,
            });
        }
        Err(unavailable(format!(
            "cuDNN's backend API has no engine for this {pass}: {}",
            reasons.join("; ")
        )))
    }

    /// Whether cuDNN runs the symmetric-padding twin of the problem's spec.
    fn is_twin(&self) -> bool {
        self.geometry.spec != self.problem.spec
    }

    /// Every engine config the search tried, fastest first, then the ones that failed.
    pub fn search(&self) -> &[AlgoTime] {
        &self.search
    }

    /// E.g. `eng28 k3=1 (of 41 configs tried)` or `eng28 (cached search)`.
    pub fn describe(&self) -> String {
        let timed = self.search.iter().filter(|a| a.status == "SUCCESS").count();
        format!(
            "cuDNN backend API, {}{}; {}",
            self.choice.name(),
            if self.is_twin() {
                " on the symmetric-padding twin, cropped"
            } else {
                ""
            },
            if self.cached {
                format!("cached search of {timed} timed configs")
            } else {
                format!(
                    "fastest of {timed} timed configs ({} tried)",
                    self.search.len()
                )
            }
        )
    }
}

/// What the search and the final binding share while the run is being built.
struct Partial<'a, 'p, 'd> {
    problem: &'p DeviceProblem<'d>,
    handle: &'a Handle,
    graph: &'a Graph,
    outputs: Vec<CudaSlice<u8>>,
}

impl<'p, 'd> Partial<'_, 'p, 'd> {
    /// The device pointers of input set `set`, in UID order (x, w, y of the pass).
    fn pointers(&self, set: usize) -> [u64; 3] {
        let p = self.problem;
        let dev = p.dev;
        let out = dev.device_ptr(&self.outputs[set]);
        let w = dev.device_ptr(&p.weight);
        match p.problem.pass {
            Pass::Forward => [dev.device_ptr(&p.inputs[set]), w, out],
            Pass::Dgrad => [out, w, dev.device_ptr(&p.grad_outputs[set])],
            Pass::Wgrad => [
                dev.device_ptr(&p.inputs[set]),
                out,
                dev.device_ptr(&p.grad_outputs[set]),
            ],
        }
    }

    fn bind(&self, plan: &BuiltPlan) -> Result<(CudaSlice<u8>, Vec<Desc>)> {
        let dev = self.problem.dev;
        let workspace = dev.alloc(plan.workspace_bytes)?;
        let ws = dev.device_ptr(&workspace);
        let packs = (0..self.problem.sets())
            .map(|s| variant_pack(self.pointers(s), ws))
            .collect::<Result<Vec<_>>>()?;
        Ok((workspace, packs))
    }

    /// The candidates of the heuristic modes and every engine, each built, run once and
    /// timed; returns them fastest first (failures after) and the fastest's choice.
    fn search(&self) -> Result<(Vec<AlgoTime>, Option<EngineChoice>)> {
        let dev = self.problem.dev;
        let dtype = self.problem.spec.dtype();
        let mut candidates: Vec<EngineChoice> = Vec::new();
        for mode in [
            sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A,
            sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_B,
            sys::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_FALLBACK,
        ] {
            let Ok(heur) = (|| -> Result<Desc> {
                let h = Desc::new(Kind::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
                h.set_descs(
                    Attr::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
                    &[&self.graph.graph],
                )?
                .set(
                    Attr::CUDNN_ATTR_ENGINEHEUR_MODE,
                    Ty::CUDNN_TYPE_HEUR_MODE,
                    &[mode],
                )?;
                h.finalize("cudnnBackendFinalize(engine heuristics)")
            })() else {
                continue;
            };
            // A zero-element read gives the count.
            let n = heur.get::<sys::cudnnBackendDescriptor_t>(
                Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS,
                Ty::CUDNN_TYPE_BACKEND_DESCRIPTOR,
                &mut [],
            )?;
            for cfg in heur.get_descs(
                Attr::CUDNN_ATTR_ENGINEHEUR_RESULTS,
                Kind::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
                n,
            )? {
                if let Ok(c) = choice_of(&cfg) {
                    if !candidates.contains(&c) {
                        candidates.push(c);
                    }
                }
            }
        }
        let engines = self
            .graph
            .graph
            .get_i64(Attr::CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT)?;
        for engine in 0..engines {
            let c = EngineChoice {
                engine,
                knobs: Vec::new(),
            };
            if !candidates.contains(&c) {
                candidates.push(c);
            }
        }
        let mut rows = Vec::new();
        let mut best: Option<(f64, EngineChoice)> = None;
        let start = std::time::Instant::now();
        for choice in candidates {
            let mut row = AlgoTime {
                algorithm: choice.name(),
                status: String::new(),
                ms: None,
                workspace_bytes: 0,
                search_ms: None,
            };
            if start.elapsed() > SEARCH_BUDGET {
                row.status = format!(
                    "not tried: the search's {} s were spent",
                    SEARCH_BUDGET.as_secs()
                );
                rows.push(row);
                continue;
            }
            let tried = std::time::Instant::now();
            let timed = (|| -> Result<std::result::Result<f64, String>> {
                // One engine config for the notes and the plan.
                let config = build_config(self.graph, &choice)?;
                if let Some(why) = excluded(dtype, &notes_of(&config)?) {
                    return Ok(Err(why.to_string()));
                }
                let plan = build_plan(self.handle, config)?;
                row.workspace_bytes = plan.workspace_bytes;
                if plan.workspace_bytes > MAX_WORKSPACE {
                    return Ok(Err(format!(
                        "workspace {} MiB over the {} MiB cap",
                        plan.workspace_bytes >> 20,
                        MAX_WORKSPACE >> 20
                    )));
                }
                let (ws, packs) = self.bind(&plan)?;
                // A first run: it must execute, and it warms the caches. A config far
                // slower than the best so far (some take seconds) is not run again: its
                // first time is its time.
                let first = dev.time(|| execute(self.handle, &plan.plan, &packs[0]))?;
                let far = |t: f64| best.as_ref().is_some_and(|(b, _)| t > 4.0 * b);
                let mut times = vec![first];
                if !far(first) {
                    times.clear();
                    for i in 0..5 {
                        let set = i % packs.len();
                        times.push(dev.time(|| execute(self.handle, &plan.plan, &packs[set]))?);
                        if far(times[0]) {
                            break;
                        }
                    }
                }
                drop(ws);
                times.sort_by(f64::total_cmp);
                Ok(Ok(times[times.len() / 2]))
            })();
            row.search_ms = Some(tried.elapsed().as_secs_f32() * 1e3);
            match timed {
                Ok(Ok(ms)) => {
                    row.status = "SUCCESS".into();
                    row.ms = Some(ms as f32);
                    if best.as_ref().is_none_or(|(b, _)| ms < *b) {
                        best = Some((ms, choice.clone()));
                    }
                }
                Ok(Err(why)) => row.status = why,
                Err(Error::Cuda { name, .. }) => row.status = name.replace("CUDNN_STATUS_", ""),
                Err(e) => return Err(e),
            }
            rows.push(row);
        }
        // Timed configs fastest first, then the rest in the order they were tried.
        rows.sort_by(|a, b| match (a.ms, b.ms) {
            (Some(x), Some(y)) => x.total_cmp(&y),
            (x, y) => y.is_some().cmp(&x.is_some()),
        });
        Ok((rows, best.map(|(_, c)| c)))
    }
}

impl ConvRun for CudnnGraphRun<'_, '_> {
    fn name(&self) -> String {
        "cudnn".into()
    }

    fn launch(&mut self, set: usize) -> Result<f64> {
        let (handle, plan, pack) = (&self.handle, &self.plan.plan, &self.packs[set]);
        self.problem.dev.time(|| execute(handle, plan, pack))
    }

    fn poison(&mut self, set: usize) -> Result<()> {
        self.problem.dev.poison(&mut self.outputs[set])
    }

    fn output(&mut self, set: usize) -> Result<HostTensor> {
        let p = self.problem;
        if !self.is_twin() {
            return p.download_output(&self.outputs[set]);
        }
        let sym = &self.geometry.spec;
        let mut full = HostTensor::zeros(sym.dtype(), &sym.output_shape());
        p.dev.download(&self.outputs[set], &mut full)?;
        Ok(crop(&p.spec, sym, self.geometry.crop, &full))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_choice_names_knobs_in_order() {
        let c = EngineChoice {
            engine: 28,
            knobs: vec![(3, 1), (7, 0)],
        };
        assert_eq!(c.name(), "eng28 k3=1 k7=0");
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<EngineChoice>(&json).unwrap(), c);
    }

    #[test]
    fn tf32_engines_are_excluded_only_in_f32() {
        use sys::cudnnBackendNumericalNote_t as N;
        let tc = [N::CUDNN_NUMERICAL_NOTE_TENSOR_CORE as u32];
        assert!(excluded(DType::F32, &tc).is_some());
        assert!(excluded(DType::Bf16, &tc).is_none());
        assert!(excluded(DType::F32, &[]).is_none());
    }
}
