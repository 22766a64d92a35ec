//! cuDNN's legacy API, called in process (the `cudnn-legacy` row): grouped N-d
//! convolution forward with the algorithm its own search
//! (cudnnFindConvolutionForwardAlgorithm) measures fastest. A weak reference on depthwise
//! (IMPLICIT_GEMM, 42 ms on the seed): speed claims are against `cudnn_graph`'s best
//! engine and PyTorch, never against this row alone.
//!
//! cuDNN pads symmetrically; an asymmetric spec runs with `max(before, after)` on both
//! sides into a larger output and is cropped when read back (what PyTorch's explicit
//! pad + conv costs too). The crop is exact only when `max - before` is a multiple of
//! the stride; other specs report the baseline as not applicable.

use cudarc::cudnn::sys::{self, cudnnDataType_t as DT, cudnnStatus_t as Status};
use cudarc::driver::CudaSlice;

use super::run::DeviceProblem;
use crate::backend::ConvRun;
use crate::error::{Error, Result};
use crate::spec::{ConvParams, ConvSpec, DType, Layout};
use crate::tensor::HostTensor;

/// cuDNN's version as `major.minor.patch`, or None when the library is absent.
pub fn version() -> Option<String> {
    // SAFETY: only probes, then calls a function without arguments.
    unsafe {
        if !sys::is_culib_present() {
            return None;
        }
        let v = sys::cudnnGetVersion();
        Some(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
    }
}

pub(crate) fn check(call: &str, s: Status) -> Result<()> {
    if s == Status::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda {
            call: call.to_string(),
            name: format!("{s:?}"),
        })
    }
}

macro_rules! raii {
    ($name:ident, $raw:ty, $create:ident, $destroy:ident) => {
        pub(crate) struct $name(pub(crate) $raw);
        impl $name {
            pub(crate) fn new() -> Result<Self> {
                let mut raw: $raw = std::ptr::null_mut();
                // SAFETY: out-pointer to a fresh handle.
                check(stringify!($create), unsafe { sys::$create(&mut raw) })?;
                Ok($name(raw))
            }
        }
        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: created by the matching create call, destroyed once.
                unsafe {
                    sys::$destroy(self.0);
                }
            }
        }
    };
}

raii!(Handle, sys::cudnnHandle_t, cudnnCreate, cudnnDestroy);
raii!(
    TensorDesc,
    sys::cudnnTensorDescriptor_t,
    cudnnCreateTensorDescriptor,
    cudnnDestroyTensorDescriptor
);
raii!(
    FilterDesc,
    sys::cudnnFilterDescriptor_t,
    cudnnCreateFilterDescriptor,
    cudnnDestroyFilterDescriptor
);
raii!(
    ConvDesc,
    sys::cudnnConvolutionDescriptor_t,
    cudnnCreateConvolutionDescriptor,
    cudnnDestroyConvolutionDescriptor
);

pub(crate) fn data_type(d: DType) -> DT {
    match d {
        DType::Bf16 => DT::CUDNN_DATA_BFLOAT16,
        DType::F16 => DT::CUDNN_DATA_HALF,
        DType::F32 => DT::CUDNN_DATA_FLOAT,
    }
}

/// The symmetric-padding spec cuDNN runs, and where the wanted output starts in it.
pub fn symmetric_equivalent(
    spec: &ConvSpec,
) -> std::result::Result<(ConvSpec, [usize; 3]), String> {
    let (pb, pa, st) = (spec.pad_before3(), spec.pad_after3(), spec.stride3());
    let off = 3 - spec.spatial_dims();
    let mut crop = [0usize; 3];
    let mut pads = Vec::new();
    for i in off..3 {
        let p = pb[i].max(pa[i]);
        if (p - pb[i]) % st[i] != 0 {
            return Err(format!(
                "asymmetric padding {}:{} with stride {} has no exact symmetric equivalent",
                pb[i], pa[i], st[i]
            ));
        }
        crop[i] = (p - pb[i]) / st[i];
        pads.push([p as i64, p as i64]);
    }
    let s = |a: [usize; 3]| a[off..].iter().map(|&v| v as i64).collect::<Vec<_>>();
    let sym = ConvParams {
        n: spec.n() as i64,
        c: spec.c() as i64,
        input: s(spec.input3()),
        kernel: s(spec.kernel3()),
        stride: s(spec.stride3()),
        dilation: s(spec.dilation3()),
        padding: pads,
        layout: spec.layout(),
        dtype: spec.dtype(),
    }
    .validate()
    .map_err(|e| e.to_string())?;
    Ok((sym, crop))
}

