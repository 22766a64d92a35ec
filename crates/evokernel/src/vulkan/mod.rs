//! The Vulkan backend (issue 19): the loader opened at run time (`ash`, no link to
//! libvulkan), devices listed with the limits the kernels must respect (read from the
//! device, never assumed), GLSL compiled to SPIR-V at run time (`shader`), prepared runs
//! on device-local buffers (`VulkanRun`); the depthwise shaders (`naive`, `tile`,
//! `depth_rotate`, `depth_rotate_cl`) and the dense ones (`dense_naive`, `dense_direct`,
//! `dense_winograd`, `dense_coopmat` and `dense_coopmat2` on cooperative matrices,
//! `dense_winograd_coopmat2` around the latter's GEMM), each verified against the
//! oracle. Tested on Mesa's lavapipe (CPU) in CI and on the H100's NVIDIA driver; not on
//! AMD hardware.

/// `Display` and `FromStr` of a shader config in its text form, `NAME:field=value,...`
/// (`write_config` / `parse_config`), for a config type with `NAME`, `NAMES` and
/// `values()`: `what` names it in errors, `hint` says what its family allows, `build`
/// makes the config of values in `NAMES` order, None outside the family.
macro_rules! config_text {
    ($config:ty, $what:literal, $hint:expr, $build:expr) => {
        impl std::fmt::Display for $config {
            /// The form configs are forced in, reported and cached.
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                $crate::vulkan::write_config(f, Self::NAME, &Self::NAMES, &self.values())
            }
        }

        impl std::str::FromStr for $config {
            type Err = $crate::error::Error;
            /// Every field, once (the form `Display` writes), in the family.
            fn from_str(s: &str) -> $crate::error::Result<Self> {
                let expected = || {
                    let fields: Vec<String> =
                        Self::NAMES.iter().map(|f| format!("{f}=N")).collect();
                    format!("expected {}:{} ({})", Self::NAME, fields.join(","), $hint)
                };
                let values =
                    $crate::vulkan::parse_config(s, $what, Self::NAME, &Self::NAMES, &expected)?;
                let build = $build;
                build(values).ok_or_else(|| $crate::error::Error::parse($what, s, expected()))
            }
        }
    };
}

pub mod dense_coopmat;
pub mod dense_coopmat2;
pub mod dense_direct;
pub mod dense_naive;
pub mod dense_winograd;
pub mod dense_winograd_coopmat2;
pub mod depth_rotate;
pub mod depth_rotate_cl;
pub(crate) mod device;
pub mod naive;
pub(crate) mod nv_coopmat2;
pub mod shader;
pub mod tile;

pub use device::{
    list_vulkan_devices, VulkanDevice, VulkanDeviceInfo, WorkgroupMatrices, WorkgroupShape,
};

use crate::error::{Error, Result};
use crate::spec::DType;
use crate::tensor::HostTensor;

/// `source` for buffers of `dtype`: f32 everywhere, f16 and bf16 where the device has
/// 16-bit storage (`storageBuffer16BitAccess`; bf16 as its 16 bits, converted in the
/// shader); without it an error naming the shader and device.
pub(crate) fn source_for(
    shader: &str,
    source: &str,
    dtype: DType,
    info: &VulkanDeviceInfo,
) -> Result<String> {
    if dtype != DType::F32 && !info.storage_f16 {
        return Err(Error::BackendUnavailable {
            backend: "vulkan".into(),
            reason: format!(
                "the {shader} Vulkan shader takes {dtype} where the device has 16-bit storage \
                 ({} has none); f32 runs everywhere",
                info.name
            ),
        });
    }
    Ok(shader::with_element(source, dtype))
}

