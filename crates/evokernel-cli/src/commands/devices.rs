//! `evokernel devices`: the CUDA GPUs and Vulkan devices, or why there are none, and the
//! libraries found.

use std::path::PathBuf;

use evokernel::Error;

use crate::args::check_output_path;
use crate::output::write_json_or_keep;
use crate::table;

/// Lists what it finds; exits 0 with or without a GPU.
pub fn run(json: Option<PathBuf>) -> Result<bool, Error> {
    if let Some(path) = &json {
        check_output_path(path)?;
    }
    let survey = evokernel::cuda::survey();
    if survey.gpus.is_empty() {
        println!(
            "no CUDA GPU: {}",
            survey.cuda_unavailable.as_deref().unwrap_or("none found")
        );
    } else {
        println!("{}", table::devices(&survey.gpus));
    }
    match &survey.vulkan_unavailable {
        Some(why) => println!("no Vulkan: {why}"),
        None => {
            for d in &survey.vulkan {
                println!(
                    "Vulkan {}: {} ({}), API {}, {}, {} B shared a workgroup, {} invocations a workgroup, subgroup {}, {} B push constants, 16-bit storage {}",
                    d.index,
                    d.name,
                    d.kind,
                    d.api_version,
                    match d.compute_units {
                        Some(n) => format!("{n} multiprocessors"),
                        None => "multiprocessors not reported".to_string(),
                    },
                    d.max_shared_bytes,
                    d.max_workgroup_invocations,
                    d.subgroup_size,
                    d.max_push_constant_bytes,
                    if d.storage_f16 { "yes (f16 kernels)" } else { "no (f32 only)" }
                );
                println!(
                    "  cooperative matrices: {}; dense_coopmat {}",
                    if d.cooperative_matrix.is_empty() {
                        "none".to_string()
                    } else {
                        d.cooperative_matrix.join(", ")
                    },
                    if d.coopmat_f16 {
                        "runs (features enabled)"
                    } else {
                        "does not run here"
                    }
                );
                match &d.workgroup_matrices {
                    Some(m) => println!(
                        "  workgroup-scope matrices: {m}; dense_coopmat2 and dense_winograd_coopmat2 run"
                    ),
                    None => println!(
                        "  workgroup-scope matrices: none (no VK_NV_cooperative_matrix2 with \
                         workgroup scope and flexible dimensions); dense_coopmat2 does not run here"
                    ),
                }
            }
        }
    }
    println!(
        "NVRTC {}, cuDNN {}, CPU backend {}",
        survey.nvrtc_version.as_deref().unwrap_or("not found"),
        survey.cudnn_version.as_deref().unwrap_or("not found"),
        survey.cpu_backend
    );
    if let Some(path) = json {
        write_json_or_keep(&path, &survey);
    }
    Ok(true)
}