/// Dims and strides of an activation tensor `[n, c, d, h, w]` in the spec's layout (both
/// cuDNN APIs describe tensors this way).
pub(crate) fn activation(spec: &ConvSpec, dims3: [usize; 3]) -> ([i64; 5], [i64; 5]) {
    let (n, c) = (spec.n() as i64, spec.c() as i64);
    let [d, h, w] = dims3.map(|v| v as i64);
    let strides = match spec.layout() {
        Layout::ChannelsFirst => [c * d * h * w, d * h * w, h * w, w, 1],
        Layout::ChannelsLast => [d * h * w * c, 1, h * w * c, w * c, c],
    };
    ([n, c, d, h, w], strides)
}

/// The legacy API's 32-bit descriptor (the caller checked the sizes fit).
fn tensor_desc(t: &TensorDesc, spec: &ConvSpec, dims3: [usize; 3]) -> Result<()> {
    let (dims, strides) = activation(spec, dims3);
    let (dims, strides) = (dims.map(|v| v as i32), strides.map(|v| v as i32));
    // SAFETY: arrays of 5 valid ints.
    check("cudnnSetTensorNdDescriptor", unsafe {
        sys::cudnnSetTensorNdDescriptor(
            t.0,
            data_type(spec.dtype()),
            5,
            dims.as_ptr(),
            strides.as_ptr(),
        )
    })
}

/// cuDNN's forward convolution as a `ConvRun`.
pub struct CudnnRun<'p, 'd> {
    problem: &'p DeviceProblem<'d>,
    handle: Handle,
    x: TensorDesc,
    w: FilterDesc,
    y: TensorDesc,
    conv: ConvDesc,
    algo: sys::cudnnConvolutionFwdAlgo_t,
    workspace: CudaSlice<u8>,
    sym: ConvSpec,
    crop: [usize; 3],
    outputs: Vec<CudaSlice<u8>>,
    search: Vec<AlgoTime>,
}

/// One algorithm (legacy API) or engine config (backend API) as a cuDNN search
/// measured it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct AlgoTime {
    pub algorithm: String,
    /// `SUCCESS`, or why it was not timed.
    pub status: String,
    /// Its time, when it ran.
    pub ms: Option<f32>,
    pub workspace_bytes: usize,
    /// Wall time the search spent on it (building its plan and running it).
    #[serde(default)]
    pub search_ms: Option<f32>,
}

