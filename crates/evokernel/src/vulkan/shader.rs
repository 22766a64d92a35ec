//! GLSL compute shaders to SPIR-V at run time with glslang (the C++ compiler built by the
//! `glslang` crate: cooperative matrices, subgroups, specialization constants, none of
//! which naga's GLSL front end has).

use crate::error::{Error, Result};

/// SPIR-V words of a compute shader; `name` labels errors.
pub fn compile_compute(name: &str, source: &str) -> Result<Vec<u32>> {
    use glslang::{
        Compiler, CompilerOptions, Shader, ShaderInput, ShaderSource, ShaderStage, SourceLanguage,
        SpirvVersion, Target, VulkanVersion,
    };
    let fail = |log: String| Error::Compile {
        kernel: format!("{name} (GLSL compute)"),
        log,
    };
    let compiler = Compiler::acquire().ok_or_else(|| fail("glslang could not start".into()))?;
    let options = CompilerOptions {
        source_language: SourceLanguage::GLSL,
        // Vulkan 1.1 / SPIR-V 1.3: what lavapipe and every current driver take.
        target: Target::Vulkan {
            version: VulkanVersion::Vulkan1_1,
            spirv_version: SpirvVersion::SPIRV1_3,
        },
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
        assert_eq!(words[0], 0x0723_0203, "SPIR-V magic");
        let e = compile_compute("broken", "#version 450\nvoid main() { undefined_x = 1; }")
            .unwrap_err()
            .to_string();
        assert!(e.contains("broken") && e.contains("undefined_x"), "{e}");
    }
}
