//! A GPU plan's kernels and launches, per pass: the forward kernel (with the tensor-core
//! variants' repair launch); grad-input as a weight flip then the forward kernel on the
//! flipped twin spec, or a grad-input kernel; grad-weight as its partial sums then the
//! finalize kernel. Scratch (the flipped weight, the partials) comes from the caller or
//! is allocated on the call's stream.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUstream;
use cudarc::driver::CudaSlice;

use super::{with_epilogue, ConvPointers, ConvProblem};
use crate::cuda::run::{
    flip_specialization, repair_specialization, to_channels_first_specialization,
};
use crate::cuda::{ConvArgs, CudaContextExt, CudaDevice, EpiArgs, LoadedKernel, TmaMaps};
use crate::epilogue::Epilogue;
use crate::error::{Error, Result};
use crate::pass::Pass;
use crate::spec::ConvSpec;
use crate::variants::{find, Config, Instance, Launch, TensorMaps, Variant};

/// How the plan's pass maps onto kernels.
pub(crate) enum Lowering {
    /// The forward kernel on the problem's spec.
    Forward,
    /// grad-input as the forward of `twin` (unit strides, mirrored padding) on the
    /// flipped weight, which `flip` writes into the workspace at byte `offset` first.
    DgradFlipped {
        twin: Box<ConvSpec>,
        flip: LoadedKernel,
        offset: u64,
    },
    /// A grad-input kernel on the problem's spec.
    Dgrad,
    /// A grad-weight kernel's partials, then `finalize` adds them.
    Wgrad { finalize: LoadedKernel },
    /// grad-weight of channels-last data by a channels-first kernel on copies.
    WgradOnCopies(Box<OnCopies>),
}

/// A chunk of channels at a time: `input` and `grad` copy the chunk's input and
/// grad-output into channels-first order in the workspace (at bytes `input_at`,
/// `grad_at`), then the kernel on `chunk` (the chunk's channels-first spec) and
/// `finalize`.
pub(crate) struct OnCopies {
    finalize: LoadedKernel,
    input: LoadedKernel,
    grad: LoadedKernel,
    chunk: ConvSpec,
    input_at: u64,
    grad_at: u64,
}

/// A GPU plan: the loaded kernel instance and what its pass needs around it.
pub(crate) struct CudaPlan {
    pub(crate) dev: Arc<CudaDevice>,
    pub(crate) instance: Instance,
    pub(crate) kernel: LoadedKernel,
    /// The repair kernel, its flag buffer and the flag's address, read once here: taking
    /// a buffer's address through cudarc records events on the context's legacy stream,
    /// which a launch must not do while torch captures a CUDA graph on another stream
    /// (cudaErrorStreamCaptureImplicit).
    repair: Option<(LoadedKernel, CudaSlice<u8>, u64)>,
    lowering: Lowering,
    /// The main kernel's third parameter, where it takes tensor maps.
    tensor_maps: Option<TensorMaps>,
    /// The maps last encoded, by the (input, output-shaped) pointers they address: a
    /// framework calls with the same buffers again and again, and encoding is host work
    /// on every launch otherwise.
    encoded_maps: Mutex<Option<((u64, u64), TmaMaps)>>,
    pub(crate) workspace_bytes: usize,
    /// A fresh number per launch, so a flag left by an earlier launch means nothing.
    epoch: AtomicU32,
}

/// The most bytes of channels-first copies a plan running channels-last grad-weight on
/// them holds at once: the seed's shape in one chunk (442 MB). Chunks cost time: the
/// seed took 0.62 ms in one chunk, 0.70 in chunks of 128 channels, 0.75 of 64 and 0.94 of
/// 32 (run 257, H100: each chunk's kernel drains its own tail, and chunks small enough
/// for the copies to stay in L2 leave the kernel too few blocks).
pub(crate) const COPY_BYTES: usize = 512 << 20;

