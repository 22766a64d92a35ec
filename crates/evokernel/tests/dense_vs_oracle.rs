//! Property tests of dense and grouped convolution: random valid specs (1-3 spatial dims,
//! stride, dilation, asymmetric padding, batch, both layouts, every dtype, groups from 1
//! to depthwise), the CPU backend against the f64 oracle under MEASURE.md's gates, with
//! NaN/Inf in some inputs; and the embedded dense suite's cases shrunk to small sizes.

use evokernel::dense::{conv_dense_cpu, dense_reference, dense_suite, DenseConvSpec};
use evokernel::tensor::{compare, SplitMix64};
use evokernel::{ConvParams, DType, HostTensor, Layout};
use proptest::prelude::*;

fn dim() -> impl Strategy<Value = (i64, i64, i64, i64, [i64; 2])> {
    (1i64..=9, 1i64..=4, 1i64..=3, 1i64..=2, 0i64..=2, 0i64..=2).prop_map(|(i, k, s, d, pb, pa)| {
        let span = d * (k - 1) + 1;
        (i.max(span - pb - pa).max(1), k, s, d, [pb, pa])
    })
}

/// A valid spec: groups 1-4 of 1-6 input and 1-6 output channels each.
fn spec() -> impl Strategy<Value = DenseConvSpec> {
    (
        1usize..=3,
        prop::collection::vec(dim(), 3),
        1i64..=2,
        1i64..=4,
        1i64..=6,
        1i64..=6,
        prop::sample::select(vec![Layout::ChannelsFirst, Layout::ChannelsLast]),
        prop::sample::select(DType::ALL.to_vec()),
    )
        .prop_map(|(ndim, dims, n, groups, cpi, cpo, layout, dtype)| {
            let dims = &dims[..ndim];
            let p = ConvParams {
                n,
                c: groups * cpi,
                input: dims.iter().map(|d| d.0).collect(),
                kernel: dims.iter().map(|d| d.1).collect(),
                stride: dims.iter().map(|d| d.2).collect(),
                dilation: dims.iter().map(|d| d.3).collect(),
                padding: dims.iter().map(|d| d.4).collect(),
                layout,
                dtype,
            };
            DenseConvSpec::from_params(&p, groups * cpo, groups)
                .expect("strategy builds valid specs")
        })
}

fn check(spec: &DenseConvSpec, seed: u64, non_finite: bool) -> Result<(), String> {
    let mut x = HostTensor::random_normal(spec.dtype(), &spec.input_shape(), seed);
    let w = HostTensor::random_normal(spec.dtype(), &spec.weight_shape(), seed ^ 1);
    if non_finite {
        let mut rng = SplitMix64::new(seed);
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let i = (rng.next_u64() % x.len() as u64) as usize;
            x.set_f64(i, v);
        }
    }
    let mut y = HostTensor::nan(spec.dtype(), &spec.output_shape());
    conv_dense_cpu(spec, &x, &w, &mut y).map_err(|e| e.to_string())?;
    let want = dense_reference(spec, &x, &w).map_err(|e| e.to_string())?;
    let c = compare(&y, &want).map_err(|e| e.to_string())?;
    if c.passes(spec.dtype()) {
        Ok(())
    } else {
        Err(format!("{spec} seed {seed}: {c:?}"))
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn cpu_dense_matches_oracle(spec in spec(), seed in any::<u64>()) {
        let r = check(&spec, seed, seed % 4 == 0);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

#[test]
fn the_dense_suite_shrunk_passes_on_the_cpu() {
    for case in dense_suite().unwrap() {
        for dtype in DType::ALL {
            let s = case.spec.small_twin(dtype).unwrap();
            check(&s, 11, false).unwrap_or_else(|e| panic!("{}: {e}", case.name));
            check(&s.with_layout(Layout::ChannelsFirst), 12, true)
                .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        }
    }
}
