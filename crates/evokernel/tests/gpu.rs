//! GPU tests: run on the H100 machine (../shared/tools/gpu-stage, then
//! .gpu/run-tests.sh). Every variant against the oracle on every case of the public and
//! channels-last suites it applies to and on random small specs; cuDNN checked like any
//! variant.

use evokernel::backend::{ConvRun, ProblemData};
use evokernel::cuda::cudnn::CudnnRun;
use evokernel::cuda::list_devices;
use evokernel::cuda::run::{DeviceProblem, KernelRun};
use evokernel::engine::with_epilogue;
use evokernel::suite::{channels_last_suite, models_suite, public_suite};
use evokernel::tensor::SplitMix64;
use evokernel::variants::registry;
use evokernel::verify::{check, oracle};
use evokernel::{
    Activation, ConvParams, ConvProblem, ConvSpec, DType, Engine, Epilogue, HostTensor, Layout,
    Pass,
};

/// Every applicable variant (default config) and optionally cuDNN against the oracle;
/// with `non_finite`, the inputs carry a NaN, a +Inf and a -Inf, which must reach
/// exactly the outputs the oracle says (cuDNN is not held to that).
fn verify_all(
    engine: &Engine,
    name: &str,
    spec: &ConvSpec,
    seed: u64,
    with_cudnn: bool,
    non_finite: bool,
) -> usize {
    verify_fused(
        engine,
        name,
        spec,
        Epilogue::NONE,
        seed,
        with_cudnn,
        non_finite,
    )
}

