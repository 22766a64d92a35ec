//! The fp8 scaled GEMM, evokernel's second kind of problem (issue 18): the problem
//! (`spec`), the e4m3 element (`fp8`), B prepacked for the kernels (`pack`), and the f64
//! oracle with the CPU backend's GEMM and the accuracy gate (`reference`), and the first
//! GPU kernel's descriptor (`mma`: warp-level MMA, compiled in CI) and its runner on a
//! CUDA device (`run`), measured against cuBLASLt in the same call (`bench`, with
//! `cuda::cublaslt`). The wgmma kernels come next.

pub mod bench;
pub mod fp8;
pub mod kernel;
pub mod mma;
pub mod pack;
pub mod reference;
pub mod run;
pub mod spec;
pub mod tune;
pub mod wgmma;

pub use bench::{bench_scaled_mm, GemmCandidate, GemmCase, GemmReference};
pub use fp8::{E4m3, E4M3_MAX};
pub use kernel::GemmKernel;
pub use mma::MmaConfig;
pub use pack::PackedB;
pub use reference::{
    gemm_gate, gemm_gate_at, sample_positions, scaled_mm_cpu, scaled_mm_reference,
    scaled_mm_reference_at, GemmVerdict, ScaledMmData,
};
pub use run::ScaledMmRun;
pub use spec::{gemm_suite, load_gemm_suite, ScaledMmSpec, Scaling, GEMM_SUITE, SCALE_BLOCK};
pub use wgmma::WgmmaConfig;
