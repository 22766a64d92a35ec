//! GPU tests: run on the H100 machine (../shared/tools/gpu-stage, then
//! .gpu/run-tests.sh). Every variant against the oracle on every case of the public and
//! channels-last suites it applies to and on random small specs; cuDNN checked like any
//! variant.

use evokernel::backend::{ConvRun, Problem};
use evokernel::cuda::cudnn::CudnnRun;
use evokernel::cuda::run::{DeviceProblem, KernelRun};
use evokernel::cuda::{list_devices, CudaDevice};
use evokernel::suite::{channels_last_suite, public_suite};
use evokernel::tensor::SplitMix64;
use evokernel::variants::registry;
use evokernel::verify::{check, oracle};
use evokernel::{ConvParams, ConvSpec, DType, Layout};

/// Every applicable variant (default config) and optionally cuDNN against the oracle;
/// with `non_finite`, the inputs carry a NaN, a +Inf and a -Inf, which must reach
/// exactly the outputs the oracle says (cuDNN is not held to that).
fn verify_all(
    dev: &CudaDevice,
    name: &str,
    spec: &ConvSpec,
    seed: u64,
    with_cudnn: bool,
    non_finite: bool,
) -> usize {
    let mut problem = Problem::random(spec, seed, 1);
    if non_finite {
        problem.inject_non_finite(seed);
    }
    let mut checked = 0;
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
            "{name} ({spec}) {cfg} seed {seed}{}: {:?}",
            if non_finite {
                " with NaN/Inf inputs"
            } else {
                ""
            },
            verdict.comparison
        );
        checked += 1;
    }
    if with_cudnn && !non_finite {
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
    checked
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
fn every_variant_passes_the_public_and_channels_last_suites() {
    let dev = CudaDevice::open(0).unwrap();
    for case in public_suite()
        .unwrap()
        .into_iter()
        .chain(channels_last_suite().unwrap())
    {
        verify_all(&dev, &case.name, &case.spec, 11, true, false);
        verify_all(&dev, &case.name, &case.spec, 12, false, true);
    }
}

/// Seeded random specs over every dimension issue 5 names: 1-3 dims, strides,
/// dilations, asymmetric padding, batch, C from 1 to 130 (not only multiples of 8),
/// tiny and degenerate sizes (inputs of 1, kernels as wide as the padded input), wide
/// rows that cross several tiles, both layouts, three dtypes. Two thirds have unit
/// stride and dilation, the tensor-core paths' domain.
fn random_specs(count: usize, seed: u64) -> Vec<ConvSpec> {
    let mut rng = SplitMix64::new(seed);
    let mut pick = |lo: u64, hi: u64| lo + rng.next_u64() % (hi - lo + 1);
    (0..count)
        .map(|i| {
            let dims = pick(1, 3) as usize;
            let unit = i % 3 != 2;
            let c = match i % 5 {
                0 => 1,
                1 => pick(2, 9),
                2 => pick(10, 40),
                3 => 64,
                _ => pick(41, 130),
            };
            let mut p = ConvParams {
                n: pick(1, 3) as i64,
                c: c as i64,
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
            for d in 0..dims {
                let last = d + 1 == dims;
                let k = pick(1, if last { 9 } else { 5 }) as i64;
                let (dl, s) = if unit {
                    (1, 1)
                } else {
                    (pick(1, 3) as i64, pick(1, 3) as i64)
                };
                let (pb, pa) = (pick(0, 4) as i64, pick(0, 4) as i64);
                let span = dl * (k - 1) + 1;
                let size = if i % 7 == 0 {
                    pick(1, 3)
                } else if last && i % 4 == 0 {
                    8 * pick(1, 25)
                } else {
                    pick(1, 40)
                } as i64;
                p.input.push(size.max(span - pb - pa).max(1));
                p.kernel.push(k);
                p.dilation.push(dl);
                p.stride.push(s);
                p.padding.push([pb, pa]);
            }
            p.validate().unwrap()
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_variant_passes_300_random_specs() {
    let dev = CudaDevice::open(0).unwrap();
    let specs = random_specs(300, 2026);
    // Compile every specialization first, on all cores.
    let work: std::collections::BTreeSet<(&str, &str, String)> = specs
        .iter()
        .flat_map(|spec| {
            registry().into_iter().filter_map(move |v| {
                v.applies(spec).ok()?;
                let expr = v.specialization(spec, &v.default_config(spec)).ok()?;
                Some((v.name(), v.source(), expr))
            })
        })
        .collect();
    let work: Vec<_> = work.into_iter().collect();
    {
        use rayon::prelude::*;
        work.par_iter().for_each(|(name, source, expr)| {
            dev.jit()
                .compile(name, source, expr)
                .unwrap_or_else(|e| panic!("{e}"));
        });
    }
    let mut checked = 0;
    for (i, spec) in specs.iter().enumerate() {
        checked += verify_all(
            &dev,
            &format!("random #{i}"),
            spec,
            i as u64,
            i % 10 == 0,
            i % 3 == 0,
        );
    }
    eprintln!("{checked} kernel checks over 300 specs");
}

/// Runs without a GPU: the generator must reach every variant, not only naive.
#[test]
fn random_specs_reach_every_variant() {
    let mut per_variant = std::collections::BTreeMap::<&str, usize>::new();
    for spec in random_specs(300, 2026) {
        for v in registry() {
            if v.applies(&spec).is_ok() {
                *per_variant.entry(v.name()).or_default() += 1;
            }
        }
    }
    eprintln!("specs per variant: {per_variant:?}");
    assert_eq!(per_variant.len(), registry().len(), "{per_variant:?}");
    assert!(per_variant.values().all(|&n| n >= 15), "{per_variant:?}");
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
