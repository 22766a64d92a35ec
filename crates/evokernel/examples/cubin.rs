//! Writes the CUBIN of one kernel specialization, for reading its resource usage and
//! SASS without a GPU (scripts/sass.sh runs cuobjdump on it).
//!
//! Usage: cargo run --release --example cubin -- CASE VARIANT[:k=v,..] OUT.cubin
//! (CASE is a case of the public or channels-last suite; without `:k=v` the variant's default config).

use evokernel::cuda::jit::Jit;
use evokernel::suite::{channels_last_suite, public_suite};
use evokernel::variants::{registry, Config};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [case, config, out] = args.as_slice() else {
        return Err("usage: cubin CASE VARIANT[:k=v,..] OUT.cubin".into());
    };
    let spec = public_suite()?
        .into_iter()
        .chain(channels_last_suite()?)
        .find(|c| &c.name == case)
        .ok_or_else(|| format!("no case '{case}' in the public or channels-last suite"))?
        .spec;
    let name = config.split(':').next().unwrap_or_default();
    let v = registry()
        .into_iter()
        .find(|v| v.name() == name)
        .ok_or_else(|| format!("no variant '{name}'"))?;
    let config: Config = if config.contains(':') {
        config.parse()?
    } else {
        v.default_config(&spec)
    };
    let expr = v.specialization(&spec, &config)?;
    let compiled = Jit::new("sm_90")?
        .without_cache()
        .compile(v.name(), v.source(), &expr)?;
    std::fs::write(out, &compiled.cubin)?;
    println!("{expr} -> {out} ({} bytes)", compiled.cubin.len());
    Ok(())
}
