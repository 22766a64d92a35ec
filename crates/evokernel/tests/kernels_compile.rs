//! Every registered variant, with its default config on every case of the public and
//! channels-last suites it applies to, the calibration kernels and the fp8 GEMM's kernel
//! must compile for sm_90 with NVRTC. Runs on
//! CI with no GPU (NVRTC from PyPI, scripts/install-nvrtc.sh); a kernel that does not
//! compile fails CI.

use std::collections::BTreeSet;

use evokernel::cuda::calibrate;
use evokernel::cuda::jit::Jit;
use evokernel::cuda::run::{
    flip_specialization, repair_specialization, to_channels_first_specialization,
};
use evokernel::engine::with_epilogue;
use evokernel::suite::{channels_last_suite, public_suite};
use evokernel::variants::{registry, Variant};
use evokernel::{Activation, ConvParams, ConvSpec, DType, Epilogue, Layout, Pass};

#[test]
fn every_variant_compiles_for_sm90() {
    let jit = Jit::new("sm_90")
        .unwrap_or_else(|e| panic!("{e}\n(run scripts/install-nvrtc.sh, or use ./scripts/test.sh)"))
        .without_cache();
    let mut work: BTreeSet<(&str, &str, String)> = BTreeSet::new();
    // Both suites (channels-last has one-output-stage streaming_cl), plus channel counts
    // that are not a multiple of 8 (scalar paths).
    let mut specs: Vec<_> = public_suite()
        .unwrap()
        .into_iter()
        .chain(channels_last_suite().unwrap())
        .map(|c| c.spec)
        .collect();
    for (c, dtype) in [(7, DType::Bf16), (3, DType::F32)] {
        let mut p = ConvParams::seed();
        p.c = c;
        p.dtype = dtype;
        p.layout = Layout::ChannelsLast;
        specs.push(p.validate().unwrap());
    }
    // Each variant also with every epilogue bit set (bias, GELU, residual) and with
    // bias + SiLU and ReLU alone, on the first spec it takes.
    let fused = [
        Epilogue {
            bias: true,
            activation: Activation::GeluTanh,
            residual: true,
        },
        Epilogue {
            bias: true,
            activation: Activation::Silu,
            residual: false,
        },
        Epilogue {
            bias: false,
            activation: Activation::Relu,
            residual: false,
        },
    ];
    let mut fused_done = BTreeSet::new();
    for spec in &specs {
        for v in registry() {
            if v.applies(spec).is_ok() {
                let cfg = v.default_config(spec);
                let expr = v.specialization(spec, &cfg).unwrap();
                // Profiles filter launches on this name.
                assert!(
                    expr.starts_with(&format!("{}<", v.kernel_function_of(&cfg))),
                    "{expr}"
                );
                let mut epilogues = vec![Epilogue::NONE];
                if fused_done.insert(v.name()) {
                    // Each pass's kernels take the epilogue bits their pass has: the
                    // forward all, grad-weight the bias (grad-bias), grad-input none.
                    match v.pass() {
                        Pass::Forward => epilogues.extend(fused),
                        Pass::Wgrad => epilogues.push(Epilogue {
                            bias: true,
                            ..Epilogue::NONE
                        }),
                        Pass::Dgrad => {}
                    }
                }
                for e in &epilogues {
                    work.insert((v.name(), v.source(), with_epilogue(&expr, e)));
                    if v.needs_repair() {
                        let (n, s, r) = repair_specialization(spec);
                        work.insert((n, s, with_epilogue(&r, e)));
                    }
                    if let Some(f) = v.finalize_kernel(spec, &cfg, 132).unwrap() {
                        work.insert((f.name, f.source, with_epilogue(&f.expr, e)));
                    }
                }
            }
        }
    }
    for spec in &specs {
        let (n, s, f) = flip_specialization(spec);
        work.insert((n, s, with_epilogue(&f, &Epilogue::NONE)));
        // The channels-first copies of channels-last grad-weight: whole 64-channel tiles,
        // narrower ones, a chunk of one channel (ragged tiles only).
        if spec.layout() == Layout::ChannelsLast {
            for chunk in [spec.c(), 16, 1] {
                for shaped in [false, true] {
                    let (n, s, e, _) = to_channels_first_specialization(spec, chunk, shaped, 132);
                    work.insert((n, s, with_epilogue(&e, &Epilogue::NONE)));
                }
            }
        }
    }
    work.extend(calibrate::specializations());
    let (n, s, e) = evokernel::cuda::l2_sweep_specialization();
    work.insert((n, s, e.to_string()));
    let mut total_ms = 0.0;
    for (name, source, expr) in &work {
        let c = jit
            .compile(name, source, expr)
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(!c.cache_hit);
        assert_eq!(&c.cubin[..4], b"\x7fELF", "{expr}: not a CUBIN");
        // ptxas compiles a wgmma kernel whose accumulators are touched mid-flight, but
        // serializes every wgmma (C7514) or adds waits (C7517): a silent 2x (run 120).
        for code in ["C7514", "C7517"] {
            assert!(!c.log.contains(code), "{expr}: ptxas {code}:\n{}", c.log);
        }
        assert!(!c.symbol.is_empty());
        total_ms += c.millis;
        eprintln!(
            "compiled {expr:<60} {:>7.0} ms, {} bytes",
            c.millis,
            c.cubin.len()
        );
    }
    let (a, b) = jit.nvrtc_version();
    eprintln!(
        "compiled {} kernels for sm_90 with NVRTC {a}.{b}: {:.0} ms cold, {:.0} ms each on average",
        work.len(),
        total_ms,
        total_ms / work.len() as f64
    );
    assert!(work.len() >= 3);
}