/// As `verify_all` with a fused epilogue (cuDNN only without one).
fn verify_fused(
    engine: &Engine,
    name: &str,
    spec: &ConvSpec,
    epilogue: Epilogue,
    seed: u64,
    with_cudnn: bool,
    non_finite: bool,
) -> usize {
    let dev = engine.device().unwrap().as_ref();
    let conv = ConvProblem::new(spec.clone()).with_epilogue(epilogue);
    let mut problem = ProblemData::random_fused(&conv, seed, 1);
    if non_finite {
        problem.inject_non_finite(seed);
    }
    let mut checked = 0;
    let reference = oracle(&problem).unwrap();
    let dp = DeviceProblem::upload(dev, &problem).unwrap();
    for v in registry().into_iter().filter(|v| v.pass() == Pass::Forward) {
        if let Err(why) = v.applies(spec) {
            eprintln!("{name}: {} does not apply: {why}", v.name());
            continue;
        }
        let cfg = v.default_config(spec);
        let mut run =
            KernelRun::new(&dp, engine, &cfg).unwrap_or_else(|e| panic!("{name} {cfg}: {e}"));
        let verdict = check(&mut run, &problem, &reference).unwrap();
        assert!(
            verdict.passed,
            "{name} ({conv}) {cfg} seed {seed}{}: {:?}",
            if non_finite {
                " with NaN/Inf inputs"
            } else {
                ""
            },
            verdict.comparison
        );
        checked += 1;
    }
    if with_cudnn && !non_finite && epilogue.is_none() {
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

/// Every variant on a suite's cases: plain, with NaN/Inf inputs, and with one epilogue
/// per case in turn (each runs on several cases and every variant on some), NaN/Inf
/// inputs on every other case.
fn every_variant_passes(cases: Vec<evokernel::suite::SuiteCase>, offset: usize) {
    let engine = Engine::cuda(0).unwrap();
    for (i, case) in cases.into_iter().enumerate() {
        let i = i + offset;
        verify_all(&engine, &case.name, &case.spec, 11, true, false);
        verify_all(&engine, &case.name, &case.spec, 12, false, true);
        let all = epilogues();
        let e = all[i % all.len()];
        verify_fused(
            &engine,
            &case.name,
            &case.spec,
            e,
            100 + i as u64,
            false,
            i.is_multiple_of(2),
        );
    }
}

// Split by suite so each fits one GPU call (the two together ran past 250 s, run 105).
#[test]
#[ignore = "needs a CUDA GPU"]
fn every_variant_passes_the_public_suite() {
    every_variant_passes(public_suite().unwrap(), 0);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_variant_passes_the_channels_last_suite() {
    let offset = public_suite().unwrap().len();
    every_variant_passes(channels_last_suite().unwrap(), offset);
}

/// Bias + each activation, and bias + SiLU + residual, and a residual alone.
fn epilogues() -> Vec<Epilogue> {
    let mut v: Vec<Epilogue> = Activation::ALL
        .into_iter()
        .map(|activation| Epilogue {
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
    v.push(Epilogue {
        bias: false,
        activation: Activation::None,
        residual: true,
    });
    v
}

/// The seed problem through nothing but the public Engine API, plain and with every
/// epilogue, against the oracle; a second plan call is a cache hit.
#[test]
#[ignore = "needs a CUDA GPU"]
fn engine_runs_the_seed_with_every_epilogue() {
    let engine = Engine::cuda(0).unwrap();
    let spec = ConvParams::seed().validate().unwrap();
    let x = HostTensor::random_normal(spec.dtype(), &spec.input_shape(), 1);
    let w = HostTensor::random_normal(spec.dtype(), &spec.weight_shape(), 2);
    let b = HostTensor::random_normal(spec.dtype(), &[spec.c()], 3);
    let r = HostTensor::random_normal(spec.dtype(), &spec.output_shape(), 4);
    for e in std::iter::once(Epilogue::NONE).chain(epilogues()) {
        let conv = ConvProblem::new(spec.clone()).with_epilogue(e);
        let plan = engine.plan(&conv).unwrap();
        assert!(std::sync::Arc::ptr_eq(&plan, &engine.plan(&conv).unwrap()));
        let (bias, res) = (e.bias.then_some(&b), e.residual.then_some(&r));
        let y = plan.run_host(&x, &w, bias, res).unwrap();
        let mut want = evokernel::reference::conv_reference(&spec, &x, &w).unwrap();
        evokernel::epilogue::epilogue_reference(&spec, &e, &mut want, bias, res).unwrap();
        let c = evokernel::compare(&y, &want).unwrap();
        assert!(
            c.passes(spec.dtype()),
            "{conv} via {}: {c:?}",
            plan.instance_name()
        );
        eprintln!("{conv}: {} rel L2 {:.2e}", plan.instance_name(), c.rel_l2);
    }
}

/// `random_specs` named by their index ("random #i"), as the checks report them.
fn named_random_specs(count: usize, seed: u64) -> Vec<(String, ConvSpec)> {
    random_specs(count, seed)
        .into_iter()
        .enumerate()
        .map(|(i, s)| (format!("random #{i}"), s))
        .collect()
}

/// Raises the last dim's padding after by the least that makes a unit-stride output row
/// whole 16-byte vectors (with a W of whole vectors: row_window's domain).
fn whole_vector_output_rows(p: &mut ConvParams) {
    let (vec, last) = (p.dtype.per_16_bytes() as i64, p.input.len() - 1);
    let span = (p.kernel[last] - 1) * p.dilation[last] + 1;
    let ow = p.input[last] + p.padding[last][0] + p.padding[last][1] - span + 1;
    p.padding[last][1] += (vec - ow.rem_euclid(vec)) % vec;
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
            // One spec in six has a one-row kernel (1 x .. x KW, Mamba's conv1d and 1xK
            // rows) over whole 16-byte channel vectors: row_window_cl's domain (and, with
            // the rows below, row_window's).
            let one_row = i % 6 == 1;
            let c = if one_row { c.div_ceil(8) * 8 } else { c };
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
                let k = if one_row && !last { 1 } else { k };
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
            if one_row && p.layout == Layout::ChannelsFirst {
                // Channels-first one-row specs get rows of whole 16-byte vectors in and out
                // (row_window's domain; one-row specs have unit steps): W rounded up, the
                // padding after topped up. No draws, so every other spec is as before.
                let (vec, last) = (p.dtype.per_16_bytes() as i64, dims - 1);
                p.input[last] = (p.input[last] + vec - 1) / vec * vec;
                whole_vector_output_rows(&mut p);
            }
            p.validate().unwrap()
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn every_variant_passes_300_random_specs() {
    let engine = Engine::cuda(0).unwrap();
    let dev = engine.device().unwrap();
    let specs = random_specs(300, 2026);
    // Compile every specialization first, on all cores.
    let work: std::collections::BTreeSet<(&str, &str, String)> = specs
        .iter()
        .flat_map(|spec| {
            registry().into_iter().filter_map(move |v| {
                (v.pass() == Pass::Forward).then_some(())?;
                v.applies(spec).ok()?;
                let expr = v.specialization(spec, &v.default_config(spec)).ok()?;
                let expr = with_epilogue(&expr, &random_epilogue(spec));
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
        checked += verify_fused(
            &engine,
            &format!("random #{i}"),
            spec,
            random_epilogue(spec),
            i as u64,
            i % 10 == 0,
            i % 3 == 0,
        );
    }
    eprintln!("{checked} kernel checks over 300 specs");
}

/// One spec in four runs with a fused epilogue, chosen from its shape.
/// Runs each config on `problem` against the oracle and asserts it passes; the count.
fn check_configs(
    engine: &Engine,
    problem: &ProblemData,
    name: &str,
    spec: &ConvSpec,
    configs: &[evokernel::variants::Config],
    non_finite: bool,
) -> usize {
    let dev = engine.device().unwrap().as_ref();
    let reference = oracle(problem).unwrap();
    let dp = DeviceProblem::upload(dev, problem).unwrap();
    for cfg in configs {
        let mut run =
            KernelRun::new(&dp, engine, cfg).unwrap_or_else(|e| panic!("{name} {cfg}: {e}"));
        let verdict = check(&mut run, problem, &reference).unwrap();
        assert!(
            verdict.passed,
            "{name} ({spec}) {cfg} non-finite {non_finite}: {:?}",
            verdict.comparison
        );
    }
    configs.len()
}

/// Compiles every (spec, config) specialization of `v` in `cases` first, on all cores.
fn precompile_configs(
    dev: &evokernel::cuda::CudaDevice,
    v: &dyn evokernel::variants::Variant,
    cases: &[(String, ConvSpec, Vec<evokernel::variants::Config>)],
) {
    use rayon::prelude::*;
    let exprs: std::collections::BTreeSet<String> = cases
        .iter()
        .flat_map(|(_, spec, configs)| {
            configs
                .iter()
                .map(|cfg| with_epilogue(&v.specialization(spec, cfg).unwrap(), &Epilogue::NONE))
        })
        .collect();
    exprs.par_iter().for_each(|expr| {
        dev.jit()
            .compile(v.name(), v.source(), expr)
            .unwrap_or_else(|e| panic!("{e}"));
    });
}

/// Adds `cfg` to `configs` where it checks and launches for `spec` and is new.
fn push_launchable(
    v: &dyn evokernel::variants::Variant,
    spec: &ConvSpec,
    cfg: evokernel::variants::Config,
    configs: &mut Vec<evokernel::variants::Config>,
) {
    if evokernel::variants::check_config(v, spec, &cfg).is_ok()
        && v.launch(spec, &cfg, 132).is_ok()
        && !configs.contains(&cfg)
    {
        configs.push(cfg);
    }
}

/// `v`'s default for `spec` with each set of overrides applied in turn, those that
/// launch (an empty set: the default itself).
fn launchable_overrides(
    v: &dyn evokernel::variants::Variant,
    spec: &ConvSpec,
    overrides: &[&[(&str, i64)]],
) -> Vec<evokernel::variants::Config> {
    let mut configs = Vec::new();
    for set in overrides {
        let mut cfg = v.default_config(spec);
        for &(k, val) in *set {
            cfg.values.insert(k.into(), val);
        }
        push_launchable(v, spec, cfg, &mut configs);
    }
    configs
}

/// Every case's configs of `v` against the oracle (compiled first, on all cores), case
/// `i` as the problem `problem_of(i, spec)` describes, NaN and Inf in every third case's
/// operands; the configs checked.
fn check_cases(
    engine: &Engine,
    v: &dyn evokernel::variants::Variant,
    cases: &[(String, ConvSpec, Vec<evokernel::variants::Config>)],
    problem_of: impl Fn(usize, &ConvSpec) -> ConvProblem,
) -> usize {
    precompile_configs(engine.device().unwrap().as_ref(), v, cases);
    let mut checked = 0;
    for (i, (name, spec, configs)) in cases.iter().enumerate() {
        let non_finite = i % 3 == 0;
        let mut problem = ProblemData::random_fused(&problem_of(i, spec), i as u64, 1);
        if non_finite {
            problem.inject_non_finite(i as u64);
        }
        checked += check_configs(engine, &problem, name, spec, configs, non_finite);
    }
    checked
}

/// Grad-weight (and grad-bias) of every case's configs of `v` against the oracle, NaN and
/// Inf in every third case's operands; (configs checked, of them with `tma=1`).
fn check_wgrad_cases(
    engine: &Engine,
    v: &dyn evokernel::variants::Variant,
    cases: &[(String, ConvSpec, Vec<evokernel::variants::Config>)],
) -> (usize, usize) {
    let checked = check_cases(engine, v, cases, |_, spec| {
        ConvProblem::new(spec.clone())
            .with_epilogue(Epilogue {
                bias: true,
                ..Epilogue::NONE
            })
            .with_pass(Pass::Wgrad)
    });
    let tma_checked = cases
        .iter()
        .flat_map(|(_, _, configs)| configs)
        .filter(|c| c.values["tma"] == 1)
        .count();
    (checked, tma_checked)
}

/// depth_reuse hands its ring's slices over either by a block barrier a slice or by a
/// producer warp and mbarriers (`producer`, with TMA loads and, for whole-row regions,
/// TMA stores); the defaults test one of them, so both run here on the public suite and
/// on the random specs depth_reuse applies to, with several ring depths (the mbarrier
/// phases wrap at different steps) and one-column regions, NaN/Inf in a third.
#[test]
#[ignore = "needs a CUDA GPU"]
fn depth_reuse_passes_with_either_slice_handover() {
    let engine = Engine::cuda(0).unwrap();
    let v = evokernel::variants::find("depth_reuse").unwrap();
    let cases: Vec<(String, ConvSpec, Vec<evokernel::variants::Config>)> = public_suite()
        .unwrap()
        .into_iter()
        .map(|c| (c.name, c.spec))
        .chain(named_random_specs(120, 2027))
        .filter(|(_, spec)| v.applies(spec).is_ok())
        .map(|(name, spec)| {
            // (producer, stages, one tile column a block): with the producer, regions that
            // are whole rows store through the TMA, narrower ones from registers; rings of
            // 3 and 6 slots hold whole rounds of KD = 3 slices (the ring walked by rounds).
            let configs = [
                (0, 1, false),
                (0, 4, false),
                (1, 1, false),
                (1, 2, false),
                (1, 4, false),
                (1, 5, false),
                (1, 4, true),
            ]
            .into_iter()
            .filter_map(|(producer, stages, narrow)| {
                let mut cfg = v.default_config(&spec);
                cfg.values.insert("producer".into(), producer);
                cfg.values.insert("stages".into(), stages);
                if producer == 0 {
                    // (a plane walk needs the producer: depth_reuse_walks_planes_like_the_oracle)
                    cfg.values.insert("planes".into(), 0);
                }
                if narrow {
                    cfg.values.insert("cols".into(), 1);
                }
                v.fits(&spec, &cfg).is_ok().then_some(cfg)
            })
            .collect();
            (name, spec, configs)
        })
        .collect();
    let checked = check_cases(&engine, v, &cases, |_, spec| ConvProblem::new(spec.clone()));
    assert!(checked >= 40, "only {checked} depth_reuse checks");
    eprintln!("{checked} depth_reuse checks");
}

/// depth_reuse_cl's producer form (TMA boxes into staging slots, stmatrix transposes by
/// a producer warp, a storer warp, mbarrier handovers) and the block-barrier form's
/// stmatrix transposes (`trans=1`): the channels-last suite, the NDHWC seed and random
/// channels-last specs, one to four staging slots ahead, regions of one and two tile
/// columns (a last region of fewer tile warps), one to four storer warps, 8 and 16
/// channels a block (where C allows; 16 reads swizzled boxes), three and four ring
/// slots, two and three output stages, one and two channels a tile warp, one and two
/// producer warps, NaN/Inf in a third.
#[test]
#[ignore = "needs a CUDA GPU"]
fn depth_reuse_cl_passes_with_the_producer() {
    let engine = Engine::cuda(0).unwrap();
    let v = evokernel::variants::find("depth_reuse_cl").unwrap();
    let cases: Vec<(String, ConvSpec, Vec<evokernel::variants::Config>)> = public_suite()
        .unwrap()
        .into_iter()
        .chain(channels_last_suite().unwrap())
        .map(|c| (c.name, c.spec))
        .chain(named_random_specs(300, 2028))
        .filter(|(_, spec)| v.applies(spec).is_ok())
        .map(|(name, spec)| {
            // (producer, stages, cols, storers, channels, ring, out_stages, warp_channels,
            // producers)
            let configs = [
                (0, 2, 1, 1, 8, 3, 2, 1, 1),
                (1, 1, 1, 1, 8, 3, 2, 1, 1),
                (1, 2, 1, 2, 8, 3, 2, 1, 2),
                (1, 4, 1, 1, 8, 4, 3, 1, 1),
                (1, 2, 2, 1, 8, 3, 2, 1, 1),
                (1, 1, 2, 3, 8, 3, 2, 2, 2),
                (1, 1, 1, 3, 16, 3, 2, 1, 1),
                (1, 3, 1, 1, 16, 3, 2, 1, 2),
                (1, 3, 1, 4, 16, 4, 3, 1, 1),
                (1, 2, 1, 2, 16, 4, 2, 1, 1),
                (1, 3, 1, 4, 16, 3, 2, 2, 1),
                (1, 3, 1, 4, 16, 3, 2, 2, 2),
            ]
            .into_iter()
            .filter_map(
                |(
                    producer,
                    stages,
                    cols,
                    storers,
                    channels,
                    ring,
                    out_stages,
                    warp_channels,
                    producers,
                )| {
                    let mut cfg = v.default_config(&spec);
                    cfg.values.insert("producer".into(), producer);
                    cfg.values.insert("trans".into(), 1);
                    cfg.values.insert("stages".into(), stages);
                    cfg.values.insert("cols".into(), cols);
                    cfg.values.insert("storers".into(), storers);
                    cfg.values.insert("channels".into(), channels);
                    cfg.values.insert("ring".into(), ring);
                    cfg.values.insert("out_stages".into(), out_stages);
                    cfg.values.insert("warp_channels".into(), warp_channels);
                    cfg.values.insert("producers".into(), producers);
                    evokernel::variants::check_config(v, &spec, &cfg)
                        .is_ok()
                        .then_some(cfg)
                },
            )
            .collect();
            (name, spec, configs)
        })
        .collect();
    let checked = check_cases(&engine, v, &cases, |_, spec| ConvProblem::new(spec.clone()));
    assert!(checked >= 40, "only {checked} depth_reuse_cl checks");
    eprintln!("{checked} depth_reuse_cl checks");
}

/// depth_reuse walking planes (one kernel depth, no depth padding): 2-D and 1xKxK 3-D
/// specs of several batches and channel counts, so chunks cross (n, c) boundaries, with
/// output rows that are and are not 16-byte multiples (TMA or register stores), every
/// epilogue, NaN/Inf in a third, and plane walks of 1, 2 and 4 waves.
#[test]
#[ignore = "needs a CUDA GPU"]
fn depth_reuse_walks_planes_like_the_oracle() {
    let engine = Engine::cuda(0).unwrap();
    let v = evokernel::variants::find("depth_reuse").unwrap();
    // (n, c, input, kernel, padding per dim)
    type Shape = (i64, i64, Vec<i64>, Vec<i64>, Vec<[i64; 2]>);
    let shapes: [Shape; 8] = [
        (2, 24, vec![56, 56], vec![7, 7], vec![[3, 3], [3, 3]]),
        (3, 5, vec![20, 40], vec![3, 3], vec![[1, 1], [1, 1]]),
        (1, 7, vec![33, 64], vec![5, 5], vec![[2, 2], [2, 2]]),
        (2, 3, vec![16, 24], vec![3, 5], vec![[0, 2], [2, 0]]),
        (1, 9, vec![40, 48], vec![7, 7], vec![[0, 0], [0, 0]]),
        (
            2,
            4,
            vec![3, 18, 32],
            vec![1, 3, 3],
            vec![[0, 0], [1, 1], [1, 1]],
        ),
        (
            1,
            6,
            vec![5, 17, 16],
            vec![1, 5, 5],
            vec![[0, 0], [2, 2], [2, 2]],
        ),
        (1, 16, vec![9, 136], vec![3, 9], vec![[1, 1], [4, 4]]),
    ];
    let cases: Vec<(String, ConvSpec, Vec<evokernel::variants::Config>)> = shapes
        .into_iter()
        .enumerate()
        .map(|(i, (n, c, input, kernel, padding))| {
            let spec = ConvParams {
                n,
                c,
                input,
                kernel,
                stride: vec![],
                dilation: vec![],
                padding,
                layout: Layout::ChannelsFirst,
                dtype: if i % 2 == 0 { DType::Bf16 } else { DType::F16 },
            }
            .validate()
            .unwrap();
            let base = v.default_config(&spec);
            let mut configs = Vec::new();
            for planes in [1, 2, 4] {
                for (stages, cols_one, bands) in
                    [(4, false, 1), (1, false, 1), (4, true, 1), (4, false, 2)]
                {
                    let mut cfg = base.clone();
                    cfg.values.insert("producer".into(), 1);
                    cfg.values.insert("planes".into(), planes);
                    cfg.values.insert("dchunk".into(), 4); // (unused by a plane walk)
                    cfg.values.insert("stages".into(), stages);
                    cfg.values.insert("bands".into(), bands);
                    if cols_one {
                        cfg.values.insert("cols".into(), 1);
                    }
                    push_launchable(v, &spec, cfg, &mut configs);
                }
            }
            assert!(
                configs.len() >= 6,
                "{spec}: {} plane configs",
                configs.len()
            );
            (format!("planes #{i}"), spec, configs)
        })
        .collect();
    let epilogues = [
        Epilogue::NONE,
        Epilogue {
            bias: true,
            ..Epilogue::NONE
        },
        Epilogue {
            bias: true,
            activation: Activation::ALL[1],
            residual: true,
        },
        Epilogue {
            residual: true,
            ..Epilogue::NONE
        },
    ];
    let checked = check_cases(&engine, v, &cases, |i, spec| {
        ConvProblem::new(spec.clone()).with_epilogue(epilogues[i % 4])
    });
    eprintln!("{checked} depth_reuse plane-walk checks");
}

/// (n, c, input, kernel, stride, dilation, padding per dim, dtype) of a plane-walk test.
type WalkShape = (
    i64,
    i64,
    Vec<i64>,
    Vec<i64>,
    Vec<i64>,
    Vec<i64>,
    Vec<[i64; 2]>,
    DType,
);

/// Forced plane walks (`planes = 1`, depth chunks 4-16, 1-4 stages, three register caps)
/// of an FMA rotation kernel on `shapes` against the oracle: epilogues, and NaN/Inf in a
/// third of the cases.
fn check_fma_plane_walks(variant: &str, layout: Layout, shapes: Vec<WalkShape>) {
    let engine = Engine::cuda(0).unwrap();
    let v = evokernel::variants::find(variant).unwrap();
    let cases: Vec<(String, ConvSpec, Vec<evokernel::variants::Config>)> = shapes
        .into_iter()
        .enumerate()
        .map(
            |(i, (n, c, input, kernel, stride, dilation, padding, dtype))| {
                let spec = ConvParams {
                    n,
                    c,
                    input,
                    kernel,
                    stride,
                    dilation,
                    padding,
                    layout,
                    dtype,
                }
                .validate()
                .unwrap();
                let base = v.default_config(&spec);
                let mut configs = Vec::new();
                for dchunk in [4, 8, 16] {
                    for (stages, minblocks) in [(2, 3), (1, 2), (4, 1)] {
                        let mut cfg = base.clone();
                        for (k, x) in [
                            ("planes", 1),
                            ("dchunk", dchunk),
                            ("stages", stages),
                            ("minblocks", minblocks),
                        ] {
                            cfg.values.insert(k.into(), x);
                        }
                        push_launchable(v, &spec, cfg, &mut configs);
                    }
                }
                assert!(
                    configs.len() >= 3,
                    "{spec}: {} plane configs",
                    configs.len()
                );
                (format!("{variant} planes #{i}"), spec, configs)
            },
        )
        .collect();
    let checked = check_cases(&engine, v, &cases, |i, spec| {
        ConvProblem::new(spec.clone()).with_epilogue(Epilogue {
            bias: i % 2 == 0,
            activation: Activation::ALL[i % 4],
            residual: i % 3 == 1,
        })
    });
    eprintln!("{checked} {variant} plane-walk checks");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn depth_reuse_fma_cl_walks_planes_like_the_oracle() {
    // Channels-last 1-D, 2-D and 1x5x5 3-D layers, strides and dilations in H and W,
    // partial channel groups.
    check_fma_plane_walks(
        "depth_reuse_fma_cl",
        Layout::ChannelsLast,
        vec![
            (
                5,
                48,
                vec![28, 28],
                vec![7, 7],
                vec![1, 1],
                vec![1, 1],
                vec![[3, 3], [3, 3]],
                DType::Bf16,
            ),
            (
                7,
                40,
                vec![30, 30],
                vec![5, 5],
                vec![2, 2],
                vec![1, 1],
                vec![[2, 2], [2, 2]],
                DType::F16,
            ),
            (
                9,
                24,
                vec![17, 23],
                vec![3, 3],
                vec![1, 1],
                vec![1, 1],
                vec![[1, 1], [1, 1]],
                DType::F16,
            ),
            (
                3,
                12,
                vec![13, 21],
                vec![3, 5],
                vec![1, 2],
                vec![2, 1],
                vec![[0, 3], [2, 1]],
                DType::F32,
            ),
            (
                2,
                16,
                vec![3, 12, 20],
                vec![1, 5, 5],
                vec![1, 1, 1],
                vec![1, 1, 1],
                vec![[0, 0], [2, 2], [2, 2]],
                DType::Bf16,
            ),
            (
                6,
                32,
                vec![100],
                vec![4],
                vec![1],
                vec![1],
                vec![[3, 0]],
                DType::Bf16,
            ),
            (
                4,
                8,
                vec![19, 9],
                vec![7, 3],
                vec![1, 1],
                vec![1, 3],
                vec![[3, 3], [3, 3]],
                DType::F16,
            ),
            (
                11,
                64,
                vec![14, 14],
                vec![7, 7],
                vec![1, 1],
                vec![1, 1],
                vec![[3, 3], [3, 3]],
                DType::F32,
            ),
        ],
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn depth_reuse_fma_walks_planes_like_the_oracle() {
    // Channels-first 1-D rows (long and short kernels, causal padding), 2-D planes with
    // strides and dilations in H and W, a 1x3x3 3-D layer: planes of a chunk change
    // channel (and image) mid-chunk.
    check_fma_plane_walks(
        "depth_reuse_fma",
        Layout::ChannelsFirst,
        vec![
            (
                3,
                7,
                vec![1024],
                vec![31],
                vec![1],
                vec![1],
                vec![[15, 15]],
                DType::F16,
            ),
            (
                4,
                9,
                vec![256],
                vec![4],
                vec![1],
                vec![1],
                vec![[3, 0]],
                DType::Bf16,
            ),
            (
                2,
                5,
                vec![20, 40],
                vec![7, 7],
                vec![1, 1],
                vec![1, 1],
                vec![[3, 3], [3, 3]],
                DType::Bf16,
            ),
            (
                3,
                6,
                vec![17, 24],
                vec![3, 5],
                vec![2, 1],
                vec![1, 2],
                vec![[1, 0], [4, 4]],
                DType::F32,
            ),
            (
                2,
                3,
                vec![3, 12, 16],
                vec![1, 3, 3],
                vec![1, 1, 1],
                vec![1, 1, 1],
                vec![[0, 0], [1, 1], [1, 1]],
                DType::F16,
            ),
            (
                5,
                4,
                vec![64],
                vec![3],
                vec![1],
                vec![1],
                vec![[2, 0]],
                DType::F32,
            ),
        ],
    );
}

fn random_epilogue(spec: &ConvSpec) -> Epilogue {
    let h = spec
        .key()
        .bytes()
        .fold(7u64, |a, b| a.wrapping_mul(31).wrapping_add(b as u64));
    if h % 4 != 0 {
        return Epilogue::NONE;
    }
    Epilogue {
        bias: h % 8 == 0,
        activation: Activation::ALL[(h / 8 % 4) as usize],
        residual: h % 3 == 0,
    }
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
    let engine = Engine::cuda(0).unwrap();
    let dev = engine.device().unwrap();
    let spec = ConvParams::seed().validate().unwrap();
    let problem = ProblemData::random(&spec, 3, 1);
    let dp = DeviceProblem::upload(dev, &problem).unwrap();
    let v = registry()[0];
    let mut run = KernelRun::new(&dp, &engine, &v.default_config(&spec)).unwrap();
    run.poison(0).unwrap();
    let y = run.output(0).unwrap();
    assert!(y.to_f64_vec().iter().all(|v| v.is_nan()));
    let ms = run.launch(0).unwrap();
    assert!(ms > 0.0 && ms.is_finite());
    assert!(run.resources().unwrap().registers > 0);
}

/// 500 random specs through nothing but the engine: the plan dispatch picks, on host
/// tensors, against the oracle (one in four with an epilogue, a third with NaN/Inf).
#[test]
#[ignore = "needs a CUDA GPU"]
fn engine_plans_500_random_specs() {
    let engine = Engine::cuda(0).unwrap();
    let specs = random_specs(500, 4242);
    // Compile every pick first, on all cores (plans then load from the CUBIN cache).
    let work: std::collections::BTreeSet<(&str, &str, String)> = specs
        .iter()
        .flat_map(|spec| {
            let conv = ConvProblem::new(spec.clone()).with_epilogue(random_epilogue(spec));
            let choice = engine.choose(&conv).unwrap();
            let v = evokernel::variants::find(&choice.variant).unwrap();
            let cfg: evokernel::variants::Config = choice.config.parse().unwrap();
            let e = conv.epilogue;
            let mut w = vec![(
                v.name(),
                v.source(),
                with_epilogue(&v.specialization(spec, &cfg).unwrap(), &e),
            )];
            if v.needs_repair() {
                let (n, src, r) = evokernel::cuda::run::repair_specialization(spec);
                w.push((n, src, with_epilogue(&r, &e)));
            }
            w
        })
        .collect();
    {
        use rayon::prelude::*;
        let dev = engine.device().unwrap();
        work.into_iter()
            .collect::<Vec<_>>()
            .par_iter()
            .for_each(|(n, src, expr)| {
                dev.jit()
                    .compile(n, src, expr)
                    .unwrap_or_else(|e| panic!("{e}"));
            });
    }
    let mut per_variant = std::collections::BTreeMap::<String, usize>::new();
    for (i, spec) in specs.into_iter().enumerate() {
        let conv = ConvProblem::new(spec.clone()).with_epilogue(random_epilogue(&spec));
        let mut data = ProblemData::random_fused(&conv, 7 + i as u64, 1);
        if i % 3 == 0 {
            data.inject_non_finite(i as u64);
        }
        let plan = engine
            .plan(&conv)
            .unwrap_or_else(|e| panic!("#{i} {conv}: {e}"));
        let y = plan
            .run_host(
                &data.inputs[0],
                &data.weight,
                data.bias.as_ref(),
                data.residual(0),
            )
            .unwrap_or_else(|e| panic!("#{i} {conv}: {e}"));
        let c = evokernel::compare(&y, &oracle(&data).unwrap()).unwrap();
        assert!(
            c.passes(spec.dtype()),
            "#{i} {conv} via {}: {c:?}",
            plan.instance_name()
        );
        *per_variant
            .entry(plan.choice().variant.clone())
            .or_default() += 1;
    }
    eprintln!("picks over 500 random specs: {per_variant:?}");
}

/// A problem larger than the device's memory is refused by the engine with the numbers,
/// not attempted (and not an abort).
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_spec_larger_than_device_memory_is_refused() {
    let engine = Engine::cuda(0).unwrap();
    let mut p = ConvParams::seed();
    p.c = 512 * 1024; // 110 GB of input alone
    let conv = ConvProblem::new(p.validate().unwrap());
    match engine.plan(&conv) {
        Err(e @ evokernel::Error::OutOfMemory { .. }) => eprintln!("{e}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a 220 GB problem was planned"),
    }
}

/// Every kernel that can compute `pass` of `spec` (its pass's variants, and for
/// grad-input the forward variants on the flipped twin), default configs, against the
/// oracle; `bias`: grad-weight also computes grad-bias.
fn verify_pass(
    engine: &Engine,
    name: &str,
    spec: &ConvSpec,
    pass: Pass,
    bias: bool,
    seed: u64,
    non_finite: bool,
) -> usize {
    let dev = engine.device().unwrap().as_ref();
    let epilogue = Epilogue {
        bias: bias && pass == Pass::Wgrad,
        ..Epilogue::NONE
    };
    let conv = ConvProblem::new(spec.clone())
        .with_epilogue(epilogue)
        .with_pass(pass);
    let mut problem = ProblemData::random_fused(&conv, seed, 1);
    if non_finite {
        problem.inject_non_finite(seed);
    }
    let reference = oracle(&problem).unwrap();
    let dp = DeviceProblem::upload(dev, &problem).unwrap();
    let mut checked = 0;
    for v in registry() {
        let Some(k) = evokernel::dispatch::kernel_problem(v, &conv) else {
            continue;
        };
        if v.applies(&k.spec).is_err() {
            continue;
        }
        let (cfg, _) = engine.config_for(v, &conv);
        let mut run =
            KernelRun::new(&dp, engine, &cfg).unwrap_or_else(|e| panic!("{name} {cfg}: {e}"));
        let verdict = check(&mut run, &problem, &reference).unwrap();
        assert!(
            verdict.passed,
            "{name} ({conv}) {cfg} seed {seed}{}: {:?}",
            if non_finite { " with NaN/Inf" } else { "" },
            verdict.comparison
        );
        checked += 1;
    }
    assert!(checked > 0, "{name}: no kernel for {conv}");
    checked
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn backward_passes_on_the_public_and_channels_last_suites() {
    let engine = Engine::cuda(0).unwrap();
    let mut todo = Vec::new();
    for case in public_suite()
        .unwrap()
        .into_iter()
        .chain(channels_last_suite().unwrap())
    {
        for pass in [Pass::Dgrad, Pass::Wgrad] {
            let conv = ConvProblem::new(case.spec.clone())
                .with_epilogue(Epilogue {
                    bias: pass == Pass::Wgrad,
                    ..Epilogue::NONE
                })
                .with_pass(pass);
            for v in registry() {
                todo.push((conv.clone(), engine.config_for(v, &conv).0));
            }
        }
    }
    engine.precompile(&todo);
    let cases = public_suite()
        .unwrap()
        .into_iter()
        .chain(channels_last_suite().unwrap());
    let mut checked = 0;
    for (i, case) in cases.enumerate() {
        // grad-input through every kernel that serves it; grad-weight with grad-bias.
        // Half the cases with NaN/Inf in the input and grad_output.
        for pass in [Pass::Dgrad, Pass::Wgrad] {
            checked += verify_pass(&engine, &case.name, &case.spec, pass, true, 11, i % 2 == 0);
        }
    }
    eprintln!("{checked} backward kernel checks over both suites");
}

/// grad-weight of channels-last data by the channels-first kernels (wgrad_mma, wgrad_tile)
/// on channels-first copies, a chunk of channels at a time as the memory budget allows:
/// C = 100 in four chunks of 25; C = 97 (prime) in 97 chunks of one channel, whose copies
/// take the element path (ragged tiles, rows not whole 16-byte vectors); one chunk (no
/// budget) on a 3x5x5 spec and random channels-last specs in all three dtypes; TMA on and
/// off where the kernel has it, grad-bias always, NaN/Inf in a third.
#[test]
#[ignore = "needs a CUDA GPU"]
fn grad_weight_on_channels_first_copies_passes() {
    let unbudgeted = Engine::cuda(0).unwrap();
    let mut specs = Vec::new();
    // (C, [N, D, H, W], dtype, channels a chunk: the memory budget leaves room for the
    // copies of this many and a few more, not twice as many).
    for (c, input, kernel, dtype, chunk) in [
        (100, [2, 16, 64, 64], [3, 3, 3], DType::Bf16, Some(25)),
        (97, [1, 20, 61, 59], [3, 3, 3], DType::F16, Some(1)),
        (24, [2, 9, 20, 40], [3, 5, 5], DType::Bf16, None),
    ] {
        let mut p = ConvParams::seed();
        p.layout = Layout::ChannelsLast;
        p.dtype = dtype;
        p.c = c;
        p.n = input[0];
        p.input = input[1..].to_vec();
        p.kernel = kernel.to_vec();
        p.stride = vec![1, 1, 1];
        p.dilation = vec![1, 1, 1];
        p.padding = kernel.iter().map(|&k| [k / 2, k / 2]).collect();
        specs.push((format!("{c} channels"), p.validate().unwrap(), chunk));
    }
    specs.extend(
        random_channels_last_specs(2041, 40)
            .into_iter()
            .map(|(n, s)| (n, s, None)),
    );
    let mut checked = 0;
    let mut chunked = 0;
    for name in ["wgrad_mma", "wgrad_tile"] {
        let v = evokernel::variants::find(name).unwrap();
        for (i, (case, spec, chunk)) in specs.iter().enumerate() {
            let conv = ConvProblem::new(spec.clone())
                .with_epilogue(Epilogue {
                    bias: true,
                    ..Epilogue::NONE
                })
                .with_pass(Pass::Wgrad);
            let Some(k) = evokernel::dispatch::kernel_problem(v, &conv) else {
                continue;
            };
            if k.spec.layout() != Layout::ChannelsFirst {
                // The kernel does not take this spec even on copies.
                assert!(case.starts_with("random"), "{case}: {name} does not apply");
                continue;
            }
            let budgeted;
            let engine = match chunk {
                Some(ch) => {
                    // Copies of `ch` channels and a fifth more (halved by the plan).
                    let copies = (spec.input_len() + spec.output_len()) / spec.c()
                        * spec.dtype().size_bytes()
                        * (ch + ch / 5 + 1);
                    budgeted = Engine::cuda(0).unwrap().with_memory_budget(
                        evokernel::memory::tensor_bytes(&conv) + 2 * copies as u64,
                    );
                    &budgeted
                }
                None => &unbudgeted,
            };
            let mut configs = Vec::new();
            for tma in [0, 1] {
                push_launchable(v, &k.spec, default_with(v, &k.spec, tma, &[]), &mut configs);
            }
            let whole = (spec.input_len() + spec.output_len()) * spec.dtype().size_bytes();
            for cfg in &configs {
                let plan = engine.plan_instance(&conv, cfg).unwrap();
                let in_chunks = plan.workspace_bytes() < whole;
                assert_eq!(
                    in_chunks,
                    chunk.is_some(),
                    "{case} {cfg}: {} bytes",
                    plan.workspace_bytes()
                );
                chunked += usize::from(in_chunks);
            }
            let non_finite = i % 3 == 0;
            let mut problem = ProblemData::random_fused(&conv, 90 + i as u64, 1);
            if non_finite {
                problem.inject_non_finite(i as u64);
            }
            checked += check_configs(engine, &problem, case, spec, &configs, non_finite);
        }
    }
    assert!(chunked >= 4, "only {chunked} plans ran in several chunks");
    eprintln!("{checked} grad-weight checks on channels-first copies");
}

/// wgrad_mma's two ways of filling its ring, cp.async chunks and TMA boxes (one or
/// several output rows a slot), on the public suite's grad-weight cases it takes and on
/// random channels-first specs whose rows are 16-byte multiples (where TMA applies):
/// tiles that are the whole row and narrower ones, rings of 2 and 4 slots, NaN/Inf in a
/// third, grad-bias in every check.
#[test]
#[ignore = "needs a CUDA GPU"]
fn wgrad_mma_passes_with_either_ring_fill() {
    let engine = Engine::cuda(0).unwrap();
    let v = evokernel::variants::find("wgrad_mma").unwrap();
    let mut rng = SplitMix64::new(2031);
    let mut pick = |lo: u64, hi: u64| (lo + rng.next_u64() % (hi - lo + 1)) as i64;
    let mut specs = named_specs([public_suite()], None);
    for i in 0..60 {
        let (kd, kh) = (pick(1, 3), pick(1, 5));
        let (kw, dw) = (pick(1, 9), pick(1, 2));
        // "Same" padding along W (split at random) keeps ow = iw, a multiple of 8.
        let span = (kw - 1) * dw;
        let pw = pick(0, span as u64);
        let mut p = ConvParams::seed();
        p.n = pick(1, 2);
        p.c = pick(1, 24);
        p.dtype = if i % 2 == 0 { DType::Bf16 } else { DType::F16 };
        p.input = vec![pick(kd as u64, 7), pick(kh as u64, 30), 8 * pick(1, 20)];
        p.kernel = vec![kd, kh, kw];
        p.stride = vec![pick(1, 2), 1, 1];
        p.dilation = vec![1, 1, dw];
        p.padding = vec![
            [pick(0, 1), pick(0, 1)],
            [pick(0, 2), pick(0, 2)],
            [pw, span - pw],
        ];
        if let Ok(spec) = p.validate() {
            specs.push((format!("random #{i}"), spec));
        }
    }
    let mut cases = Vec::new();
    for (name, spec) in specs {
        if v.applies(&spec).is_err() {
            continue;
        }
        let mut configs = Vec::new();
        // (tma, rows, ring, k-steps, share, warps); 0: the default's. rows 0 takes KH
        // rows a slot where tiles are whole rows; share 1 the block's ring of depths.
        for (tma, rows, ring, ks, share, warps) in [
            (0, 1, 4, 0, 0, 0),
            (1, 1, 4, 0, 0, 0),
            (1, 1, 2, 3, 0, 0),
            (1, 2, 4, 0, 0, 0),
            (1, 4, 2, 0, 0, 0),
            (1, 0, 2, 0, 0, 0),
            (1, 0, 2, 0, 1, 0),
            (1, 4, 4, 0, 1, 2),
            (1, 0, 2, 0, 1, 8),
        ] {
            let cfg = default_with(
                v,
                &spec,
                tma,
                &[("rows", rows), ("ring", ring), ("ks", ks), ("warps", warps)],
            );
            let mut cfg = cfg;
            cfg.values.insert("share".into(), share);
            push_launchable(v, &spec, cfg, &mut configs);
        }
        cases.push((name, spec, configs));
    }
    let shared = cases
        .iter()
        .flat_map(|c| &c.2)
        .filter(|c| c.values.get("share") == Some(&1))
        .count();
    let (checked, tma_checked) = check_wgrad_cases(&engine, v, &cases);
    eprintln!(
        "{checked} wgrad_mma checks, {tma_checked} with TMA boxes, {shared} with a shared ring"
    );
    assert!(tma_checked >= 40, "only {tma_checked} TMA checks");
    assert!(shared >= 15, "only {shared} shared-ring configs");
}

/// wgrad_mma_cl (wgrad_mma on channels-last data, its slots transposed in shared memory)
/// on the suites' channels-last cases it takes and on random channels-last specs: 1-3
/// dims, rows of any width (the boxes' zero fill past the edges), asymmetric padding, D
/// stride, W dilation, 8 to 48 channels (16-channel blocks with a ragged last group),
/// slots of one row and of several, rings of 2 and 4, 16 channels in one barrier group and
/// in two, NaN/Inf in a third, grad-bias in every check.
#[test]
#[ignore = "needs a CUDA GPU"]
fn wgrad_mma_cl_passes_on_channels_last_specs() {
    let engine = Engine::cuda(0).unwrap();
    let v = evokernel::variants::find("wgrad_mma_cl").unwrap();
    let mut rng = SplitMix64::new(2041);
    let mut pick = |lo: u64, hi: u64| (lo + rng.next_u64() % (hi - lo + 1)) as i64;
    let mut specs = named_specs(
        [public_suite(), channels_last_suite(), models_suite()],
        Some(Layout::ChannelsLast),
    );
    for i in 0..48 {
        let (kd, kh, kw, dw) = (pick(1, 3), pick(1, 5), pick(1, 9), pick(1, 2));
        let mut p = ConvParams::seed();
        p.layout = Layout::ChannelsLast;
        p.n = pick(1, 2);
        p.c = 8 * pick(1, 6);
        p.dtype = if i % 2 == 0 { DType::Bf16 } else { DType::F16 };
        let dims = match i % 3 {
            0 => vec![(kw, 1, dw, pick(kw as u64, 90))],
            1 => vec![
                (kh, 1, 1, pick(kh as u64, 30)),
                (kw, 1, dw, pick(kw as u64, 90)),
            ],
            _ => vec![
                (kd, pick(1, 2), 1, pick(kd as u64, 7)),
                (kh, 1, 1, pick(kh as u64, 24)),
                (kw, 1, dw, pick(kw as u64, 90)),
            ],
        };
        set_dims(&mut p, &dims, &mut pick);
        if let Ok(spec) = p.validate() {
            specs.push((format!("random #{i}"), spec));
        }
    }
    let mut cases = Vec::new();
    for (name, spec) in specs {
        if v.applies(&spec).is_err() {
            continue;
        }
        let configs = launchable_overrides(
            v,
            &spec,
            &[
                &[],
                &[("rows", 1)],
                &[("rows", 1), ("ks", 3), ("ring", 4)],
                &[("channels", 16), ("minblocks", 1)],
                &[("rows", 2), ("ring", 4), ("splits", 1)],
                &[("channels", 16), ("rows", 1), ("minblocks", 1)],
                &[("channels", 16), ("groups", 2), ("minblocks", 1)],
                &[
                    ("channels", 16),
                    ("groups", 2),
                    ("rows", 1),
                    ("ring", 4),
                    ("minblocks", 1),
                ],
            ],
        );
        cases.push((name, spec, configs));
    }
    let several_rows = cases
        .iter()
        .flat_map(|c| &c.2)
        .filter(|c| c.values["rows"] > 1)
        .count();
    let sixteen = cases
        .iter()
        .flat_map(|c| &c.2)
        .filter(|c| c.values["channels"] == 16)
        .count();
    let grouped = cases
        .iter()
        .flat_map(|c| &c.2)
        .filter(|c| c.values["groups"] == 2)
        .count();
    let checked = check_cases(&engine, v, &cases, |_, spec| {
        ConvProblem::new(spec.clone())
            .with_epilogue(Epilogue {
                bias: true,
                ..Epilogue::NONE
            })
            .with_pass(Pass::Wgrad)
    });
    eprintln!(
        "{checked} wgrad_mma_cl checks on {} specs, {several_rows} with several rows a slot, {sixteen} with 16 channels a block, {grouped} in two groups",
        cases.len()
    );
    assert!(cases.len() >= 30, "only {} specs", cases.len());
    assert!(
        several_rows >= 20 && sixteen >= 30 && grouped >= 20,
        "{several_rows} / {sixteen} / {grouped}"
    );
}

/// The cases of `suites` (of `layout` only, where given) as (name, spec): the random-spec
/// fill tests start from them.
fn named_specs<const N: usize>(
    suites: [evokernel::Result<Vec<evokernel::suite::SuiteCase>>; N],
    layout: Option<Layout>,
) -> Vec<(String, ConvSpec)> {
    suites
        .into_iter()
        .flat_map(|s| s.unwrap())
        .filter(|c| layout.is_none_or(|l| c.spec.layout() == l))
        .map(|c| (c.name, c.spec))
        .collect()
}

/// `p`'s spatial dims from (kernel, stride, dilation, input size) per dim, each side's
/// padding picked at random within the kernel's span.
fn set_dims(
    p: &mut ConvParams,
    dims: &[(i64, i64, i64, i64)],
    pick: &mut impl FnMut(u64, u64) -> i64,
) {
    p.input = dims.iter().map(|t| t.3).collect();
    p.kernel = dims.iter().map(|t| t.0).collect();
    p.stride = dims.iter().map(|t| t.1).collect();
    p.dilation = dims.iter().map(|t| t.2).collect();
    p.padding = dims
        .iter()
        .map(|t| {
            let span = ((t.0 - 1) * t.2) as u64;
            [pick(0, span), pick(0, span)]
        })
        .collect();
}

/// `v`'s default config for `spec` with `tma` and the nonzero `params` overridden.
fn default_with(
    v: &dyn evokernel::variants::Variant,
    spec: &ConvSpec,
    tma: i64,
    params: &[(&str, i64)],
) -> evokernel::variants::Config {
    let mut cfg = v.default_config(spec);
    cfg.values.insert("tma".into(), tma);
    for &(k, val) in params {
        if val > 0 {
            cfg.values.insert(k.into(), val);
        }
    }
    cfg
}

/// wgrad_tile (channels-first, FMA pipes) with its buffers filled by TMA boxes and by the
/// threads, on the public and models suites' channels-first cases it takes and on random
/// channels-first specs: 1-3 dims, every dtype, W and D strides, W dilation (and depth
/// dilation, threads' copies only), widths that are and are not 16-byte multiples, tiles
/// with tails on both axes, partial last kernel-row groups, NaN/Inf in a third, grad-bias.
#[test]
#[ignore = "needs a CUDA GPU"]
fn wgrad_tile_passes_with_either_fill() {
    let engine = Engine::cuda(0).unwrap();
    let v = evokernel::variants::find("wgrad_tile").unwrap();
    let mut rng = SplitMix64::new(2033);
    let mut pick = |lo: u64, hi: u64| (lo + rng.next_u64() % (hi - lo + 1)) as i64;
    let mut specs = named_specs(
        [public_suite(), models_suite()],
        Some(Layout::ChannelsFirst),
    );
    for i in 0..60 {
        let dims = pick(1, 3) as usize;
        let (kd, kh, kw) = (pick(1, 3), pick(1, 5), pick(1, 7));
        let mut p = ConvParams::seed();
        p.n = pick(1, 3);
        p.c = pick(1, 12);
        p.dtype = [DType::Bf16, DType::F16, DType::F32][i % 3];
        let (sd, sw) = (pick(1, 2), pick(1, 2));
        let (dd, dw) = (if i % 5 == 4 { 2 } else { 1 }, pick(1, 2));
        // Mostly widths that make 16-byte rows (TMA) at unit W stride, some odd ones.
        let iw = if i % 4 == 3 {
            pick((kw * dw) as u64, 40)
        } else {
            8 * pick(1, 12)
        };
        let all = [
            (kd, sd, dd, pick((kd * dd) as u64, 6)),
            (kh, 1, 1, pick(kh as u64, 30)),
            (kw, sw, dw, iw.max(kw * dw)),
        ];
        set_dims(&mut p, &all[3 - dims..], &mut pick);
        if let Ok(spec) = p.validate() {
            specs.push((format!("random #{i}"), spec));
        }
    }
    let mut cases = Vec::new();
    for (name, spec) in specs {
        if v.applies(&spec).is_err() {
            continue;
        }
        let mut configs = Vec::new();
        // (tma, tw, rw, workers, rows): 0 keeps the default's value.
        for (tma, tw, rw, workers, rows) in [
            (0, 0, 0, 0, 0),
            (1, 0, 0, 0, 0),
            (1, 16, 3, 2, 0),
            (1, 8, 1, 4, 2),
            (0, 16, 5, 1, 2),
        ] {
            let cfg = default_with(
                v,
                &spec,
                tma,
                &[("tw", tw), ("rw", rw), ("workers", workers), ("rows", rows)],
            );
            push_launchable(v, &spec, cfg, &mut configs);
        }
        cases.push((name, spec, configs));
    }
    let (checked, tma_checked) = check_wgrad_cases(&engine, v, &cases);
    eprintln!("{checked} wgrad_tile checks, {tma_checked} with TMA boxes");
    assert!(tma_checked >= 60, "only {tma_checked} TMA checks");
    assert!(checked >= tma_checked + 40, "only {checked} checks");
}

/// `count` random channels-last specs for the grad-weight fill tests: 1-3 dims, every
/// dtype, whole 16-byte pixels mostly (TMA) and a few 4-byte ones (cp.async only),
/// strides, H and W dilations, random padding.
fn random_channels_last_specs(seed: u64, count: usize) -> Vec<(String, ConvSpec)> {
    let mut rng = SplitMix64::new(seed);
    let mut pick = |lo: u64, hi: u64| (lo + rng.next_u64() % (hi - lo + 1)) as i64;
    let mut specs = Vec::new();
    for i in 0..count {
        let dims = pick(1, 3) as usize;
        let (kd, kh, kw) = (pick(1, 3), pick(1, 5), pick(1, 7));
        let mut p = ConvParams::seed();
        p.layout = Layout::ChannelsLast;
        p.n = pick(1, 3);
        p.dtype = [DType::Bf16, DType::F16, DType::F32][i % 3];
        // Whole 16-byte pixels mostly (TMA), a few 4-byte ones (cp.async only).
        let unit = if p.dtype == DType::F32 { 4 } else { 8 };
        p.c = if i % 7 == 6 {
            pick(1, 40) * 2
        } else {
            unit * pick(1, 40)
        };
        let (sd, sh, sw) = (pick(1, 2), pick(1, 2), pick(1, 2));
        let (dh, dw) = (pick(1, 2), pick(1, 2));
        let all = [
            (kd, sd, 1, pick(kd as u64, 6)),
            (kh, sh, dh, pick((kh * dh) as u64, 24)),
            (kw, sw, dw, pick((kw * dw) as u64, 40)),
        ];
        set_dims(&mut p, &all[3 - dims..], &mut pick);
        if let Ok(spec) = p.validate() {
            specs.push((format!("random #{i}"), spec));
        }
    }
    specs
}

/// wgrad_tile_cl with its buffers filled by cp.async and by TMA boxes (whose zero fill is
/// the padding and the tails) on the channels-last suites and random channels-last
/// specs: 1-3 dims, strides, dilations (depth dilation 1 for boxes), partial channel
/// blocks, tiles with tails, NaN/Inf in a third of them, grad-bias.
#[test]
#[ignore = "needs a CUDA GPU"]
fn wgrad_tile_cl_passes_with_either_fill() {
    let engine = Engine::cuda(0).unwrap();
    let v = evokernel::variants::find("wgrad_tile_cl").unwrap();
    let mut specs = named_specs(
        [public_suite(), channels_last_suite()],
        Some(Layout::ChannelsLast),
    );
    specs.extend(random_channels_last_specs(2032, 60));
    let mut cases = Vec::new();
    for (name, spec) in specs {
        if v.applies(&spec).is_err() {
            continue;
        }
        let mut configs = Vec::new();
        for (tma, th, tw, workers, smallest_cb) in [
            (0, 0, 0, 0, false),
            (1, 0, 0, 0, false),
            (1, 8, 4, 2, false),
            (1, 2, 16, 1, true),
            (1, 4, 8, 4, false),
        ] {
            let mut cfg = default_with(
                v,
                &spec,
                tma,
                &[("th", th), ("tw", tw), ("workers", workers)],
            );
            if smallest_cb {
                let cbs = v.space(&spec).into_iter().find(|p| p.name == "cb").unwrap();
                cfg.values.insert("cb".into(), cbs.values[0]);
            }
            push_launchable(v, &spec, cfg, &mut configs);
        }
        cases.push((name, spec, configs));
    }
    let (checked, tma_checked) = check_wgrad_cases(&engine, v, &cases);
    eprintln!("{checked} wgrad_tile_cl checks, {tma_checked} with TMA boxes");
    assert!(tma_checked >= 60, "only {tma_checked} TMA checks");
}

/// wgrad_strip_cl with its ring filled by cp.async and by TMA boxes on the channels-last
/// suites and random channels-last specs (as wgrad_tile_cl's test, other seeds): slices
/// of rows that start and end mid-column and cross images, the smallest ring (one step
/// ahead) and the largest, segments past a row's end, several tap-row groups, NaN/Inf in
/// a third.
#[test]
#[ignore = "needs a CUDA GPU"]
fn wgrad_strip_cl_passes_with_either_fill() {
    let engine = Engine::cuda(0).unwrap();
    let v = evokernel::variants::find("wgrad_strip_cl").unwrap();
    let mut specs = named_specs(
        [public_suite(), channels_last_suite(), models_suite()],
        Some(Layout::ChannelsLast),
    );
    specs.extend(random_channels_last_specs(2033, 60));
    let mut cases = Vec::new();
    for (name, spec) in specs {
        if v.applies(&spec).is_err() {
            continue;
        }
        let space = v.space(&spec);
        let values = |name: &str| {
            space
                .iter()
                .find(|p| p.name == name)
                .unwrap()
                .values
                .clone()
        };
        let rings = values("ring");
        let (first_ring, last_ring) = (rings[0], rings[rings.len() - 1]);
        let mut configs = Vec::new();
        for (tma, tw, segs, ring, rows, smallest_cb) in [
            (0, 0, 0, 0, 0, false),
            (1, 0, 0, 0, 0, false),
            (1, 2, 4, first_ring, 0, false),
            (0, 2, 3, first_ring, 0, false),
            (1, 8, 1, last_ring, 1, false),
            (1, 4, 7, last_ring, 1, true),
            (0, 4, 2, first_ring + 1, 1, true),
        ] {
            let mut cfg = default_with(
                v,
                &spec,
                tma,
                &[("tw", tw), ("segs", segs), ("ring", ring), ("rows", rows)],
            );
            cfg.values
                .insert("splits".into(), [4, 8, 64][configs.len() % 3]);
            if smallest_cb {
                cfg.values.insert("cb".into(), values("cb")[0]);
            }
            push_launchable(v, &spec, cfg, &mut configs);
        }
        cases.push((name, spec, configs));
    }
    let (checked, tma_checked) = check_wgrad_cases(&engine, v, &cases);
    eprintln!("{checked} wgrad_strip_cl checks, {tma_checked} with TMA boxes");
    assert!(tma_checked >= 80, "only {tma_checked} TMA checks");
    assert!(checked >= tma_checked + 60, "only {checked} checks");
}

/// Grad-weight where padding and tile tails meet non-finite values: an Inf grad_output at
/// the first output and a NaN at the last (both corners, where taps read padding), an Inf
/// input at the last position of the first row (read by the row's last outputs only).
/// Like PyTorch, padded taps stay finite: every grad-weight kernel, default and tuned-
/// looking configs (tiles that leave tails), on both layouts.
#[test]
#[ignore = "needs a CUDA GPU"]
fn grad_weight_keeps_padding_out_of_non_finite_values() {
    let engine = Engine::cuda(0).unwrap();
    let dev = engine.device().unwrap().as_ref();
    let mut checked = 0;
    for (layout, dtype, input, kernel, stride, pad) in [
        (
            Layout::ChannelsLast,
            DType::F16,
            vec![1, 13, 19],
            vec![1, 3, 3],
            vec![1, 1, 1],
            [0, 1, 1],
        ),
        (
            Layout::ChannelsLast,
            DType::Bf16,
            vec![1, 11, 21],
            vec![1, 7, 7],
            vec![1, 1, 1],
            [0, 3, 3],
        ),
        (
            Layout::ChannelsLast,
            DType::F32,
            vec![5, 9, 10],
            vec![3, 3, 3],
            vec![1, 2, 2],
            [1, 1, 1],
        ),
        (
            Layout::ChannelsFirst,
            DType::Bf16,
            vec![1, 13, 19],
            vec![1, 3, 3],
            vec![1, 1, 1],
            [0, 1, 1],
        ),
        (
            Layout::ChannelsFirst,
            DType::F32,
            vec![3, 13, 20],
            vec![3, 5, 5],
            vec![1, 1, 1],
            [1, 2, 2],
        ),
    ] {
        let mut p = ConvParams::seed();
        p.n = 2;
        p.c = 48;
        p.layout = layout;
        p.dtype = dtype;
        p.input = input;
        p.kernel = kernel;
        p.stride = stride;
        p.padding = pad.iter().map(|&q| [q, q]).collect();
        let spec = p.validate().unwrap();
        let conv = ConvProblem::new(spec.clone())
            .with_epilogue(Epilogue {
                bias: true,
                ..Epilogue::NONE
            })
            .with_pass(Pass::Wgrad);
        let mut data = ProblemData::random_fused(&conv, 5, 1);
        let gy = &mut data.grad_outputs[0];
        let last = gy.len() - 1;
        gy.set_f64(0, f64::INFINITY);
        gy.set_f64(last, f64::NAN);
        // The last input of the first row, channel 0 (either layout).
        let iw = spec.input3()[2];
        let at = match layout {
            Layout::ChannelsLast => (iw - 1) * spec.c(),
            Layout::ChannelsFirst => iw - 1,
        };
        data.inputs[0].set_f64(at, f64::INFINITY);
        let want = oracle(&data).unwrap();
        let dp = DeviceProblem::upload(dev, &data).unwrap();
        for v in registry().into_iter().filter(|v| v.pass() == Pass::Wgrad) {
            if v.applies(&spec).is_err() {
                continue;
            }
            let mut configs = vec![v.default_config(&spec)];
            if v.name() == "wgrad_tile_cl" {
                // Tiles of 8 x 16 on 9-21 wide planes: tails on both axes, filled by
                // cp.async and by TMA boxes.
                for c in [
                    "wgrad_tile_cl:vec=4,cb=16,rows=3,th=8,tw=16,workers=2,splits=4,minblocks=3",
                    "wgrad_tile_cl:vec=8,cb=48,rows=1,th=8,tw=16,workers=1,splits=2,minblocks=1",
                ] {
                    for tma in [",tma=0", ",tma=1"] {
                        let c: evokernel::variants::Config = format!("{c}{tma}").parse().unwrap();
                        if evokernel::variants::check_config(v, &spec, &c).is_ok() {
                            configs.push(c);
                        }
                    }
                }
                let boxes = configs
                    .iter()
                    .filter(|c| c.values.get("tma") == Some(&1))
                    .count();
                assert!(boxes >= 2, "{spec}: {boxes} TMA tail configs fit");
            }
            if v.name() == "wgrad_tile" {
                // Tiles of 6 x 16 on 13 x 19-20 planes (tails on both axes), a partial last
                // kernel-row group; boxes where rows are 16-byte multiples.
                for c in [
                    "wgrad_tile:tw=16,rw=3,workers=2,rows=2,splits=2,minblocks=1",
                    "wgrad_tile:tw=8,rw=1,workers=4,rows=1,splits=1,minblocks=1",
                ] {
                    for tma in [",tma=0", ",tma=1"] {
                        let c: evokernel::variants::Config = format!("{c}{tma}").parse().unwrap();
                        if evokernel::variants::check_config(v, &spec, &c).is_ok() {
                            configs.push(c);
                        }
                    }
                }
            }
            for cfg in configs {
                let mut run = KernelRun::new(&dp, &engine, &cfg)
                    .unwrap_or_else(|e| panic!("{spec} {cfg}: {e}"));
                let verdict = check(&mut run, &data, &want).unwrap();
                assert!(verdict.passed, "{spec} {cfg}: {:?}", verdict.comparison);
                checked += 1;
            }
        }
    }
    eprintln!("{checked} grad-weight kernels checked with non-finite values at the edges");
}

/// depth_reuse_fma walking its slices KD at a time behind one barrier (stages 0) on the
/// channels-first suite cases and random specs with kernel depths, at the default depth
/// chunk and at 4 (chunks whose last group is partial: 4 + KD - 1 steps), NaN/Inf in a
/// third.
#[test]
#[ignore = "needs a CUDA GPU"]
fn depth_reuse_fma_passes_with_slice_groups() {
    let engine = Engine::cuda(0).unwrap();
    let v = evokernel::variants::find("depth_reuse_fma").unwrap();
    let mut specs = named_specs(
        [public_suite(), models_suite()],
        Some(Layout::ChannelsFirst),
    );
    specs.extend(named_random_specs(300, 2041));
    let mut cases = Vec::new();
    for (name, spec) in specs {
        if v.applies(&spec).is_err() || spec.kernel3()[0] < 2 {
            continue;
        }
        let configs = launchable_overrides(
            v,
            &spec,
            &[&[("stages", 0)], &[("stages", 0), ("dchunk", 4)]],
        );
        if !configs.is_empty() {
            cases.push((name, spec, configs));
        }
    }
    assert!(cases.len() >= 10, "only {} specs", cases.len());
    let checked = check_cases(&engine, v, &cases, |_, spec| ConvProblem::new(spec.clone()));
    eprintln!(
        "{checked} depth_reuse_fma slice-group checks over {} specs",
        cases.len()
    );
}

/// depth_reuse_fma on input rows that are not whole 16-byte chunks (f32 of any width,
/// 16-bit types of even width): the slice fill copies 4-byte pieces and zero-fills those
/// past a row's end. x3d-m-res4 (14 bf16 a row), named specs (3-D, plane-walked 2-D and
/// 1-D rows, W stride and dilation, padding past the row, odd f32 widths) and random
/// specs with such rows; the default config and the other stages, NaN/Inf in a third.
#[test]
#[ignore = "needs a CUDA GPU"]
fn depth_reuse_fma_copies_rows_in_4_byte_pieces() {
    let engine = Engine::cuda(0).unwrap();
    let v = evokernel::variants::find("depth_reuse_fma").unwrap();
    let partial_rows = |s: &ConvSpec| !(s.input3()[2] * s.dtype().size_bytes()).is_multiple_of(16);
    let mut specs: Vec<(String, ConvSpec)> = named_specs(
        [public_suite(), models_suite()],
        Some(Layout::ChannelsFirst),
    )
    .into_iter()
    .filter(|(_, s)| partial_rows(s))
    .collect();
    for (name, key) in [
        (
            "3-D 14 wide",
            "dw3d-n2-c12-i6x14x14-k3x3x3-s1x1x1-d1x1x1-p1:1,1:1,1:1-ncdhw-bf16",
        ),
        (
            "3-D 30 wide, f16, kernel rows of 5",
            "dw3d-n1-c8-i5x9x30-k3x3x5-s1x1x1-d1x1x1-p0:2,1:1,2:2-ncdhw-f16",
        ),
        (
            "2-D 22 wide (planes walked)",
            "dw2d-n3-c16-i20x22-k3x3-s1x1-d1x1-p1:1,1:1-nchw-bf16",
        ),
        (
            "2-D 28 wide, W stride 2",
            "dw2d-n2-c8-i16x28-k3x3-s1x2-d1x1-p1:1,1:1-nchw-bf16",
        ),
        (
            "1-D 2 wide, padding past the row",
            "dw1d-n4-c32-i2-k4-s1-d1-p3:2-ncw-bf16",
        ),
        (
            "1-D 1030 wide, dilation 2",
            "dw1d-n2-c16-i1030-k3-s1-d2-p2:2-ncw-f16",
        ),
        (
            "3-D f32 13 wide",
            "dw3d-n1-c8-i5x9x13-k3x5x5-s1x1x1-d1x1x1-p0:0,2:2,2:2-ncdhw-f32",
        ),
        (
            "2-D f32 47 wide, W dilation 3",
            "dw2d-n2-c8-i11x47-k3x3-s1x1-d1x3-p1:1,3:3-nchw-f32",
        ),
    ] {
        specs.push((name.into(), ConvSpec::from_key(key).unwrap()));
    }
    specs.extend(
        named_random_specs(300, 2042)
            .into_iter()
            .filter(|(_, s)| partial_rows(s)),
    );
    let mut cases = Vec::new();
    for (name, spec) in specs {
        if v.applies(&spec).is_err() {
            continue;
        }
        let configs = launchable_overrides(v, &spec, &[&[], &[("stages", 0)], &[("stages", 2)]]);
        cases.push((name, spec, configs));
    }
    assert!(cases.len() >= 20, "only {} specs", cases.len());
    let checked = check_cases(&engine, v, &cases, |_, spec| ConvProblem::new(spec.clone()));
    eprintln!(
        "{checked} depth_reuse_fma 4-byte-copy checks over {} specs",
        cases.len()
    );
}

/// row_rotation_cl (input rows rotated through the output rows they feed) on the
/// channels-last specs of every suite it takes, random channels-last specs (strides and
/// dilations up to 2, 1-3 dims) and named ones past them: H stride 3 with dilation 2, a
/// 1x5x5 3-D kernel at depth stride 2 with depth padding (planes of zeros), W stride 3,
/// f32, 7-row kernels (7 live rows), chunks of one and two rows; the default and other
/// ring depths, run widths and chunk sizes, NaN/Inf in a third.
#[test]
#[ignore = "needs a CUDA GPU"]
fn row_rotation_cl_passes_on_channels_last_specs() {
    let engine = Engine::cuda(0).unwrap();
    let v = evokernel::variants::find("row_rotation_cl").unwrap();
    let mut specs = named_specs(
        [public_suite(), channels_last_suite(), models_suite()],
        Some(Layout::ChannelsLast),
    );
    specs.extend(random_channels_last_specs(2043, 150));
    for (name, key) in [
        (
            "2-D H stride 3, dilation 2",
            "dw2d-n2-c16-i29x21-k3x3-s3x1-d2x1-p2:1,1:1-nhwc-bf16",
        ),
        (
            "3-D 1x5x5, depth stride 2 and padding",
            "dw3d-n2-c24-i5x20x18-k1x5x5-s2x2x2-d1x1x1-p1:1,2:2,2:2-ndhwc-f16",
        ),
        (
            "2-D W stride 3, f32",
            "dw2d-n1-c12-i13x40-k3x5-s1x3-d1x1-p1:1,2:2-nhwc-f32",
        ),
        (
            "2-D 7x7, 7 live rows",
            "dw2d-n2-c32-i15x15-k7x7-s1x1-d1x1-p3:3,3:3-nhwc-bf16",
        ),
        (
            "2-D 5x5 stride 2, asymmetric padding, odd rows",
            "dw2d-n3-c40-i23x19-k5x5-s2x2-d1x1-p0:2,1:3-nhwc-f16",
        ),
    ] {
        specs.push((name.into(), ConvSpec::from_key(key).unwrap()));
    }
    let mut cases = Vec::new();
    for (name, spec) in specs {
        if v.applies(&spec).is_err() {
            continue;
        }
        let configs = launchable_overrides(
            v,
            &spec,
            &[
                &[],
                &[("stages", 1)],
                &[("rows", 1), ("stages", 8)],
                &[("rows", 2), ("out_w", 7)],
                &[("cv", 1), ("lanes", 8), ("out_w", 2)],
            ],
        );
        cases.push((name, spec, configs));
    }
    assert!(cases.len() >= 40, "only {} specs", cases.len());
    let checked = check_cases(&engine, v, &cases, |_, spec| ConvProblem::new(spec.clone()));
    eprintln!(
        "{checked} row_rotation_cl checks over {} specs",
        cases.len()
    );
}

/// dgrad_cell_cl (a thread per stride cell) on the channels-last suites' specs it takes,
/// random channels-last specs (strides and dilations up to 2, padding within the span,
/// partial last cells) and named ones past them: stride 3, padding past the kernel's
/// span, residues no tap feeds, a 1x1 kernel at stride 2, f32 with 16 positions a cell;
/// the default config and a small grid (several cells a thread), NaN/Inf in a third.
#[test]
#[ignore = "needs a CUDA GPU"]
fn dgrad_cell_cl_passes_on_strided_channels_last_specs() {
    let engine = Engine::cuda(0).unwrap();
    let v = evokernel::variants::find("dgrad_cell_cl").unwrap();
    let mut specs = named_specs(
        [public_suite(), channels_last_suite(), models_suite()],
        Some(Layout::ChannelsLast),
    );
    specs.extend(random_channels_last_specs(2040, 80));
    for (name, key) in [
        (
            "1-D stride 3 pad 4/1",
            "dw1d-n2-c16-i50-k5-s3-d1-p4:1-nwc-bf16",
        ),
        (
            "2-D stride 3x2 dilated, pad past the span",
            "dw2d-n2-c24-i17x23-k4x3-s3x2-d2x1-p9:0,0:5-nhwc-f16",
        ),
        (
            "1x1 at stride 2 (odd residues fed by no tap)",
            "dw2d-n2-c8-i9x13-k1x1-s2x2-d1x1-p0:0,0:0-nhwc-bf16",
        ),
        (
            "3-D stride 2 everywhere",
            "dw3d-n2-c16-i7x10x11-k3x3x3-s2x2x2-d1x1x1-p1:1,1:1,1:0-ndhwc-f16",
        ),
        (
            "f32, 4x4 cells",
            "dw2d-n2-c12-i21x18-k5x4-s4x4-d1x1-p2:2,1:2-nhwc-f32",
        ),
    ] {
        let spec = ConvSpec::from_key(key).unwrap();
        assert_eq!(spec.key(), key);
        specs.push((name.to_string(), spec));
    }
    let mut cases = Vec::new();
    for (name, spec) in specs {
        if v.applies(&spec).is_err() {
            continue;
        }
        // The default, smaller blocks and grids, and both window forms (a row at a time;
        // the whole window up front where the kernel takes it, under the tightest cap).
        let configs = launchable_overrides(
            v,
            &spec,
            &[
                &[],
                &[("block", 128), ("waves", 4)],
                &[("window", 0)],
                &[("window", 1), ("minblocks", 5)],
            ],
        );
        cases.push((name, spec, configs));
    }
    assert!(cases.len() >= 60, "only {} specs", cases.len());
    let checked = check_cases(&engine, v, &cases, |_, spec| {
        ConvProblem::new(spec.clone()).with_pass(Pass::Dgrad)
    });
    eprintln!("{checked} dgrad_cell_cl checks over {} specs", cases.len());
}

/// The engine's pick for each backward pass (and dgrad_gather, which every spec has) on
/// 300 random specs, a third with NaN/Inf in the inputs and grad_output.
#[test]
#[ignore = "needs a CUDA GPU"]
fn backward_passes_on_300_random_specs() {
    let engine = Engine::cuda(0).unwrap();
    let gather: evokernel::variants::Config = "dgrad_gather:block=256,waves=16".parse().unwrap();
    let mut per_variant = std::collections::BTreeMap::<String, usize>::new();
    let specs = random_specs(300, 2027);
    // Compile every kernel first, on all cores (the plans then load from the cache).
    let mut todo = Vec::new();
    for spec in &specs {
        for pass in [Pass::Dgrad, Pass::Wgrad] {
            for bias in [false, true] {
                let conv = ConvProblem::new(spec.clone())
                    .with_epilogue(Epilogue {
                        bias: bias && pass == Pass::Wgrad,
                        ..Epilogue::NONE
                    })
                    .with_pass(pass);
                let pick: evokernel::variants::Config =
                    engine.choose(&conv).unwrap().config.parse().unwrap();
                todo.push((conv.clone(), pick));
                todo.push((conv, gather.clone()));
            }
        }
    }
    engine.precompile(&todo);
    for (i, spec) in specs.into_iter().enumerate() {
        for pass in [Pass::Dgrad, Pass::Wgrad] {
            let conv = ConvProblem::new(spec.clone())
                .with_epilogue(Epilogue {
                    bias: pass == Pass::Wgrad && i % 2 == 0,
                    ..Epilogue::NONE
                })
                .with_pass(pass);
            let mut data = ProblemData::random_fused(&conv, 70 + i as u64, 1);
            if i % 3 == 0 {
                data.inject_non_finite(i as u64);
            }
            let want = oracle(&data).unwrap();
            let plan = engine
                .plan(&conv)
                .unwrap_or_else(|e| panic!("#{i} {conv}: {e}"));
            let mut plans = vec![plan.instance_name()];
            let got = run_pass(&plan, &data);
            let c = evokernel::compare(&got, &want).unwrap();
            assert!(
                c.passes(spec.dtype()),
                "#{i} {conv} via {}: {c:?}",
                plans[0]
            );
            *per_variant
                .entry(plan.choice().variant.clone())
                .or_default() += 1;
            if pass == Pass::Dgrad && plan.choice().variant != "dgrad_gather" {
                let g = engine.plan_instance(&conv, &gather).unwrap();
                plans.push(g.instance_name());
                let c = evokernel::compare(&run_pass(&g, &data), &want).unwrap();
                assert!(
                    c.passes(spec.dtype()),
                    "#{i} {conv} via dgrad_gather: {c:?}"
                );
            }
        }
    }
    eprintln!("backward picks over 300 random specs: {per_variant:?}");
}

fn run_pass(plan: &evokernel::Plan, data: &ProblemData) -> HostTensor {
    match data.pass {
        Pass::Forward => plan
            .run_host(
                &data.inputs[0],
                &data.weight,
                data.bias.as_ref(),
                data.residual(0),
            )
            .unwrap(),
        Pass::Dgrad => plan
            .dgrad_host(&data.grad_outputs[0], &data.weight)
            .unwrap_or_else(|e| panic!("{}: {e}", plan.instance_name())),
        Pass::Wgrad => {
            let (gw, gb) = plan
                .wgrad_host(&data.inputs[0], &data.grad_outputs[0])
                .unwrap_or_else(|e| panic!("{}: {e}", plan.instance_name()));
            evokernel::backend::join_grads(&gw, gb.as_ref())
        }
    }
}

/// grad-weight and grad-bias are the same bits on every run (no atomics; fixed order), on
/// the plans of the public and channels-last suites.
#[test]
#[ignore = "needs a CUDA GPU"]
fn grad_weight_is_bit_identical_across_runs() {
    let engine = Engine::cuda(0).unwrap();
    let cases = public_suite()
        .unwrap()
        .into_iter()
        .chain(channels_last_suite().unwrap());
    for case in cases {
        let conv = ConvProblem::new(case.spec.clone())
            .with_epilogue(Epilogue {
                bias: true,
                ..Epilogue::NONE
            })
            .with_pass(Pass::Wgrad);
        let data = ProblemData::random_fused(&conv, 5, 1);
        let plan = engine.plan(&conv).unwrap();
        let a = run_pass(&plan, &data);
        let b = run_pass(&plan, &data);
        assert_eq!(
            a.data(),
            b.data(),
            "{}: grad-weight differs between runs",
            case.name
        );
    }
}

/// The safe device-buffer API of the backward passes: the same bits as the host path
/// (which goes through it with no workspace) with the caller's workspace, and every
/// short buffer refused with the operand's name before anything launches.
#[test]
#[ignore = "needs a CUDA GPU"]
fn backward_device_buffers_match_the_host_path_and_check_sizes() {
    use evokernel::engine::{DgradBuffers, WgradBuffers};
    let engine = Engine::cuda(0).unwrap();
    let dev = engine.device().unwrap();
    let mut p = ConvParams::seed();
    p.c = 24;
    p.input = vec![9, 20, 36];
    let spec = p.validate().unwrap();
    let x = HostTensor::random_normal(spec.dtype(), &spec.input_shape(), 1);
    let w = HostTensor::random_normal(spec.dtype(), &spec.weight_shape(), 2);
    let gy = HostTensor::random_normal(spec.dtype(), &spec.output_shape(), 3);
    let (dx, dw, dgy) = (
        dev.upload(&x).unwrap(),
        dev.upload(&w).unwrap(),
        dev.upload(&gy).unwrap(),
    );

    let dgrad = engine
        .plan(&ConvProblem::new(spec.clone()).with_pass(Pass::Dgrad))
        .unwrap();
    let mut dgx = dev.alloc(x.size_bytes()).unwrap();
    let mut ws = dev.alloc(dgrad.workspace_bytes().max(1)).unwrap();
    dgrad
        .dgrad(
            DgradBuffers {
                grad_output: &dgy,
                w: &dw,
                grad_input: &mut dgx,
                workspace: Some(&mut ws),
            },
            dev.stream(),
        )
        .unwrap();
    let mut gx = HostTensor::zeros(spec.dtype(), &spec.input_shape());
    dev.download(&dgx, &mut gx).unwrap();
    assert_eq!(gx.data(), dgrad.dgrad_host(&gy, &w).unwrap().data());
    let mut short = dev.alloc(x.size_bytes() - 2).unwrap();
    let e = dgrad
        .dgrad(
            DgradBuffers {
                grad_output: &dgy,
                w: &dw,
                grad_input: &mut short,
                workspace: None,
            },
            dev.stream(),
        )
        .unwrap_err();
    assert!(e.to_string().contains("grad_input"), "{e}");

    let problem = ConvProblem::new(spec.clone())
        .with_epilogue(Epilogue {
            bias: true,
            ..Epilogue::NONE
        })
        .with_pass(Pass::Wgrad);
    let wgrad = engine.plan(&problem).unwrap();
    assert!(
        wgrad.workspace_bytes() > 0,
        "grad-weight sums partials in scratch"
    );
    let mut dgw = dev.alloc(w.size_bytes()).unwrap();
    let mut dgb = dev.alloc(spec.c() * spec.dtype().size_bytes()).unwrap();
    let mut ws = dev.alloc(wgrad.workspace_bytes()).unwrap();
    wgrad
        .wgrad(
            WgradBuffers {
                x: &dx,
                grad_output: &dgy,
                grad_weight: &mut dgw,
                grad_bias: Some(&mut dgb),
                workspace: Some(&mut ws),
            },
            dev.stream(),
        )
        .unwrap();
    let mut gw = HostTensor::zeros(spec.dtype(), &spec.weight_shape());
    let mut gb = HostTensor::zeros(spec.dtype(), &[spec.c()]);
    dev.download(&dgw, &mut gw).unwrap();
    dev.download(&dgb, &mut gb).unwrap();
    let (hw, hb) = wgrad.wgrad_host(&x, &gy).unwrap();
    assert_eq!(gw.data(), hw.data());
    assert_eq!(gb.data(), hb.unwrap().data());
    let mut small = dev.alloc(wgrad.workspace_bytes() - 4).unwrap();
    let e = wgrad
        .wgrad(
            WgradBuffers {
                x: &dx,
                grad_output: &dgy,
                grad_weight: &mut dgw,
                grad_bias: Some(&mut dgb),
                workspace: Some(&mut small),
            },
            dev.stream(),
        )
        .unwrap_err();
    assert!(e.to_string().contains("workspace"), "{e}");
    let e = wgrad
        .wgrad(
            WgradBuffers {
                x: &dx,
                grad_output: &dgy,
                grad_weight: &mut dgw,
                grad_bias: None,
                workspace: None,
            },
            dev.stream(),
        )
        .unwrap_err();
    assert!(e.to_string().contains("grad_bias"), "{e}");
}

/// cuDNN's backend API (the `cudnn` reference row) on every pass of the public suite's
/// cases and of odd specs: an engine is found, its output passes the oracle's gate, and
/// a second build takes the cached choice. (The bench runs it on every suite case.)
#[test]
#[ignore = "needs a CUDA GPU"]
fn cudnn_backend_api_passes_every_pass_of_the_suites() {
    use evokernel::cuda::cudnn_graph::CudnnGraphRun;
    let engine = Engine::cuda(0).unwrap();
    let dev = engine.device().unwrap().as_ref();
    let odd = |input: Vec<i64>, kernel: Vec<i64>, stride: Vec<i64>, padding: Vec<[i64; 2]>| {
        ConvParams {
            n: 2,
            c: 24,
            dilation: vec![1; input.len()],
            input,
            kernel,
            stride,
            padding,
            layout: Layout::ChannelsFirst,
            dtype: DType::F16,
        }
        .validate()
        .unwrap()
    };
    let mut cases: Vec<(String, ConvSpec)> = public_suite()
        .unwrap()
        .into_iter()
        .map(|c| (c.name, c.spec))
        .collect();
    // Asymmetric padding with a stride (the forward may take the symmetric twin), and
    // an asymmetric 1-D causal pad.
    cases.push((
        "odd-asym-strided".into(),
        odd(vec![9, 11], vec![3, 3], vec![2, 2], vec![[0, 2], [1, 1]]),
    ));
    cases.push((
        "odd-causal-1d".into(),
        odd(vec![37], vec![4], vec![1], vec![[3, 0]]),
    ));
    let mut found = 0;
    for (name, spec) in &cases {
        for pass in Pass::ALL {
            let conv = ConvProblem::new(spec.clone()).with_pass(pass);
            let problem = ProblemData::random_fused(&conv, 5, 1);
            let reference = oracle(&problem).unwrap();
            let dp = DeviceProblem::upload(dev, &problem).unwrap();
            let mut run = match CudnnGraphRun::new(&dp) {
                Ok(r) => r,
                Err(e) => {
                    assert!(pass != Pass::Forward, "{name} forward: {e}");
                    eprintln!("{name} {pass}: {e}");
                    continue;
                }
            };
            let verdict = check(&mut run, &problem, &reference).unwrap();
            assert!(
                verdict.passed,
                "{name} {pass} {}: {:?}",
                run.describe(),
                verdict.comparison
            );
            eprintln!("{name} {pass}: {}", run.describe());
            found += 1;
            let again = CudnnGraphRun::new(&dp).unwrap();
            assert!(again.describe().contains("cached"), "{}", again.describe());
        }
    }
    eprintln!(
        "cuDNN's backend API ran {found} of {} passes",
        cases.len() * 3
    );
}

/// The fp8 scaled GEMM's warp-MMA kernel against the f64 oracle (rel L2 <= 0.01, max abs
/// <= 1.0): every scaling mode, output type and bias, on ragged shapes (M, N past a tile;
/// K a multiple of 16 but not of the K step) and a decode shape, with the default config
/// and two others of the family.
#[test]
#[ignore = "needs a CUDA GPU"]
fn scaled_mm_kernels_pass_the_gate() {
    use evokernel::gemm::{
        gemm_gate, mma, scaled_mm_reference, GemmKernel, MmaConfig, ScaledMmData, ScaledMmRun,
        ScaledMmSpec, Scaling, WgmmaConfig,
    };
    let engine = Engine::cuda(0).unwrap();
    let dev = engine.device().unwrap().as_ref();
    let others = [
        GemmKernel::Mma(MmaConfig {
            bm: 64,
            bn: 64,
            bk: 32,
            warps_m: 2,
            warps_n: 2,
        }),
        GemmKernel::Mma(MmaConfig {
            bm: 128,
            bn: 256,
            bk: 128,
            warps_m: 2,
            warps_n: 4,
        }),
        GemmKernel::Wgmma(WgmmaConfig {
            bn: 64,
            consumers: 1,
            stages: 3,
            group_m: 1,
            splits: 1,
            persistent: 0,
            cluster: 1,
            fold: 1,
        }),
        // Persistent: more tiles than SMs on the 520 x 1100 shape, so blocks loop.
        GemmKernel::Wgmma(WgmmaConfig {
            bn: 64,
            consumers: 1,
            stages: 3,
            group_m: 8,
            splits: 1,
            persistent: 1,
            cluster: 1,
            fold: 1,
        }),
        GemmKernel::Wgmma(WgmmaConfig {
            bn: 256,
            consumers: 2,
            stages: 4,
            group_m: 16,
            splits: 1,
            persistent: 1,
            cluster: 1,
            fold: 1,
        }),
        GemmKernel::Wgmma(WgmmaConfig {
            bn: 128,
            consumers: 2,
            stages: 5,
            group_m: 8,
            splits: 3,
            persistent: 1,
            cluster: 1,
            fold: 1,
        }),
        // Clusters of two sharing B by multicast: an odd count of 64-row tiles on 300 x
        // 130 leaves the last cluster's second block past M; split-K and persistent too.
        GemmKernel::Wgmma(WgmmaConfig {
            bn: 64,
            consumers: 1,
            stages: 3,
            group_m: 1,
            splits: 1,
            persistent: 0,
            cluster: 2,
            fold: 1,
        }),
        GemmKernel::Wgmma(WgmmaConfig {
            bn: 256,
            consumers: 2,
            stages: 4,
            group_m: 8,
            splits: 1,
            persistent: 0,
            cluster: 2,
            fold: 1,
        }),
        GemmKernel::Wgmma(WgmmaConfig {
            bn: 128,
            consumers: 2,
            stages: 4,
            group_m: 16,
            splits: 3,
            persistent: 1,
            cluster: 2,
            fold: 1,
        }),
        // Block-wise in batches of two stages (the others refuse fold 2): odd step counts
        // (K = 272, 384; splits of 11 of 32) leave a single tail stage.
        GemmKernel::Wgmma(WgmmaConfig {
            bn: 128,
            consumers: 2,
            stages: 4,
            group_m: 8,
            splits: 1,
            persistent: 1,
            cluster: 2,
            fold: 2,
        }),
        GemmKernel::Wgmma(WgmmaConfig {
            bn: 64,
            consumers: 1,
            stages: 3,
            group_m: 1,
            splits: 3,
            persistent: 0,
            cluster: 1,
            fold: 2,
        }),
        // Three consumer warpgroups (192-row tiles, 160 registers each): ragged in M
        // everywhere here, clustered and persistent, and split.
        GemmKernel::Wgmma(WgmmaConfig {
            bn: 128,
            consumers: 3,
            stages: 4,
            group_m: 8,
            splits: 1,
            persistent: 1,
            cluster: 2,
            fold: 1,
        }),
        GemmKernel::Wgmma(WgmmaConfig {
            bn: 64,
            consumers: 3,
            stages: 3,
            group_m: 1,
            splits: 3,
            persistent: 0,
            cluster: 1,
            fold: 1,
        }),
        // 192-column tiles: block-wise tiles straddle two 128-column B blocks (N = 200
        // and 1100 start tiles at column 192, mid-block), persistent; clustered and split.
        GemmKernel::Wgmma(WgmmaConfig {
            bn: 192,
            consumers: 2,
            stages: 4,
            group_m: 8,
            splits: 1,
            persistent: 1,
            cluster: 1,
            fold: 1,
        }),
        GemmKernel::Wgmma(WgmmaConfig {
            bn: 192,
            consumers: 1,
            stages: 5,
            group_m: 1,
            splits: 3,
            persistent: 0,
            cluster: 2,
            fold: 1,
        }),
    ];
    let mut checked = 0;
    for scaling in [Scaling::PerTensor, Scaling::RowWise, Scaling::BlockWise] {
        for out in mma::OUT_TYPES {
            for bias in [false, true] {
                for (m, n, k) in [
                    (100, 200, 272),
                    (16, 1024, 4096),
                    (300, 130, 512),
                    (520, 1100, 384),
                ] {
                    let spec = ScaledMmSpec::new(m, n, k, scaling, out, bias).unwrap();
                    let data = ScaledMmData::random(&spec, (m + n + k) as u64);
                    let want = scaled_mm_reference(&spec, &data).unwrap();
                    let kernels = GemmKernel::ladder(&spec)
                        .into_iter()
                        .chain(others)
                        .filter(|c| c.fits(&spec).is_ok());
                    for cfg in kernels {
                        let mut run = ScaledMmRun::new(dev, &spec, &data, cfg)
                            .unwrap_or_else(|e| panic!("{spec} {cfg}: {e}"));
                        run.launch().unwrap();
                        let got = run.output().unwrap();
                        let v = gemm_gate(&got, &want).unwrap();
                        assert!(v.passed, "{spec} {cfg}: {v:?}");
                        checked += 1;
                    }
                }
            }
        }
    }
    eprintln!("{checked} scaled GEMM runs pass the gate");
}

/// Block-wise scaling on scales a quantizer would never give (zero, subnormal, NaN, 2^70
/// apart along K, rising and falling by 2^20-2^30 a stage), row by row and in B's column
/// blocks, against the f64 oracle row by row (each row's rel L2 <= 0.01: magnitudes span
/// 2^200 between rows), a row of zero scales exactly zero and a NaN scale's row NaN, with
/// each fold of the kernel (one partial set, two) and split-K. (A fold that rescaled the
/// total instead of keeping a partial set was built against this test and measured
/// slower, run 145 in docs/perf.md.)
#[test]
#[ignore = "needs a CUDA GPU"]
fn blockwise_scaling_survives_hostile_scales() {
    use evokernel::gemm::{
        scaled_mm_reference, GemmKernel, ScaledMmData, ScaledMmRun, ScaledMmSpec, Scaling,
        WgmmaConfig,
    };
    let engine = Engine::cuda(0).unwrap();
    let dev = engine.device().unwrap().as_ref();
    let (m, n, k) = (200usize, 448usize, 1024usize);
    let spec = ScaledMmSpec::new(
        m as i64,
        n as i64,
        k as i64,
        Scaling::BlockWise,
        evokernel::DType::F32,
        false,
    )
    .unwrap();
    let mut data = ScaledMmData::random(&spec, 99);
    let steps = k / 128;
    let mut a = |row: usize, step: usize, f: &dyn Fn(f32) -> f32| {
        let i = spec.scale_index_a(row, step * 128);
        data.scale_a[i] = f(data.scale_a[i]);
    };
    for step in 0..steps {
        a(0, step, &|_| 0.0);
        // Rising by 2^30 a stage from 2^-100, falling by 2^20 a stage from 2^70.
        a(5, step, &|s| s * 2f32.powi(30 * step as i32 - 100));
        a(6, step, &|s| s * 2f32.powi(70 - 20 * step as i32));
    }
    a(1, 3, &|_| 0.0);
    a(2, 0, &|s| s * 2f32.powi(70));
    a(2, 1, &|s| s * 2f32.powi(-70));
    a(3, 2, &|_| 2f32.powi(-135));
    a(7, 4, &|_| f32::NAN);
    a(150, 7, &|_| 0.0);
    let blocks = n.div_ceil(128);
    data.scale_b[4 * blocks + 1] = 0.0;
    data.scale_b[5 * blocks] *= 2f32.powi(-80);
    data.scale_b[2 * blocks + 3] *= 2f32.powi(40);
    let want = scaled_mm_reference(&spec, &data).unwrap();
    let base = WgmmaConfig {
        bn: 128,
        consumers: 3,
        stages: 3,
        group_m: 16,
        splits: 1,
        persistent: 1,
        cluster: 1,
        fold: 1,
    };
    let configs = [
        base,
        WgmmaConfig::default_for(&spec),
        WgmmaConfig {
            bn: 192,
            consumers: 2,
            ..base
        },
        WgmmaConfig {
            consumers: 2,
            stages: 4,
            cluster: 2,
            fold: 2,
            ..base
        },
        WgmmaConfig {
            bn: 64,
            consumers: 1,
            splits: 3,
            persistent: 0,
            ..base
        },
    ];
    for cfg in configs {
        cfg.fits(&spec).unwrap();
        let mut run = ScaledMmRun::new(dev, &spec, &data, GemmKernel::Wgmma(cfg)).unwrap();
        run.launch().unwrap();
        let got = run.output().unwrap();
        for row in 0..m {
            let (mut err2, mut ref2) = (0f64, 0f64);
            for col in 0..n {
                let (g, w) = (got.get_f64(row * n + col), want[row * n + col]);
                if row == 7 {
                    assert!(
                        g.is_nan() && w.is_nan(),
                        "{cfg} row 7 col {col}: {g} vs {w}"
                    );
                    continue;
                }
                assert!(g.is_finite(), "{cfg} row {row} col {col}: {g} (want {w})");
                err2 += (g - w) * (g - w);
                ref2 += w * w;
            }
            if row == 0 {
                assert_eq!(err2, 0.0, "{cfg}: a row of zero scales is zero");
            } else if row != 7 {
                let rel = (err2 / ref2).sqrt();
                assert!(rel <= 0.01, "{cfg} row {row}: rel L2 {rel:e}");
            }
        }
        eprintln!("{cfg}: every row within the gate");
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cublaslt_scaled_mm_passes_the_gate_and_benches_beside_the_kernel() {
    use evokernel::bench::Protocol;
    use evokernel::cuda::cublaslt::CublasLtScaledMm;
    use evokernel::gemm::{
        bench_scaled_mm, gemm_gate, mma, scaled_mm_reference, ScaledMmData, ScaledMmSpec, Scaling,
    };
    let engine = Engine::cuda(0).unwrap();
    let dev = engine.device().unwrap().as_ref();
    let mut checked = 0;
    for scaling in [Scaling::PerTensor, Scaling::RowWise, Scaling::BlockWise] {
        for out in mma::OUT_TYPES {
            // Block-wise scaling takes no bias epilogue in cuBLASLt on sm_90 (refused).
            for bias in [false, scaling != Scaling::BlockWise] {
                for (m, n, k) in [(128, 256, 512), (16, 1024, 4096), (256, 384, 640)] {
                    let spec = ScaledMmSpec::new(m, n, k, scaling, out, bias).unwrap();
                    let data = ScaledMmData::random(&spec, (m * n + k) as u64);
                    let want = scaled_mm_reference(&spec, &data).unwrap();
                    let mut r = CublasLtScaledMm::new(dev, &spec, &data)
                        .unwrap_or_else(|e| panic!("{spec}: {e}"));
                    r.launch().unwrap();
                    let v = gemm_gate(&r.output().unwrap(), &want).unwrap();
                    assert!(v.passed, "cuBLASLt {spec}: {v:?}");
                    checked += 1;
                }
            }
        }
    }
    eprintln!("{checked} cuBLASLt runs pass the gate");
    let spec = ScaledMmSpec::new(
        1024,
        2048,
        1024,
        Scaling::RowWise,
        evokernel::DType::Bf16,
        true,
    )
    .unwrap();
    let case = bench_scaled_mm(dev, "t", &spec, &[], &Protocol::default(), 7).unwrap();
    assert!(case.passed(), "{case:?}");
    let r = case.cublaslt.as_ref().expect("a cuBLASLt row");
    assert!(r.median_ms > 0.0 && case.candidates[0].vs_cublaslt.unwrap() > 0.0);
    assert!(case.checked > 1024, "sampled positions: {}", case.checked);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gemm_tuner_records_a_config_the_bench_can_pick() {
    use evokernel::bench::Protocol;
    use evokernel::gemm::tune::{target_of, tune_scaled_mm, tuned_config};
    use evokernel::gemm::{ScaledMmSpec, Scaling};
    use evokernel::tune::{SearchKind, TuneCache, TunePlan};
    let engine = Engine::cuda(0).unwrap();
    let dev = engine.device().unwrap().as_ref();
    let dir = std::env::temp_dir().join(format!("evokernel-gemm-tune-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cache = TuneCache::open(&dir.join("tune.json"));
    let spec = ScaledMmSpec::new(
        256,
        512,
        1024,
        Scaling::RowWise,
        evokernel::DType::Bf16,
        false,
    )
    .unwrap();
    let plan = TunePlan {
        search: SearchKind::Evolutionary,
        max_candidates: Some(12),
        max_seconds: 60.0,
        retune: true,
        shard: None,
    };
    let protocol = Protocol::default().with_launches(5);
    let row = tune_scaled_mm(dev, &spec, &plan, &protocol, 3, &mut cache, &mut |_| {}).unwrap();
    assert!(row.timed >= 6 && row.failed == 0, "{row:?}");
    let best = tuned_config(&cache, &target_of(dev), &spec).expect("a tuned config");
    assert_eq!(Some(best.to_string()), row.best_config);
    // The second call reads the cache instead of timing.
    let plan = TunePlan {
        retune: false,
        ..plan
    };
    let again = tune_scaled_mm(dev, &spec, &plan, &protocol, 3, &mut cache, &mut |_| {}).unwrap();
    assert!(again.from_cache && again.timed == 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The suites' channels-last cases and 60 random one-row channels-last specs (1-D rows,
/// 1xK rows of 2-D and 3-D tensors with D and H strides and padding, so whole rows lie in
/// the padding; W dilation, asymmetric padding, rows shorter than a run; every dtype,
/// channel counts of one 16-byte vector and up): the window kernels' tests filter them.
fn one_row_specs(layout: Layout) -> Vec<(String, ConvSpec)> {
    let mut rng = SplitMix64::new(2071);
    let mut pick = |lo: u64, hi: u64| (lo + rng.next_u64() % (hi - lo + 1)) as i64;
    let mut specs: Vec<(String, ConvSpec)> = named_specs(
        [public_suite(), channels_last_suite(), models_suite()],
        Some(layout),
    );
    for i in 0..60 {
        let mut p = ConvParams::seed();
        p.layout = layout;
        p.n = pick(1, 3);
        p.dtype = DType::ALL[i % 3];
        let vec = p.dtype.per_16_bytes() as i64;
        p.c = vec * pick(1, 40);
        let (kw, dw) = (pick(1, 8), pick(1, 3));
        let row = (kw, 1, dw, pick(1, 70));
        let dims = match i % 3 {
            0 => vec![row],
            1 => vec![(1, pick(1, 2), 1, pick(1, 9)), row],
            _ => vec![
                (1, pick(1, 2), 1, pick(1, 4)),
                (1, pick(1, 3), 1, pick(1, 6)),
                row,
            ],
        };
        set_dims(&mut p, &dims, &mut pick);
        // Padding along D and H (kernel 1: set_dims leaves none), so rows lie in it.
        let dims_n = p.padding.len();
        for d in 0..dims_n - 1 {
            p.padding[d] = [pick(0, 1), pick(0, 1)];
        }
        if layout == Layout::ChannelsFirst {
            // Channels-first rows of whole 16-byte vectors in and out (row_window's
            // domain): W a multiple of VEC, the padding after topped up to one.
            p.input[dims_n - 1] = vec * pick(1, 12);
            p.padding[dims_n - 1][1] = vec * pick(0, 1);
            whole_vector_output_rows(&mut p);
        }
        if let Ok(spec) = p.validate() {
            specs.push((format!("random #{i}"), spec));
        }
    }
    specs
}

/// `v`'s cases on `one_row_specs(layout)` (with `twins`, the suites' cases' grad-input
/// twins too: the forward of the flipped kernel, the padding swapped), each with its
/// default and `overrides(spec)` that launch.
fn window_cases(
    v: &dyn evokernel::variants::Variant,
    layout: Layout,
    twins: bool,
    overrides: impl Fn(&ConvSpec) -> Vec<Vec<(&'static str, i64)>>,
) -> Vec<(String, ConvSpec, Vec<evokernel::variants::Config>)> {
    let mut cases = Vec::new();
    for (case, spec) in one_row_specs(layout) {
        let twin = (twins && !case.starts_with("random"))
            .then(|| spec.dgrad_twin())
            .flatten();
        for (case, spec) in std::iter::once((case.clone(), spec))
            .chain(twin.map(|t| (format!("{case} grad-input twin"), t)))
        {
            if v.applies(&spec).is_err() {
                continue;
            }
            let sets = overrides(&spec);
            let mut refs: Vec<&[(&str, i64)]> = vec![&[]];
            refs.extend(sets.iter().map(|s| s.as_slice()));
            let configs = launchable_overrides(v, &spec, &refs);
            cases.push((case, spec, configs));
        }
    }
    cases
}

/// A window kernel's forward against the oracle on `one_row_specs(layout)` and the
/// suites' grad-input twins, each spec's default and `overrides(spec)`, the fused
/// epilogue in turn, NaN and Inf in every third case.
fn window_forward_passes(
    name: &str,
    layout: Layout,
    overrides: impl Fn(&ConvSpec) -> Vec<Vec<(&'static str, i64)>>,
) {
    let engine = Engine::cuda(0).unwrap();
    let v = evokernel::variants::find(name).unwrap();
    let cases = window_cases(v, layout, true, overrides);
    let all = epilogues();
    let checked = check_cases(&engine, v, &cases, |i, spec| {
        ConvProblem::new(spec.clone()).with_epilogue(if i % 2 == 0 {
            Epilogue::NONE
        } else {
            all[i % all.len()]
        })
    });
    let padded_rows = cases
        .iter()
        .filter(|(_, s, _)| {
            let (before, after) = (s.pad_before3(), s.pad_after3());
            before[0] + before[1] + after[0] + after[1] > 0
        })
        .count();
    eprintln!(
        "{checked} {name} checks on {} specs, {padded_rows} with rows in the padding",
        cases.len()
    );
    assert!(cases.len() >= 40, "only {} specs", cases.len());
    assert!(padded_rows >= 5, "{padded_rows}");
}

/// `row_window_cl` against the oracle: the suites' one-row channels-last cases, forward
/// and grad-input, and random one-row specs (1-D rows, 1xK rows of 2-D and 3-D tensors
/// with D and H strides and padding, so whole rows lie in the padding; W dilation,
/// asymmetric padding wider than the run, rows shorter than a run; every dtype, channel
/// counts of one vector and up), every run length on some, the fused epilogue in turn,
/// NaN and Inf in every third case.
#[test]
#[ignore = "needs a CUDA GPU"]
fn row_window_cl_passes_on_one_row_specs() {
    window_forward_passes("row_window_cl", Layout::ChannelsLast, |_| {
        vec![
            vec![("run", 2), ("block", 128)],
            vec![("run", 16), ("minblocks", 1)],
        ]
    });
}

/// `row_window` against the oracle: the suites' one-row channels-first cases, forward and
/// grad-input, and random channels-first one-row specs (rows of whole 16-byte vectors; 1xK
/// rows of 2-D and 3-D tensors with whole rows in the D and H padding, W dilation,
/// asymmetric padding, rows shorter than a run; every dtype), runs of one, two and four
/// vectors, the fused epilogue in turn, NaN and Inf in every third case.
#[test]
#[ignore = "needs a CUDA GPU"]
fn row_window_passes_on_one_row_specs() {
    window_forward_passes("row_window", Layout::ChannelsFirst, |spec| {
        let vec = spec.dtype().per_16_bytes() as i64;
        vec![
            vec![("run", vec), ("block", 128)],
            vec![("run", 4 * vec), ("minblocks", 1)],
        ]
    });
}

/// A window kernel's grad-weight and grad-bias against the oracle on
/// `one_row_specs(layout)`: each spec's default and `overrides(spec)`, NaN and Inf in
/// every third case.
fn window_grad_weight_passes(
    name: &str,
    layout: Layout,
    overrides: impl Fn(&ConvSpec) -> Vec<Vec<(&'static str, i64)>>,
) {
    let engine = Engine::cuda(0).unwrap();
    let v = evokernel::variants::find(name).unwrap();
    let cases = window_cases(v, layout, false, overrides);
    let checked = check_cases(&engine, v, &cases, |_, spec| {
        ConvProblem::new(spec.clone())
            .with_epilogue(Epilogue {
                bias: true,
                ..Epilogue::NONE
            })
            .with_pass(Pass::Wgrad)
    });
    eprintln!("{checked} {name} checks on {} specs", cases.len());
    assert!(cases.len() >= 40, "only {} specs", cases.len());
}

/// `wgrad_window_cl` (grad-weight and grad-bias) against the oracle on `one_row_specs`:
/// the default, runs of 2 and 8, one split and many, one group and 32.
#[test]
#[ignore = "needs a CUDA GPU"]
fn wgrad_window_cl_passes_on_one_row_specs() {
    window_grad_weight_passes("wgrad_window_cl", Layout::ChannelsLast, |_| {
        vec![
            // One group: partials written straight from registers.
            vec![("run", 2), ("splits", 1), ("block", 128), ("groups", 1)],
            vec![("run", 8), ("splits", 256), ("groups", 1)],
            // Warps across 8 groups of 4 vectors, an odd split count.
            vec![("run", 2), ("block", 128), ("groups", 32), ("splits", 7)],
        ]
    });
}

/// `wgrad_window` (grad-weight and grad-bias) against the oracle on the channels-first
/// `one_row_specs`: the default, runs of one and four vectors, one split and many, blocks
/// of 128 and 256, the next item's loads ahead.
#[test]
#[ignore = "needs a CUDA GPU"]
fn wgrad_window_passes_on_one_row_specs() {
    window_grad_weight_passes("wgrad_window", Layout::ChannelsFirst, |spec| {
        let vec = spec.dtype().per_16_bytes() as i64;
        vec![
            vec![("run", vec), ("splits", 1), ("block", 256)],
            vec![("run", 4 * vec), ("splits", 64), ("block", 128)],
            // The next item's loads ahead of the sums.
            vec![("ahead", 1)],
            vec![("ahead", 1), ("splits", 1), ("run", vec)],
        ]
    });
}
