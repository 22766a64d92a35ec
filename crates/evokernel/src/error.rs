//! The library's one error type. Each message is a sentence a user can act on.

use std::path::PathBuf;

/// Everything that can go wrong in evokernel, from a bad shape to a missing GPU.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A field of a convolution spec is out of range.
    #[error("invalid {field}: {value} ({expected})")]
    InvalidSpec {
        field: String,
        value: String,
        expected: String,
    },

    /// Some per-dimension lists do not have one entry per spatial dim.
    #[error("{field} has {got} entries but the input has {want} spatial dims; give one entry per spatial dim")]
    DimMismatch {
        field: &'static str,
        got: usize,
        want: usize,
    },

    /// A text (flag, suite field) could not be parsed.
    #[error("cannot parse {what} from '{text}': {expected}")]
    Parse {
        what: &'static str,
        text: String,
        expected: String,
    },

    /// A file could not be read or written.
    #[error("{action} '{path}': {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A suite file is not in the expected format.
    #[error("suite '{path}': {message}")]
    Suite { path: PathBuf, message: String },

    /// A backend cannot run here (no GPU, no driver, not compiled in).
    #[error("backend '{backend}' is not available: {reason}")]
    BackendUnavailable { backend: String, reason: String },

    /// A Vulkan call failed; `result` is the VkResult's name.
    #[error("Vulkan error {result} in {call}")]
    Vulkan { call: &'static str, result: String },

    /// A CUDA call failed; `name` is the CUDA error name.
    #[error("CUDA error {name} in {call}")]
    Cuda { call: String, name: String },

    /// A kernel failed to compile; the compiler's log is attached (`compiler`: NVRTC
    /// for CUDA kernels, glslang for Vulkan shaders).
    #[error("{compiler} could not compile {kernel}:\n{log}")]
    Compile {
        compiler: &'static str,
        kernel: String,
        log: String,
    },

    /// A variant does not support a spec.
    #[error("variant '{variant}' does not apply to {spec}: {reason}")]
    NotApplicable {
        variant: String,
        spec: String,
        reason: String,
    },

    /// Nsight Compute is missing or failed.
    #[error("profiler: {message}")]
    Profiler { message: String },

    /// A plan or a run needs more memory than the host or the device has free.
    #[error("{what} needs {} of {place} memory but only {} is available; use a smaller problem (fewer channels, batch or sizes)", crate::memory::human(*needed), crate::memory::human(*available))]
    OutOfMemory {
        what: String,
        place: &'static str,
        needed: u64,
        available: u64,
    },

    /// A tensor's size or dtype does not match what the spec needs.
    #[error("tensor {what}: expected {expected}, got {got}")]
    TensorMismatch {
        what: &'static str,
        expected: String,
        got: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn invalid(
        field: impl Into<String>,
        value: impl ToString,
        expected: impl Into<String>,
    ) -> Self {
        Error::InvalidSpec {
            field: field.into(),
            value: value.to_string(),
            expected: expected.into(),
        }
    }

    /// A flag or text that did not parse: what it was, the text, what was expected.
    pub fn parse(what: &'static str, text: &str, expected: impl Into<String>) -> Self {
        Error::Parse {
            what,
            text: text.to_string(),
            expected: expected.into(),
        }
    }

    /// Whether the error comes from what the user typed or gave (exit status 2 in the CLI).
    pub fn is_user_input(&self) -> bool {
        matches!(
            self,
            Error::InvalidSpec { .. }
                | Error::DimMismatch { .. }
                | Error::Parse { .. }
                | Error::Suite { .. }
                | Error::NotApplicable { .. }
                | Error::Io { .. }
                | Error::TensorMismatch { .. }
                | Error::OutOfMemory { .. }
        )
    }

    /// The CLI's exit status for this error (README, "Exit status"): 2 for bad input
    /// (a problem too big for memory included), 3 when a backend, device or tool is not
    /// available or failed, 4 for a kernel that does not compile (a defect of evokernel).
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::BackendUnavailable { .. }
            | Error::Cuda { .. }
            | Error::Vulkan { .. }
            | Error::Profiler { .. } => 3,
            Error::Compile { .. } => 4,
            _ => 2,
        }
    }
}
