//! The Vulkan backend on whatever Vulkan device is here: Mesa's lavapipe (CPU) in CI
//! (scripts/install-vulkan.sh installs it), the H100's driver on the GPU machine. The
//! naive and tiled shaders against the f64 oracle: the public suite's cases shrunk to
//! small sizes (the same kernels, strides, dilations, paddings and layouts) and seeded
//! random specs, with NaN/Inf in some inputs; the tiled shader also over its whole
//! config space (pruned by the device's limits) on a few specs. The dense and grouped
//! shaders (naive, direct) the same way: the dense suite on small twins, random specs,
//! and the direct shader over a sample of its space.

use evokernel::dense::{dense_reference, dense_suite, DenseConvSpec};
use evokernel::reference::conv_reference;
use evokernel::suite::public_suite;
use evokernel::tensor::SplitMix64;
use evokernel::vulkan::dense_coopmat2::{prepare_dense_coopmat2, Coopmat2Config};
use evokernel::vulkan::dense_direct::{prepare_dense_direct, DirectConfig};
use evokernel::vulkan::dense_naive::prepare_dense_naive;
use evokernel::vulkan::depth_rotate::{prepare_depth_rotate, RotateConfig};
use evokernel::vulkan::depth_rotate_cl::{prepare_depth_rotate_cl, RotateClConfig};
use evokernel::vulkan::naive::{conv_vulkan_naive, conv_vulkan_naive_timed};
use evokernel::vulkan::tile::{prepare_tile, TileConfig};
use evokernel::vulkan::{list_vulkan_devices, run_once, VulkanDevice};
use evokernel::{compare, ConvParams, ConvSpec, DType, HostTensor, Layout};

fn device() -> VulkanDevice {
    let devices = list_vulkan_devices()
        .unwrap_or_else(|e| panic!("{e}\n(run scripts/install-vulkan.sh, or ./scripts/test.sh)"));
    assert!(
        !devices.is_empty(),
        "a Vulkan loader but no device: run scripts/install-vulkan.sh (Mesa's lavapipe)"
    );
    for d in &devices {
        eprintln!("vulkan device: {d:?}");
    }
    VulkanDevice::open(0).unwrap()
}

/// Every dtype the device's buffers store: f32, and f16 and bf16 with 16-bit storage.
fn stored_dtypes(dev: &VulkanDevice) -> Vec<DType> {
    let mut dtypes = vec![DType::F32];
    if dev.info().storage_f16 {
        dtypes.extend([DType::F16, DType::Bf16]);
    }
    dtypes
}

/// Which shader a check runs.
#[derive(Clone, Copy, Debug)]
enum Shader {
    Naive,
    Tile(Option<TileConfig>),
    Rotate(Option<RotateConfig>),
    RotateCl(Option<RotateClConfig>),
}

fn check(dev: &VulkanDevice, name: &str, spec: &ConvSpec, seed: u64, non_finite: bool) {
    check_with(dev, Shader::Naive, name, spec, seed, non_finite);
    check_with(dev, Shader::Tile(None), name, spec, seed, non_finite);
    if RotateConfig::applies(spec).is_ok() {
        check_with(dev, Shader::Rotate(None), name, spec, seed, non_finite);
    }
    if RotateClConfig::applies(spec).is_ok() {
        check_with(dev, Shader::RotateCl(None), name, spec, seed, non_finite);
    }
}

fn check_with(
    dev: &VulkanDevice,
    shader: Shader,
    name: &str,
    spec: &ConvSpec,
    seed: u64,
    non_finite: bool,
) {
    let dtype = spec.dtype();
    let mut x = HostTensor::random_normal(dtype, &spec.input_shape(), seed);
    let w = HostTensor::random_normal(dtype, &spec.weight_shape(), seed + 1);
    if non_finite {
        let mut rng = SplitMix64::new(seed);
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let i = (rng.next_u64() % x.len() as u64) as usize;
            x.set_f64(i, v);
        }
    }
    let y = match shader {
        Shader::Naive => conv_vulkan_naive(dev, spec, &x, &w),
        Shader::Tile(config) => prepare_tile(dev, spec, &x, &w, config)
            .and_then(run_once)
            .map(|r| r.0),
        Shader::Rotate(config) => prepare_depth_rotate(dev, spec, &x, &w, config)
            .and_then(run_once)
            .map(|r| r.0),
        Shader::RotateCl(config) => prepare_depth_rotate_cl(dev, spec, &x, &w, config)
            .and_then(run_once)
            .map(|r| r.0),
    }
    .unwrap_or_else(|e| panic!("{name} {shader:?}: {e}"));
    let want = conv_reference(spec, &x, &w).unwrap();
    let c = compare(&y, &want).unwrap();
    assert!(c.passes(dtype), "{name} {shader:?} {spec}: {c:?}");
}

/// A public-suite case's kernel, strides, dilations, paddings and layout on a small input
/// of `c` channels (each dim `grow` past the smallest the kernel takes) in `dtype`.
fn shrunk(s: &ConvSpec, c: i64, grow: i64, dtype: DType) -> ConvSpec {
    let dims = s.spatial_dims();
    let keep = |a: [usize; 3]| a[3 - dims..].iter().map(|&v| v as i64).collect::<Vec<_>>();
    let (pb, pa) = (keep(s.pad_before3()), keep(s.pad_after3()));
    let (kernel, dilation) = (keep(s.kernel3()), keep(s.dilation3()));
    let input: Vec<i64> = (0..dims)
        .map(|d| (dilation[d] * (kernel[d] - 1) + 1 - pb[d] - pa[d]).max(1) + grow + d as i64)
        .collect();
    ConvParams {
        n: 2,
        c,
        input,
        kernel,
        stride: keep(s.stride3()),
        dilation,
        padding: (0..dims).map(|d| [pb[d], pa[d]]).collect(),
        layout: s.layout(),
        dtype,
    }
    .validate()
    .unwrap()
}

#[test]
fn naive_shader_matches_the_oracle_on_the_public_suite_shrunk() {
    let dev = device();
    for (i, case) in public_suite().unwrap().into_iter().enumerate() {
        let spec = shrunk(&case.spec, 5, 6, DType::F32);
        check(&dev, &case.name, &spec, 10 + i as u64, i % 3 == 0);
    }
}

/// Appends `dims` random spatial dims to `p`: kernel 1..=`max_k`, stride 1..=`max_s`,
/// dilation 1-2, padding 0..=`max_pad` on each side, each input at least the dilated
/// kernel less its padding plus 0..=`extra`.
fn push_random_dims(
    p: &mut ConvParams,
    pick: &mut dyn FnMut(u64, u64) -> u64,
    dims: usize,
    [max_k, max_s, max_pad, extra]: [u64; 4],
) {
    for _ in 0..dims {
        let k = pick(1, max_k) as i64;
        let (s, dl) = (pick(1, max_s) as i64, pick(1, 2) as i64);
        let (pb, pa) = (pick(0, max_pad) as i64, pick(0, max_pad) as i64);
        p.input
            .push(((dl * (k - 1) + 1) - pb - pa).max(1) + pick(0, extra) as i64);
        p.kernel.push(k);
        p.stride.push(s);
        p.dilation.push(dl);
        p.padding.push([pb, pa]);
    }
}

#[test]
fn naive_shader_matches_the_oracle_on_random_specs() {
    let dev = device();
    let mut rng = SplitMix64::new(2026);
    let mut pick = |lo: u64, hi: u64| lo + rng.next_u64() % (hi - lo + 1);
    let mut checked = 0;
    for i in 0..40u64 {
        let dims = pick(1, 3) as usize;
        let mut p = ConvParams {
            n: pick(1, 2) as i64,
            c: pick(1, 12) as i64,
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
            dtype: DType::F32,
        };
        push_random_dims(&mut p, &mut pick, dims, [5, 3, 3, 12]);
        if let Ok(spec) = p.validate() {
            check(&dev, &format!("random #{i}"), &spec, 100 + i, i % 4 == 0);
            checked += 1;
        }
    }
    assert!(checked >= 30, "only {checked} random specs were valid");
}

/// Every config of the tiled shader's space on this device (bands of 1 to 32 rows,
/// 1-4 outputs an invocation, 32-256 invocations) on specs with partial bands, partial
/// output runs, strides, dilations and both layouts.
#[test]
fn tile_shader_passes_over_its_whole_config_space() {
    let dev = device();
    let specs = [
        ConvParams {
            n: 2,
            c: 3,
            input: vec![4, 11, 13],
            kernel: vec![3, 3, 5],
            stride: vec![1, 1, 1],
            dilation: vec![1, 1, 1],
            padding: vec![[0, 0], [1, 1], [2, 2]],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        },
        ConvParams {
            n: 1,
            c: 4,
            input: vec![19, 23],
            kernel: vec![3, 4],
            stride: vec![2, 3],
            dilation: vec![2, 1],
            padding: vec![[2, 0], [1, 3]],
            layout: Layout::ChannelsLast,
            dtype: DType::F32,
        },
        ConvParams {
            n: 3,
            c: 2,
            input: vec![37],
            kernel: vec![4],
            stride: vec![1],
            dilation: vec![1],
            padding: vec![[3, 0]],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        },
    ];
    let mut runs = 0;
    for (i, p) in specs.into_iter().enumerate() {
        let spec = p.validate().unwrap();
        let space = TileConfig::space(dev.info(), &spec);
        // 4 workgroup sizes x 3 output runs x the band heights that fit (1-D: one).
        assert!(space.len() >= 12, "{spec}: {} configs", space.len());
        for (j, c) in space.into_iter().enumerate() {
            let name = format!("spec {i} config {j}");
            check_with(
                &dev,
                Shader::Tile(Some(c)),
                &name,
                &spec,
                50 + i as u64,
                j % 5 == 0,
            );
            runs += 1;
        }
    }
    eprintln!(
        "tile shader: {runs} (spec, config) pairs pass on {}",
        dev.info().name
    );
}

