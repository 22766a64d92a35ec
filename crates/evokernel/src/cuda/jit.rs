//! Run-time compilation: CUDA C++ sources embedded in the crate, compiled by NVRTC for
//! the device's own arch, one template specialization per config, CUBINs cached on disk
//! keyed by a hash of source, specialization, options, arch and NVRTC version.

use std::ffi::{CStr, CString};
use std::path::PathBuf;
use std::time::Instant;

use cudarc::nvrtc::sys;

use crate::cache::{cache_dir, stable_hash, write_atomic};
use crate::cuda::libs::{cuda_include_dir, ensure_nvrtc, nvrtc_version};
use crate::error::{Error, Result};

/// Shared declarations every kernel source starts with (argument struct, dtype traits).
pub const COMMON_HEADER: &str = include_str!("../../kernels/common.cuh");

/// A compiled specialization, ready to load into a context.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub cubin: Vec<u8>,
    /// The mangled name of the specialization to look up in the module.
    pub symbol: String,
    /// Milliseconds spent: compiling (cache miss) or reading the cache (hit).
    pub millis: f64,
    pub cache_hit: bool,
    /// NVRTC's and ptxas' notes on a fresh compile (e.g. ptxas' C7514 when it serializes
    /// wgmma); empty on a cache hit.
    pub log: String,
}

/// NVRTC for one target arch, with its CUBIN cache.
pub struct Jit {
    arch: String,
    include: PathBuf,
    version: (i32, i32),
    cache: Option<PathBuf>,
}

impl Jit {
    /// `arch` is e.g. `sm_90`. Fails with what is missing when NVRTC or its headers are.
    pub fn new(arch: &str) -> Result<Self> {
        ensure_nvrtc()?;
        Ok(Jit {
            arch: arch.to_string(),
            include: cuda_include_dir()?,
            version: nvrtc_version()?,
            cache: Some(cache_dir().join("kernels")),
        })
    }

    /// The same, never reading or writing the CUBIN cache (to measure cold compiles).
    pub fn without_cache(mut self) -> Self {
        self.cache = None;
        self
    }

    pub fn arch(&self) -> &str {
        &self.arch
    }

    pub fn nvrtc_version(&self) -> (i32, i32) {
        self.version
    }

    /// The arch-specific target (`sm_90` -> `sm_90a`): what wgmma and setmaxnreg need.
    pub fn arch_specific(&self) -> String {
        format!("{}a", self.arch)
    }

    fn options(&self, arch: &str) -> Vec<String> {
        vec![
            format!("--gpu-architecture={arch}"),
            "--std=c++17".into(),
            "-lineinfo".into(),
            "--dopt=on".into(),
            format!("--include-path={}", self.include.display()),
        ]
    }

    /// Compiles `source` (after the common header) and returns the CUBIN of the
    /// specialization `expr`, e.g. `naive_dwconv<__nv_bfloat16, false, 3, 5, 5>`.
    pub fn compile(&self, name: &str, source: &str, expr: &str) -> Result<Compiled> {
        self.compile_for(name, source, expr, false)
    }

    /// `compile`, for the arch-specific target when `arch_specific` (kernels using
    /// sm_90a-only instructions such as wgmma).
    pub fn compile_for(
        &self,
        name: &str,
        source: &str,
        expr: &str,
        arch_specific: bool,
    ) -> Result<Compiled> {
        let start = Instant::now();
        let arch = if arch_specific {
            self.arch_specific()
        } else {
            self.arch.clone()
        };
        let options = self.options(&arch);
        let full = format!("{COMMON_HEADER}\n#line 1 \"{name}.cu\"\n{source}");
        let version = format!("{}.{}", self.version.0, self.version.1);
        let key = stable_hash(&[
            full.as_bytes(),
            expr.as_bytes(),
            options.join(" ").as_bytes(),
            arch.as_bytes(),
            version.as_bytes(),
        ]);
        let paths = self.cache.as_ref().map(|d| {
            (
                d.join(format!("{name}-{key}.cubin")),
                d.join(format!("{name}-{key}.sym")),
            )
        });
        if let Some((cubin, sym)) = &paths {
            if let (Ok(c), Ok(s)) = (std::fs::read(cubin), std::fs::read_to_string(sym)) {
                if !c.is_empty() && !s.is_empty() {
                    return Ok(Compiled {
                        cubin: c,
                        symbol: s,
                        millis: start.elapsed().as_secs_f64() * 1e3,
                        cache_hit: true,
                        log: String::new(),
                    });
                }
            }
        }
        let (cubin, symbol, log) = nvrtc_compile(name, &full, expr, &options)?;
        if let Some((c, s)) = &paths {
            // A cache that cannot be written costs a recompile next time, nothing more.
            let _ = write_atomic(c, &cubin).and_then(|_| write_atomic(s, symbol.as_bytes()));
        }
        Ok(Compiled {
            cubin,
            symbol,
            millis: start.elapsed().as_secs_f64() * 1e3,
            cache_hit: false,
            log,
        })
    }
}

