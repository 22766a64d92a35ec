//! Property tests: random valid specs over every dimension of the spec space, CPU
//! backend against the f64 oracle under MEASURE.md's gates.

use evokernel::backend::ProblemData;
use evokernel::cpu::{
    conv_cpu, conv_cpu_with, dgrad_cpu, wgrad_cpu, wgrad_cpu_with, FusedEpilogue, Isa,
};
use evokernel::reference::{conv_reference, dgrad_reference, wgrad_reference};
use evokernel::tensor::compare;
use evokernel::verify::oracle;
use evokernel::{Activation, ConvProblem, Engine, Epilogue};
use evokernel::{ConvParams, ConvSpec, DType, HostTensor, Layout};
use proptest::prelude::*;

/// One spatial dim: (input, kernel, stride, dilation, [pad before, pad after]), made
/// valid by growing the input until the dilated kernel fits the padded input.
fn dim(max_input: i64) -> impl Strategy<Value = (i64, i64, i64, i64, [i64; 2])> {
    (
        1..=max_input,
        1i64..=5,
        1i64..=3,
        1i64..=3,
        0i64..=3,
        0i64..=3,
    )
        .prop_map(|(i, k, s, d, pb, pa)| {
            let span = d * (k - 1) + 1;
            (i.max(span - pb - pa).max(1), k, s, d, [pb, pa])
        })
}

