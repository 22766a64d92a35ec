//! evokernel: verified, measured and tuned depthwise convolution kernels.
//!
//! Data flows one way: a [`ConvSpec`] describes the problem, [`reference`] holds the f64
//! oracle, backends ([`cpu`]) compute it, and [`verify`] / [`bench`] check and time them.

pub mod backend;
pub mod bench;
pub mod cache;
pub mod cpu;
pub mod cuda;
pub mod dispatch;
pub mod engine;
pub mod epilogue;
pub mod error;
pub mod memory;
pub mod profile;
pub mod reference;
pub mod session;
pub mod spec;
pub mod suite;
pub mod tensor;
pub mod tune;
pub mod variants;
pub mod verify;

pub use engine::{ConvProblem, Engine, Plan};
pub use epilogue::{Activation, Epilogue};
pub use error::{Error, Result};
pub use spec::{ConvParams, ConvSpec, DType, Layout};
pub use tensor::{compare, Comparison, HostTensor};
