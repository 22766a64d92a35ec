//! GLSL compute shaders to SPIR-V at run time with glslang (the C++ compiler built by the
//! `glslang` crate: cooperative matrices, subgroups, specialization constants, none of
//! which naga's GLSL front end has), cached on disk like the CUBINs
//! (`<cache>/spirv/<name>-<hash>.spv`, the hash over the source and the target).

use crate::cache::{cache_dir, stable_hash, write_atomic};
use crate::error::{Error, Result};

/// What every cached SPIR-V depends on besides its source (a new target or compiler
/// changes it).
const TARGET: &str = "vulkan1.1-spirv1.3-glslang0.6";
/// The target of shaders that need SPIR-V 1.6 ([`needs_spirv16`]).
const TARGET_16: &str = "vulkan1.3-spirv1.6-glslang0.6";

/// Whether `source` needs SPIR-V 1.6 (Vulkan 1.3): glslang compiles
/// `GL_NV_cooperative_matrix2` (workgroup-scope matrices, tensor addressing) for no lower
/// target. Every other shader stays at SPIR-V 1.3, which lavapipe and every current
/// driver take.
pub fn needs_spirv16(source: &str) -> bool {
    source.contains("#extension GL_NV_cooperative_matrix2")
}

/// SPIR-V words of a compute shader, from the disk cache when it has them; `name` labels
/// errors and cache files. The bool says whether they came from the cache.
pub fn compile_compute_cached(name: &str, source: &str) -> Result<(Vec<u32>, bool)> {
    let path = cache_dir().join("spirv").join(format!(
        "{name}-{}.spv",
        stable_hash(&[
            source.as_bytes(),
            if needs_spirv16(source) {
                TARGET_16
            } else {
                TARGET
            }
            .as_bytes()
        ])
    ));
    if let Ok(bytes) = std::fs::read(&path) {
        if !bytes.is_empty() && bytes.len() % 4 == 0 {
            let words: Vec<u32> = bytes
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            if words[0] == SPIRV_MAGIC {
                return Ok((words, true));
            }
        }
    }
    let words = compile_compute(name, source)?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    // A cache that cannot be written costs a recompile next time, nothing more.
    let _ = write_atomic(&path, &bytes);
    Ok((words, false))
}

/// A shader's source with its element type defined: after `#version`, the prelude that
/// gives `ELEM` (the buffers' element), `LOAD(v)` (an element to f32) and `STORE(f)` (f32
/// to an element, rounded to nearest even; bf16 keeps NaN a NaN). f16 and bf16 need
/// 16-bit storage (`storageBuffer16BitAccess`); bf16 is stored as its 16 bits.
/// Where the source defines `CV` (1, 2 or 4: elements a load; see [`with_defines`]) the
/// prelude also gives `VEC` (CV floats), `VELEM` (CV elements: one 4-, 8- or 16-byte
/// load), `LOADV(v)` and `STOREV(f)`; where CV is 2 or 4, also `VRAW` (the CV elements'
/// bits in 32-bit words, which registers can hold without 16-bit arithmetic types) and
/// `UNPACKV(r)` (those words to CV floats).
pub(crate) fn with_element(source: &str, dtype: crate::spec::DType) -> String {
    use crate::spec::DType;
    let prelude = match dtype {
        DType::F32 => {
            "#define ELEM float\n#define LOAD(v) (v)\n#define STORE(f) (f)\n\
             #ifdef CV\n#define VELEM VEC\n#define LOADV(v) (v)\n#define STOREV(f) (f)\n\
             #define VRAW VEC\n#define UNPACKV(r) (r)\n#endif\n"
        }
        DType::F16 => {
            "#extension GL_EXT_shader_16bit_storage : require\n\
             #define ELEM float16_t\n#define LOAD(v) float(v)\n#define STORE(f) float16_t(f)\n\
             #ifdef CV\n\
             #if CV == 1\n#define VELEM float16_t\n#elif CV == 2\n#define VELEM f16vec2\n\
             #else\n#define VELEM f16vec4\n#endif\n\
             #define LOADV(v) VEC(v)\n#define STOREV(f) VELEM(f)\n\
             #if CV == 2\n#define VRAW uint\n#define UNPACKV(r) unpackHalf2x16(r)\n\
             #elif CV == 4\n#define VRAW uvec2\n\
             #define UNPACKV(r) vec4(unpackHalf2x16((r).x), unpackHalf2x16((r).y))\n#endif\n\
             #endif\n"
        }
        DType::Bf16 => {
            "#extension GL_EXT_shader_16bit_storage : require\n\
             #define ELEM uint16_t\n\
             #define LOAD(v) uintBitsToFloat(uint(v) << 16)\n\
             #define STORE(f) uint16_t(evk_bf16_bits(f))\n\
             uint evk_bf16_bits(float f) {\n\
             \x20   if (isnan(f)) return 0x7FC0u;\n\
             \x20   const uint u = floatBitsToUint(f);\n\
             \x20   return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;\n\
             }\n\
             #ifdef CV\n\
             uvec2 evk_bf16_bits(vec2 f) { return uvec2(evk_bf16_bits(f.x), evk_bf16_bits(f.y)); }\n\
             uvec4 evk_bf16_bits(vec4 f) { return uvec4(evk_bf16_bits(f.xy), evk_bf16_bits(f.zw)); }\n\
             #if CV == 1\n#define VELEM uint16_t\n#define UVEC uint\n\
             #elif CV == 2\n#define VELEM u16vec2\n#define UVEC uvec2\n\
             #else\n#define VELEM u16vec4\n#define UVEC uvec4\n#endif\n\
             #define LOADV(v) uintBitsToFloat(UVEC(v) << 16)\n\
             #define STOREV(f) VELEM(evk_bf16_bits(f))\n\
             vec2 evk_bf16_pair(uint r) { return uintBitsToFloat(uvec2(r << 16, r & 0xFFFF0000u)); }\n\
             #if CV == 2\n#define VRAW uint\n#define UNPACKV(r) evk_bf16_pair(r)\n\
             #elif CV == 4\n#define VRAW uvec2\n\
             #define UNPACKV(r) vec4(evk_bf16_pair((r).x), evk_bf16_pair((r).y))\n#endif\n\
             #endif\n"
        }
    };
    // `[[unroll]]` (GL_EXT_control_flow_attributes) asks the driver to unroll loops whose
    // trip counts are specialization constants, so the arrays they index stay in
    // registers.
    let vec = "#extension GL_EXT_control_flow_attributes : enable\n#ifdef CV\n#if CV == 1\n#define VEC float\n#elif CV == 2\n#define VEC vec2\n\
               #else\n#define VEC vec4\n#endif\n#endif\n";
    source.replacen(
        "#version 450\n",
        &format!("#version 450\n{vec}{prelude}"),
        1,
    )
}

