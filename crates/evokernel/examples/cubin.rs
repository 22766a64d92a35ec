//! Writes the CUBIN of one kernel specialization, for reading its resource usage and
//! SASS without a GPU (scripts/sass.sh runs cuobjdump on it).
//!
//! Usage: cargo run --release --example cubin -- CASE VARIANT[:k=v,..] OUT.cubin [EPILOGUE]
//! (CASE is a case of the public, channels-last or models suite; without `:k=v` the variant's
//! default config; EPILOGUE e.g. `bias+silu+res`, default none).
//!
//! The fp8 GEMM's wgmma kernel: CASE is `MxNxK` and the scaling goes where EPILOGUE does,
//! e.g. `cubin 8192x8192x8192 scaled_mm_wgmma:bn=128,consumers=3,.. OUT.cubin blockwise`.
//! The channels-first copy of channels-last grad-weight: VARIANT `to_channels_first:CHUNK`
//! (`:grad` for grad-output's).

use evokernel::cuda::jit::Jit;
use evokernel::engine::with_epilogue;
use evokernel::gemm::{wgmma, ScaledMmSpec, Scaling, WgmmaConfig};
use evokernel::suite::{channels_last_suite, models_suite, public_suite};
use evokernel::variants::{registry, Config};
use evokernel::{Activation, Epilogue};

/// `bias`, `res` and an activation name joined by `+`.
fn parse_epilogue(text: &str) -> Result<Epilogue, Box<dyn std::error::Error>> {
    let mut e = Epilogue::NONE;
    for part in text.split('+').filter(|p| !p.is_empty() && *p != "none") {
        match part {
            "bias" => e.bias = true,
            "res" | "residual" => e.residual = true,
            act => e.activation = act.parse::<Activation>()?,
        }
    }
    Ok(e)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [shape, config, out, rest @ ..] = args.as_slice() {
        if config.starts_with(wgmma::NAME) {
            let scaling = rest.first().map_or("per-tensor", String::as_str);
            return gemm_cubin(shape, config, out, scaling);
        }
    }
    let (case, config, out, epilogue) = match args.as_slice() {
        [c, v, o] => (c, v, o, Epilogue::NONE),
        [c, v, o, e] => (c, v, o, parse_epilogue(e)?),
        _ => return Err("usage: cubin CASE VARIANT[:k=v,..] OUT.cubin [bias+silu+res]".into()),
    };
    let spec = public_suite()?
        .into_iter()
        .chain(channels_last_suite()?)
        .chain(models_suite()?)
        .find(|c| &c.name == case)
        .ok_or_else(|| format!("no case '{case}' in the public, channels-last or models suite"))?
        .spec;
    let name = config.split(':').next().unwrap_or_default();
    if name == "to_channels_first" {
        // `to_channels_first:CHUNK[:grad]`: the channels-first copy of a channels-last case.
        let mut parts = config.split(':').skip(1);
        let chunk = parts.next().unwrap_or("16").parse()?;
        let shaped = parts.next() == Some("grad");
        let (n, src, expr, _) =
            evokernel::cuda::run::to_channels_first_specialization(&spec, chunk, shaped, 132);
        let expr = with_epilogue(&expr, &Epilogue::NONE);
        let compiled = Jit::new("sm_90")?.without_cache().compile(n, src, &expr)?;
        std::fs::write(out, &compiled.cubin)?;
        println!("{expr} -> {out} ({} bytes)", compiled.cubin.len());
        return Ok(());
    }
    let v = registry()
        .into_iter()
        .find(|v| v.name() == name)
        .ok_or_else(|| format!("no variant '{name}'"))?;
    // As --config: the parameters named, the default for the rest.
    let config: Config = if config.contains(':') {
        evokernel::variants::forced_over_default(v, &spec, &config.parse()?)
    } else {
        v.default_config(&spec)
    };
    let expr = with_epilogue(&v.specialization(&spec, &config)?, &epilogue);
    let compiled = Jit::new(&std::env::var("EVOKERNEL_ARCH").unwrap_or_else(|_| "sm_90".into()))?
        .without_cache()
        .compile(v.name(), v.source(), &expr)?;
    std::fs::write(out, &compiled.cubin)?;
    println!("{expr} -> {out} ({} bytes)", compiled.cubin.len());
    Ok(())
}

/// The wgmma GEMM's CUBIN for `MxNxK` under `scaling` (bf16 output, no bias).
fn gemm_cubin(
    shape: &str,
    config: &str,
    out: &str,
    scaling: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let dims: Vec<i64> = shape
        .split('x')
        .map(str::parse)
        .collect::<Result<_, _>>()
        .map_err(|_| format!("'{shape}' is not MxNxK"))?;
    let [m, n, k] = dims[..] else {
        return Err(format!("'{shape}' is not MxNxK").into());
    };
    let scaling: Scaling = scaling.parse()?;
    let spec = ScaledMmSpec::new(m, n, k, scaling, evokernel::DType::Bf16, false)?;
    let wc = if config.contains(':') {
        WgmmaConfig::from_config(&config.parse()?)?
    } else {
        WgmmaConfig::default_for(&spec)
    };
    wc.fits(&spec)?;
    let expr = wc.specialization(&spec);
    let compiled =
        Jit::new("sm_90")?
            .without_cache()
            .compile_for(wgmma::NAME, wgmma::SOURCE, &expr, true)?;
    std::fs::write(out, &compiled.cubin)?;
    println!("{expr} -> {out} ({} bytes)", compiled.cubin.len());
    Ok(())
}
