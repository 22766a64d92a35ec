//! Which pass of the convolution a problem computes: the forward, grad-input (dgrad)
//! or grad-weight (wgrad, with grad-bias when the problem's epilogue has a bias).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::spec::ConvSpec;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pass {
    #[default]
    Forward,
    /// grad-input: grad_output and the weight in, grad_input out.
    Dgrad,
    /// grad-weight: the input and grad_output in, grad_weight (and grad_bias) out.
    Wgrad,
}

impl Pass {
    pub const ALL: [Pass; 3] = [Pass::Forward, Pass::Dgrad, Pass::Wgrad];

    pub fn name(self) -> &'static str {
        match self {
            Pass::Forward => "forward",
            Pass::Dgrad => "dgrad",
            Pass::Wgrad => "wgrad",
        }
    }

    /// The suffix of problem keys (empty for the forward, so forward keys and the tune
    /// entries under them stay what they were).
    pub fn key_suffix(self) -> &'static str {
        match self {
            Pass::Forward => "",
            Pass::Dgrad => "+dgrad",
            Pass::Wgrad => "+wgrad",
        }
    }

    /// Bytes any implementation must move: forward, input + weight read and output
    /// written; dgrad, grad_output + weight read and grad_input written; wgrad, input +
    /// grad_output read and grad_weight written.
    /// Every pass touches each of the three tensors once.
    pub fn min_bytes(self, spec: &ConvSpec) -> u64 {
        spec.min_bytes()
    }

    /// Each pass does the forward's multiply-adds (grad-input sums w * gy over the same
    /// (output, tap) pairs; grad-weight sums x * gy over them), 2 FLOPs each.
    pub fn flops(self, spec: &ConvSpec) -> u64 {
        spec.flops()
    }

    /// The operands the pass reads and the one it writes, by name (for messages).
    pub fn operands(self) -> (&'static [&'static str], &'static str) {
        match self {
            Pass::Forward => (&["input", "weight"], "output"),
            Pass::Dgrad => (&["grad_output", "weight"], "grad_input"),
            Pass::Wgrad => (&["input", "grad_output"], "grad_weight"),
        }
    }
}

impl fmt::Display for Pass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Pass {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "forward" | "fwd" => Ok(Pass::Forward),
            "dgrad" | "grad-input" | "grad_input" => Ok(Pass::Dgrad),
            "wgrad" | "grad-weight" | "grad_weight" => Ok(Pass::Wgrad),
            _ => Err(Error::parse("pass", s, "expected forward, dgrad or wgrad")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in Pass::ALL {
            assert_eq!(p.name().parse::<Pass>().unwrap(), p);
        }
        assert!("backward".parse::<Pass>().is_err());
        assert_eq!(Pass::Forward.key_suffix(), "");
    }
}