#[test]
fn compile_errors_carry_the_nvrtc_log() {
    let jit = Jit::new("sm_90").unwrap().without_cache();
    let e = jit
        .compile(
            "broken",
            "template <int N> __global__ void k(ConvArgs a) { undefined_thing(); }",
            "k<1>",
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("undefined_thing") && e.contains("broken"), "{e}");
}

#[test]
fn warm_compile_comes_from_the_cache() {
    let dir = std::env::temp_dir().join(format!("evk-jit-{}", std::process::id()));
    std::env::set_var("EVOKERNEL_CACHE_DIR", &dir);
    let jit = Jit::new("sm_90").unwrap();
    let v = registry()[0];
    let spec = evokernel::ConvParams::seed().validate().unwrap();
    let expr = with_epilogue(
        &v.specialization(&spec, &v.default_config(&spec)).unwrap(),
        &Epilogue::NONE,
    );
    let cold = jit.compile(v.name(), v.source(), &expr).unwrap();
    let warm = jit.compile(v.name(), v.source(), &expr).unwrap();
    assert!(!cold.cache_hit && warm.cache_hit);
    assert_eq!(cold.cubin, warm.cubin);
    assert_eq!(cold.symbol, warm.symbol);
    eprintln!(
        "naive seed specialization: cold {:.0} ms, warm {:.2} ms",
        cold.millis, warm.millis
    );
    std::fs::remove_dir_all(dir).ok();
}

/// Compiles every specialization of a GEMM kernel for sm_90 (sm_90a when
/// `arch_specific`), cold (no CUBIN cache); each must give a CUBIN.
fn compile_every(name: &str, source: &str, work: &BTreeSet<String>, arch_specific: bool) {
    let jit = Jit::new("sm_90")
        .unwrap_or_else(|e| panic!("{e}\n(run scripts/install-nvrtc.sh, or use ./scripts/test.sh)"))
        .without_cache();
    for expr in work {
        let c = jit
            .compile_for(name, source, expr, arch_specific)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&c.cubin[..4], b"\x7fELF", "{expr}: not a CUBIN");
        // ptxas compiles a wgmma kernel whose accumulators are touched mid-flight, but
        // serializes every wgmma (C7514) or adds waits (C7517): a silent 2x (run 120).
        for code in ["C7514", "C7517"] {
            assert!(!c.log.contains(code), "{expr}: ptxas {code}:\n{}", c.log);
        }
        eprintln!(
            "compiled {expr:<70} {:>7.0} ms, {} bytes",
            c.millis,
            c.cubin.len()
        );
    }
}

