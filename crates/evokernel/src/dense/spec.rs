//! [`DenseConvSpec`]: a convolution with `groups` groups of `in / groups` input and
//! `out / groups` output channels each, on the geometry (batch, sizes, kernel, stride,
//! dilation, asymmetric padding, layout, dtype) a depthwise [`ConvSpec`] validates.
//! Weights are PyTorch's `[out, in / groups, kd, kh, kw]` in every layout.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::spec::{activation_index, ConvParams, ConvSpec, DType, Layout};

/// A dense (groups 1) or grouped convolution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DenseConvSpec {
    /// Batch, input channels (as `c`), sizes, kernel, stride, dilation, padding, layout, dtype.
    geometry: ConvSpec,
    out_channels: usize,
    groups: usize,
}

impl DenseConvSpec {
    /// `geometry`'s channels are the input channels; `groups` must divide both counts.
    pub fn new(geometry: ConvSpec, out_channels: i64, groups: i64) -> Result<Self> {
        if out_channels < 1 {
            return Err(Error::invalid(
                "output channels",
                out_channels,
                "at least 1",
            ));
        }
        if groups < 1 {
            return Err(Error::invalid("groups", groups, "at least 1"));
        }
        let (co, g) = (out_channels as usize, groups as usize);
        if !geometry.c().is_multiple_of(g) || !co.is_multiple_of(g) {
            return Err(Error::invalid(
                "groups",
                groups,
                format!(
                    "a divisor of both the input channels ({}) and the output channels ({co})",
                    geometry.c()
                ),
            ));
        }
        // The weight's length must be an index too (the Vulkan shaders use 32 bits, the
        // host usize; 2^40 elements is far past any memory).
        let weight = (co as u128) * (geometry.c() / g) as u128 * geometry.taps() as u128;
        let output = geometry.output_len() as u128 / geometry.c() as u128 * co as u128;
        if weight > 1 << 40 || output > 1 << 40 {
            return Err(Error::invalid(
                "output channels",
                out_channels,
                "a weight and an output of fewer than 2^40 elements",
            ));
        }
        Ok(DenseConvSpec {
            geometry,
            out_channels: co,
            groups: g,
        })
    }

    /// From the depthwise flags' parameters (`p.c` the input channels).
    pub fn from_params(p: &ConvParams, out_channels: i64, groups: i64) -> Result<Self> {
        Self::new(p.validate()?, out_channels, groups)
    }

    pub fn geometry(&self) -> &ConvSpec {
        &self.geometry
    }
    pub fn n(&self) -> usize {
        self.geometry.n()
    }
    pub fn in_channels(&self) -> usize {
        self.geometry.c()
    }
    pub fn out_channels(&self) -> usize {
        self.out_channels
    }
    pub fn groups(&self) -> usize {
        self.groups
    }
    pub fn in_per_group(&self) -> usize {
        self.in_channels() / self.groups
    }
    pub fn out_per_group(&self) -> usize {
        self.out_channels / self.groups
    }
    pub fn layout(&self) -> Layout {
        self.geometry.layout()
    }
    pub fn dtype(&self) -> DType {
        self.geometry.dtype()
    }
    pub fn spatial_dims(&self) -> usize {
        self.geometry.spatial_dims()
    }
    /// Whether this is the depthwise convolution (one input and one output channel a group).
    pub fn is_depthwise(&self) -> bool {
        self.groups == self.in_channels() && self.groups == self.out_channels
    }

    pub fn with_dtype(&self, dtype: DType) -> Self {
        DenseConvSpec {
            geometry: self.geometry.with_dtype(dtype),
            ..self.clone()
        }
    }
    pub fn with_layout(&self, layout: Layout) -> Self {
        DenseConvSpec {
            geometry: self.geometry.with_layout(layout),
            ..self.clone()
        }
    }

    pub fn input_len(&self) -> usize {
        self.geometry.input_len()
    }
    pub fn output_len(&self) -> usize {
        self.n() * self.out_channels * self.geometry.output3().iter().product::<usize>()
    }
    pub fn weight_len(&self) -> usize {
        self.out_channels * self.in_per_group() * self.geometry.taps()
    }