/// A shader prepared once on device-local copies of an input and a weight and an output
/// buffer: launched as often as a timing needs (each launch timed by timestamps around
/// its dispatch alone), its output read back after. A run of several stages
/// (`VulkanRun::chain`: transforms around a GEMM) dispatches them in order, timed as one.
pub struct VulkanRun<'d> {
    dev: &'d VulkanDevice,
    stages: Vec<Stage<'d>>,
    // Declared after the kernels: dropped after them.
    _x: device::DeviceBuffer<'d>,
    _w: device::DeviceBuffer<'d>,
    y: device::DeviceBuffer<'d>,
    /// Zeroed buffers the stages keep between them (a chain's intermediates) or across
    /// their workgroups (a shader's scratch, binding 3).
    _intermediates: Vec<device::DeviceBuffer<'d>>,
    out: HostTensor,
    /// What runs, in its forced-config form (`dense_direct:threads_x=..`), or the
    /// shader's name where it has no config.
    config: String,
}

/// One dispatch of a run: its kernel (bound to its buffers), push constants, workgroups.
struct Stage<'d> {
    name: String,
    kernel: device::ComputeKernel<'d>,
    push: Vec<u8>,
    grid: [u32; 2],
}

/// A buffer a chain's stage binds: the run's input, weight or output, or intermediate `i`
/// (`ChainStage`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChainBuffer {
    Input,
    Weight,
    Output,
    Intermediate(usize),
}

/// One stage of `VulkanRun::chain`: a shader (`name`, for the compile cache and the
/// statistics), its specialization constants, push constants, workgroups and bindings (0..
/// in order).
pub(crate) struct ChainStage<'a> {
    pub name: &'a str,
    pub source: String,
    pub constants: Vec<(u32, u32)>,
    pub push: Vec<u8>,
    pub grid: [u32; 2],
    pub bindings: Vec<ChainBuffer>,
}