/// Every config of the depth rotation's space on this device, on specs with depth
/// padding on both sides, partial bands and runs, W strides and dilations, both layouts
/// and 1-D; with f16 where the device has 16-bit storage.
#[test]
fn rotate_shader_passes_over_its_config_space() {
    let dev = device();
    let specs = [
        ConvParams {
            n: 2,
            c: 3,
            input: vec![5, 11, 13],
            kernel: vec![3, 3, 5],
            stride: vec![1, 1, 2],
            dilation: vec![1, 2, 1],
            padding: vec![[2, 1], [1, 3], [2, 2]],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        },
        ConvParams {
            n: 1,
            c: 4,
            input: vec![4, 9, 23],
            kernel: vec![2, 3, 4],
            stride: vec![1, 2, 3],
            dilation: vec![1, 1, 1],
            padding: vec![[0, 0], [1, 0], [1, 3]],
            layout: Layout::ChannelsLast,
            dtype: DType::F32,
        },
        ConvParams {
            n: 3,
            c: 2,
            input: vec![37],
            kernel: vec![4],
            stride: vec![1],
            dilation: vec![1],
            padding: vec![[3, 0]],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        },
    ];
    let mut runs = 0;
    for (i, p) in specs.into_iter().enumerate() {
        let spec = p.validate().unwrap();
        let space = RotateConfig::space(dev.info(), &spec);
        assert!(space.len() >= 12, "{spec}: {} configs", space.len());
        // Every value of every field, and every twentieth config besides (the whole
        // space, over a thousand configs a spec since the family has sizes between the
        // powers of two and runs 1-4 rows tall, would take many minutes on lavapipe).
        let mut seen = std::collections::HashSet::new();
        let space: Vec<RotateConfig> = space
            .into_iter()
            .enumerate()
            .filter(|(j, c)| {
                let new = c
                    .values()
                    .iter()
                    .enumerate()
                    .fold(false, |new, (f, &v)| seen.insert((f, v)) || new);
                new || j % 20 == 0
            })
            .map(|(_, c)| c)
            .collect();
        for (j, c) in space.into_iter().enumerate() {
            let name = format!("spec {i} config {j} {c}");
            check_with(
                &dev,
                Shader::Rotate(Some(c)),
                &name,
                &spec,
                90 + i as u64,
                j % 5 == 0,
            );
            runs += 1;
        }
        if dev.info().storage_f16 {
            let half = spec.with_dtype(DType::F16);
            check_with(&dev, Shader::Rotate(None), "f16", &half, 95, true);
        }
        // The channels-last rotation over its whole space on the channels-last twin.
        let cl = spec.with_layout(Layout::ChannelsLast);
        let cl_space = RotateClConfig::space(dev.info(), &cl);
        assert!(cl_space.len() >= 4, "{cl}: {} configs", cl_space.len());
        for (j, c) in cl_space.into_iter().enumerate() {
            let name = format!("cl spec {i} config {j} {c}");
            check_with(
                &dev,
                Shader::RotateCl(Some(c)),
                &name,
                &cl,
                97 + i as u64,
                j % 3 == 0,
            );
            runs += 1;
        }
        if dev.info().storage_f16 {
            let half = cl.with_dtype(DType::F16);
            check_with(&dev, Shader::RotateCl(None), "cl f16", &half, 99, true);
        }
    }
    eprintln!(
        "depth_rotate: {runs} (spec, config) pairs pass on {}",
        dev.info().name
    );
}

/// The channels-last rotation on channel vectors (`cv` 2 and 4: a pixel's channels one
/// 4-16 byte load, every FMA a vector one): several workgroups across the channels with
/// a part-filled last one, runs of several rows, every dtype the device stores (f16 and
/// bf16 as 16-bit vectors), NaN/Inf in some.
#[test]
fn rotate_cl_shader_takes_channel_vectors() {
    let dev = device();
    let specs = [
        // 2-D 3x3: 68 channels = 34 vectors of 2, so a workgroup of 32 leaves a second
        // with 2 live invocations (17 of 4: one part-filled workgroup).
        ConvParams {
            n: 2,
            c: 68,
            input: vec![11, 14],
            kernel: vec![3, 3],
            stride: vec![1, 1],
            dilation: vec![1, 1],
            padding: vec![[1, 1], [2, 0]],
            layout: Layout::ChannelsLast,
            dtype: DType::F32,
        },
        // 3-D 2x3x3 (72 weights at 4 channels): H dilation, W stride, asymmetric depth
        // padding.
        ConvParams {
            n: 1,
            c: 24,
            input: vec![5, 9, 11],
            kernel: vec![2, 3, 3],
            stride: vec![1, 1, 2],
            dilation: vec![1, 2, 1],
            padding: vec![[1, 0], [2, 2], [1, 1]],
            layout: Layout::ChannelsLast,
            dtype: DType::F32,
        },
    ];
    let dtypes = stored_dtypes(&dev);
    let mut runs = 0;
    for (i, p) in specs.into_iter().enumerate() {
        let spec = p.validate().unwrap();
        let space = RotateClConfig::space(dev.info(), &spec);
        for cv in [2, 4] {
            assert!(
                space.iter().any(|c| c.cv == cv),
                "{spec}: no config of {cv} channels"
            );
        }
        for (j, c) in space.into_iter().filter(|c| c.cv > 1).enumerate() {
            // Every dtype on every third config, f32 on the rest.
            let picks = if j % 3 == 0 {
                &dtypes[..]
            } else {
                &dtypes[..1]
            };
            for &dtype in picks {
                let typed = spec.with_dtype(dtype);
                let name = format!("spec {i} config {j} {c} {dtype}");
                check_with(
                    &dev,
                    Shader::RotateCl(Some(c)),
                    &name,
                    &typed,
                    120 + j as u64,
                    j % 4 == 1,
                );
                runs += 1;
            }
        }
    }
    eprintln!(
        "depth_rotate_cl channel vectors: {runs} (spec, config, dtype) runs pass on {}",
        dev.info().name
    );
}

/// The rotation walking planes (channels-first, one kernel depth, no depth padding: a
/// workgroup takes 2-8 consecutive N x C x D planes in turn, the channel's weights
/// changing inside a walk): 1-D, 2-D and a 1xKxK 3-D spec (a walk crossing depths and
/// channels), strides and dilations along H and W, ragged last walks, every dtype the
/// device stores, NaN/Inf in some.
#[test]
fn rotate_shader_walks_planes() {
    let dev = device();
    let specs = [
        // 16,384 planes of one 19-wide row: walks of 8.
        ConvParams {
            n: 8,
            c: 2048,
            input: vec![19],
            kernel: vec![4],
            stride: vec![1],
            dilation: vec![1],
            padding: vec![[3, 0]],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        },
        // 2-D, 3 x 1,367 planes (ragged last walk), strided and dilated.
        ConvParams {
            n: 3,
            c: 1367,
            input: vec![7, 9],
            kernel: vec![3, 3],
            stride: vec![2, 1],
            dilation: vec![1, 2],
            padding: vec![[1, 2], [2, 1]],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        },
        // 3-D, 1 x 3 x 3: 2 x 701 channels x 3 depths.
        ConvParams {
            n: 2,
            c: 701,
            input: vec![3, 5, 6],
            kernel: vec![1, 3, 3],
            stride: vec![1, 1, 1],
            dilation: vec![1, 1, 1],
            padding: vec![[0, 0], [1, 1], [1, 1]],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        },
    ];
    let mut walked = 0;
    for (i, p) in specs.into_iter().enumerate() {
        let spec = p.validate().unwrap();
        let space = RotateConfig::space(dev.info(), &spec);
        let default = RotateConfig::default_for(dev.info(), &spec).unwrap();
        assert!(default.walk(&spec) > 0, "{spec}: {default} does not walk");
        for (j, c) in space.iter().enumerate().filter(|(j, _)| j % 24 == 0) {
            walked += usize::from(c.walk(&spec) > 0);
            let name = format!("walk spec {i} config {j} {c} (walk {})", c.walk(&spec));
            check_with(
                &dev,
                Shader::Rotate(Some(*c)),
                &name,
                &spec,
                70 + i as u64,
                j % 2 == 0,
            );
        }
        if dev.info().storage_f16 {
            for dtype in [DType::F16, DType::Bf16] {
                let half = spec.with_dtype(dtype);
                check_with(&dev, Shader::Rotate(None), "walk half", &half, 75, true);
            }
        }
    }
    assert!(walked >= 6, "{walked} walking configs checked");
}

/// The rotation storing each run of 2 or 4 outputs as one vector (channels-first data,
/// rows a multiple of the run): 3-D with depth padding, 2-D strided, a 1-D plane walk,
/// every dtype the device stores, NaN/Inf in some; runs that do not divide the rows
/// (and channels-last data) keep the element stores, checked beside them.
#[test]
fn rotate_shader_stores_runs_as_vectors() {
    let dev = device();
    let specs = [
        ConvParams {
            n: 2,
            c: 5,
            input: vec![5, 9, 24],
            kernel: vec![3, 3, 3],
            stride: vec![1, 1, 1],
            dilation: vec![1, 1, 1],
            padding: vec![[2, 0], [1, 1], [1, 1]],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        },
        // 2-D 5x5 at W stride 2: 16 outputs a row.
        ConvParams {
            n: 1,
            c: 3,
            input: vec![11, 31],
            kernel: vec![5, 5],
            stride: vec![1, 2],
            dilation: vec![1, 1],
            padding: vec![[2, 2], [2, 2]],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        },
        // 1-D causal rows of 40, walked.
        ConvParams {
            n: 4,
            c: 640,
            input: vec![40],
            kernel: vec![4],
            stride: vec![1],
            dilation: vec![1],
            padding: vec![[3, 0]],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        },
    ];
    let dtypes = stored_dtypes(&dev);
    let mut vectors = 0;
    for (i, p) in specs.into_iter().enumerate() {
        let spec = p.validate().unwrap();
        let space = RotateConfig::space(dev.info(), &spec);
        let ow = spec.output3()[2];
        for out_w in [2, 3, 4, 6, 8] {
            if !ow.is_multiple_of(out_w) {
                continue;
            }
            let pick = space
                .iter()
                .filter(|c| c.out_w as usize == out_w)
                .nth(i * 3 % 5)
                .or_else(|| space.iter().find(|c| c.out_w as usize == out_w))
                .copied()
                .unwrap_or_else(|| panic!("{spec}: no config with runs of {out_w}"));
            // Runs of 6 and 8 leave as 3 vectors of 2 and 2 of 4.
            let cv = [4, 2].into_iter().find(|v| out_w.is_multiple_of(*v));
            assert_eq!(pick.store_vector(&spec), cv, "{pick}");
            vectors += usize::from(cv.is_some());
            for &dtype in &dtypes {
                let typed = spec.with_dtype(dtype);
                let name = format!("vector spec {i} {pick} {dtype}");
                check_with(
                    &dev,
                    Shader::Rotate(Some(pick)),
                    &name,
                    &typed,
                    140 + i as u64,
                    out_w == 4,
                );
            }
        }
        let cl = spec.with_layout(Layout::ChannelsLast);
        let c = RotateConfig::space(dev.info(), &cl)
            .into_iter()
            .find(|c| c.out_w == 4)
            .unwrap();
        assert!(c.store_vector(&cl).is_none());
        check_with(&dev, Shader::Rotate(Some(c)), "vector cl", &cl, 150, false);
    }
    // Spec 0's 24-wide rows: runs of 2, 4, 6, 8; spec 1's 16: 2, 4, 8; spec 2's 40: 2, 4, 8.
    assert_eq!(vectors, 10);
}