fn spec() -> impl Strategy<Value = ConvSpec> {
    (
        1usize..=3,
        prop::collection::vec(dim(12), 3),
        1i64..=40,
        1i64..=140,
        1i64..=3,
        1i64..=19,
        prop::sample::select(vec![Layout::ChannelsFirst, Layout::ChannelsLast]),
        prop::sample::select(DType::ALL.to_vec()),
    )
        .prop_map(|(ndim, dims, depth_w, wide_w, n, c, layout, dtype)| {
            let mut dims = dims[..ndim].to_vec();
            // The W dim is sometimes wide, to cross several register blocks.
            let last = dims.last_mut().unwrap();
            let span = last.3 * (last.1 - 1) + 1;
            last.0 = if depth_w % 4 == 0 { wide_w } else { last.0 }
                .max(span - last.4[0] - last.4[1])
                .max(1);
            ConvParams {
                n,
                c,
                input: dims.iter().map(|d| d.0).collect(),
                kernel: dims.iter().map(|d| d.1).collect(),
                stride: dims.iter().map(|d| d.2).collect(),
                dilation: dims.iter().map(|d| d.3).collect(),
                padding: dims.iter().map(|d| d.4).collect(),
                layout,
                dtype,
            }
            .validate()
            .expect("strategy builds valid specs")
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn cpu_matches_oracle(spec in spec(), seed in any::<u64>()) {
        let x = HostTensor::random_normal(spec.dtype(), &spec.input_shape(), seed);
        let w = HostTensor::random_normal(spec.dtype(), &spec.weight_shape(), seed ^ 1);
        let mut y = HostTensor::nan(spec.dtype(), &spec.output_shape());
        conv_cpu(&spec, &x, &w, &mut y).unwrap();
        let r = conv_reference(&spec, &x, &w).unwrap();
        let c = compare(&y, &r).unwrap();
        prop_assert!(c.passes(spec.dtype()), "{} seed {}: {:?}", spec, seed, c);
        // Every vector width this CPU runs (AVX-512's intrinsics, AVX2, portable: their
        // row groups and tails differ).
        for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable] {
            if !isa.supported() {
                continue;
            }
            let mut y = HostTensor::nan(spec.dtype(), &spec.output_shape());
            conv_cpu_with(isa, &spec, &FusedEpilogue::default(), &x, &w, &mut y).unwrap();
            let c = compare(&y, &r).unwrap();
            prop_assert!(c.passes(spec.dtype()), "{:?} {} seed {}: {:?}", isa, spec, seed, c);
        }
    }

    #[test]
    fn cpu_propagates_nan_and_inf_like_the_oracle(spec in spec(), seed in any::<u64>()) {
        let mut p = ProblemData::random(&spec, seed, 1);
        p.inject_non_finite(seed);
        let mut y = HostTensor::nan(spec.dtype(), &spec.output_shape());
        conv_cpu(&spec, &p.inputs[0], &p.weight, &mut y).unwrap();
        let r = conv_reference(&spec, &p.inputs[0], &p.weight).unwrap();
        // (With strides, a poisoned input may feed no output at all.)
        let c = compare(&y, &r).unwrap();
        prop_assert!(c.passes(spec.dtype()), "{} seed {}: {:?}", spec, seed, c);
    }

    /// Every epilogue (bias, each activation, residual) through the Engine's CPU plan,
    /// against the oracle; NaN/Inf inputs in a third of the cases.
    #[test]
    fn cpu_epilogues_match_oracle(
        spec in spec(),
        seed in any::<u64>(),
        bias in any::<bool>(),
        act in 0usize..4,
        residual in any::<bool>(),
    ) {
        let epilogue = Epilogue { bias, activation: Activation::ALL[act], residual };
        let problem = ConvProblem::new(spec.clone()).with_epilogue(epilogue);
        let mut p = ProblemData::random_fused(&problem, seed, 1);
        if seed % 3 == 0 {
            p.inject_non_finite(seed);
        }
        let plan = Engine::cpu().plan(&problem).unwrap();
        let y = plan.run_host(&p.inputs[0], &p.weight, p.bias.as_ref(), p.residual(0)).unwrap();
        let r = oracle(&p).unwrap();
        let c = compare(&y, &r).unwrap();
        prop_assert!(c.passes(spec.dtype()), "{} seed {}: {:?}", problem, seed, c);
    }

    /// The CPU backward passes against the f64 oracles: grad-input (the flipped-kernel
    /// forward where strides are 1, a gather otherwise) and grad-weight, with NaN/Inf in
    /// grad_output in a third of the cases (they must reach exactly the oracle's
    /// elements, of the same kind).
    #[test]
    fn cpu_backward_matches_oracle(spec in spec(), seed in any::<u64>()) {
        let mut gy = HostTensor::random_normal(spec.dtype(), &spec.output_shape(), seed);
        if seed % 3 == 0 {
            let i = (seed / 3) as usize % gy.len();
            gy.set_f64(i, if seed % 2 == 0 { f64::NAN } else { f64::INFINITY });
        }
        let x = HostTensor::random_normal(spec.dtype(), &spec.input_shape(), seed ^ 1);
        let w = HostTensor::random_normal(spec.dtype(), &spec.weight_shape(), seed ^ 2);
        let mut gx = HostTensor::nan(spec.dtype(), &spec.input_shape());
        dgrad_cpu(&spec, &gy, &w, &mut gx).unwrap();
        let c = compare(&gx, &dgrad_reference(&spec, &gy, &w).unwrap()).unwrap();
        prop_assert!(c.passes(spec.dtype()), "dgrad {} seed {}: {:?}", spec, seed, c);
        let want = wgrad_reference(&spec, &x, &gy).unwrap();
        let mut gw = HostTensor::nan(spec.dtype(), &spec.weight_shape());
        wgrad_cpu(&spec, &x, &gy, &mut gw).unwrap();
        let c = compare(&gw, &want).unwrap();
        prop_assert!(c.passes(spec.dtype()), "wgrad {} seed {}: {:?}", spec, seed, c);
        // Deterministic: the same bits on a second run.
        let mut again = HostTensor::nan(spec.dtype(), &spec.weight_shape());
        wgrad_cpu(&spec, &x, &gy, &mut again).unwrap();
        prop_assert_eq!(gw.as_bytes(), again.as_bytes());
        // And whatever the thread count: the tasks follow it (a channel each on one
        // thread, a channel's kernel depths or tap rows each on 16), the sums do not.
        for threads in [1, 16] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let mut split = HostTensor::nan(spec.dtype(), &spec.weight_shape());
            pool.install(|| wgrad_cpu(&spec, &x, &gy, &mut split)).unwrap();
            prop_assert_eq!(split.as_bytes(), again.as_bytes(), "{} threads", threads);
        }
        // Every vector width this CPU runs (AVX-512's masked tails, AVX2, portable).
        for isa in [Isa::Avx512, Isa::Avx2, Isa::Portable] {
            if !isa.supported() {
                continue;
            }
            let mut gw = HostTensor::nan(spec.dtype(), &spec.weight_shape());
            wgrad_cpu_with(isa, &spec, &x, &gy, &mut gw).unwrap();
            let c = compare(&gw, &want).unwrap();
            prop_assert!(c.passes(spec.dtype()), "wgrad {:?} {} seed {}: {:?}", isa, spec, seed, c);
        }
    }

    #[test]
    fn layouts_agree(spec in spec(), seed in any::<u64>()) {
        // The same numbers in the other layout must give the same numbers out.
        let other = spec.with_layout(match spec.layout() {
            Layout::ChannelsFirst => Layout::ChannelsLast,
            Layout::ChannelsLast => Layout::ChannelsFirst,
        });
        let x = HostTensor::random_normal(spec.dtype(), &spec.input_shape(), seed);
        let w = HostTensor::random_normal(spec.dtype(), &spec.weight_shape(), seed ^ 1);
        let mut xo = HostTensor::zeros(spec.dtype(), &other.input_shape());
        let [d, h, wd] = spec.input3();
        for n in 0..spec.n() { for c in 0..spec.c() { for a in 0..d { for b in 0..h { for e in 0..wd {
            let v = x.get_f64(spec.input_index(n, c, a, b, e));
            xo.set_f64(other.input_index(n, c, a, b, e), v);
        }}}}}
        let r = conv_reference(&spec, &x, &w).unwrap();
        let ro = conv_reference(&other, &xo, &w).unwrap();
        let [od, oh, ow] = spec.output3();
        for n in 0..spec.n() { for c in 0..spec.c() { for a in 0..od { for b in 0..oh { for e in 0..ow {
            prop_assert_eq!(r[spec.output_index(n, c, a, b, e)], ro[other.output_index(n, c, a, b, e)]);
        }}}}}
    }
}

