//! The fused epilogue of a convolution: per-channel bias, an activation, and a residual
//! tensor of the output's shape added after the activation, all in f32 (f64 in the
//! oracle) before the one rounding to the output dtype:
//! `y = act(conv(x, w) + bias[c]) + residual`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::spec::{ConvSpec, DType, Layout};
use crate::tensor::HostTensor;

/// The activation applied after the bias.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Activation {
    #[default]
    None,
    Relu,
    /// `x * sigmoid(x)`, written `x / (1 + exp(-x))` everywhere.
    Silu,
    /// GELU with the tanh approximation (PyTorch's `approximate="tanh"`).
    GeluTanh,
}

impl Activation {
    pub const ALL: [Activation; 4] = [
        Activation::None,
        Activation::Relu,
        Activation::Silu,
        Activation::GeluTanh,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Activation::None => "none",
            Activation::Relu => "relu",
            Activation::Silu => "silu",
            Activation::GeluTanh => "gelu-tanh",
        }
    }

    /// The code the kernels' `EPI` template argument carries in its two low bits
    /// (kernels/common.cuh, `activate`).
    fn code(self) -> u32 {
        match self {
            Activation::None => 0,
            Activation::Relu => 1,
            Activation::Silu => 2,
            Activation::GeluTanh => 3,
        }
    }

    /// The oracle's activation. NaN stays NaN through every one of them (ReLU too, as
    /// in PyTorch), so a non-finite convolution output is never hidden.
    pub fn apply_f64(self, v: f64) -> f64 {
        match self {
            Activation::None => v,
            Activation::Relu => {
                if v < 0.0 {
                    0.0
                } else {
                    v
                }
            }
            Activation::Silu => v / (1.0 + (-v).exp()),
            Activation::GeluTanh => {
                const K: f64 = 0.797_884_560_802_865_4; // sqrt(2 / pi)
                0.5 * v * (1.0 + (K * (v + 0.044715 * v * v * v)).tanh())
            }
        }
    }

    /// The CPU backend's activation: the same formulas in f32.
    #[inline(always)]
    pub fn apply_f32(self, v: f32) -> f32 {
        match self {
            Activation::None => v,
            Activation::Relu => {
                if v < 0.0 {
                    0.0
                } else {
                    v
                }
            }
            Activation::Silu => v / (1.0 + (-v).exp()),
            Activation::GeluTanh => {
                const K: f32 = 0.797_884_6;
                0.5 * v * (1.0 + (K * (v + 0.044715 * v * v * v)).tanh())
            }
        }
    }
}

impl fmt::Display for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Activation {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" | "identity" | "" => Ok(Activation::None),
            "relu" => Ok(Activation::Relu),
            "silu" | "swish" => Ok(Activation::Silu),
            "gelu-tanh" | "gelu_tanh" | "gelu" => Ok(Activation::GeluTanh),
            _ => Err(Error::parse(
                "activation",
                s,
                "expected none, relu, silu or gelu-tanh",
            )),
        }
    }
}

/// What a convolution does to each output before it is rounded and stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Epilogue {
    /// Add a per-channel bias (a `[C]` tensor of the spec's dtype).
    pub bias: bool,
    pub activation: Activation,
    /// Add a tensor of the output's shape, layout and dtype after the activation.
    pub residual: bool,
}

impl Epilogue {
    /// The plain convolution.
    pub const NONE: Epilogue = Epilogue {
        bias: false,
        activation: Activation::None,
        residual: false,
    };

    pub fn is_none(&self) -> bool {
        *self == Epilogue::NONE
    }

    /// The kernels' `EPI` template argument: activation in bits 0-1, bias bit 2,
    /// residual bit 3 (kernels/common.cuh, `epilogue`).
    pub fn kernel_code(&self) -> u32 {
        self.activation.code() | (u32::from(self.bias) << 2) | (u32::from(self.residual) << 3)
    }

    /// A suffix for keys and names: empty for the plain convolution, else e.g.
    /// `+bias+silu+res`.
    pub fn key_suffix(&self) -> String {
        let mut s = String::new();
        if self.bias {
            s.push_str("+bias");
        }
        if self.activation != Activation::None {
            s.push('+');
            s.push_str(self.activation.name());
        }
        if self.residual {
            s.push_str("+res");
        }
        s
    }

