//! GPU tests: run on the H100 machine (../shared/tools/gpu-stage, then
//! .gpu/run-tests.sh). Every variant against the oracle on every public-suite case it
//! applies to and on random small specs; cuDNN checked like any variant.

use evokernel::backend::{ConvRun, Problem};
use evokernel::cuda::cudnn::CudnnRun;
use evokernel::cuda::run::{DeviceProblem, KernelRun};
use evokernel::cuda::{list_devices, CudaDevice};
use evokernel::suite::public_suite;
use evokernel::tensor::SplitMix64;
use evokernel::variants::registry;
use evokernel::verify::{check, oracle};
use evokernel::{ConvParams, ConvSpec, DType, Layout};

fn verify_all(dev: &CudaDevice, name: &str, spec: &ConvSpec, seed: u64, with_cudnn: bool) {
    let problem = Problem::random(spec, seed, 1);
    let reference = oracle(&problem).unwrap();
    let dp = DeviceProblem::upload(dev, &problem).unwrap();
    for v in registry() {
        if let Err(why) = v.applies(spec) {
            eprintln!("{name}: {} does not apply: {why}", v.name());
            continue;
        }
        let cfg = v.default_config(spec);
        let mut run = KernelRun::new(&dp, v, &cfg).unwrap_or_else(|e| panic!("{name} {cfg}: {e}"));
        let verdict = check(&mut run, &problem, &reference).unwrap();
        assert!(
            verdict.passed,
            "{name} ({spec}) {cfg} seed {seed}: {:?}",
            verdict.comparison
        );
    }
    if with_cudnn {
        match CudnnRun::new(&dp) {
            Ok(mut b) => {
                let verdict = check(&mut b, &problem, &reference).unwrap();
                assert!(
                    verdict.passed,
                    "{name} cudnn ({}): {:?}",
                    b.algorithm(),
                    verdict.comparison
                );
            }
            Err(e) => eprintln!("{name}: cudnn not run: {e}"),
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn devices_are_listed() {
    let list = list_devices().unwrap();
    assert!(!list.is_empty());
    assert!(list[0].sms > 0 && list[0].l2_bytes > 0);
    eprintln!("{list:?}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_variant_passes_the_public_suite() {
    let dev = CudaDevice::open(0).unwrap();
    for case in public_suite().unwrap() {
        verify_all(&dev, &case.name, &case.spec, 11, true);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_variant_passes_random_small_specs() {
    let dev = CudaDevice::open(0).unwrap();
    let mut rng = SplitMix64::new(2026);
    let mut pick = |lo: u64, hi: u64| lo + rng.next_u64() % (hi - lo + 1);
    for i in 0..60 {
        let dims = pick(1, 3) as usize;
        let mut p = ConvParams {
            n: pick(1, 3) as i64,
            c: pick(1, 37) as i64,
            input: vec![],
            kernel: vec![],
            stride: vec![],
            dilation: vec![],
            padding: vec![],
            layout: if pick(0, 1) == 0 {
                Layout::ChannelsFirst
            } else {
                Layout::ChannelsLast
            },
            dtype: DType::ALL[pick(0, 2) as usize],
        };
        for _ in 0..dims {
            let (k, d, s) = (pick(1, 5) as i64, pick(1, 2) as i64, pick(1, 3) as i64);
            let (pb, pa) = (pick(0, 3) as i64, pick(0, 3) as i64);
            let span = d * (k - 1) + 1;
            p.input
                .push((pick(1, 40) as i64).max(span - pb - pa).max(1));
            p.kernel.push(k);
            p.dilation.push(d);
            p.stride.push(s);
            p.padding.push([pb, pa]);
        }
        let spec = p.validate().unwrap();
        verify_all(&dev, &format!("random #{i}"), &spec, i, i % 4 == 0);
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn launches_are_timed_and_outputs_poisoned_first() {
    let dev = CudaDevice::open(0).unwrap();
    let spec = ConvParams::seed().validate().unwrap();
    let problem = Problem::random(&spec, 3, 1);
    let dp = DeviceProblem::upload(&dev, &problem).unwrap();
    let v = registry()[0];
    let mut run = KernelRun::new(&dp, v, &v.default_config(&spec)).unwrap();
    run.poison(0).unwrap();
    let y = run.output(0).unwrap();
    assert!(y.to_f64_vec().iter().all(|v| v.is_nan()));
    let ms = run.launch(0).unwrap();
    assert!(ms > 0.0 && ms.is_finite());
    assert!(run.resources().registers > 0);
}