impl<'d> VulkanRun<'d> {
    /// `source` compiled with `constants`, bound to device-local copies of `x` and `w`
    /// and an output buffer for `out`, and, where `scratch` is given, a fourth buffer
    /// (binding 3) of that many bytes, zeroed once here: workspace a shader keeps across
    /// its workgroups (and leaves zeroed where it needs that at the next launch).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        dev: &'d VulkanDevice,
        name: &str,
        source: &str,
        constants: &[(u32, u32)],
        push: &[u8],
        grid: [u32; 2],
        x: &HostTensor,
        w: &HostTensor,
        out: HostTensor,
        scratch: Option<usize>,
    ) -> Result<Self> {
        let mut bindings = vec![ChainBuffer::Input, ChainBuffer::Weight, ChainBuffer::Output];
        bindings.extend(scratch.map(|_| ChainBuffer::Intermediate(0)));
        let stage = ChainStage {
            name,
            source: source.to_string(),
            constants: constants.to_vec(),
            push: push.to_vec(),
            grid,
            bindings,
        };
        Self::chain(dev, x, w, out, &Vec::from_iter(scratch), vec![stage])
    }

    /// `stages` compiled and bound to device-local copies of `x` and `w`, an output buffer
    /// for `out` and zeroed intermediate buffers of `intermediates` bytes each; a launch
    /// dispatches the stages in order, a barrier between each.
    pub(crate) fn chain(
        dev: &'d VulkanDevice,
        x: &HostTensor,
        w: &HostTensor,
        out: HostTensor,
        intermediates: &[usize],
        stages: Vec<ChainStage<'_>>,
    ) -> Result<Self> {
        let bx = dev.device_buffer(x.size_bytes())?;
        let bw = dev.device_buffer(w.size_bytes())?;
        let y = dev.device_buffer(out.size_bytes())?;
        dev.upload(&bx, x.as_bytes())?;
        dev.upload(&bw, w.as_bytes())?;
        let mut kept = Vec::new();
        for &bytes in intermediates {
            let b = dev.device_buffer(bytes)?;
            dev.upload(&b, &vec![0u8; b.bytes])?;
            kept.push(b);
        }
        let mut prepared = Vec::new();
        for st in stages {
            let (spirv, _) = shader::compile_compute_cached(st.name, &st.source)?;
            let buffers = st
                .bindings
                .iter()
                .map(|b| match b {
                    ChainBuffer::Input => Ok(bx.buffer),
                    ChainBuffer::Weight => Ok(bw.buffer),
                    ChainBuffer::Output => Ok(y.buffer),
                    ChainBuffer::Intermediate(i) => {
                        kept.get(*i)
                            .map(|b| b.buffer)
                            .ok_or_else(|| Error::BackendUnavailable {
                                backend: "vulkan".into(),
                                reason: format!(
                                    "stage {} binds intermediate {i} of {}",
                                    st.name,
                                    kept.len()
                                ),
                            })
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            let kernel = dev.kernel(&spirv, &st.constants, &buffers, st.push.len())?;
            prepared.push(Stage {
                name: st.name.to_string(),
                kernel,
                push: st.push,
                grid: st.grid,
            });
        }
        let config = prepared.first().map(|s| s.name.clone()).unwrap_or_default();
        Ok(VulkanRun {
            dev,
            stages: prepared,
            _x: bx,
            _w: bw,
            y,
            _intermediates: kept,
            out,
            config,
        })
    }

    /// The run, named by the config it was prepared with.
    pub(crate) fn with_config(mut self, config: &dyn std::fmt::Display) -> Self {
        self.config = config.to_string();
        self
    }

    /// The config it runs (forced, tuned or the device's default), as `--config` takes it.
    pub fn config(&self) -> &str {
        &self.config
    }

    /// One launch, waited for: its device time in ms where the queue has timestamps.
    pub fn launch(&self) -> Result<Option<f64>> {
        self.launch_repeated(1)
    }

    /// `reps` launches back to back in one submission, waited for: the device time a
    /// launch in ms where the queue has timestamps (what a timing sample takes).
    pub fn launch_repeated(&self, reps: usize) -> Result<Option<f64>> {
        device::launch_chain(&self.dispatches(), reps)
    }

    /// Each stage's kernel, push constants and workgroups, as a launch takes them.
    fn dispatches(&self) -> Vec<(&device::ComputeKernel<'d>, &[u8], [u32; 2])> {
        self.stages
            .iter()
            .map(|s| (&s.kernel, s.push.as_slice(), s.grid))
            .collect()
    }

    /// A chain's time in each stage (its shader's name and ms; from the end of the stage
    /// before, the barrier's wait included), the median over `samples` runs of `reps`
    /// launches each (the last launch of a run split by stage); empty for one stage or
    /// where the queue has no timestamps.
    pub fn stage_times(&self, samples: usize, reps: usize) -> Result<Vec<(String, f64)>> {
        if self.stages.len() < 2 {
            return Ok(Vec::new());
        }
        let stages = self.dispatches();
        let mut runs = Vec::new();
        for _ in 0..samples.max(1) {
            match device::launch_chain_timed(&stages, reps, true)? {
                Some((_, per_stage)) => runs.push(per_stage),
                None => return Ok(Vec::new()),
            }
        }
        Ok(self
            .stages
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let mut v: Vec<f64> = runs.iter().map(|r| r[i]).collect();
                v.sort_by(f64::total_cmp);
                (s.name.clone(), v[v.len() / 2])
            })
            .collect())
    }

    /// The driver's statistics of the compiled shader (`name value`, e.g. NVIDIA's
    /// register count): what the resource report of a CUDA kernel says, where the device
    /// reports it (`VK_KHR_pipeline_executable_properties`); empty elsewhere. A chain's
    /// each prefixed by its stage's shader (`name: ...`).
    pub fn statistics(&self) -> Result<Vec<String>> {
        if let [one] = self.stages.as_slice() {
            return one.kernel.statistics();
        }
        let mut out = Vec::new();
        for s in &self.stages {
            out.extend(
                s.kernel
                    .statistics()?
                    .into_iter()
                    .map(|v| format!("{}: {v}", s.name)),
            );
        }
        Ok(out)
    }

    /// The output of the last launch.
    pub fn output(&self) -> Result<HostTensor> {
        let mut y = self.out.clone();
        self.dev.download(&self.y, y.as_bytes_mut())?;
        Ok(y)
    }
}