    pub fn input_shape(&self) -> Vec<usize> {
        self.geometry.input_shape()
    }
    pub fn output_shape(&self) -> Vec<usize> {
        let mut v = vec![self.n()];
        let sp = self.geometry.output_dims();
        match self.layout() {
            Layout::ChannelsFirst => {
                v.push(self.out_channels);
                v.extend_from_slice(sp);
            }
            Layout::ChannelsLast => {
                v.extend_from_slice(sp);
                v.push(self.out_channels);
            }
        }
        v
    }
    /// PyTorch's `[out, in / groups, kd, kh, kw]` (spatial dims as the spec has them).
    pub fn weight_shape(&self) -> Vec<usize> {
        let mut v = vec![self.out_channels, self.in_per_group()];
        v.extend_from_slice(self.geometry.kernel_dims());
        v
    }

    /// Flat index of input element (n, c, d, h, w) in the spec's layout.
    #[inline]
    pub fn input_index(&self, n: usize, c: usize, d: usize, h: usize, w: usize) -> usize {
        self.geometry.input_index(n, c, d, h, w)
    }
    /// Flat index of output element (n, co, d, h, w) in the spec's layout.
    #[inline]
    pub fn output_index(&self, n: usize, co: usize, d: usize, h: usize, w: usize) -> usize {
        activation_index(
            self.layout(),
            self.out_channels,
            self.geometry.output3(),
            n,
            co,
            d,
            h,
            w,
        )
    }
    /// Flat index of weight (co, ci within co's group, kd, kh, kw).
    #[inline]
    pub fn weight_index(&self, co: usize, ci: usize, kd: usize, kh: usize, kw: usize) -> usize {
        let [_, k1, k2] = self.geometry.kernel3();
        (((co * self.in_per_group() + ci) * self.geometry.kernel3()[0] + kd) * k1 + kh) * k2 + kw
    }

    /// The same kernel, strides, dilations, paddings, layout and grouping on a small
    /// problem in `dtype`: batch 2, at most two groups of at most 8 input and 8 output
    /// channels, each size at most 9 (grown where the dilated kernel needs more). For
    /// checking a kernel against the oracle where the real size would take too long.
    pub fn small_twin(&self, dtype: DType) -> Result<DenseConvSpec> {
        let g = &self.geometry;
        let dims = self.spatial_dims();
        let keep = |a: [usize; 3]| a[3 - dims..].iter().map(|&v| v as i64).collect::<Vec<_>>();
        let (kernel, dilation) = (keep(g.kernel3()), keep(g.dilation3()));
        let (pb, pa) = (keep(g.pad_before3()), keep(g.pad_after3()));
        let input = keep(g.input3())
            .iter()
            .enumerate()
            .map(|(d, &v)| {
                v.min(9)
                    .max(dilation[d] * (kernel[d] - 1) + 1 - pb[d] - pa[d])
            })
            .collect();
        let groups = self.groups.min(2) as i64;
        let (cpi, cpo) = (
            self.in_per_group().min(8) as i64,
            self.out_per_group().min(8) as i64,
        );
        let p = ConvParams {
            n: 2,
            c: groups * cpi,
            input,
            kernel,
            stride: keep(g.stride3()),
            dilation,
            padding: pb.iter().zip(&pa).map(|(&b, &a)| [b, a]).collect(),
            layout: self.layout(),
            dtype,
        };
        DenseConvSpec::from_params(&p, groups * cpo, groups)
    }

    /// 2 FLOPs per multiply-add, padding taps included.
    pub fn flops(&self) -> u64 {
        2 * self.output_len() as u64 * self.in_per_group() as u64 * self.geometry.taps() as u64
    }
    /// Input and weight read once, output written once.
    pub fn min_bytes(&self) -> u64 {
        ((self.input_len() + self.weight_len() + self.output_len()) * self.dtype().size_bytes())
            as u64
    }

    /// A stable identifier for caches and reports: the geometry's key with `dw` replaced
    /// by `conv`, the output channels and the groups.
    pub fn key(&self) -> String {
        let g = self.geometry.key();
        let rest = g.split_once('-').map_or(g.as_str(), |(_, r)| r);
        format!(
            "conv{}d-co{}-g{}-{rest}",
            self.spatial_dims(),
            self.out_channels,
            self.groups
        )
    }
}