/// The scaled GEMM's warp-MMA kernel (issue 18) for sm_90: each scaling mode, output type
/// and bias with the default config of a suite shape, and every config of the family
/// that fits (per-tensor, bf16). The e4m3 MMA needs sm_89+; a kernel that does not compile
/// (or an MMA shape the target refuses) fails CI.
#[test]
fn scaled_mm_kernels_compile_for_sm90() {
    use evokernel::gemm::{mma, MmaConfig, ScaledMmSpec, Scaling};
    let mut work = BTreeSet::new();
    for scaling in [Scaling::PerTensor, Scaling::RowWise, Scaling::BlockWise] {
        for out in mma::OUT_TYPES {
            for bias in [false, true] {
                let spec = ScaledMmSpec::new(2048, 4096, 4096, scaling, out, bias).unwrap();
                work.insert(MmaConfig::default_for(&spec).specialization(&spec));
            }
        }
    }
    let spec = ScaledMmSpec::new(2048, 4096, 4096, Scaling::PerTensor, DType::Bf16, false).unwrap();
    let fitting: Vec<MmaConfig> = MmaConfig::space()
        .into_iter()
        .filter(|c| c.fits(&spec).is_ok())
        .collect();
    assert!(fitting.len() >= 10, "{} configs fit", fitting.len());
    work.extend(fitting.iter().map(|c| c.specialization(&spec)));
    compile_every("scaled_mm_mma", mma::SOURCE, &work, false);
}

/// The wgmma rung for sm_90a: every default (scaling x output x bias, split-K or not) and
/// every config of the family that fits a square problem, with split-K's finalize.
#[test]
fn scaled_mm_wgmma_kernels_compile_for_sm90a() {
    use evokernel::gemm::{mma, ScaledMmSpec, Scaling, WgmmaConfig};
    let mut work = BTreeSet::new();
    for scaling in [Scaling::PerTensor, Scaling::RowWise, Scaling::BlockWise] {
        for out in mma::OUT_TYPES {
            for bias in [false, true] {
                for m in [16, 4096] {
                    let spec = ScaledMmSpec::new(m, 4096, 4096, scaling, out, bias).unwrap();
                    let cfg = WgmmaConfig::default_for(&spec);
                    work.insert(cfg.specialization(&spec));
                    if cfg.splits > 1 {
                        work.insert(cfg.finalize_specialization(&spec));
                    }
                }
            }
        }
    }
    let spec = ScaledMmSpec::new(4096, 4096, 4096, Scaling::RowWise, DType::Bf16, false).unwrap();
    let fitting: Vec<WgmmaConfig> = WgmmaConfig::space()
        .into_iter()
        .filter(|c| c.fits(&spec).is_ok() && c.group_m == 8 && c.splits <= 2)
        .collect();
    assert!(fitting.len() >= 10, "{} configs fit", fitting.len());
    work.extend(fitting.iter().map(|c| c.specialization(&spec)));
    // Block-wise scaling's own code (the scale warp, batches of one or two stages).
    let spec = ScaledMmSpec::new(4096, 4096, 4096, Scaling::BlockWise, DType::Bf16, false).unwrap();
    let blockwise: Vec<WgmmaConfig> = WgmmaConfig::space()
        .into_iter()
        .filter(|c| c.fits(&spec).is_ok() && c.group_m == 8 && c.splits == 1 && c.stages == 4)
        .collect();
    assert!(
        blockwise.iter().any(|c| c.fold == 2),
        "fold 2 fits block-wise"
    );
    work.extend(blockwise.iter().map(|c| c.specialization(&spec)));
    compile_every(
        "scaled_mm_wgmma",
        evokernel::gemm::wgmma::SOURCE,
        &work,
        true,
    );
}