/// The channels of one chunk of copies: the largest divisor of C whose input and
/// grad-output copies fit `bytes` (one channel at least).
pub(crate) fn copy_chunk(spec: &ConvSpec, bytes: usize) -> usize {
    let per_channel =
        (spec.input_len() + spec.output_len()) / spec.c().max(1) * spec.dtype().size_bytes();
    let fit = (bytes / per_channel.max(1)).clamp(1, spec.c().max(1));
    (1..=fit)
        .rev()
        .find(|d| spec.c().is_multiple_of(*d))
        .unwrap_or(1)
}

fn not_applicable(v: &dyn Variant, spec: impl std::fmt::Display, reason: String) -> Error {
    Error::NotApplicable {
        variant: v.name().into(),
        spec: spec.to_string(),
        reason,
    }
}

impl CudaPlan {
    /// The variant, the spec its main kernel computes and that kernel's epilogue.
    /// `copy_bytes`: the most bytes of channels-first copies the plan may hold, asked
    /// only where the kernel runs on copies.
    fn resolve(
        problem: &ConvProblem,
        config: &Config,
        copy_bytes: &dyn Fn() -> usize,
    ) -> Result<(&'static dyn Variant, ConvSpec, Epilogue)> {
        let variant = find(&config.variant)?;
        let spec = &problem.spec;
        ConvArgs::new(spec, 0, 0, 0)?;
        let (kernel_spec, epilogue) = match (problem.pass, variant.pass()) {
            (Pass::Forward, Pass::Forward) => (spec.clone(), problem.epilogue),
            (Pass::Dgrad, Pass::Forward) => {
                let twin = spec.dgrad_twin().ok_or_else(|| {
                    not_applicable(
                        variant,
                        problem,
                        "grad-input runs on the forward kernels only with unit strides and \
                         padding within the kernel's span; use dgrad_gather"
                            .into(),
                    )
                })?;
                (twin, Epilogue::NONE)
            }
            // On channels-first copies, chunk by chunk, where the kernel takes only
            // channels-first data.
            (Pass::Wgrad, Pass::Wgrad) => (
                match crate::dispatch::kernel_problem(variant, problem) {
                    Some(k) if k.spec.layout() != spec.layout() => {
                        k.spec.with_channels(copy_chunk(spec, copy_bytes()))
                    }
                    _ => spec.clone(),
                },
                problem.epilogue,
            ),
            (a, b) if a == b => (spec.clone(), problem.epilogue),
            (a, b) => {
                return Err(not_applicable(
                    variant,
                    problem,
                    format!("it is a {b} kernel and the problem is the {a} pass"),
                ))
            }
        };
        variant
            .applies(&kernel_spec)
            .map_err(|reason| not_applicable(variant, &kernel_spec, reason))?;
        Ok((variant, kernel_spec, epilogue))
    }

    /// Every kernel a plan of `config` loads, as (name, source, name expression), with
    /// its launch: what `Engine::precompile` compiles ahead, in parallel.
    pub(crate) fn kernels(
        problem: &ConvProblem,
        config: &Config,
        sms: u32,
        copy_bytes: &dyn Fn() -> usize,
    ) -> Result<Vec<(&'static str, &'static str, String, Launch)>> {
        let (variant, kernel_spec, epilogue) = Self::resolve(problem, config, copy_bytes)?;
        let spec = &problem.spec;
        // grad-weight's main kernel always sums grad-bias; its finalize writes it or not.
        let main_epilogue = if problem.pass == Pass::Wgrad {
            Epilogue::NONE
        } else {
            epilogue
        };
        let expr = with_epilogue(
            &variant.specialization(&kernel_spec, config)?,
            &main_epilogue,
        );
        let mut out = vec![(
            variant.name(),
            variant.source(),
            expr,
            variant.launch(&kernel_spec, config, sms)?,
        )];
        if problem.pass == Pass::Dgrad && variant.pass() == Pass::Forward {
            let (name, source, expr) = flip_specialization(spec);
            out.push((
                name,
                source,
                with_epilogue(&expr, &Epilogue::NONE),
                crate::variants::grid_stride_launch(spec.weight_len() as u64, 256, 4, sms),
            ));
        }
        if let Some(f) = variant.finalize_kernel(&kernel_spec, config, sms)? {
            out.push((
                f.name,
                f.source,
                with_epilogue(&f.expr, &epilogue),
                f.launch,
            ));
        }
        if kernel_spec.layout() != spec.layout() {
            for output_shaped in [false, true] {
                let (name, source, expr, launch) =
                    to_channels_first_specialization(spec, kernel_spec.c(), output_shaped, sms);
                out.push((name, source, with_epilogue(&expr, &Epilogue::NONE), launch));
            }
        }
        if variant.needs_repair() {
            let (name, source, expr) = repair_specialization(&kernel_spec);
            let planes = (kernel_spec.n() * kernel_spec.c() * kernel_spec.output3()[0]) as u64;
            let launch = Launch {
                // Small: without a flag every block just reads it and leaves.
                grid: (planes.min(sms as u64).max(1) as u32, 1, 1),
                block: (256, 1, 1),
                shared_bytes: 0,
            };
            out.push((name, source, with_epilogue(&expr, &epilogue), launch));
        }
        Ok(out)
    }