impl fmt::Display for DenseConvSpec {
    /// `n32 c64 56x56 k3x3 p1 NHWC f16 -> 64 g1`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} -> {} g{}",
            self.geometry, self.out_channels, self.groups
        )
    }
}

/// A named case of a dense suite.
#[derive(Clone, Debug)]
pub struct DenseCase {
    pub name: String,
    pub spec: DenseConvSpec,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    name: String,
    n: i64,
    c: i64,
    out_channels: i64,
    #[serde(default = "one")]
    groups: i64,
    input: Vec<i64>,
    kernel: Vec<i64>,
    #[serde(default)]
    stride: Vec<i64>,
    #[serde(default)]
    dilation: Vec<i64>,
    #[serde(default)]
    padding: Vec<[i64; 2]>,
    layout: String,
    dtype: String,
}

fn one() -> i64 {
    1
}

#[derive(Deserialize)]
struct RawSuite {
    #[serde(default)]
    #[allow(dead_code)]
    about: String,
    cases: Vec<serde_json::Value>,
}

/// The dense suite (`suite/dense.json`): ResNet-50's 3x3 layers, a VAE decoder's 3x3 at
/// 512 x 512, a 3-D video-VAE convolution and ResNeXt's grouped layers.
pub const DENSE_SUITE: &str = include_str!("../../../../suite/dense.json");

/// The embedded dense suite's cases.
pub fn dense_suite() -> Result<Vec<DenseCase>> {
    parse_dense_suite(DENSE_SUITE, Path::new("<embedded dense suite>"))
}

/// A dense suite file (`dense` names the embedded one). A depthwise suite (`public`,
/// `channels-last`, `models` or a file in their format, without `out_channels`) loads as
/// its depthwise twins: groups = input = output channels.
pub fn load_dense_suite(path: &Path) -> Result<Vec<DenseCase>> {
    if path == Path::new("dense") && !path.exists() {
        return dense_suite();
    }
    let depthwise = |cases: Vec<crate::suite::SuiteCase>| -> Result<Vec<DenseCase>> {
        cases
            .into_iter()
            .map(|c| {
                let ch = c.spec.c() as i64;
                Ok(DenseCase {
                    name: c.name,
                    spec: DenseConvSpec::new(c.spec, ch, ch)?,
                })
            })
            .collect()
    };
    let text = if path.exists() {
        crate::suite::read_suite_text(path)?
    } else {
        return depthwise(crate::suite::load_suite(path)?);
    };
    if text.contains("\"out_channels\"") {
        parse_dense_suite(&text, path)
    } else {
        depthwise(crate::suite::parse_suite(&text, path)?)
    }
}