/// Compiles `v`'s default config for `spec` with `params` overridden, with `jit` (sm_80
/// for the fallbacks of kernels whose TMA and mbarrier forms are sm_90 only); the config
/// must check against the space first.
fn builds_for_sm80(jit: &Jit, v: &dyn Variant, spec: &ConvSpec, params: &[(&str, i64)]) {
    let mut cfg = v.default_config(spec);
    for &(k, val) in params {
        cfg.values.insert(k.into(), val);
    }
    evokernel::variants::check_config(v, spec, &cfg).unwrap_or_else(|e| panic!("{cfg}: {e}"));
    let expr = with_epilogue(&v.specialization(spec, &cfg).unwrap(), &Epilogue::NONE);
    jit.compile(v.name(), v.source(), &expr)
        .unwrap_or_else(|e| panic!("{spec} {cfg}: {e}"));
}

/// depth_reuse's producer path uses sm_90's TMA and mbarrier forms; on older GPUs the
/// same configs must still build (cp.async copies, sm_80's mbarrier forms): the seed's
/// whole-row default and a split-row one, both layouts of the handover, and the plane
/// walk (convnext-7x7's default: the producer lanes' fragments, cp.async slices, no
/// storer work).
#[test]
fn depth_reuse_builds_for_sm80_in_every_handover() {
    let jit = Jit::new("sm_80").unwrap().without_cache();
    let v = evokernel::variants::find("depth_reuse").unwrap();
    let suite = evokernel::suite::public_suite().unwrap();
    for case in ["seed-bf16", "video-vae-causal"] {
        let spec = &suite.iter().find(|c| c.name == case).unwrap().spec;
        for producer in [0, 1] {
            builds_for_sm80(&jit, v, spec, &[("producer", producer)]);
        }
    }
    let convnext = &suite
        .iter()
        .find(|c| c.name == "convnext-7x7")
        .unwrap()
        .spec;
    builds_for_sm80(&jit, v, convnext, &[("planes", 1)]);
}

/// depth_reuse_cl's producer form (TMA boxes, stmatrix transposes, mbarriers: sm_90) and
/// its sm_80 fallback (cp.async copies, lane-by-lane transposes, sm_80's mbarrier forms)
/// build on the NDHWC seed (5 kernel rows, two regions a row at cols 2) and x3d-ndhwc, 8
/// and 16 channels a block, one and two channels a tile warp, with the stmatrix
/// transposes of the block-barrier form beside them.
#[test]
fn depth_reuse_cl_producer_builds_for_sm90_and_sm80() {
    let v = evokernel::variants::find("depth_reuse_cl").unwrap();
    let seed = evokernel::suite::public_suite()
        .unwrap()
        .into_iter()
        .find(|c| c.name == "seed-bf16-ndhwc")
        .unwrap()
        .spec;
    let x3d = evokernel::suite::channels_last_suite()
        .unwrap()
        .into_iter()
        .find(|c| c.name == "x3d-ndhwc")
        .unwrap()
        .spec;
    for arch in ["sm_90", "sm_80"] {
        let jit = Jit::new(arch).unwrap().without_cache();
        for (spec, cols) in [(&seed, 1), (&seed, 2), (&x3d, 1)] {
            builds_for_sm80(
                &jit,
                v,
                spec,
                &[
                    ("producer", 1),
                    ("trans", 1),
                    ("cols", cols),
                    ("channels", 8),
                    ("warp_channels", 1),
                ],
            );
            builds_for_sm80(
                &jit,
                v,
                spec,
                &[
                    ("producer", 0),
                    ("trans", 1),
                    ("cols", cols),
                    ("channels", 8),
                    ("storers", 1),
                    ("warp_channels", 1),
                ],
            );
        }
        // 16 channels a block (two 16-byte vectors a pixel): the default on both (two
        // channels a tile warp), one channel a tile warp, and two producer warps.
        for spec in [&seed, &x3d] {
            builds_for_sm80(&jit, v, spec, &[]);
            builds_for_sm80(&jit, v, spec, &[("warp_channels", 1)]);
            builds_for_sm80(&jit, v, spec, &[("producers", 2)]);
        }
    }
}

