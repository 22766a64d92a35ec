//! Dense and grouped convolution (issue 19): the problem the Vulkan backend takes beyond
//! depthwise. `groups = 1` is a dense convolution, `1 < groups < channels` a grouped one
//! (ResNeXt), and `groups = in = out channels` the depthwise convolution the rest of
//! evokernel serves (the oracle here agrees with the depthwise oracle there, tested).
//!
//! - `spec`: [`DenseConvSpec`] (a depthwise [`crate::ConvSpec`]'s geometry plus output
//!   channels and groups), its shapes, FLOPs, bytes and key; the dense suite.
//! - `reference`: the f64 oracle.
//! - `cpu`: the CPU backend (f32 accumulation, rayon), the reference for CI.
//! - `bench`: verify then time the CPU backend and the Vulkan shaders on a case.
//! - `tune`: the Vulkan direct shader's configs searched, the best in `tune.json`.

#[cfg(feature = "vulkan")]
pub mod bench;
pub mod cpu;
pub mod reference;
pub mod spec;
#[cfg(feature = "vulkan")]
pub mod tune;

pub use cpu::conv_dense_cpu;
pub use reference::{dense_reference, dense_reference_at};
pub use spec::{dense_suite, load_dense_suite, DenseCase, DenseConvSpec, DENSE_SUITE};