impl<'p, 'd> CudnnRun<'p, 'd> {
    pub fn new(problem: &'p DeviceProblem<'d>) -> Result<Self> {
        let spec = &problem.spec;
        let unavailable = |reason: String| Error::NotApplicable {
            variant: "cudnn".into(),
            spec: spec.to_string(),
            reason,
        };
        if version().is_none() {
            return Err(Error::BackendUnavailable {
                backend: "cudnn".into(),
                reason:
                    "libcudnn.so.9 is not on the loader path; reports go on without the cuDNN ratio"
                        .into(),
            });
        }
        let (sym, crop) = symmetric_equivalent(spec).map_err(unavailable)?;
        if sym.input_len() > i32::MAX as usize || sym.output_len() > i32::MAX as usize {
            return Err(unavailable("cuDNN's descriptors take 32-bit sizes".into()));
        }
        let dev = problem.dev;
        let handle = Handle::new()?;
        // SAFETY: the handle is live; the stream belongs to the same context.
        check("cudnnSetStream", unsafe {
            sys::cudnnSetStream(handle.0, dev.stream().cu_stream() as sys::cudaStream_t)
        })?;
        let (x, w, y, conv) = (
            TensorDesc::new()?,
            FilterDesc::new()?,
            TensorDesc::new()?,
            ConvDesc::new()?,
        );
        tensor_desc(&x, &sym, sym.input3())?;
        tensor_desc(&y, &sym, sym.output3())?;
        let [kd, kh, kw] = sym.kernel3().map(|v| v as i32);
        let fdims = [sym.c() as i32, 1, kd, kh, kw];
        let format = match sym.layout() {
            Layout::ChannelsFirst => sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
            Layout::ChannelsLast => sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
        };
        let i3 = |a: [usize; 3]| a.map(|v| v as i32);
        let (pads, strides, dils) = (
            i3(sym.pad_before3()),
            i3(sym.stride3()),
            i3(sym.dilation3()),
        );
        // SAFETY: descriptors are live; arrays have the lengths passed.
        unsafe {
            check(
                "cudnnSetFilterNdDescriptor",
                sys::cudnnSetFilterNdDescriptor(
                    w.0,
                    data_type(sym.dtype()),
                    format,
                    5,
                    fdims.as_ptr(),
                ),
            )?;
            check(
                "cudnnSetConvolutionNdDescriptor",
                sys::cudnnSetConvolutionNdDescriptor(
                    conv.0,
                    3,
                    pads.as_ptr(),
                    strides.as_ptr(),
                    dils.as_ptr(),
                    sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    DT::CUDNN_DATA_FLOAT,
                ),
            )?;
            check(
                "cudnnSetConvolutionGroupCount",
                sys::cudnnSetConvolutionGroupCount(conv.0, sym.c() as i32),
            )?;
            // f32 stays exact (no TF32); half types may use tensor cores.
            let math = match sym.dtype() {
                DType::F32 => sys::cudnnMathType_t::CUDNN_FMA_MATH,
                _ => sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
            };
            check(
                "cudnnSetConvolutionMathType",
                sys::cudnnSetConvolutionMathType(conv.0, math),
            )?;
            let mut out = [0i32; 5];
            check(
                "cudnnGetConvolutionNdForwardOutputDim",
                sys::cudnnGetConvolutionNdForwardOutputDim(conv.0, x.0, w.0, 5, out.as_mut_ptr()),
            )?;
            let want = sym.output3().map(|v| v as i32);
            if out[2..] != want {
                return Err(unavailable(format!(
                    "cuDNN computes output {:?}, expected {:?}",
                    &out[2..],
                    want
                )));
            }
        }
        // cuDNN's own search: it times every algorithm and returns them fastest first.
        let mut perf: [sys::cudnnConvolutionFwdAlgoPerf_t; 8] = unsafe { std::mem::zeroed() };
        let mut count = 0i32;
        // SAFETY: descriptors live, perf has room for 8 results.
        check("cudnnFindConvolutionForwardAlgorithm", unsafe {
            sys::cudnnFindConvolutionForwardAlgorithm(
                handle.0,
                x.0,
                w.0,
                conv.0,
                y.0,
                8,
                &mut count,
                perf.as_mut_ptr(),
            )
        })?;
        let found = &perf[..count.max(0) as usize];
        let search = found
            .iter()
            .map(|p| AlgoTime {
                algorithm: format!("{:?}", p.algo).replace("CUDNN_CONVOLUTION_FWD_ALGO_", ""),
                status: format!("{:?}", p.status).replace("CUDNN_STATUS_", ""),
                ms: (p.status == Status::CUDNN_STATUS_SUCCESS).then_some(p.time),
                workspace_bytes: p.memory,
                search_ms: None,
            })
            .collect();
        let best = found
            .iter()
            .find(|p| p.status == Status::CUDNN_STATUS_SUCCESS)
            .ok_or_else(|| unavailable("cuDNN found no algorithm for this convolution".into()))?;
        let workspace = dev.alloc(best.memory)?;
        let outputs = problem.outputs_for(&sym)?;
        Ok(CudnnRun {
            problem,
            handle,
            x,
            w,
            y,
            conv,
            algo: best.algo,
            workspace,
            sym,
            crop,
            outputs,
            search,
        })
    }

    /// Every algorithm cuDNN's search tried, fastest first.
    pub fn search(&self) -> &[AlgoTime] {
        &self.search
    }

    /// The algorithm cuDNN's search chose, e.g. `CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM`.
    pub fn algorithm(&self) -> String {
        format!("{:?}", self.algo).replace("CUDNN_CONVOLUTION_FWD_ALGO_", "")
    }
}

impl ConvRun for CudnnRun<'_, '_> {
    fn name(&self) -> String {
        "cudnn-legacy".into()
    }