/// Parses a dense suite: `{"cases": [{"name", "n", "c", "out_channels", "groups", "input",
/// "kernel", "stride", "dilation", "padding", "layout", "dtype"}]}`.
pub fn parse_dense_suite(text: &str, path: &Path) -> Result<Vec<DenseCase>> {
    let err = |message: String| Error::Suite {
        path: PathBuf::from(path),
        message,
    };
    let raw: RawSuite = serde_json::from_str(text).map_err(|e| {
        err(format!(
            "not a dense suite file ({e}); expected {{\"cases\": [...]}}"
        ))
    })?;
    if raw.cases.is_empty() {
        return Err(err("has no cases".into()));
    }
    let mut cases: Vec<DenseCase> = Vec::new();
    for (i, v) in raw.cases.into_iter().enumerate() {
        let c: RawCase =
            serde_json::from_value(v).map_err(|e| err(format!("case #{}: {e}", i + 1)))?;
        let named = |e: Error| err(format!("case '{}': {e}", c.name));
        let params = ConvParams {
            n: c.n,
            c: c.c,
            input: c.input.clone(),
            kernel: c.kernel.clone(),
            stride: c.stride.clone(),
            dilation: c.dilation.clone(),
            padding: c.padding.clone(),
            layout: c.layout.parse().map_err(named)?,
            dtype: c.dtype.parse().map_err(named)?,
        };
        let spec = DenseConvSpec::from_params(&params, c.out_channels, c.groups).map_err(named)?;
        if cases.iter().any(|o| o.name == c.name) {
            return Err(err(format!(
                "has two cases named '{}'; names pick cases (--case) and must be unique",
                c.name
            )));
        }
        cases.push(DenseCase { name: c.name, spec });
    }
    Ok(cases)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(c: i64, input: &[i64], kernel: &[i64], pad: i64, layout: Layout) -> ConvParams {
        ConvParams {
            n: 2,
            c,
            input: input.to_vec(),
            kernel: kernel.to_vec(),
            stride: vec![],
            dilation: vec![],
            padding: vec![[pad, pad]; input.len()],
            layout,
            dtype: DType::F32,
        }
    }

    #[test]
    fn shapes_indices_flops_and_key() {
        let p = params(8, &[5, 7], &[3, 3], 1, Layout::ChannelsLast);
        let s = DenseConvSpec::from_params(&p, 12, 4).unwrap();
        assert_eq!(s.in_per_group(), 2);
        assert_eq!(s.out_per_group(), 3);
        assert_eq!(s.weight_shape(), vec![12, 2, 3, 3]);
        assert_eq!(s.output_shape(), vec![2, 5, 7, 12]);
        assert_eq!(s.output_len(), 2 * 5 * 7 * 12);
        assert_eq!(s.weight_len(), 12 * 2 * 9);
        assert_eq!(s.flops(), 2 * (2 * 5 * 7 * 12) * 2 * 9);
        // NHWC: channels fastest, then w.
        assert_eq!(s.output_index(0, 5, 0, 0, 1), 12 + 5);
        assert_eq!(s.weight_index(1, 1, 0, 2, 1), ((2 + 1) * 3 + 2) * 3 + 1);
        assert_eq!(
            s.key(),
            "conv2d-co12-g4-n2-c8-i5x7-k3x3-s1x1-d1x1-p1:1,1:1-nhwc-f32"
        );
        assert!(s.to_string().ends_with("-> 12 g4"), "{s}");
        assert!(!s.is_depthwise());
        let dw = DenseConvSpec::from_params(&p, 8, 8).unwrap();
        assert!(dw.is_depthwise());
    }

    #[test]
    fn groups_must_divide_both_channel_counts() {
        let p = params(8, &[9], &[3], 1, Layout::ChannelsFirst);
        for (co, g) in [(12, 3), (10, 4), (8, 0), (0, 1), (-4, 1)] {
            let e = DenseConvSpec::from_params(&p, co, g)
                .unwrap_err()
                .to_string();
            assert!(e.contains("groups") || e.contains("output channels"), "{e}");
        }
        assert!(DenseConvSpec::from_params(&p, 6, 2).is_ok());
    }

    #[test]
    fn the_embedded_suite_parses_and_names_bad_cases() {
        let cases = dense_suite().unwrap();
        assert!(cases.len() >= 6);
        assert!(cases.iter().any(|c| c.spec.groups() > 1));
        assert!(cases.iter().any(|c| c.spec.spatial_dims() == 3));
        let p = Path::new("d.json");
        let ok = r#"{"cases": [{"name": "a", "n": 1, "c": 4, "out_channels": 8, "groups": 2,
            "input": [9, 9], "kernel": [3, 3], "padding": [[1, 1], [1, 1]],
            "layout": "channels-last", "dtype": "f32"}]}"#;
        let c = parse_dense_suite(ok, p).unwrap();
        assert_eq!(c[0].spec.out_per_group(), 4);
        let e = parse_dense_suite(&ok.replace("\"groups\": 2", "\"groups\": 3"), p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("case 'a'") && e.contains("groups"), "{e}");
        let e = parse_dense_suite(&ok.replace("out_channels", "outs"), p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("case #1"), "{e}");
        // The depthwise suites load as their depthwise twins.
        let public = load_dense_suite(Path::new("public")).unwrap();
        assert!(!public.is_empty() && public.iter().all(|c| c.spec.is_depthwise()));
    }
}
