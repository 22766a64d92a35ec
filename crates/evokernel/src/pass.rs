//! Which pass of the convolution a problem computes: the forward, grad-input (dgrad)
//! or grad-weight (wgrad, with grad-bias when the problem's epilogue has a bias).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::epilogue::Epilogue;
use crate::error::{Error, Result};

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
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

    /// What of `epilogue` this pass takes: the forward all of it, grad-input nothing,
    /// grad-weight the bias (whose gradient it computes alongside). The one rule both
    /// `ConvProblem::check` and the measuring commands (which narrow `--bias` etc.) use.
    pub fn epilogue(self, epilogue: Epilogue) -> Epilogue {
        match self {
            Pass::Forward => epilogue,
            Pass::Dgrad => Epilogue::NONE,
            Pass::Wgrad => Epilogue {
                bias: epilogue.bias,
                ..Epilogue::NONE
            },
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