    fn launch(&mut self, set: usize) -> Result<f64> {
        let dev = self.problem.dev;
        let x = dev.device_ptr(&self.problem.inputs[set]);
        let w = dev.device_ptr(&self.problem.weight);
        let y = dev.device_ptr(&self.outputs[set]);
        let ws = dev.device_ptr(&self.workspace);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (h, xd, wd, cd, yd, algo, wlen) = (
            self.handle.0,
            self.x.0,
            self.w.0,
            self.conv.0,
            self.y.0,
            self.algo,
            self.workspace.len(),
        );
        dev.time(|| {
            // SAFETY: all buffers are live device allocations of the descriptors' sizes.
            check("cudnnConvolutionForward", unsafe {
                sys::cudnnConvolutionForward(
                    h,
                    &alpha as *const f32 as *const _,
                    xd,
                    x as *const _,
                    wd,
                    w as *const _,
                    cd,
                    algo,
                    ws as *mut _,
                    wlen,
                    &beta as *const f32 as *const _,
                    yd,
                    y as *mut _,
                )
            })
        })
    }

    fn poison(&mut self, set: usize) -> Result<()> {
        self.problem.dev.poison(&mut self.outputs[set])
    }

    fn output(&mut self, set: usize) -> Result<HostTensor> {
        let mut full = HostTensor::zeros(self.sym.dtype(), &self.sym.output_shape());
        self.problem.dev.download(&self.outputs[set], &mut full)?;
        Ok(crop(&self.problem.spec, &self.sym, self.crop, &full))
    }
}

/// The part of `full` (output of `sym`) that is the output of `spec`.
pub(crate) fn crop(
    spec: &ConvSpec,
    sym: &ConvSpec,
    at: [usize; 3],
    full: &HostTensor,
) -> HostTensor {
    if spec.output3() == sym.output3() {
        return full.clone();
    }
    let es = spec.dtype().size_bytes();
    let mut out = HostTensor::zeros(spec.dtype(), &spec.output_shape());
    let src = full.as_bytes();
    let dst = out.as_bytes_mut();
    let [od, oh, ow] = spec.output3();
    for n in 0..spec.n() {
        for c in 0..spec.c() {
            for d in 0..od {
                for h in 0..oh {
                    for w in 0..ow {
                        let i = spec.output_index(n, c, d, h, w) * es;
                        let j = sym.output_index(n, c, d + at[0], h + at[1], w + at[2]) * es;
                        dst[i..i + es].copy_from_slice(&src[j..j + es]);
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::conv_reference;

    #[test]
    fn symmetric_padding_plus_crop_equals_asymmetric_conv() {
        let spec = ConvParams {
            n: 2,
            c: 3,
            input: vec![5, 9],
            kernel: vec![3, 4],
            stride: vec![1, 1],
            dilation: vec![1, 2],
            padding: vec![[0, 2], [3, 1]],
            layout: Layout::ChannelsLast,
            dtype: DType::F32,
        }
        .validate()
        .unwrap();
        let (sym, at) = symmetric_equivalent(&spec).unwrap();
        assert_eq!(at, [0, 2, 0]);
        let x = HostTensor::random_normal(DType::F32, &spec.input_shape(), 1);
        let w = HostTensor::random_normal(DType::F32, &spec.weight_shape(), 2);
        let full = conv_reference(&sym, &x, &w).unwrap();
        let full = HostTensor::from_data(
            &sym.output_shape(),
            crate::tensor::TensorData::F32(full.iter().map(|&v| v as f32).collect()),
        )
        .unwrap();
        let got = crop(&spec, &sym, at, &full);
        let want = conv_reference(&spec, &x, &w).unwrap();
        assert_eq!(
            got.to_f64_vec(),
            want.iter().map(|&v| v as f32 as f64).collect::<Vec<_>>()
        );
    }

    #[test]
    fn inexact_crop_is_refused() {
        let spec = ConvParams {
            n: 1,
            c: 1,
            input: vec![9],
            kernel: vec![3],
            stride: vec![2],
            dilation: vec![],
            padding: vec![[0, 1]],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        }
        .validate()
        .unwrap();
        assert!(symmetric_equivalent(&spec).is_err());
    }

    #[test]
    fn activation_strides_follow_the_layout() {
        let spec = ConvParams {
            n: 2,
            c: 3,
            input: vec![4, 5],
            kernel: vec![3, 3],
            stride: vec![1, 1],
            dilation: vec![1, 1],
            padding: vec![[1, 1], [1, 1]],
            layout: Layout::ChannelsLast,
            dtype: DType::Bf16,
        }
        .validate()
        .unwrap();
        let (dims, strides) = activation(&spec, spec.input3());
        assert_eq!(dims, [2, 3, 1, 4, 5]);
        assert_eq!(strides, [60, 1, 60, 15, 3]);
    }
}