fn nvrtc_err(call: &str, r: sys::nvrtcResult) -> Error {
    Error::Cuda {
        call: call.into(),
        name: format!("{r:?}"),
    }
}

fn check(call: &str, r: sys::nvrtcResult) -> Result<()> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(nvrtc_err(call, r))
    }
}

/// Owns an NVRTC program so it is destroyed on every path.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed only here.
        unsafe {
            sys::nvrtcDestroyProgram(&mut self.0);
        }
    }
}

fn nvrtc_compile(
    name: &str,
    source: &str,
    expr: &str,
    options: &[String],
) -> Result<(Vec<u8>, String, String)> {
    let bad = |what: &str| Error::Compile {
        compiler: "NVRTC",
        kernel: name.to_string(),
        log: format!("{what} contains a NUL byte"),
    };
    let src = CString::new(source).map_err(|_| bad("source"))?;
    let file = CString::new(format!("{name}.cu")).map_err(|_| bad("name"))?;
    let cexpr = CString::new(expr).map_err(|_| bad("name expression"))?;
    let copts: Vec<CString> = options
        .iter()
        .map(|o| CString::new(o.as_str()).map_err(|_| bad("option")))
        .collect::<Result<_>>()?;
    let popts: Vec<*const std::ffi::c_char> = copts.iter().map(|c| c.as_ptr()).collect();
    let mut raw: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: all pointers are valid C strings for the duration of the calls; the
    // program handle is owned by `Program` and freed once.
    unsafe {
        check(
            "nvrtcCreateProgram",
            sys::nvrtcCreateProgram(
                &mut raw,
                src.as_ptr(),
                file.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            ),
        )?;
        let prog = Program(raw);
        check(
            "nvrtcAddNameExpression",
            sys::nvrtcAddNameExpression(prog.0, cexpr.as_ptr()),
        )?;
        let r = sys::nvrtcCompileProgram(prog.0, popts.len() as i32, popts.as_ptr());
        let log = {
            let mut size = 0usize;
            sys::nvrtcGetProgramLogSize(prog.0, &mut size);
            let mut log = vec![0u8; size.max(1)];
            sys::nvrtcGetProgramLog(prog.0, log.as_mut_ptr() as *mut _);
            String::from_utf8_lossy(&log)
                .trim_end_matches('\0')
                .trim()
                .to_string()
        };
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(Error::Compile {
                compiler: "NVRTC",
                kernel: format!("{name} ({expr}, {r:?})"),
                log,
            });
        }
        let mut size = 0usize;
        check(
            "nvrtcGetCUBINSize",
            sys::nvrtcGetCUBINSize(prog.0, &mut size),
        )?;
        let mut cubin = vec![0u8; size];
        check(
            "nvrtcGetCUBIN",
            sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr() as *mut _),
        )?;
        let mut lowered: *const std::ffi::c_char = std::ptr::null();
        check(
            "nvrtcGetLoweredName",
            sys::nvrtcGetLoweredName(prog.0, cexpr.as_ptr(), &mut lowered),
        )?;
        let symbol = CStr::from_ptr(lowered).to_string_lossy().into_owned();
        Ok((cubin, symbol, log))
    }
}