    /// The oracle's epilogue of one output in channel `c` at flat index `i`.
    pub fn apply_f64(
        &self,
        v: f64,
        bias: Option<&[f64]>,
        residual: Option<&[f64]>,
        c: usize,
        i: usize,
    ) -> f64 {
        let v = match bias {
            Some(b) if self.bias => v + b[c],
            _ => v,
        };
        let v = self.activation.apply_f64(v);
        match residual {
            Some(r) if self.residual => v + r[i],
            _ => v,
        }
    }
}

impl fmt::Display for Epilogue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_none() {
            f.write_str("none")
        } else {
            f.write_str(self.key_suffix().trim_start_matches('+'))
        }
    }
}

/// The operand `what` checked against the epilogue: present exactly when `wanted`, of
/// `dtype` and `len` elements. Returns it when wanted.
pub(crate) fn check_operand<'a>(
    what: &'static str,
    wanted: bool,
    operand: Option<&'a HostTensor>,
    dtype: DType,
    len: usize,
) -> Result<Option<&'a HostTensor>> {
    match (wanted, operand) {
        (true, Some(t)) => {
            t.expect(what, dtype, len)?;
            Ok(Some(t))
        }
        (true, None) => Err(Error::TensorMismatch {
            what,
            expected: format!("a {dtype} tensor of {len} elements (the epilogue adds a {what})"),
            got: "none".into(),
        }),
        (false, Some(_)) => Err(Error::TensorMismatch {
            what,
            expected: format!("none (the epilogue has no {what}; plan one with it)"),
            got: "a tensor".into(),
        }),
        (false, None) => Ok(None),
    }
}

/// The oracle's epilogue over a whole f64 output of `spec`, in place.
pub fn epilogue_reference(
    spec: &ConvSpec,
    epilogue: &Epilogue,
    y: &mut [f64],
    bias: Option<&HostTensor>,
    residual: Option<&HostTensor>,
) -> Result<()> {
    let bias = check_operand("bias", epilogue.bias, bias, spec.dtype(), spec.c())?
        .map(HostTensor::to_f64_vec);
    let residual = check_operand(
        "residual",
        epilogue.residual,
        residual,
        spec.dtype(),
        spec.output_len(),
    )?
    .map(HostTensor::to_f64_vec);
    if epilogue.is_none() {
        return Ok(());
    }
    let [od, oh, ow] = spec.output3();
    let plane = od * oh * ow;
    let c_count = spec.c();
    let channel = |i: usize| match spec.layout() {
        Layout::ChannelsFirst => (i / plane) % c_count,
        Layout::ChannelsLast => i % c_count,
    };
    y.par_iter_mut().enumerate().for_each(|(i, v)| {
        *v = epilogue.apply_f64(*v, bias.as_deref(), residual.as_deref(), channel(i), i);
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_suffixes() {
        assert_eq!(Epilogue::NONE.kernel_code(), 0);
        assert_eq!(Epilogue::NONE.key_suffix(), "");
        let e = Epilogue {
            bias: true,
            activation: Activation::Silu,
            residual: true,
        };
        assert_eq!(e.kernel_code(), 2 | 4 | 8);
        assert_eq!(e.key_suffix(), "+bias+silu+res");
        assert_eq!(e.to_string(), "bias+silu+res");
        for a in Activation::ALL {
            assert_eq!(a.name().parse::<Activation>().unwrap(), a);
        }
        assert!("tanh".parse::<Activation>().is_err());
    }

    #[test]
    fn activations_agree_and_keep_nan() {
        for a in Activation::ALL {
            assert!(a.apply_f64(f64::NAN).is_nan(), "{a}");
            assert!(a.apply_f32(f32::NAN).is_nan(), "{a}");
            for v in [-6.0, -1.5, -0.1, 0.0, 0.3, 2.0, 7.5] {
                let (x, y) = (a.apply_f64(v), a.apply_f32(v as f32) as f64);
                assert!(
                    (x - y).abs() <= 1e-6 * (1.0 + x.abs()),
                    "{a}({v}): {x} vs {y}"
                );
            }
        }
        assert_eq!(Activation::Relu.apply_f64(-2.0), 0.0);
        assert!((Activation::Silu.apply_f64(1.0) - 0.731_058_578_6).abs() < 1e-9);
        // PyTorch: F.gelu(torch.tensor(1.0, dtype=torch.float64), approximate="tanh")
        assert!((Activation::GeluTanh.apply_f64(1.0) - 0.841_191_990_607_477_6).abs() < 1e-12);
    }
}
