//! Finding the CUDA pieces evokernel loads at run time: NVRTC (and its headers) may live
//! in a toolkit, in Python wheels, or in `.nvrtc/` of this checkout (what CI installs).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Candidate CUDA roots, in order: `$CUDA_HOME`, `$CUDA_PATH`, this checkout's
/// `.nvrtc/nvidia/cu13` (installed by scripts/install-nvrtc.sh), `/usr/local/cuda`,
/// and the `nvidia/cu13` folder of Python wheels next to any `python3*` site-packages.
pub fn cuda_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(v) = std::env::var_os(var) {
            roots.push(PathBuf::from(v));
        }
    }
    roots.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.nvrtc/nvidia/cu13"));
    if let Ok(exe) = std::env::current_exe() {
        // A staged binary (.gpu/evokernel) looks beside itself too.
        if let Some(dir) = exe.parent() {
            roots.push(dir.join("../.nvrtc/nvidia/cu13"));
        }
    }
    roots.push(PathBuf::from("/usr/local/cuda"));
    for base in ["/usr/lib", "/usr/local/lib", "/opt/torch/.venv/lib"] {
        if let Ok(entries) = std::fs::read_dir(base) {
            for e in entries.flatten() {
                let name = e.file_name();
                if name.to_string_lossy().starts_with("python3") {
                    for sub in ["site-packages", "dist-packages"] {
                        roots.push(e.path().join(sub).join("nvidia/cu13"));
                    }
                }
            }
        }
    }
    roots.retain(|r| r.is_dir());
    roots
}

/// The folder holding `cuda_bf16.h`, or an error listing where it looked.
pub fn cuda_include_dir() -> Result<PathBuf> {
    let roots = cuda_roots();
    roots
        .iter()
        .map(|r| r.join("include"))
        .find(|d| d.join("cuda_bf16.h").is_file())
        .ok_or_else(|| Error::BackendUnavailable {
            backend: "nvrtc".into(),
            reason: format!(
                "cuda_bf16.h not found under {:?}/include; set CUDA_HOME or run scripts/install-nvrtc.sh",
                roots
            ),
        })
}

static NVRTC: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
static CUBLASLT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();

/// Makes a CUDA library loadable: if the loader path has none (`present` says), loads
/// the first `soname` found under the CUDA roots by absolute path (after `first`, the
/// libraries it dlopens by soname itself), so that cudarc's later `dlopen(soname)` finds
/// it. Returns the library used.
fn ensure_library(
    soname: &str,
    first: &[&str],
    present: impl FnOnce() -> bool,
) -> std::result::Result<PathBuf, String> {
    if present() {
        return Ok(PathBuf::from(format!("{soname} (loader path)")));
    }
    let roots = cuda_roots();
    for root in &roots {
        for lib in ["lib64", "lib"] {
            let path = root.join(lib).join(soname);
            if !path.is_file() {
                continue;
            }
            for dep in first {
                // SAFETY: loading CUDA libraries runs their initializers, which are sound.
                if let Ok(b) = unsafe { libloading::Library::new(root.join(lib).join(dep)) } {
                    std::mem::forget(b);
                }
            }
            // SAFETY: as above.
            return match unsafe { libloading::Library::new(&path) } {
                Ok(l) => {
                    std::mem::forget(l); // stays loaded for the process
                    Ok(path)
                }
                Err(e) => Err(format!("{}: {e}", path.display())),
            };
        }
    }
    Err(format!(
        "{soname} is not on the loader path nor under {roots:?}/lib64; set CUDA_HOME or LD_LIBRARY_PATH"
    ))
}

/// Makes NVRTC loadable (its builtins first: NVRTC dlopens them by soname at compile
/// time). Returns the library used.
pub fn ensure_nvrtc() -> Result<PathBuf> {
    NVRTC
        .get_or_init(|| {
            ensure_library("libnvrtc.so.13", &["libnvrtc-builtins.so.13.0"], || {
                // SAFETY: only probes whether a library can be opened.
                unsafe { cudarc::nvrtc::sys::is_culib_present() }
            })
            .map_err(|e| format!("{e}, or run scripts/install-nvrtc.sh"))
        })
        .clone()
        .map_err(|reason| Error::BackendUnavailable {
            backend: "nvrtc".into(),
            reason,
        })
}

/// Makes cuBLASLt loadable (libcublas first, which it links). Returns the library used.
pub fn ensure_cublaslt() -> Result<PathBuf> {
    CUBLASLT
        .get_or_init(|| {
            ensure_library("libcublasLt.so.13", &["libcublas.so.13"], || {
                // SAFETY: only probes whether a library can be opened.
                unsafe { cudarc::cublaslt::sys::is_culib_present() }
            })
        })
        .clone()
        .map_err(|reason| Error::BackendUnavailable {
            backend: "cublaslt".into(),
            reason,
        })
}

/// NVRTC's version, e.g. (13, 0).
pub fn nvrtc_version() -> Result<(i32, i32)> {
    ensure_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded; the pointers are valid for the call.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(Error::Cuda {
            call: "nvrtcVersion".into(),
            name: format!("{r:?}"),
        });
    }
    Ok((major, minor))
}