/// Runs spanning 2-4 output rows (`out_h`): each band row read once for every row it
/// feeds, at H stride and dilation 2, bands whose last rows are past the plane, direct
/// reads and the shared band, both layouts, every dtype the device stores.
#[test]
fn rotate_shader_spans_runs_over_rows() {
    let dev = device();
    let specs = [
        // 3-D, H dilation 2, padding on every side: 13 output rows.
        ConvParams {
            n: 2,
            c: 3,
            input: vec![4, 13, 10],
            kernel: vec![2, 3, 3],
            stride: vec![1, 1, 1],
            dilation: vec![1, 2, 1],
            padding: vec![[1, 0], [2, 2], [1, 1]],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        },
        // 2-D, H stride 2, a 7-row kernel: 8 output rows of 16 (vector stores).
        ConvParams {
            n: 1,
            c: 4,
            input: vec![17, 16],
            kernel: vec![7, 5],
            stride: vec![2, 1],
            dilation: vec![1, 1],
            padding: vec![[3, 2], [2, 2]],
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        },
        // 2-D channels-last, stride and dilation 2 in H.
        ConvParams {
            n: 2,
            c: 5,
            input: vec![15, 9],
            kernel: vec![3, 3],
            stride: vec![2, 1],
            dilation: vec![2, 1],
            padding: vec![[1, 2], [1, 1]],
            layout: Layout::ChannelsLast,
            dtype: DType::F32,
        },
    ];
    let dtypes = stored_dtypes(&dev);
    let mut checked = 0;
    for (i, p) in specs.into_iter().enumerate() {
        let spec = p.validate().unwrap();
        let space = RotateConfig::space(dev.info(), &spec);
        for out_h in [2, 3, 4] {
            for direct in [0, 1] {
                let pick = space
                    .iter()
                    .filter(|c| c.out_h == out_h && c.direct == direct)
                    .nth(checked % 4);
                let Some(&pick) = pick else {
                    // Channels-last data has no direct form.
                    assert!(direct == 1 && spec.layout() == Layout::ChannelsLast);
                    continue;
                };
                assert_eq!(pick.rows % out_h, 0, "{pick}");
                for &dtype in &dtypes {
                    let typed = spec.with_dtype(dtype);
                    let name = format!("rows spec {i} {pick} {dtype}");
                    check_with(
                        &dev,
                        Shader::Rotate(Some(pick)),
                        &name,
                        &typed,
                        160 + i as u64,
                        out_h == 3,
                    );
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 15);
}

/// Direct reads of channels-first rows whose length is a whole number of stored runs take
/// each window as aligned vectors: every left padding 0-5 (the window starting anywhere
/// in its first vector), runs of 2 and 4, 1-D and 2-D, rows cut by the padding, every
/// dtype the device stores; a row length that is not whole vectors reads elements.
#[test]
fn rotate_shader_reads_direct_windows_as_vectors() {
    let dev = device();
    let dtypes = stored_dtypes(&dev);
    let mut vectors = 0;
    for pad in 0..6i64 {
        // (dims, input width, padding past the kernel's): rows of 24 and 20 are whole
        // vectors; 19 padded to 20 outputs stores vectors but reads elements.
        for (dims, width, extra) in [(1, 24i64, 0), (2, 20, 0), (1, 19, 1)] {
            let k = 3 + pad;
            let mut p = ConvParams {
                n: 2,
                c: 3,
                input: vec![width],
                kernel: vec![k],
                stride: vec![1],
                dilation: vec![1],
                padding: vec![[pad, k - 1 - pad + extra]],
                layout: Layout::ChannelsFirst,
                dtype: DType::F32,
            };
            if dims == 2 {
                p.input.insert(0, 5);
                p.kernel.insert(0, 3);
                p.stride.insert(0, 1);
                p.dilation.insert(0, 1);
                p.padding.insert(0, [1, 1]);
            }
            let spec = p.validate().unwrap();
            for out_w in [2, 4, 8] {
                let Some(&pick) = RotateConfig::space(dev.info(), &spec)
                    .iter()
                    .find(|c| c.direct == 1 && c.out_w == out_w && c.store_vector(&spec).is_some())
                else {
                    continue;
                };
                let cv = pick.store_vector(&spec).unwrap() as i64;
                let vector = pick.load_vector_offset(&spec);
                assert_eq!(vector.is_some(), width % cv == 0, "{spec} {pick}");
                vectors += usize::from(vector.is_some());
                for &dtype in &dtypes {
                    let typed = spec.with_dtype(dtype);
                    let name = format!("vector loads {pick} {dtype}");
                    check_with(
                        &dev,
                        Shader::Rotate(Some(pick)),
                        &name,
                        &typed,
                        170 + pad as u64,
                        pad == 2,
                    );
                }
            }
        }
    }
    // Rows of 24 in runs of 2, 4, 8 and of 20 in runs of 2 and 4, at six paddings.
    assert_eq!(vectors, 30, "configs reading vectors");
}

/// `direct` 2: the windows read as vectors a slice ahead (the next slice's rows loaded
/// into the registers the current one's were unpacked from). 3-D walks with causal and
/// symmetric depth padding, runs over one and two rows, one and two runs an invocation,
/// a plane walk (KD 1) and one-slice planes (nothing ahead), every stored dtype.
#[test]
fn rotate_shader_reads_windows_a_slice_ahead() {
    let dev = device();
    let dtypes = stored_dtypes(&dev);
    let (mut checked, mut several_runs) = (0, 0);
    // (input, kernel, padding): video-vae-causal's form shrunk, a symmetric 3-D, a 1-deep
    // kernel over several slices (the plane walk), a 2-D layer.
    type Case = (Vec<i64>, Vec<i64>, Vec<[i64; 2]>);
    let cases: [Case; 4] = [
        (vec![5, 6, 16], vec![3, 3, 3], vec![[2, 0], [1, 1], [1, 1]]),
        (vec![4, 5, 8], vec![3, 3, 3], vec![[1, 1], [1, 1], [1, 1]]),
        (vec![3, 4, 16], vec![1, 3, 3], vec![[0, 0], [1, 1], [1, 1]]),
        (vec![7, 24], vec![5, 5], vec![[2, 2], [2, 2]]),
    ];
    for (i, (input, kernel, padding)) in cases.into_iter().enumerate() {
        let dims = input.len();
        let spec = ConvParams {
            n: 2,
            c: 3,
            input,
            kernel,
            stride: vec![1; dims],
            dilation: vec![1; dims],
            padding,
            layout: Layout::ChannelsFirst,
            dtype: DType::F32,
        }
        .validate()
        .unwrap();
        for &dtype in &dtypes {
            // The space is the dtype's: a window's vectors take half the registers in 16 bits.
            let spec = spec.with_dtype(dtype);
            let mut picks: Vec<RotateConfig> = Vec::new();
            for c in RotateConfig::space(dev.info(), &spec)
                .iter()
                .filter(|c| c.direct == 2)
            {
                assert!(c.ahead_registers(&spec).is_some(), "{spec} {c}");
                // One config a (out_w, out_h, runs an invocation).
                let kind = |d: &RotateConfig| (d.out_w, d.out_h, d.items(&spec));
                if !picks.iter().any(|p| kind(p) == kind(c)) {
                    picks.push(*c);
                }
            }
            several_runs += usize::from(picks.iter().any(|c| c.items(&spec) > 1));
            for pick in picks {
                let name = format!("ahead {pick} {dtype}");
                check_with(
                    &dev,
                    Shader::Rotate(Some(pick)),
                    &name,
                    &spec,
                    190 + i as u64,
                    i == 0,
                );
                checked += 1;
            }
        }
    }
    assert!(several_runs > 0, "no config holds two runs an invocation");
    assert!(checked >= 20, "{checked} checks");
}

/// f16 and bf16 through the depthwise shaders (tiled, rotating, channels-last rotating)
/// where the device has 16-bit storage (lavapipe does; bf16 is stored as its 16 bits and
/// converted in the shader): the public suite's cases shrunk, both layouts, NaN/Inf in
/// some; refused with the reason where it has none.
#[test]
fn depthwise_shaders_take_f16_and_bf16_where_the_device_has_16_bit_storage() {
    let dev = device();
    let mut checked = 0;
    for (i, case) in public_suite().unwrap().into_iter().enumerate() {
        for dtype in [DType::F16, DType::Bf16] {
            let spec = shrunk(&case.spec, 6, 9, dtype);
            if !dev.info().storage_f16 {
                let x = HostTensor::random_normal(dtype, &spec.input_shape(), 1);
                let w = HostTensor::random_normal(dtype, &spec.weight_shape(), 2);
                let e = prepare_tile(&dev, &spec, &x, &w, None)
                    .and_then(run_once)
                    .unwrap_err();
                assert!(e.to_string().contains("16-bit"), "{e}");
                continue;
            }
            for layout in [Layout::ChannelsFirst, Layout::ChannelsLast] {
                let spec = spec.with_layout(layout);
                let seed = 70 + i as u64;
                check_with(
                    &dev,
                    Shader::Tile(None),
                    &case.name,
                    &spec,
                    seed,
                    i % 3 == 1,
                );
                if RotateConfig::applies(&spec).is_ok() {
                    check_with(
                        &dev,
                        Shader::Rotate(None),
                        &case.name,
                        &spec,
                        seed,
                        i % 3 == 2,
                    );
                }
                if RotateClConfig::applies(&spec).is_ok() {
                    check_with(
                        &dev,
                        Shader::RotateCl(None),
                        &case.name,
                        &spec,
                        seed,
                        i % 3 == 0,
                    );
                }
                checked += 1;
            }
        }
    }
    eprintln!("f16/bf16 depthwise on {}: {checked} cases", dev.info().name);
}

/// A config the device cannot hold is refused with the reason, before any dispatch.
#[test]
fn tile_configs_past_the_device_limits_are_refused() {
    let dev = device();
    let spec = ConvParams {
        n: 1,
        c: 1,
        input: vec![8, 4000],
        kernel: vec![3, 3],
        stride: vec![1, 1],
        dilation: vec![1, 1],
        padding: vec![[1, 1], [1, 1]],
        layout: Layout::ChannelsFirst,
        dtype: DType::F32,
    }
    .validate()
    .unwrap();
    let x = HostTensor::random_normal(DType::F32, &spec.input_shape(), 1);
    let w = HostTensor::random_normal(DType::F32, &spec.weight_shape(), 2);
    let too_tall = TileConfig {
        workgroup: 64,
        out_w: 4,
        rows: 32,
    };
    let e = prepare_tile(&dev, &spec, &x, &w, Some(too_tall))
        .and_then(run_once)
        .unwrap_err()
        .to_string();
    assert!(e.contains("shared memory") || e.contains("rows"), "{e}");
    let too_wide = TileConfig {
        workgroup: 1 << 20,
        out_w: 4,
        rows: 1,
    };
    assert!(prepare_tile(&dev, &spec, &x, &w, Some(too_wide))
        .and_then(run_once)
        .is_err());
}

#[test]
fn devices_report_their_limits() {
    let devices = list_vulkan_devices().unwrap();
    assert!(!devices.is_empty());
    for d in devices {
        assert!(d.max_shared_bytes >= 16 * 1024, "{d:?}");
        assert!(d.max_push_constant_bytes >= 128, "{d:?}");
        assert!(d.max_workgroup_invocations >= 128, "{d:?}");
        assert!(d.subgroup_size >= 1, "{d:?}");
        assert!(d.max_workgroup_count[0] >= 65535, "{d:?}");
    }
}

/// Timestamps around the dispatch give its device time (lavapipe has them): positive and
/// finite (speed itself is the bench's business, not a test's).
#[test]
fn dispatches_are_timed_by_timestamps() {
    let dev = device();
    let time = |c: i64| {
        let mut p = ConvParams::seed();
        p.c = c;
        p.input = vec![9, 20, 24];
        p.dtype = DType::F32;
        let spec = p.validate().unwrap();
        let x = HostTensor::random_normal(DType::F32, &spec.input_shape(), 1);
        let w = HostTensor::random_normal(DType::F32, &spec.weight_shape(), 2);
        let (_, ms) = conv_vulkan_naive_timed(&dev, &spec, &x, &w).unwrap();
        let ms = ms.expect("the compute queue writes timestamps");
        assert!(ms.is_finite() && ms > 0.0, "{ms}");
        ms
    };
    let (small, large) = (time(2), time(64));
    eprintln!(
        "naive on {}: 2 channels {small:.3} ms, 64 channels {large:.3} ms",
        dev.info().name
    );
    assert!(large > small, "32x the work took {large} vs {small} ms");
}

/// Which dense shader a check runs.
#[derive(Clone, Copy, Debug)]
enum DenseShader {
    Naive,
    Direct(Option<DirectConfig>),
}

fn check_dense(
    dev: &VulkanDevice,
    shader: DenseShader,
    name: &str,
    spec: &DenseConvSpec,
    seed: u64,
    non_finite: bool,
) {
    let dtype = spec.dtype();
    let mut x = HostTensor::random_normal(dtype, &spec.input_shape(), seed);
    let w = HostTensor::random_normal(dtype, &spec.weight_shape(), seed + 1);
    if non_finite {
        let mut rng = SplitMix64::new(seed);
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let i = (rng.next_u64() % x.len() as u64) as usize;
            x.set_f64(i, v);
        }
    }
    let y = match shader {
        DenseShader::Naive => prepare_dense_naive(dev, spec, &x, &w).and_then(run_once),
        DenseShader::Direct(c) => prepare_dense_direct(dev, spec, &x, &w, c).and_then(run_once),
    }
    .unwrap_or_else(|e| panic!("{name} {shader:?}: {e}"))
    .0;
    let want = dense_reference(spec, &x, &w).unwrap();
    let c = compare(&y, &want).unwrap();
    assert!(c.passes(dtype), "{name} {shader:?} {spec}: {c:?}");
}

/// The dense suite's cases (ResNet-50, VAE, 3-D, ResNeXt grouped) on small twins: both
/// dense shaders, f32 and (where the device has 16-bit storage) f16 and bf16, both
/// layouts, NaN/Inf in some inputs.
#[test]
fn dense_shaders_match_the_oracle_on_the_dense_suite_shrunk() {
    let dev = device();
    let dtypes: &[DType] = if dev.info().storage_f16 {
        &[DType::F32, DType::F16, DType::Bf16]
    } else {
        &[DType::F32]
    };
    for (i, case) in dense_suite().unwrap().into_iter().enumerate() {
        for &dtype in dtypes {
            for layout in [Layout::ChannelsLast, Layout::ChannelsFirst] {
                let spec = case.spec.small_twin(dtype).unwrap().with_layout(layout);
                let seed = 300 + i as u64;
                check_dense(
                    &dev,
                    DenseShader::Naive,
                    &case.name,
                    &spec,
                    seed,
                    i % 3 == 0,
                );
                check_dense(
                    &dev,
                    DenseShader::Direct(None),
                    &case.name,
                    &spec,
                    seed,
                    i % 3 == 1,
                );
            }
        }
    }
}

/// Seeded random dense and grouped specs (1-3 spatial dims, stride, dilation, asymmetric
/// padding, batch, both layouts, groups 1-4 of 1-9 channels, depthwise among them): both
/// dense shaders against the oracle.
#[test]
fn dense_shaders_match_the_oracle_on_random_specs() {
    let dev = device();
    let mut rng = SplitMix64::new(2027);
    let mut pick = |lo: u64, hi: u64| lo + rng.next_u64() % (hi - lo + 1);
    let mut checked = 0;
    for i in 0..40u64 {
        let dims = pick(1, 3) as usize;
        let groups = pick(1, 4) as i64;
        let (cpi, cpo) = (pick(1, 9) as i64, pick(1, 9) as i64);
        let mut p = ConvParams {
            n: pick(1, 2) as i64,
            c: groups * cpi,
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
            dtype: DType::F32,
        };
        push_random_dims(&mut p, &mut pick, dims, [4, 3, 2, 10]);
        let Ok(spec) = DenseConvSpec::from_params(&p, groups * cpo, groups) else {
            continue;
        };
        let name = format!("random #{i}");
        check_dense(&dev, DenseShader::Naive, &name, &spec, 400 + i, i % 4 == 0);
        check_dense(
            &dev,
            DenseShader::Direct(None),
            &name,
            &spec,
            400 + i,
            i % 4 == 1,
        );
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} random specs were valid");
}

/// The direct shader over its config space on this device, pruned by the device's
/// limits: every config whose index is a multiple of a stride chosen to visit ~40 per
/// spec (every field value appears), on specs with partial tiles in H, W and channels,
/// strides, dilation, groups and both layouts.
#[test]
fn direct_shader_passes_over_its_config_space() {
    let dev = device();
    let specs = [
        (
            ConvParams {
                n: 1,
                c: 12,
                input: vec![11, 21],
                kernel: vec![3, 3],
                stride: vec![1, 2],
                dilation: vec![2, 1],
                padding: vec![[2, 1], [1, 1]],
                layout: Layout::ChannelsLast,
                dtype: DType::F32,
            },
            20,
            2,
        ),
        (
            ConvParams {
                n: 2,
                c: 5,
                input: vec![3, 9, 10],
                kernel: vec![2, 3, 3],
                stride: vec![1, 1, 1],
                dilation: vec![1, 1, 1],
                padding: vec![[1, 0], [1, 1], [1, 1]],
                layout: Layout::ChannelsFirst,
                dtype: DType::F32,
            },
            7,
            1,
        ),
    ];
    let mut runs = 0;
    for (i, (p, co, groups)) in specs.into_iter().enumerate() {
        let spec = DenseConvSpec::from_params(&p, co, groups).unwrap();
        let space = DirectConfig::space(dev.info(), &spec);
        assert!(space.len() >= 100, "{spec}: {} configs", space.len());
        // A stride coprime to the fields' counts (2, 3, 4) walks every value of each.
        let step = (space.len() / 40).max(1) | 1;
        let step = if step.is_multiple_of(3) {
            step + 2
        } else {
            step
        };
        for (j, c) in space.into_iter().enumerate().step_by(step) {
            check_dense(
                &dev,
                DenseShader::Direct(Some(c)),
                &format!("spec {i} config {j} {c}"),
                &spec,
                500 + j as u64,
                j % 7 == 0,
            );
            runs += 1;
        }
    }
    eprintln!(
        "dense_direct: {runs} (spec, config) pairs pass on {}",
        dev.info().name
    );
}

/// A config past the device's shared memory is refused with the reason, before any
/// dispatch.
#[test]
fn direct_configs_past_the_device_limits_are_refused() {
    let dev = device();
    let p = ConvParams {
        n: 1,
        c: 64,
        input: vec![40, 40],
        kernel: vec![7, 7],
        stride: vec![1, 1],
        dilation: vec![1, 1],
        padding: vec![[3, 3], [3, 3]],
        layout: Layout::ChannelsLast,
        dtype: DType::F32,
    };
    let spec = DenseConvSpec::from_params(&p, 64, 1).unwrap();
    let x = HostTensor::random_normal(DType::F32, &spec.input_shape(), 1);
    let w = HostTensor::random_normal(DType::F32, &spec.weight_shape(), 2);
    let huge = DirectConfig {
        threads_x: 32,
        threads_y: 8,
        outputs_x: 1,
        outputs_y: 2,
        ko_tile: 32,
        ci_tile: 16,
        lds_pad: 1,
    };
    let e = prepare_dense_direct(&dev, &spec, &x, &w, Some(huge))
        .and_then(run_once)
        .unwrap_err()
        .to_string();
    assert!(e.contains("shared memory"), "{e}");
}

/// The dense bench on this device: the CPU and both shaders verified (all outputs of a
/// small case; a sample of a larger one) and timed, the fastest named; a shader refused
/// by the device is reported, not fatal.
#[test]
fn dense_bench_verifies_and_times_every_kernel() {
    use evokernel::bench::Protocol;
    use evokernel::dense::bench::{bench_dense, positions_for, DenseKernel};
    let dev = device();
    let p = ConvParams {
        n: 2,
        c: 8,
        input: vec![30, 40],
        kernel: vec![3, 3],
        stride: vec![1, 1],
        dilation: vec![1, 1],
        padding: vec![[1, 1], [1, 1]],
        layout: Layout::ChannelsLast,
        dtype: DType::F32,
    };
    let spec = DenseConvSpec::from_params(&p, 16, 2).unwrap();
    // 2 x 30 x 40 x 16 outputs: sampled.
    assert!(positions_for(&spec, 1).len() < spec.output_len());
    let protocol = Protocol::default().with_launches(3);
    let kernels = [
        DenseKernel::Cpu,
        DenseKernel::VulkanNaive,
        DenseKernel::VulkanDirect(None),
        DenseKernel::VulkanDirect(Some(DirectConfig {
            threads_x: 32,
            threads_y: 8,
            outputs_x: 1,
            outputs_y: 2,
            ko_tile: 32,
            ci_tile: 16,
            lds_pad: 1,
        })),
    ];
    let r = bench_dense(Some(&dev), "small", &spec, &kernels, &protocol, 5, vec![]).unwrap();
    assert!(r.passed(), "{r:?}");
    for c in &r.candidates[..3] {
        assert!(
            c.passed && c.timing.as_ref().unwrap().median_ms > 0.0,
            "{c:?}"
        );
    }
    // 58 KiB of shared memory (and 32 output channels for a group of 8): refused with
    // the reason, not fatal.
    let refused = &r.candidates[3];
    let why = refused.error.as_deref().unwrap_or("");
    assert!(
        why.contains("does not apply") && !refused.passed,
        "{refused:?}"
    );
    assert!(r.best.is_some_and(|b| b < 3));
}

/// A tuner's scratch: a fresh cache in its own directory (removed by the caller), an
/// evolutionary plan of `candidates` timed configs that retunes, three launches a timing.
fn tune_scratch(
    tag: &str,
    candidates: usize,
) -> (
    std::path::PathBuf,
    evokernel::tune::TuneCache,
    evokernel::tune::TunePlan,
    evokernel::bench::Protocol,
) {
    use evokernel::tune::{SearchKind, TuneCache, TunePlan};
    let dir = std::env::temp_dir().join(format!("evk-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cache = TuneCache::open(&dir.join("tune.json"));
    let plan = TunePlan {
        search: SearchKind::Evolutionary,
        max_candidates: Some(candidates),
        max_seconds: 60.0,
        retune: true,
        shard: None,
    };
    (
        dir,
        cache,
        plan,
        evokernel::bench::Protocol::default().with_launches(3),
    )
}

/// A small dense 3 x 3 convolution (8 input channels, padding 1, NHWC f32) for the tuner's
/// tests.
fn small_dense_3x3(input: [i64; 2], out_channels: i64) -> DenseConvSpec {
    let p = ConvParams {
        n: 1,
        c: 8,
        input: input.to_vec(),
        kernel: vec![3, 3],
        stride: vec![1, 1],
        dilation: vec![1, 1],
        padding: vec![[1, 1], [1, 1]],
        layout: Layout::ChannelsLast,
        dtype: DType::F32,
    };
    DenseConvSpec::from_params(&p, out_channels, 1).unwrap()
}

/// The direct shader's tuner on this device: an evolutionary search of a few candidates,
/// each verified before it is timed; the winner recorded and read back as the tuned
/// config (what the bench then runs), and a second tune served from the cache.
#[test]
fn dense_tuner_records_a_config_the_bench_reads_back() {
    use evokernel::dense::tune::{tune_dense, tuned_config};
    use evokernel::tune::TunePlan;
    let dev = device();
    let spec = small_dense_3x3([10, 13], 12);
    let (dir, mut cache, plan, protocol) = tune_scratch("dense-tune", 6);
    let row = tune_dense::<DirectConfig>(&dev, &spec, &plan, &protocol, 7, &mut cache, &mut |_| {})
        .unwrap();
    assert!(row.timed >= 6 && row.failed == 0, "{row:?}");
    let best: DirectConfig = row.best_config.as_deref().unwrap().parse().unwrap();
    assert_eq!(tuned_config(&cache, &dev, &spec), Some(best));
    let again = TunePlan {
        retune: false,
        ..plan
    };
    let cached =
        tune_dense::<DirectConfig>(&dev, &spec, &again, &protocol, 7, &mut cache, &mut |_| {})
            .unwrap();
    assert!(cached.from_cache && cached.timed == 0, "{cached:?}");
    std::fs::remove_dir_all(&dir).ok();
}

/// An exhaustive search split in shards (`tune --shard K/N`): each shard times its own
/// part of the space and no other, the parts together are the space, and nothing goes
/// into the cache (a part's best is not the space's).
#[test]
fn dense_tuner_shards_time_disjoint_parts_of_the_space() {
    use evokernel::dense::tune::{tune_dense, tuned_config, tuning_space};
    use evokernel::tune::{SearchKind, Shard, TunePlan};
    let dev = device();
    let spec = small_dense_3x3([6, 7], 8);
    let (dir, mut cache, _, protocol) = tune_scratch("dense-shard", 0);
    let space: Vec<String> = tuning_space::<DirectConfig>(&dev, &spec)
        .0
        .iter()
        .map(|c| c.to_string())
        .collect();
    // Shards of about three configs each; two of them timed.
    let count = (space.len() / 3).max(2);
    let mut timed = Vec::new();
    for index in [1, count] {
        let shard = Shard { index, count };
        let plan = TunePlan {
            search: SearchKind::Exhaustive,
            retune: false,
            shard: Some(shard),
            ..TunePlan::default()
        };
        let row =
            tune_dense::<DirectConfig>(&dev, &spec, &plan, &protocol, 7, &mut cache, &mut |_| {})
                .unwrap();
        let want: Vec<&String> = shard.take(space.iter().collect());
        let got: Vec<&String> = row.trials.iter().map(|t| &t.config).collect();
        assert_eq!(got, want, "shard {index}/{count} times its part, in order");
        assert!(row.failed == 0 && !row.from_cache, "{row:?}");
        assert!(row.strategy.ends_with(&format!("(shard {index}/{count})")));
        timed.extend(got.into_iter().cloned());
    }
    let distinct: std::collections::HashSet<&String> = timed.iter().collect();
    assert_eq!(distinct.len(), timed.len(), "the shards are disjoint");
    assert_eq!(tuned_config::<DirectConfig>(&cache, &dev, &spec), None);
    std::fs::remove_dir_all(&dir).ok();
}

/// The depthwise shaders are tuned like the dense ones: on a depthwise spec each of
/// tile, depth_rotate and depth_rotate_cl searches its space (every config checked
/// against the oracle before it is timed), records its best, and the cache gives that
/// config back to the bench; a forced config runs as given.
#[test]
fn depthwise_shaders_are_tuned_and_their_configs_read_back() {
    use evokernel::bench::Protocol;
    use evokernel::dense::bench::{bench_dense, DenseKernel};
    use evokernel::dense::tune::{tune_dense, tuned_config, TunableShader};
    use evokernel::tune::{TuneCache, TunePlan, TuneRow};
    use evokernel::vulkan::VulkanDevice;
    let dev = device();
    let p = ConvParams {
        n: 1,
        c: 8,
        input: vec![3, 6, 20],
        kernel: vec![2, 3, 3],
        stride: vec![1, 1, 1],
        dilation: vec![1, 1, 1],
        padding: vec![[1, 0], [1, 1], [1, 1]],
        layout: Layout::ChannelsLast,
        dtype: DType::F32,
    };
    let spec = DenseConvSpec::from_params(&p, 8, 8).unwrap();
    let (dir, mut cache, plan, protocol) = tune_scratch("dw-tune", 5);
    fn tuned<S: TunableShader + std::fmt::Debug>(
        dev: &VulkanDevice,
        spec: &DenseConvSpec,
        plan: &TunePlan,
        protocol: &Protocol,
        cache: &mut TuneCache,
    ) -> (TuneRow, S) {
        let row = tune_dense::<S>(dev, spec, plan, protocol, 5, cache, &mut |_| {}).unwrap();
        assert!(row.timed >= 2 && row.failed == 0, "{row:?}");
        let best: S = row.best_config.as_deref().unwrap().parse().unwrap();
        assert_eq!(tuned_config::<S>(cache, dev, spec), Some(best));
        (row, best)
    }
    let (_, tile) = tuned::<TileConfig>(&dev, &spec, &plan, &protocol, &mut cache);
    let (_, rotate) = tuned::<RotateConfig>(&dev, &spec, &plan, &protocol, &mut cache);
    let (_, rotate_cl) = tuned::<RotateClConfig>(&dev, &spec, &plan, &protocol, &mut cache);
    // The tuned configs forced through the bench pass the oracle under their names.
    let kernels = [
        DenseKernel::VulkanDepthwiseTile(Some(tile)),
        DenseKernel::VulkanDepthRotate(Some(rotate)),
        DenseKernel::VulkanDepthRotateCl(Some(rotate_cl)),
    ];
    let report = bench_dense(Some(&dev), "dw", &spec, &kernels, &protocol, 5, Vec::new()).unwrap();
    let want = [tile.to_string(), rotate.to_string(), rotate_cl.to_string()];
    for (c, name) in report.candidates.iter().zip(&want) {
        assert!(c.passed && &c.kernel == name, "{c:?}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Winograd F(2x2, 3x3): every 3 x 3 stride-1 case of the dense suite on small twins (f32
/// and f16, both layouts), random 3 x 3 specs (groups, padding, 3-D slices with 1 x 3 x 3
/// kernels, depth strides), a sample of its config space, NaN inputs reaching exactly
/// the oracle's outputs; an infinity may come out NaN (the transforms add and subtract
/// it) but never finite where the oracle is not; other kernels refused.
#[test]
fn winograd_shader_matches_the_oracle() {
    use evokernel::vulkan::dense_winograd::{prepare_dense_winograd, WinogradConfig};
    let dev = device();
    let run = |spec: &DenseConvSpec, seed: u64, config: Option<WinogradConfig>, poison: f64| {
        let dtype = spec.dtype();
        let mut x = HostTensor::random_normal(dtype, &spec.input_shape(), seed);
        let w = HostTensor::random_normal(dtype, &spec.weight_shape(), seed + 1);
        if !poison.is_nan() || seed.is_multiple_of(3) {
            let i = (SplitMix64::new(seed).next_u64() % x.len() as u64) as usize;
            x.set_f64(i, poison);
        }
        let y = prepare_dense_winograd(&dev, spec, &x, &w, config)
            .and_then(run_once)
            .unwrap_or_else(|e| panic!("{spec}: {e}"))
            .0;
        (y, dense_reference(spec, &x, &w).unwrap())
    };
    let mut checked = 0;
    let dtypes: &[DType] = if dev.info().storage_f16 {
        &[DType::F32, DType::F16, DType::Bf16]
    } else {
        &[DType::F32]
    };
    for (i, case) in dense_suite().unwrap().into_iter().enumerate() {
        for &dtype in dtypes {
            let spec = case.spec.small_twin(dtype).unwrap();
            if WinogradConfig::applies(&spec).is_err() {
                continue;
            }
            for layout in [Layout::ChannelsLast, Layout::ChannelsFirst] {
                let spec = spec.with_layout(layout);
                let (y, want) = run(&spec, 600 + i as u64, None, f64::NAN);
                let c = compare(&y, &want).unwrap();
                assert!(c.passes(dtype), "{} {spec}: {c:?}", case.name);
                checked += 1;
            }
        }
    }
    assert!(checked >= 16, "{checked}");
    let mut rng = SplitMix64::new(2028);
    let mut pick = |lo: u64, hi: u64| lo + rng.next_u64() % (hi - lo + 1);
    for i in 0..24u64 {
        let groups = pick(1, 3) as i64;
        let three_d = pick(0, 2) == 0;
        let mut p = ConvParams {
            n: pick(1, 2) as i64,
            c: groups * pick(1, 9) as i64,
            input: vec![pick(1, 19) as i64, pick(1, 23) as i64],
            kernel: vec![3, 3],
            stride: vec![1, 1],
            dilation: vec![1, 1],
            padding: (0..2)
                .map(|_| [pick(0, 2) as i64, pick(0, 2) as i64])
                .collect(),
            layout: if i % 2 == 0 {
                Layout::ChannelsLast
            } else {
                Layout::ChannelsFirst
            },
            dtype: DType::F32,
        };
        for d in 0..2 {
            let span = 3 - p.padding[d][0] - p.padding[d][1];
            p.input[d] = p.input[d].max(span).max(1);
        }
        if three_d {
            p.input.insert(0, pick(1, 4) as i64);
            p.kernel.insert(0, 1);
            p.stride.insert(0, pick(1, 2) as i64);
            p.dilation.insert(0, 1);
            p.padding.insert(0, [pick(0, 1) as i64, 0]);
        }
        let spec = DenseConvSpec::from_params(&p, groups * pick(1, 9) as i64, groups).unwrap();
        let space = WinogradConfig::space(dev.info(), &spec);
        let config = space[(pick(0, 1000) as usize) % space.len()];
        let (y, want) = run(&spec, 700 + i, Some(config), f64::NAN);
        let c = compare(&y, &want).unwrap();
        assert!(c.passes(DType::F32), "random #{i} {spec} {config}: {c:?}");
        // An infinity: non-finite exactly where the oracle is (NaN may stand for it).
        let (y, want) = run(&spec, 800 + i, Some(config), f64::INFINITY);
        for (j, &r) in want.iter().enumerate() {
            assert_eq!(
                y.get_f64(j).is_finite(),
                r.is_finite(),
                "random #{i} {spec} output {j}: {} vs {r}",
                y.get_f64(j)
            );
        }
    }
    let p = ConvParams {
        n: 1,
        c: 4,
        input: vec![9, 9],
        kernel: vec![3, 3],
        stride: vec![2, 2],
        dilation: vec![1, 1],
        padding: vec![[1, 1], [1, 1]],
        layout: Layout::ChannelsLast,
        dtype: DType::F32,
    };
    let strided = DenseConvSpec::from_params(&p, 4, 1).unwrap();
    let x = HostTensor::random_normal(DType::F32, &strided.input_shape(), 1);
    let w = HostTensor::random_normal(DType::F32, &strided.weight_shape(), 2);
    let e = prepare_dense_winograd(&dev, &strided, &x, &w, None)
        .and_then(run_once)
        .unwrap_err();
    assert!(e.to_string().contains("3 x 3"), "{e}");
}

/// Depthwise specs through the dense bench: the public and channels-last suites load as
/// their depthwise twins, the depthwise shaders (tiled, rotating, channels-last rotating
/// where they apply) and the dense naive one pass the oracle on them (f32 small twins),
/// and the tiled shader refuses a dense spec with the reason.
#[test]
fn depthwise_specs_run_through_the_dense_bench() {
    use evokernel::bench::Protocol;
    use evokernel::dense::bench::{bench_dense, DenseKernel};
    use evokernel::dense::load_dense_suite;
    let dev = device();
    let protocol = Protocol::default().with_launches(2);
    let mut suites = load_dense_suite(std::path::Path::new("public")).unwrap();
    suites.extend(load_dense_suite(std::path::Path::new("channels-last")).unwrap());
    let mut rotated = 0;
    for case in suites {
        assert!(case.spec.is_depthwise());
        let spec = case.spec.small_twin(DType::F32).unwrap();
        let mut kernels = vec![
            DenseKernel::VulkanNaive,
            DenseKernel::VulkanDepthwiseTile(None),
        ];
        if RotateConfig::applies(spec.geometry()).is_ok() {
            kernels.push(DenseKernel::VulkanDepthRotate(None));
            rotated += 1;
        }
        if RotateClConfig::applies(spec.geometry()).is_ok() {
            kernels.push(DenseKernel::VulkanDepthRotateCl(None));
        }
        let r = bench_dense(
            Some(&dev),
            &case.name,
            &spec,
            &kernels,
            &protocol,
            3,
            vec![],
        )
        .unwrap();
        assert!(
            r.candidates.iter().all(|c| c.passed),
            "{}: {:?}",
            case.name,
            r.candidates
        );
    }
    let p = ConvParams {
        n: 1,
        c: 4,
        input: vec![8, 8],
        kernel: vec![3, 3],
        stride: vec![],
        dilation: vec![],
        padding: vec![[1, 1], [1, 1]],
        layout: Layout::ChannelsLast,
        dtype: DType::F32,
    };
    assert!(rotated >= 10, "{rotated}");
    let dense = DenseConvSpec::from_params(&p, 8, 1).unwrap();
    let r = bench_dense(
        Some(&dev),
        "dense",
        &dense,
        &[DenseKernel::VulkanDepthwiseTile(None)],
        &protocol,
        3,
        vec![],
    )
    .unwrap();
    let why = r.candidates[0].error.as_deref().unwrap_or("");
    assert!(why.contains("depthwise"), "{why}");
}

/// bf16 outputs are rounded to nearest, not truncated (a truncating store passes the
/// oracle's bf16 gate, so it is checked directly): 1 + 1.5 * 2^-8 lies past the midpoint
/// between the bf16 neighbours 1 and 1 + 2^-7, and must come out as the upper one.
#[test]
fn bf16_outputs_round_to_nearest() {
    let dev = device();
    if !dev.info().storage_f16 {
        eprintln!("{} has no 16-bit storage: bf16 is refused", dev.info().name);
        return;
    }
    let p = ConvParams {
        n: 1,
        c: 2,
        input: vec![1, 1],
        kernel: vec![1, 1],
        stride: vec![],
        dilation: vec![],
        padding: vec![],
        layout: Layout::ChannelsLast,
        dtype: DType::Bf16,
    };
    let spec = DenseConvSpec::from_params(&p, 1, 1).unwrap();
    let mut x = HostTensor::zeros(DType::Bf16, &spec.input_shape());
    x.set_f64(0, 1.0);
    x.set_f64(1, 1.5 / 256.0);
    let mut w = HostTensor::zeros(DType::Bf16, &spec.weight_shape());
    w.set_f64(0, 1.0);
    w.set_f64(1, 1.0);
    let (y, _) = prepare_dense_naive(&dev, &spec, &x, &w)
        .and_then(run_once)
        .unwrap();
    assert_eq!(y.get_f64(0), 1.0 + 1.0 / 128.0);
    let (y, _) = prepare_dense_direct(&dev, &spec, &x, &w, None)
        .and_then(run_once)
        .unwrap();
    assert_eq!(y.get_f64(0), 1.0 + 1.0 / 128.0);
}

/// The cooperative-matrix shader where the device has it (the H100's driver): seeded
/// random dense f16 channels-last specs (1-3 spatial dims, stride, dilation, asymmetric
/// padding, batch; channels multiples of 8 but not all of 16 or 32, so B's padding and
/// partial tiles in M and N are exercised), NaN/Inf in some inputs, at the default and
/// with two steps loaded ahead, then every config of
/// its space on two specs (the dense bench checks the dense suite's real layers at
/// sampled positions). Where the device has no cooperative matrices (lavapipe), the
/// refusal says so, by name.
/// Random dense f16 channels-last specs for the cooperative-matrix shaders: 1-3 spatial
/// dims, stride, dilation, asymmetric padding, batch; channels multiples of 8 but not all
/// of 16 or 32, so B's padding and partial tiles in M and N are exercised.
fn random_coopmat_specs() -> Vec<DenseConvSpec> {
    let mut rng = SplitMix64::new(2029);
    let mut pick = |lo: u64, hi: u64| lo + rng.next_u64() % (hi - lo + 1);
    let mut specs = Vec::new();
    for _ in 0..30 {
        let dims = pick(1, 3) as usize;
        let mut p = ConvParams {
            n: pick(1, 3) as i64,
            c: 8 * pick(1, 9) as i64,
            input: vec![],
            kernel: vec![],
            stride: vec![],
            dilation: vec![],
            padding: vec![],
            layout: Layout::ChannelsLast,
            dtype: DType::F16,
        };
        push_random_dims(&mut p, &mut pick, dims, [3, 2, 2, 12]);
        if let Ok(spec) = DenseConvSpec::from_params(&p, 8 * pick(1, 10) as i64, 1) {
            specs.push(spec);
        }
    }
    assert!(specs.len() >= 25, "{}", specs.len());
    specs
}

/// `dense_coopmat2` at `config` on `spec` (operands of `seed`) launched twice: the same
/// bits both times, and the oracle's outputs at f16's tolerance.
fn coopmat2_twice_matches_the_oracle(
    dev: &VulkanDevice,
    spec: &DenseConvSpec,
    config: Coopmat2Config,
    seed: u64,
) {
    let (x, w) = coopmat_operands(spec, seed);
    let run = prepare_dense_coopmat2(dev, spec, &x, &w, Some(config)).unwrap();
    twice_matches_the_oracle(&run, spec, &x, &w, &config.to_string());
}

/// A prepared f16 run on `spec`, `x`, `w` (`what` names its config) launched twice: the
/// same bits both times, and the oracle's outputs at f16's tolerance.
fn twice_matches_the_oracle(
    run: &evokernel::vulkan::VulkanRun<'_>,
    spec: &DenseConvSpec,
    x: &HostTensor,
    w: &HostTensor,
    what: &str,
) {
    run.launch().unwrap();
    let first = run.output().unwrap();
    run.launch().unwrap();
    let second = run.output().unwrap();
    assert_eq!(
        first.as_bytes(),
        second.as_bytes(),
        "{spec} {what}: bits differ"
    );
    assert_f16_matches_oracle(spec, x, w, Ok(first), what);
}

/// `got` (a cooperative-matrix shader's output on `spec`, `x`, `w`; `what` names the
/// config) against the f64 oracle at f16's tolerance.
fn assert_f16_matches_oracle(
    spec: &DenseConvSpec,
    x: &HostTensor,
    w: &HostTensor,
    got: evokernel::error::Result<HostTensor>,
    what: &str,
) {
    let y = got.unwrap_or_else(|e| panic!("{spec} {what}: {e}"));
    let want = dense_reference(spec, x, w).unwrap();
    let c = compare(&y, &want).unwrap();
    assert!(c.passes(DType::F16), "{spec} {what}: {c:?}");
}

/// Random operands for a cooperative-matrix spec; NaN and infinities in the input where
/// `seed` is a multiple of 4.
fn coopmat_operands(spec: &DenseConvSpec, seed: u64) -> (HostTensor, HostTensor) {
    let mut x = HostTensor::random_normal(DType::F16, &spec.input_shape(), seed);
    let w = HostTensor::random_normal(DType::F16, &spec.weight_shape(), seed + 1);
    if seed.is_multiple_of(4) {
        let mut rng = SplitMix64::new(seed);
        for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let i = (rng.next_u64() % x.len() as u64) as usize;
            x.set_f64(i, v);
        }
    }
    (x, w)
}

#[test]
fn coopmat_shader_matches_the_oracle_where_the_device_has_it() {
    use evokernel::vulkan::dense_coopmat::{prepare_dense_coopmat, CoopmatConfig};
    let dev = device();
    let specs = random_coopmat_specs();
    let run = |spec: &DenseConvSpec, seed: u64, config: Option<CoopmatConfig>| {
        let (x, w) = coopmat_operands(spec, seed);
        let got = prepare_dense_coopmat(&dev, spec, &x, &w, config)
            .and_then(|run| run.launch().and_then(|_| run.output()));
        (got, x, w)
    };
    if !dev.info().coopmat_f16 {
        let (got, _, _) = run(&specs[0], 1, None);
        let e = got.unwrap_err().to_string();
        assert!(
            e.contains("cooperative matrix") && e.contains(&dev.info().name),
            "{e}"
        );
        eprintln!(
            "{}: no cooperative matrices, the shader refuses: {e}",
            dev.info().name
        );
        return;
    }
    let check = |spec: &DenseConvSpec, seed: u64, config: Option<CoopmatConfig>| {
        let (got, x, w) = run(spec, seed, config);
        assert_f16_matches_oracle(spec, &x, &w, got, &format!("{config:?}"));
    };
    for (i, spec) in specs.iter().enumerate() {
        check(spec, 700 + i as u64, None);
        // The two-deep prefetch too: its loop runs steps in pairs (odd counts, one step).
        let mut two = CoopmatConfig::default_for(dev.info(), spec).unwrap();
        two.ahead = 2;
        check(spec, 800 + i as u64, Some(two));
    }
    for spec in &specs[..2] {
        let space = CoopmatConfig::space(dev.info(), spec);
        assert!(!space.is_empty(), "{spec}");
        for c in space {
            check(spec, 900, Some(c));
        }
    }
}

/// Pointwise specs for `dense_coopmat2` (one tap: ragged M, Cin past a K step, Cout past a
/// tile), 1-3-D.
fn coopmat2_pointwise_specs() -> Vec<DenseConvSpec> {
    let mut pointwise = Vec::new();
    for (dims, n, c, cout) in [(1, 3, 40, 24), (2, 2, 72, 136), (3, 1, 8, 8)] {
        let p = ConvParams {
            n,
            c,
            input: [7, 9, 5][..dims].to_vec(),
            kernel: vec![1; dims],
            stride: vec![1; dims],
            dilation: vec![1; dims],
            padding: vec![[0, 0]; dims],
            layout: Layout::ChannelsLast,
            dtype: DType::F16,
        };
        pointwise.push(DenseConvSpec::from_params(&p, cout, 1).unwrap());
    }
    pointwise
}

/// The workgroup-scope cooperative-matrix shader (`dense_coopmat2`) against the f64 oracle
/// on `random_coopmat_specs` and three pointwise specs (NaN/Inf in some inputs) at the
/// default, with K split 2, 4 and 8 ways (each launched twice: the same bits; the unsplit
/// configs of its space: `coopmat2_config_space_on`). Where the device has no
/// `VK_NV_cooperative_matrix2` workgroup-scope matrices (lavapipe), the refusal says so.
#[test]
fn coopmat2_shader_matches_the_oracle_where_the_device_has_it() {
    let dev = device();
    let specs = random_coopmat_specs();
    let run = |spec: &DenseConvSpec, seed: u64, config: Option<Coopmat2Config>| {
        let (x, w) = coopmat_operands(spec, seed);
        let got = prepare_dense_coopmat2(&dev, spec, &x, &w, config)
            .and_then(|run| run.launch().and_then(|_| run.output()));
        (got, x, w)
    };
    let Some(m) = &dev.info().workgroup_matrices else {
        let (got, _, _) = run(&specs[0], 1, None);
        let e = got.unwrap_err().to_string();
        assert!(
            e.contains("VK_NV_cooperative_matrix2") && e.contains(&dev.info().name),
            "{e}"
        );
        eprintln!(
            "{}: no workgroup-scope matrices, the shader refuses: {e}",
            dev.info().name
        );
        return;
    };
    eprintln!("{}: {m}", dev.info().name);
    let check = |spec: &DenseConvSpec, seed: u64, config: Option<Coopmat2Config>| {
        let (got, x, w) = run(spec, seed, config);
        assert_f16_matches_oracle(spec, &x, &w, got, &format!("{config:?}"));
    };
    for (i, spec) in specs.iter().enumerate() {
        check(spec, 700 + i as u64, None);
    }
    let pointwise = coopmat2_pointwise_specs();
    for (i, spec) in pointwise.iter().enumerate() {
        check(spec, 600 + i as u64, None);
    }
    // K split across workgroups: the default tile at each split count that fits, on every
    // spec; launched twice, the same bits both times (the partials are added in split
    // order, and the last workgroup of a tile resets its counter for the next launch).
    for (i, spec) in specs.iter().chain(&pointwise).enumerate() {
        let d = Coopmat2Config::default_for(dev.info(), spec).unwrap();
        for splits in [2, 4, 8] {
            let c = Coopmat2Config { splits, ..d };
            if c.fits(dev.info(), spec).is_err() {
                continue;
            }
            coopmat2_twice_matches_the_oracle(&dev, spec, c, 500 + i as u64);
        }
    }
}

/// `dense_coopmat2`'s unsplit configs on one of three specs (`which`: two random ones with
/// partial tiles in M and N and K padding, then a pointwise one) against the f64 oracle:
/// every config in one product a step whose bm is a power of two, and every other bm
/// (tiles whose A pieces do not split evenly among the invocations) and product count with
/// the default's other fields; all at the default's `persistent`
/// (`coopmat2_tile_loop_forms_match_the_oracle` takes the other). A test a spec, so that
/// each fits a GPU call (H200 run 442: the pointwise spec alone 263 s, 274 configs; the
/// three were ~420-450 s together before the tile loop, run 431).
fn coopmat2_config_space_on(which: usize) {
    let dev = device();
    if dev.info().workgroup_matrices.is_none() {
        eprintln!("{}: no workgroup-scope matrices", dev.info().name);
        return;
    }
    let specs = random_coopmat_specs();
    let pointwise = coopmat2_pointwise_specs();
    let spec = [&specs[0], &specs[1], &pointwise[1]][which];
    let space = Coopmat2Config::space(dev.info(), spec);
    assert!(!space.is_empty(), "{spec}");
    let d = Coopmat2Config::default_for(dev.info(), spec).unwrap();
    let mut ran = 0;
    for c in space.into_iter().filter(|c| {
        c.splits == 1
            && c.persistent == d.persistent
            && ((c.bm.is_power_of_two() && c.products == 1)
                || (c.bn, c.bk, c.threads, c.ahead) == (d.bn, d.bk, d.threads, d.ahead))
    }) {
        let (x, w) = coopmat_operands(spec, 900);
        let got = prepare_dense_coopmat2(&dev, spec, &x, &w, Some(c))
            .and_then(|run| run.launch().and_then(|_| run.output()));
        assert_f16_matches_oracle(spec, &x, &w, got, &c.to_string());
        ran += 1;
    }
    eprintln!("{spec}: {ran} configs passed");
}

#[test]
fn coopmat2_config_space_matches_the_oracle_on_a_random_spec() {
    coopmat2_config_space_on(0);
}

#[test]
fn coopmat2_config_space_matches_the_oracle_on_another_random_spec() {
    coopmat2_config_space_on(1);
}

#[test]
fn coopmat2_config_space_matches_the_oracle_on_a_pointwise_spec() {
    coopmat2_config_space_on(2);
}

/// `dense_coopmat2`'s tile loop in its forms against the f64 oracle (below); where the
/// device has no workgroup-scope matrices or no SM count, nothing to run, as in the other
/// `coopmat2` tests.
#[test]
fn coopmat2_tile_loop_forms_match_the_oracle() {
    let dev = device();
    if dev.info().workgroup_matrices.is_none() || dev.info().compute_units.is_none() {
        eprintln!(
            "{}: no workgroup-scope matrices or no SM count",
            dev.info().name
        );
        return;
    }
    // The shader's tile loop in its forms: persistent workgroups (a workgroup an SM
    // taking every grid-th tile, each next tile's first loads before the last one's
    // epilogue) and one tile a workgroup, at each spec's default, at the default's other
    // load forms and in 32 x 32 tiles (many tiles a workgroup); K split in two; launched
    // twice, the same bits. The random specs and three with more tiles than SMs (ragged M
    // and Cout, 1-3-D).
    let mut specs = random_coopmat_specs();
    for (input, kernel, n, c, cout) in [
        (vec![100, 100], vec![3, 3], 2, 16, 24),
        (vec![6, 40, 48], vec![3, 3, 3], 1, 8, 40),
        (vec![7000], vec![5], 3, 24, 16),
    ] {
        let dims = input.len();
        let p = ConvParams {
            n,
            c,
            input,
            padding: kernel.iter().map(|k| [k / 2, k / 2]).collect(),
            kernel,
            stride: vec![1; dims],
            dilation: vec![1; dims],
            layout: Layout::ChannelsLast,
            dtype: DType::F16,
        };
        specs.push(DenseConvSpec::from_params(&p, cout, 1).unwrap());
    }
    for (i, spec) in specs.iter().enumerate() {
        let d = Coopmat2Config::default_for(dev.info(), spec).unwrap();
        let base = Coopmat2Config {
            persistent: 1,
            splits: 1,
            ..d
        };
        let forms = [
            Coopmat2Config {
                bm: 32,
                bn: 32,
                threads: 128,
                frags_ahead: 0,
                ..base
            },
            base,
            Coopmat2Config {
                frags_ahead: 0,
                ahead: 1,
                late_loads: 0,
                ..base
            },
            Coopmat2Config {
                frags_ahead: 0,
                ahead: 2,
                late_loads: 1,
                products: 1,
                ..base
            },
        ];
        // Each form also one tile a workgroup (the same text's other path), and K split
        // in two at the default.
        let split = Coopmat2Config {
            splits: 2,
            persistent: 0,
            ..d
        };
        let forms = forms
            .into_iter()
            .flat_map(|c| [c, Coopmat2Config { persistent: 0, ..c }])
            .chain([split]);
        for c in forms {
            if c.fits(dev.info(), spec).is_err() {
                continue;
            }
            coopmat2_twice_matches_the_oracle(&dev, spec, c, 1100 + i as u64);
        }
    }
}

/// Random 3 x 3 stride-1 specs (1 x 3 x 3 in 3-D, any depth stride), ragged sizes and
/// asymmetric padding: what `dense_winograd_coopmat2` takes.
fn random_winograd_specs(count: usize, seed: u64) -> Vec<DenseConvSpec> {
    let mut rng = SplitMix64::new(seed);
    let mut pick = |lo: u64, hi: u64| lo + rng.next_u64() % (hi - lo + 1);
    let mut specs = Vec::new();
    while specs.len() < count {
        let three_d = pick(0, 3) == 0;
        let mut p = ConvParams {
            n: pick(1, 3) as i64,
            c: 8 * pick(1, 9) as i64,
            input: vec![pick(1, 21) as i64, pick(1, 21) as i64],
            kernel: vec![3, 3],
            stride: vec![1, 1],
            dilation: vec![1, 1],
            padding: vec![
                [pick(0, 2) as i64, pick(0, 2) as i64],
                [pick(0, 2) as i64, pick(0, 2) as i64],
            ],
            layout: Layout::ChannelsLast,
            dtype: DType::F16,
        };
        if three_d {
            p.input.insert(0, pick(1, 5) as i64);
            p.kernel.insert(0, 1);
            p.stride.insert(0, pick(1, 2) as i64);
            p.dilation.insert(0, 1);
            p.padding.insert(0, [pick(0, 1) as i64, pick(0, 1) as i64]);
        }
        if let Ok(spec) = DenseConvSpec::from_params(&p, 8 * pick(1, 10) as i64, 1) {
            specs.push(spec);
        }
    }
    specs
}

/// `dense_winograd_coopmat2` (input transform, `dense_coopmat2`'s batch of 16 GEMMs,
/// output transform) against the f64 oracle at f16's tolerance, launched twice (the same
/// bits): random specs and ResNet-50's 14 x 14 and 7 x 7 layers, each at its default, at 96
/// rows (the points' rows padded), one tile a workgroup and persistent, K split in two.
/// Finite operands only (an infinity comes out NaN, a NaN reaches a neighbouring tile: the
/// module says so). Where the device has no workgroup-scope matrices it refuses, saying so.
#[test]
fn winograd_coopmat2_matches_the_oracle() {
    use evokernel::vulkan::dense_winograd_coopmat2::{
        prepare_dense_winograd_coopmat2, WinogradCoopmat2Config,
    };
    let dev = device();
    let mut specs = random_winograd_specs(24, 2031);
    let (x, w) = coopmat_operands(&specs[0], 1);
    if dev.info().workgroup_matrices.is_none() {
        let e = prepare_dense_winograd_coopmat2(&dev, &specs[0], &x, &w, None)
            .err()
            .expect("refused without the matrices")
            .to_string();
        assert!(e.contains("cooperative"), "{e}");
        eprintln!("{}: no workgroup-scope matrices: {e}", dev.info().name);
        return;
    }
    specs.extend(
        dense_suite()
            .unwrap()
            .into_iter()
            .filter(|c| c.name == "resnet50-3x3-14" || c.name == "resnet50-3x3-7")
            .map(|c| c.spec),
    );
    let mut ran = 0;
    for (i, spec) in specs.iter().enumerate() {
        let d = WinogradCoopmat2Config::default_for(dev.info(), spec).unwrap();
        let c = d.0;
        let forms = [
            c,
            Coopmat2Config { bm: 96, ..c },
            Coopmat2Config {
                persistent: 1 - c.persistent,
                ..c
            },
            Coopmat2Config {
                splits: 2,
                persistent: 0,
                ..c
            },
        ];
        for f in forms.map(WinogradCoopmat2Config) {
            if f.fits(dev.info(), spec).is_err() {
                continue;
            }
            // Seeds 4k + 1: finite operands.
            let (x, w) = coopmat_operands(spec, 4 * (1200 + i as u64) + 1);
            let run = prepare_dense_winograd_coopmat2(&dev, spec, &x, &w, Some(f)).unwrap();
            twice_matches_the_oracle(&run, spec, &x, &w, &f.to_string());
            ran += 1;
        }
    }
    eprintln!("{ran} runs of {} specs passed", specs.len());
}

/// The Winograd transforms on any device (lavapipe in CI): input transform, the 16 GEMMs
/// on the host, output transform, against the f64 oracle at f16's tolerance on random 3 x
/// 3 stride-1 specs (asymmetric padding, ragged tiles, 1 x 3 x 3 kernels over depth
/// slices with depth stride): what `dense_winograd_coopmat2` runs around its GEMM.
#[test]
fn winograd_transforms_match_the_oracle_on_any_device() {
    use evokernel::vulkan::dense_winograd_coopmat2::transforms_with_host_gemm;
    // (Their buffers are 16-byte words: no 16-bit storage needed.)
    let dev = device();
    for (i, spec) in random_winograd_specs(16, 2037).iter().enumerate() {
        let (x, w) = coopmat_operands(spec, 4 * (1300 + i as u64) + 1);
        let got = transforms_with_host_gemm(&dev, spec, &x, &w);
        assert_f16_matches_oracle(spec, &x, &w, got, "transforms");
    }
}
