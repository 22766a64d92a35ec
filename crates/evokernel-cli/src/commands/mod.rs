//! One module per command; each turns parsed flags into library calls and prints.

pub mod dense;
pub mod devices;
pub mod gemm;
pub mod measure;
pub mod plot;
pub mod profile;
pub mod tune;
