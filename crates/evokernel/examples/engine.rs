//! The seed problem from nothing but the public API: an `Engine`, its plans, plain and
//! with each fused epilogue, checked against the f64 oracle. On a GPU it also times the
//! seed plan with CUDA events and measures the host time of one plan call against a
//! bare driver launch of the same kernel.
//!
//! cargo run --release -p evokernel --example engine            (GPU if any, else CPU)
//! cargo run --release -p evokernel --example engine -- --cpu

use std::time::Instant;

use evokernel::engine::{ConvBuffers, ConvPointers};
use evokernel::epilogue::epilogue_reference;
use evokernel::reference::conv_reference;
use evokernel::{
    compare, Activation, ConvParams, ConvProblem, Engine, Epilogue, HostTensor, Result,
};

fn main() -> Result<()> {
    let engine = if std::env::args().any(|a| a == "--cpu") {
        Engine::cpu()
    } else {
        Engine::auto()
    };
    let spec = ConvParams::seed().validate()?;
    println!("backend {}; problem {spec}", engine.backend_name());
    let x = HostTensor::random_normal(spec.dtype(), &spec.input_shape(), 1);
    let w = HostTensor::random_normal(spec.dtype(), &spec.weight_shape(), 2);
    let b = HostTensor::random_normal(spec.dtype(), &[spec.c()], 3);
    let r = HostTensor::random_normal(spec.dtype(), &spec.output_shape(), 4);
    let plain = conv_reference(&spec, &x, &w)?;
    let mut failed = false;
    for e in std::iter::once(Epilogue::NONE).chain(with_bias(&Activation::ALL[1..])) {
        let problem = ConvProblem::new(spec.clone()).with_epilogue(e);
        let plan = engine.plan(&problem)?;
        let (bias, res) = (e.bias.then_some(&b), e.residual.then_some(&r));
        let t = Instant::now();
        let y = plan.run_host(&x, &w, bias, res)?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let mut want = plain.clone();
        epilogue_reference(&spec, &e, &mut want, bias, res)?;
        let c = compare(&y, &want)?;
        let ok = c.passes(spec.dtype());
        failed |= !ok;
        println!(
            "{:<22} {:<48} rel L2 {:.2e} {}  (host call {ms:.1} ms, copies included)",
            e.to_string(),
            plan.instance_name(),
            c.rel_l2,
            if ok { "pass" } else { "FAIL" }
        );
    }
    if let Some(dev) = engine.device() {
        gpu_timings(&engine, dev)?;
    }
    if failed {
        std::process::exit(1);
    }
    Ok(())
}

/// Bias + each of `activations`, then bias + SiLU + a residual.
fn with_bias(activations: &[Activation]) -> Vec<Epilogue> {
    let mut v: Vec<Epilogue> = activations
        .iter()
        .map(|&activation| Epilogue {
            bias: true,
            activation,
            residual: false,
        })
        .collect();
    v.push(Epilogue {
        bias: true,
        activation: Activation::Silu,
        residual: true,
    });
    v
}