    pub(crate) fn load(
        dev: &Arc<CudaDevice>,
        problem: &ConvProblem,
        config: &Config,
        copy_bytes: &dyn Fn() -> usize,
    ) -> Result<Self> {
        let sms = dev.info().sms;
        let spec = &problem.spec;
        // Asked at most once: it may read the free memory, which moves between asks, and
        // `resolve` and `kernels` must agree on the chunk.
        let asked = std::cell::OnceCell::new();
        let copy_bytes = &|| *asked.get_or_init(copy_bytes);
        let (variant, kernel_spec, _) = Self::resolve(problem, config, copy_bytes)?;
        let mut kernels = Self::kernels(problem, config, sms, copy_bytes)?.into_iter();
        let mut next = || -> Result<LoadedKernel> {
            let (name, source, expr, launch) = kernels.next().ok_or_else(|| {
                not_applicable(variant, problem, "a kernel of the plan is missing".into())
            })?;
            dev.load(name, source, &expr, launch)
        };
        let instance = Instance::new(&kernel_spec, config.clone());
        // In the order `kernels` lists them.
        let kernel = next()?;
        let mut workspace_bytes = variant.workspace_bytes(&kernel_spec, config)?;
        let lowering = match (problem.pass, variant.pass()) {
            (Pass::Forward, _) => Lowering::Forward,
            (Pass::Dgrad, Pass::Forward) => {
                let flip = next()?;
                // The flipped weight, 256-byte aligned after any workspace of the kernel.
                let offset = workspace_bytes.div_ceil(256) * 256;
                workspace_bytes = offset + spec.weight_len() * spec.dtype().size_bytes();
                Lowering::DgradFlipped {
                    twin: Box::new(kernel_spec.clone()),
                    flip,
                    offset: offset as u64,
                }
            }
            (Pass::Dgrad, _) => Lowering::Dgrad,
            (Pass::Wgrad, _) if kernel_spec.layout() != spec.layout() => {
                let finalize = next()?;
                let e = spec.dtype().size_bytes();
                // The two copies, 256-byte aligned after the kernel's partials.
                let input_at = workspace_bytes.div_ceil(256) * 256;
                let grad_at = (input_at + kernel_spec.input_len() * e).div_ceil(256) * 256;
                workspace_bytes = grad_at + kernel_spec.output_len() * e;
                Lowering::WgradOnCopies(Box::new(OnCopies {
                    finalize,
                    input: next()?,
                    grad: next()?,
                    chunk: kernel_spec.clone(),
                    input_at: input_at as u64,
                    grad_at: grad_at as u64,
                }))
            }
            (Pass::Wgrad, _) => Lowering::Wgrad { finalize: next()? },
        };
        let repair = if variant.needs_repair() {
            let flag = dev.alloc(4)?;
            let at = dev.device_ptr(&flag);
            Some((next()?, flag, at))
        } else {
            None
        };
        Ok(CudaPlan {
            dev: Arc::clone(dev),
            tensor_maps: variant.tensor_maps(&kernel_spec, config),
            encoded_maps: Mutex::new(None),
            instance,
            kernel,
            repair,
            lowering,
            workspace_bytes,
            epoch: AtomicU32::new(0),
        })
    }