/// The push-constant fields the dense shaders share, in their order: n, cin, cout, cpi,
/// cpo, the input's and output's D H W, the depth stride and dilation, the padding before
/// (D H W), channels_last; each checked to fit the shaders' 32-bit ints.
pub(crate) fn dense_push_fields(
    shader: &str,
    spec: &crate::dense::DenseConvSpec,
) -> Result<Vec<i32>> {
    let g = spec.geometry();
    let mut v = vec![
        spec.n(),
        spec.in_channels(),
        spec.out_channels(),
        spec.in_per_group(),
        spec.out_per_group(),
    ];
    v.extend(g.input3());
    v.extend(g.output3());
    v.extend([g.stride3()[0], g.dilation3()[0]]);
    v.extend(g.pad_before3());
    v.push(usize::from(
        spec.layout() == crate::spec::Layout::ChannelsLast,
    ));
    v.into_iter().map(|x| i32_of(shader, "a size", x)).collect()
}

/// `config`, else the device's default (`default`), checked with `fits`; a config that
/// does not fit is `NotApplicable` naming `variant`, the spec and the reason.
pub(crate) fn resolve_config<C: std::fmt::Display>(
    variant: &str,
    spec: &dyn std::fmt::Display,
    config: Option<C>,
    default: impl FnOnce() -> Result<C>,
    fits: impl FnOnce(&C) -> std::result::Result<(), String>,
) -> Result<C> {
    let config = match config {
        Some(c) => c,
        None => default()?,
    };
    fits(&config).map_err(|reason| Error::NotApplicable {
        variant: variant.to_string(),
        spec: spec.to_string(),
        reason: format!("{config}: {reason}"),
    })?;
    Ok(config)
}

/// One launch of a prepared run (a shader's `prepare_*`): its output and device time, the
/// one-shot form.
pub fn run_once(run: VulkanRun<'_>) -> Result<(HostTensor, Option<f64>)> {
    let ms = run.launch()?;
    Ok((run.output()?, ms))
}

/// A shader config's text form, `name:field=value,...` (every field, in order): what
/// `--config` takes, reports print and the tune cache keeps.
pub(crate) fn write_config(
    f: &mut std::fmt::Formatter<'_>,
    name: &str,
    fields: &[&str],
    values: &[u32],
) -> std::fmt::Result {
    write!(f, "{name}:")?;
    for (i, (k, v)) in fields.iter().zip(values).enumerate() {
        write!(f, "{}{k}={v}", if i == 0 { "" } else { "," })?;
    }
    Ok(())
}

/// The values of `name:field=value,...` in `fields`' order, each field given once, else
/// an error naming `what` and what was `expected`. The caller checks the values against
/// its family.
pub(crate) fn parse_config<const N: usize>(
    text: &str,
    what: &'static str,
    name: &str,
    fields: &[&str; N],
    expected: &dyn Fn() -> String,
) -> Result<[u32; N]> {
    let bad = || Error::parse(what, text, expected());
    let body = text
        .trim()
        .strip_prefix(name)
        .and_then(|b| b.strip_prefix(':'))
        .ok_or_else(bad)?;
    let mut v = [None::<u32>; N];
    for part in body.split(',') {
        let (k, val) = part.split_once('=').ok_or_else(bad)?;
        let i = fields.iter().position(|f| *f == k.trim()).ok_or_else(bad)?;
        if v[i].is_some() {
            return Err(bad());
        }
        v[i] = Some(val.trim().parse().map_err(|_| bad())?);
    }
    let mut out = [0u32; N];
    for (o, x) in out.iter_mut().zip(v) {
        *o = x.ok_or_else(bad)?;
    }
    Ok(out)
}

/// How far config `values` lie from `want`, in log2 steps summed over the fields (0 read
/// as 1): the measure of the dense shaders' defaults, "the fitting config nearest to".
pub(crate) fn log2_distance(values: &[u32], want: &[u32]) -> i32 {
    let log2 = |v: u32| v.max(1).ilog2() as i32;
    values
        .iter()
        .zip(want)
        .map(|(&a, &b)| (log2(a) - log2(b)).abs())
        .sum()
}

