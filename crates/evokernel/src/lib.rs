//! evokernel: verified, measured and tuned depthwise convolution kernels.
//!
//! One runtime path: an [`Engine`] (CUDA or CPU) turns a [`ConvProblem`] (a validated
//! [`ConvSpec`] and a fused [`Epilogue`]) into a [`Plan`], and a plan runs on host tensors,
//! on device buffers, or on raw device pointers and a foreign stream
//! ([`Plan::run_raw`], what PyTorch's op uses). Plans are cached per problem; the kernel
//! is chosen forced > tuned > ranked and compiled once through the CUBIN cache.
//!
//! ```
//! use evokernel::{Activation, ConvParams, ConvProblem, Engine, Epilogue, HostTensor};
//!
//! // A depthwise 2-D convolution, NHWC f32, 3x3, padding 1, with bias and GELU fused.
//! let spec = ConvParams {
//!     n: 2,
//!     c: 8,
//!     input: vec![12, 10],
//!     kernel: vec![3, 3],
//!     stride: vec![],
//!     dilation: vec![],
//!     padding: vec![[1, 1]],
//!     layout: evokernel::Layout::ChannelsLast,
//!     dtype: evokernel::DType::F32,
//! }
//! .validate()?;
//! let problem = ConvProblem::new(spec.clone()).with_epilogue(Epilogue {
//!     bias: true,
//!     activation: Activation::GeluTanh,
//!     residual: false,
//! });
//! let engine = Engine::auto(); // the GPU when there is one, else the CPU
//! let plan = engine.plan(&problem)?;
//! let x = HostTensor::random_normal(spec.dtype(), &spec.input_shape(), 1);
//! let w = HostTensor::random_normal(spec.dtype(), &spec.weight_shape(), 2);
//! let b = HostTensor::random_normal(spec.dtype(), &[spec.c()], 3);
//! let y = plan.run_host(&x, &w, Some(&b), None)?;
//!
//! // The f64 oracle agrees.
//! let mut want = evokernel::reference::conv_reference(&spec, &x, &w)?;
//! evokernel::epilogue::epilogue_reference(&spec, &problem.epilogue, &mut want, Some(&b), None)?;
//! assert!(evokernel::compare(&y, &want)?.passes(spec.dtype()));
//! # Ok::<(), evokernel::Error>(())
//! ```
//!
//! Data flows one way: [`spec`] describes the problem, [`reference`] holds the f64
//! oracle, the backends ([`cpu`], [`cuda`]) and the kernels ([`variants`]) compute it,
//! [`tune`] and [`dispatch`] choose, [`engine`] plans and runs, and [`verify`],
//! [`bench`], [`session`] and [`profile`] check and measure exactly those plans.

pub mod backend;
pub mod bench;
pub mod cache;
pub mod cpu;
pub mod cuda;
pub mod dense;
pub mod dispatch;
pub mod engine;
pub mod epilogue;
pub mod error;
pub mod external;
pub mod gemm;
pub mod memory;
pub mod pass;
pub mod profile;
pub mod reference;
pub mod session;
pub mod spec;
pub mod suite;
pub mod tensor;
pub mod tune;
pub mod variants;
pub mod verify;
#[cfg(feature = "vulkan")]
pub mod vulkan;

pub use engine::{ConvProblem, Engine, Plan};
pub use epilogue::{Activation, Epilogue};
pub use error::{Error, Result};
pub use pass::Pass;
pub use spec::{ConvParams, ConvSpec, DType, Layout};
pub use tensor::{compare, Comparison, HostTensor};