/// A shader's source with `#define NAME value` lines right after `#version`: applied
/// after [`with_element`], they come ahead of its prelude, which may read them. What
/// specialization constants cannot give, such as a type's width or a shared array that
/// exists or not.
pub(crate) fn with_defines(source: &str, defines: &[(&str, usize)]) -> String {
    let lines: String = defines
        .iter()
        .map(|(name, value)| format!("#define {name} {value}\n"))
        .collect();
    source.replacen("#version 450\n", &format!("#version 450\n{lines}"), 1)
}

/// The first word of every SPIR-V module.
pub const SPIRV_MAGIC: u32 = 0x0723_0203;

/// SPIR-V words of a compute shader (no cache); `name` labels errors.
pub fn compile_compute(name: &str, source: &str) -> Result<Vec<u32>> {
    use glslang::{
        Compiler, CompilerOptions, Shader, ShaderInput, ShaderSource, ShaderStage, SourceLanguage,
        SpirvVersion, Target, VulkanVersion,
    };
    let fail = |log: String| Error::Compile {
        compiler: "glslang",
        kernel: format!("{name} (GLSL compute)"),
        log,
    };
    let compiler = Compiler::acquire().ok_or_else(|| fail("glslang could not start".into()))?;
    let target = if needs_spirv16(source) {
        Target::Vulkan {
            version: VulkanVersion::Vulkan1_3,
            spirv_version: SpirvVersion::SPIRV1_6,
        }
    } else {
        // Vulkan 1.1 / SPIR-V 1.3: what lavapipe and every current driver take.
        Target::Vulkan {
            version: VulkanVersion::Vulkan1_1,
            spirv_version: SpirvVersion::SPIRV1_3,
        }
    };
    let options = CompilerOptions {
        source_language: SourceLanguage::GLSL,
        target,
        ..CompilerOptions::default()
    };
    let source = ShaderSource::from(source);
    let input = ShaderInput::new(
        &source,
        ShaderStage::Compute,
        &options,
        None::<&[(&str, Option<&str>)]>,
        None,
    )
    .map_err(|e| fail(e.to_string()))?;
    let shader = Shader::new(compiler, input).map_err(|e| fail(e.to_string()))?;
    shader.compile().map_err(|e| fail(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_naive_shader_compiles_and_errors_carry_the_log() {
        let words = compile_compute("naive", super::super::naive::SOURCE).unwrap();
        assert_eq!(words[0], SPIRV_MAGIC);
        let e = compile_compute("broken", "#version 450\nvoid main() { undefined_x = 1; }")
            .unwrap_err()
            .to_string();
        assert!(e.contains("broken") && e.contains("undefined_x"), "{e}");
        assert!(e.starts_with("glslang could not compile"), "{e}");
    }

    #[test]
    fn a_second_compile_comes_from_the_disk_cache() {
        // A source no other run compiled: its own cache entry.
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let src = format!(
            "{}\n// cache probe {} {nonce}\n",
            super::super::naive::SOURCE,
            std::process::id()
        );
        let (a, hit_a) = compile_compute_cached("cache-probe", &src).unwrap();
        let (b, hit_b) = compile_compute_cached("cache-probe", &src).unwrap();
        assert!(!hit_a && hit_b);
        assert_eq!(a, b);
    }
}