    /// The main kernel's argument block for `ptrs` (the workspace at `ws`).
    pub(crate) fn main_args(
        &self,
        problem: &ConvProblem,
        ptrs: &ConvPointers,
        ws: u64,
    ) -> Result<(ConvArgs, EpiArgs)> {
        let spec = &problem.spec;
        let none = EpiArgs {
            bias: 0,
            residual: 0,
        };
        Ok(match &self.lowering {
            Lowering::Forward => (
                ConvArgs::new(spec, ptrs.x, ptrs.w, ptrs.y)?,
                EpiArgs {
                    bias: ptrs.bias,
                    residual: ptrs.residual,
                },
            ),
            Lowering::DgradFlipped { twin, offset, .. } => (
                ConvArgs::new(twin, ptrs.grad_output, ws + offset, ptrs.grad_input)?,
                none,
            ),
            Lowering::Dgrad => (
                ConvArgs::new(spec, ptrs.grad_output, ptrs.w, ptrs.grad_input)?,
                none,
            ),
            Lowering::Wgrad { .. } => (ConvArgs::new(spec, ptrs.x, ptrs.grad_output, ws)?, none),
            Lowering::WgradOnCopies(c) => (
                ConvArgs::new(&c.chunk, ws + c.input_at, ws + c.grad_at, ws)?,
                none,
            ),
        })
    }

    /// The launches of one call on `stream`.
    pub(crate) fn launch(
        &self,
        problem: &ConvProblem,
        ptrs: &ConvPointers,
        stream: CUstream,
    ) -> Result<()> {
        self.dev.bind().cuda("cuCtxSetCurrent")?;
        let owned = if ptrs.workspace == 0 && self.workspace_bytes > 0 {
            // SAFETY: a stream-ordered allocation on the caller's stream, freed on it
            // after the launches that use it.
            Some(
                unsafe { cudarc::driver::result::malloc_async(stream, self.workspace_bytes) }
                    .cuda("cuMemAllocAsync")?,
            )
        } else {
            None
        };
        let ws = owned.unwrap_or(ptrs.workspace);
        let result = self.launch_with(problem, ptrs, ws, stream);
        if let Some(p) = owned {
            // SAFETY: `p` came from malloc_async above; later work on `stream` is
            // ordered after the kernels that read it.
            unsafe { cudarc::driver::result::free_async(p, stream) }.cuda("cuMemFreeAsync")?;
        }
        result
    }

    /// The main kernel's tensor maps for `args` (`shaped`: the output-shaped tensor),
    /// encoded once per pair of pointers.
    fn maps_for(&self, spec: &ConvSpec, args: &ConvArgs, shaped: u64) -> Result<Option<TmaMaps>> {
        let encode = |input: [u32; 3], output, swizzled| {
            TmaMaps::encode(
                args,
                spec.dtype().size_bytes(),
                input,
                shaped,
                output,
                swizzled,
            )
        };
        let maps = match self.tensor_maps {
            None => return Ok(None),
            Some(TensorMaps::Unused) => return Ok(Some(TmaMaps::UNUSED)),
            Some(m) => m,
        };
        let key = (args.x, shaped);
        let mut last = self.encoded_maps.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((k, encoded)) = *last {
            if k == key {
                return Ok(Some(encoded));
            }
        }
        let maps = match maps {
            TensorMaps::Unused => TmaMaps::UNUSED,
            TensorMaps::Boxes {
                input,
                output,
                output_swizzled,
            } => encode(input, output, output_swizzled)?,
            TensorMaps::ChannelsLast {
                input,
                output,
                input_swizzled,
            } => TmaMaps::encode_channels_last(
                args,
                spec.dtype().size_bytes(),
                input,
                shaped,
                output,
                input_swizzled,
            )?,
        };
        *last = Some((key, maps));
        Ok(Some(maps))
    }