/// Device time of the dispatch pick (CUDA events, median of 50 after 10 warm-ups) on the
/// seed and two more public cases, plain and with bias + SiLU and with a residual too;
/// then the host time per call.
fn gpu_timings(engine: &Engine, dev: &evokernel::cuda::CudaDevice) -> Result<()> {
    let stream = dev.stream();
    let cases = evokernel::suite::public_suite()?;
    for case in cases
        .iter()
        .filter(|c| ["seed-bf16", "x3d-3x3x3", "seed-f32"].contains(&c.name.as_str()))
    {
        let spec = &case.spec;
        let up = |shape: &[usize], seed| {
            dev.upload(&HostTensor::random_normal(spec.dtype(), shape, seed))
        };
        let (dx, dw) = (up(&spec.input_shape(), 1)?, up(&spec.weight_shape(), 2)?);
        let (db, dr) = (up(&[spec.c()], 3)?, up(&spec.output_shape(), 4)?);
        let mut dy = dev.alloc(spec.output_len() * spec.dtype().size_bytes())?;
        let mut base_ms = 0.0;
        for e in std::iter::once(Epilogue::NONE).chain(with_bias(&Activation::ALL[2..])) {
            let problem = ConvProblem::new(spec.clone()).with_epilogue(e);
            let plan = engine.plan(&problem)?;
            let mut samples = Vec::new();
            for i in 0..60 {
                let ms = dev.time(|| {
                    plan.run(
                        ConvBuffers {
                            x: &dx,
                            w: &dw,
                            y: &mut dy,
                            bias: e.bias.then_some(&db),
                            residual: e.residual.then_some(&dr),
                        },
                        stream,
                    )
                })?;
                if i >= 10 {
                    samples.push(ms);
                }
            }
            samples.sort_by(f64::total_cmp);
            let median = samples[samples.len() / 2];
            if e.is_none() {
                base_ms = median;
            }
            println!(
                "device time {:<10} {:<15} {:.4} ms median (min {:.4}), {:+.1}% vs plain  [{}]",
                case.name,
                e.to_string(),
                median,
                samples[0],
                100.0 * (median / base_ms - 1.0),
                plan.instance_name()
            );
        }
    }

    // Host cost of one call: a small f32 problem (an FMA kernel: one launch, where the
    // tensor-core plans add a repair launch), so the GPU keeps up and the queue never
    // blocks; batches of 200 enqueues timed on the host, synchronized outside.
    let mut p = ConvParams::seed();
    p.c = 8;
    p.input = vec![4, 8, 16];
    p.dtype = evokernel::DType::F32;
    let small = p.validate()?;
    let plan = engine.plan(&ConvProblem::new(small.clone()))?;
    let sx = dev.upload(&HostTensor::random_normal(
        small.dtype(),
        &small.input_shape(),
        5,
    ))?;
    let sw = dev.upload(&HostTensor::random_normal(
        small.dtype(),
        &small.weight_shape(),
        6,
    ))?;
    let sy = dev.alloc(small.output_len() * small.dtype().size_bytes())?;
    let ptrs = ConvPointers {
        x: dev.device_ptr(&sx),
        w: dev.device_ptr(&sw),
        y: dev.device_ptr(&sy),
        ..ConvPointers::default()
    };
    let kernel = plan.cuda_kernel().expect("a GPU plan has a kernel");
    let (args, epi) = plan.kernel_args(&ptrs)?;
    let per_call = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        let mut best = f64::INFINITY;
        for _ in 0..20 {
            let t = Instant::now();
            for _ in 0..200 {
                f()?;
            }
            best = best.min(t.elapsed().as_secs_f64() * 1e6 / 200.0);
            stream.synchronize().map_err(|e| evokernel::Error::Cuda {
                call: "cuStreamSynchronize".into(),
                name: format!("{e:?}"),
            })?;
        }
        Ok(best)
    };
    let cu_stream = stream.cu_stream();
    // SAFETY: the pointers address live buffers sized for `small`.
    let plan_us = per_call(&mut || unsafe { plan.run_raw(&ptrs, cu_stream) })?;
    // SAFETY: the same kernel, arguments and stream as the plan's call.
    let bare_us = per_call(&mut || unsafe { dev.launch_on(kernel, &args, &epi, None, cu_stream) })?;
    let cached_us = {
        let t = Instant::now();
        for _ in 0..1000 {
            engine.plan(&ConvProblem::new(small.clone()))?;
        }
        t.elapsed().as_secs_f64() * 1e6 / 1000.0
    };
    println!(
        "host time per call ({}): plan.run_raw {plan_us:.2} us, bare cuLaunchKernel {bare_us:.2} us, overhead {:.2} us; engine.plan cache hit {cached_us:.2} us",
        plan.instance_name(),
        plan_us - bare_us
    );
    Ok(())
}