/// One engine shared by threads: each plans and runs its own problem (and the shared
/// one), and every result matches the oracle.
#[test]
fn two_threads_share_one_engine() {
    let engine = std::sync::Arc::new(Engine::cpu());
    let base = ConvParams::seed();
    let handles: Vec<_> = (0..2)
        .map(|t| {
            let engine = std::sync::Arc::clone(&engine);
            let base = base.clone();
            let mut p = base.clone();
            p.c = 3 + t;
            p.input = vec![4, 7, 12];
            std::thread::spawn(move || {
                for spec in [p.validate().unwrap(), {
                    let mut q = base.clone();
                    q.c = 2;
                    q.input = vec![3, 6, 8];
                    q.validate().unwrap()
                }] {
                    let problem = ConvProblem::new(spec.clone()).with_epilogue(Epilogue {
                        bias: true,
                        activation: Activation::GeluTanh,
                        residual: false,
                    });
                    let data = ProblemData::random_fused(&problem, 9 + t as u64, 1);
                    let plan = engine.plan(&problem).unwrap();
                    let y = plan
                        .run_host(&data.inputs[0], &data.weight, data.bias.as_ref(), None)
                        .unwrap();
                    let c = compare(&y, &oracle(&data).unwrap()).unwrap();
                    assert!(c.passes(spec.dtype()), "{problem}: {c:?}");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // Three distinct problems: two per-thread ones and the shared one, planned once.
    assert_eq!(engine.cached_plans(), 3);
}

#[test]
fn nan_and_inf_in_the_input_propagate_like_pytorch() {
    // One NaN poisons exactly the outputs whose window covers it; Inf likewise.
    let spec = ConvParams {
        n: 1,
        c: 2,
        input: vec![9],
        kernel: vec![3],
        stride: vec![],
        dilation: vec![],
        padding: vec![[1, 1]],
        layout: Layout::ChannelsFirst,
        dtype: DType::F32,
    }
    .validate()
    .unwrap();
    let mut x = HostTensor::random_normal(DType::F32, &spec.input_shape(), 5);
    x.set_f64(4, f64::NAN);
    x.set_f64(9, f64::INFINITY);
    let w = HostTensor::random_normal(DType::F32, &spec.weight_shape(), 6);
    let mut y = HostTensor::nan(DType::F32, &spec.output_shape());
    conv_cpu(&spec, &x, &w, &mut y).unwrap();
    let r = conv_reference(&spec, &x, &w).unwrap();
    for (i, &b) in r.iter().enumerate() {
        let a = y.get_f64(i);
        assert_eq!(a.is_nan(), b.is_nan(), "{i}");
        assert_eq!(a.is_infinite(), b.is_infinite(), "{i}");
    }
    assert!((3..=5).all(|i| r[i].is_nan()) && r[2].is_finite() && r[6].is_finite());
    assert!(r[9].is_infinite() && r[10].is_infinite() && r[11].is_finite());
    assert_eq!(compare(&y, &r).unwrap().non_finite, 0);
}