/// Every combination of `choices` (one value of each, the last varying fastest): a
/// config family as values in field order.
pub(crate) fn combinations<const N: usize>(choices: [&[u32]; N]) -> Vec<[u32; N]> {
    let mut out = vec![[0u32; N]];
    for (i, values) in choices.iter().enumerate() {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                values.iter().map(move |&v| {
                    let mut c = prefix;
                    c[i] = v;
                    c
                })
            })
            .collect();
    }
    out
}

/// Specialization constants by id: `values[i]` is `constant_id = i` (the shaders' sizes,
/// each far below 32 bits).
pub(crate) fn spec_constants(values: &[usize]) -> Vec<(u32, u32)> {
    values
        .iter()
        .enumerate()
        .map(|(i, &v)| (i as u32, v as u32))
        .collect()
}

/// Little-endian bytes of 4-byte push-constant fields, in order.
pub(crate) fn push_bytes(fields: &[i32]) -> Vec<u8> {
    fields.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A workgroup count as a grid within the device's limits along x (y takes the rest).
pub(crate) fn grid_for(info: &VulkanDeviceInfo, groups: usize) -> Result<[u32; 2]> {
    let g = u32::try_from(groups).map_err(|_| Error::BackendUnavailable {
        backend: "vulkan".into(),
        reason: format!("{groups} workgroups exceed 32 bits"),
    })?;
    let gx = g.clamp(1, info.max_workgroup_count[0].max(1));
    Ok([gx, g.div_ceil(gx).max(1)])
}

/// Whether each depth slice of `spec` is its own output plane (one kernel depth, input
/// depth 1: 1-D and 2-D layers) under a kernel of more than 9 taps. An invocation of the
/// rotation shaders then meets each weight once a run, so weights held in registers buy
/// nothing there; both shaders' defaults set such layers apart (H100 runs 277-282).
pub(crate) fn one_slice_planes_of_many_taps(spec: &crate::spec::ConvSpec) -> bool {
    spec.kernel3()[0] == 1 && spec.input3()[0] == 1 && spec.taps() > 9
}

/// `v` as a shader's 32-bit index, or an error naming the shader and the size.
pub(crate) fn i32_of(shader: &str, what: &str, v: usize) -> crate::error::Result<i32> {
    i32::try_from(v).map_err(|_| Error::BackendUnavailable {
        backend: "vulkan".into(),
        reason: format!("{what} {v} exceeds the {shader} shader's 32-bit indices"),
    })
}

/// A failed Vulkan call as an error naming the call and the VkResult.
pub(crate) fn vk_err(call: &'static str) -> impl Fn(ash::vk::Result) -> Error {
    move |r| Error::Vulkan {
        call,
        result: format!("{r:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combinations_vary_the_last_field_fastest() {
        assert_eq!(
            combinations([&[1, 2], &[7], &[3, 4]]),
            vec![[1, 7, 3], [1, 7, 4], [2, 7, 3], [2, 7, 4]]
        );
        assert!(combinations([&[1, 2], &[]]).is_empty());
    }

    struct Shown([u32; 2]);
    impl std::fmt::Display for Shown {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write_config(f, "shader", &["a", "b"], &self.0)
        }
    }

    #[test]
    fn config_text_round_trips_and_refuses_malformed_forms() {
        let text = Shown([3, 40]).to_string();
        assert_eq!(text, "shader:a=3,b=40");
        let parse = |t: &str| {
            parse_config(t, "a test config", "shader", &["a", "b"], &|| {
                "a=N,b=N".into()
            })
        };
        assert_eq!(parse(&text).unwrap(), [3, 40]);
        assert_eq!(parse(" shader: b = 40 ,a=3 ").unwrap(), [3, 40]);
        for bad in [
            "shader:a=3",
            "shader:a=3,b=4,a=5",
            "shader:a=3,c=4",
            "shader:a=x,b=4",
            "shaderx:a=3,b=4",
            "other:a=3,b=4",
            "shader a=3,b=4",
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(e.contains("a=N,b=N"), "{bad}: {e}");
        }
    }
}
