//! The fp8 scaled GEMM, evokernel's second kind of problem (issue 18): the problem
//! (`spec`), the e4m3 element (`fp8`), B prepacked for the kernels (`pack`), and the f64
//! oracle with the CPU backend's GEMM and the accuracy gate (`reference`), and the first
//! GPU kernel's descriptor (`mma`: warp-level MMA, compiled in CI) and its runner on a
//! CUDA device (`run`). The wgmma kernels, the cuBLASLt baseline and the CLI come next.

pub mod fp8;
pub mod mma;
pub mod pack;
pub mod reference;
pub mod run;
pub mod spec;

pub use fp8::{E4m3, E4M3_MAX};
pub use mma::MmaConfig;
pub use pack::PackedB;
pub use reference::{gemm_gate, scaled_mm_cpu, scaled_mm_reference, GemmVerdict, ScaledMmData};
pub use run::ScaledMmRun;
pub use spec::{gemm_suite, ScaledMmSpec, Scaling, GEMM_SUITE, SCALE_BLOCK};