/// wgrad_mma's TMA ring falls back to cp.async copies of the same layout off Hopper
/// (the TMA and mbarrier forms are sm_90 only): both fills, one and four rows a slot,
/// build for sm_80.
#[test]
fn wgrad_mma_builds_for_sm80_with_either_ring_fill() {
    let jit = Jit::new("sm_80").unwrap().without_cache();
    let v = evokernel::variants::find("wgrad_mma").unwrap();
    let suite = evokernel::suite::public_suite().unwrap();
    let spec = &suite.iter().find(|c| c.name == "seed-bf16").unwrap().spec;
    for (tma, rows, share) in [(0, 1, 0), (1, 1, 0), (1, 4, 0), (1, 5, 0), (1, 5, 1)] {
        builds_for_sm80(
            &jit,
            v,
            spec,
            &[("tma", tma), ("rows", rows), ("share", share)],
        );
    }
}

/// wgrad_mma_cl off Hopper: its staging slots filled by 16-byte loads instead of TMA
/// boxes and its transposes stored lane by lane instead of by stmatrix (sm_90 only):
/// slots of one and five rows, 8 and 16 channels (one and two groups), build for sm_80.
#[test]
fn wgrad_mma_cl_builds_for_sm80() {
    let jit = Jit::new("sm_80").unwrap().without_cache();
    let v = evokernel::variants::find("wgrad_mma_cl").unwrap();
    let suite = evokernel::suite::public_suite().unwrap();
    let spec = &suite
        .iter()
        .find(|c| c.name == "seed-bf16-ndhwc")
        .unwrap()
        .spec;
    // (Two groups off Hopper: the block fills each slot together, as one group.)
    for (rows, channels, groups, minblocks) in [(5, 8, 1, 2), (1, 16, 2, 1)] {
        builds_for_sm80(
            &jit,
            v,
            spec,
            &[
                ("rows", rows),
                ("channels", channels),
                ("groups", groups),
                ("minblocks", minblocks),
            ],
        );
    }
}

/// wgrad_tile_cl and wgrad_strip_cl off Hopper: a `tma=1` config fills the same
/// 128-byte-aligned buffers with cp.async (the TMA and mbarrier forms are sm_90 only);
/// both fills build for sm_80, 2-D and 3-D, f16 and f32.
#[test]
fn channels_last_grad_weight_builds_for_sm80_with_either_fill() {
    let jit = Jit::new("sm_80").unwrap().without_cache();
    let suite = evokernel::suite::public_suite().unwrap();
    let mut specs: Vec<_> = ["mobilenet-s2", "seed-bf16-ndhwc"]
        .iter()
        .map(|n| suite.iter().find(|c| c.name == *n).unwrap().spec.clone())
        .collect();
    let mut f32_seed = ConvParams::seed();
    f32_seed.layout = Layout::ChannelsLast;
    f32_seed.dtype = DType::F32;
    f32_seed.c = 64;
    specs.push(f32_seed.validate().unwrap());
    for name in ["wgrad_tile_cl", "wgrad_strip_cl"] {
        let v = evokernel::variants::find(name).unwrap();
        for spec in &specs {
            for tma in [0, 1] {
                builds_for_sm80(&jit, v, spec, &[("tma", tma)]);
            }
        }
    }
}

/// wgrad_tile's TMA boxes compile away off Hopper, where the threads copy the same layout:
/// both fills build for sm_80 on the seed (bf16, f32) and x3d.
#[test]
fn wgrad_tile_builds_for_sm80_with_either_fill() {
    let jit = Jit::new("sm_80").unwrap().without_cache();
    let v = evokernel::variants::find("wgrad_tile").unwrap();
    let suite = evokernel::suite::public_suite().unwrap();
    for case in ["seed-bf16", "seed-f32", "x3d-3x3x3"] {
        let spec = &suite.iter().find(|c| c.name == case).unwrap().spec;
        for tma in [0, 1] {
            builds_for_sm80(&jit, v, spec, &[("tma", tma)]);
        }
    }
}