    fn launch_with(
        &self,
        problem: &ConvProblem,
        ptrs: &ConvPointers,
        ws: u64,
        stream: CUstream,
    ) -> Result<()> {
        let spec = &problem.spec;
        let none = EpiArgs {
            bias: 0,
            residual: 0,
        };
        let (mut args, epi) = self.main_args(problem, ptrs, ws)?;
        if let Some((_, _, flag)) = &self.repair {
            args.flag = *flag;
            let e = self.epoch.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
            args.epoch = e.max(1);
        }
        // SAFETY: run_raw's caller vouches for the stream and the pointers in `ptrs`;
        // the flag and the workspace are the plan's or the call's own buffers, sized
        // by the plan.
        unsafe {
            if let Lowering::DgradFlipped { flip, offset, .. } = &self.lowering {
                let f = ConvArgs::new(spec, 0, ptrs.w, ws + offset)?;
                self.dev.launch_on(flip, &f, &none, None, stream)?;
            }
            // A grad-weight kernel's output-shaped tensor is grad-output.
            let shaped = match self.lowering {
                Lowering::Wgrad { .. } | Lowering::WgradOnCopies(_) => args.w,
                _ => args.y,
            };
            let maps = self.maps_for(spec, &args, shaped)?;
            if let Lowering::WgradOnCopies(c) = &self.lowering {
                // Chunk by chunk: the copies, the kernel, the finalize into the chunk's
                // rows of grad-weight (and grad-bias). Stream order keeps a chunk's copies
                // from overwriting what the last chunk's kernel reads.
                let e = spec.dtype().size_bytes() as u64;
                let at = |ptr: u64, elems: u64| if ptr == 0 { 0 } else { ptr + elems * e };
                for c0 in (0..spec.c()).step_by(c.chunk.c()).map(|c0| c0 as u64) {
                    let copy = ConvArgs::new(spec, at(ptrs.x, c0), 0, ws + c.input_at)?;
                    self.dev.launch_on(&c.input, &copy, &none, None, stream)?;
                    let copy = ConvArgs::new(spec, at(ptrs.grad_output, c0), 0, ws + c.grad_at)?;
                    self.dev.launch_on(&c.grad, &copy, &none, None, stream)?;
                    self.dev
                        .launch_on(&self.kernel, &args, &epi, maps.as_ref(), stream)?;
                    let f = ConvArgs::new(
                        &c.chunk,
                        ws,
                        at(ptrs.grad_bias, c0),
                        at(ptrs.grad_weight, c0 * spec.taps() as u64),
                    )?;
                    self.dev
                        .launch_dependent_on(&c.finalize, &f, &none, stream)?;
                }
                return Ok(());
            }
            self.dev
                .launch_on(&self.kernel, &args, &epi, maps.as_ref(), stream)?;
            if let Some((r, _, _)) = &self.repair {
                self.dev.launch_on(r, &args, &epi, None, stream)?;
            }
            if let Lowering::Wgrad { finalize } = &self.lowering {
                let f = ConvArgs::new(spec, ws, ptrs.grad_bias, ptrs.grad_weight)?;
                self.dev.launch_dependent_on(finalize, &f, &none, stream)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{ConvParams, Layout};

    #[test]
    fn copies_come_in_chunks_of_a_divisor_of_the_channels() {
        let mut p = ConvParams::seed();
        p.layout = Layout::ChannelsLast;
        let seed = p.validate().unwrap();
        // 864 KB of copies a channel (bf16, 61 x 45 x 80 in, 59 x 45 x 80 out).
        let per_channel = (seed.input_len() + seed.output_len()) / 512 * 2;
        assert_eq!(per_channel, 864_000);
        assert_eq!(copy_chunk(&seed, COPY_BYTES), 512);
        assert_eq!(copy_chunk(&seed, 100 * per_channel), 64);
        assert_eq!(copy_chunk(&seed, 64 * per_channel), 64);
        assert_eq!(copy_chunk(&seed, 63 * per_channel), 32);
        assert_eq!(copy_chunk(&seed, 0), 1);
        p.c = 97;
        let prime = p.validate().unwrap();
        assert_eq!(copy_chunk(&prime, 96 * per_channel), 1);
        assert_eq!(copy_chunk(&prime, 97 * per_channel), 97);
    }
}
