//! The scaled GEMM's kernels as one typed choice: the ladder's rungs (`scaled_mm_mma`,
//! warp-level MMA; `scaled_mm_wgmma`, warpgroup MMA fed by TMA), each with its config.
//! What a bench, a test or `--config` names.

use std::fmt;

use super::mma::MmaConfig;
use super::spec::ScaledMmSpec;
use super::wgmma::WgmmaConfig;
use crate::error::Result;
use crate::Error;

/// One kernel of the GEMM ladder with its config.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmKernel {
    Mma(MmaConfig),
    Wgmma(WgmmaConfig),
}

impl fmt::Display for GemmKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GemmKernel::Mma(c) => c.fmt(f),
            GemmKernel::Wgmma(c) => c.fmt(f),
        }
    }
}

impl std::str::FromStr for GemmKernel {
    type Err = Error;
    /// `scaled_mm_mma:bm=..,bn=..,bk=..,warps_m=..,warps_n=..` or
    /// `scaled_mm_wgmma:bn=..,consumers=..,stages=..,group_m=..,splits=..`.
    fn from_str(s: &str) -> Result<Self> {
        let c: crate::variants::Config = s.parse()?;
        let names: &[&str] = match c.variant.as_str() {
            "scaled_mm_mma" => &MmaConfig::NAMES,
            super::wgmma::NAME => &WgmmaConfig::NAMES,
            other => {
                return Err(Error::parse(
                    "config",
                    s,
                    format!(
                    "the fp8 GEMM's kernels are scaled_mm_mma and scaled_mm_wgmma, not '{other}'"
                ),
                ))
            }
        };
        if let Some(k) = c.values.keys().find(|k| !names.contains(&k.as_str())) {
            return Err(Error::parse(
                "config",
                s,
                format!(
                    "{} has no parameter '{k}'; its parameters are {}",
                    c.variant,
                    names.join(", ")
                ),
            ));
        }
        Ok(match c.variant.as_str() {
            "scaled_mm_mma" => GemmKernel::Mma(MmaConfig::from_config(&c)?),
            _ => GemmKernel::Wgmma(WgmmaConfig::from_config(&c)?),
        })
    }
}

/// A config parameter that must be a positive count.
pub(crate) fn positive_param(c: &crate::variants::Config, k: &str) -> Result<usize> {
    usize::try_from(c.param(k)?)
        .ok()
        .filter(|&v| v > 0)
        .ok_or_else(|| Error::parse("config", &c.to_string(), format!("{k} must be positive")))
}

impl GemmKernel {
    /// The ladder on `spec`: each rung's default config, lowest rung first.
    pub fn ladder(spec: &ScaledMmSpec) -> Vec<GemmKernel> {
        vec![
            GemmKernel::Mma(MmaConfig::default_for(spec)),
            GemmKernel::Wgmma(WgmmaConfig::default_for(spec)),
        ]
    }

    /// `Err(reason)` when this kernel cannot run `spec`.
    pub fn fits(&self, spec: &ScaledMmSpec) -> std::result::Result<(), String> {
        match self {
            GemmKernel::Mma(c) => c.fits(spec),
            GemmKernel::Wgmma(c) => c.fits(spec),
        }
    }

    /// The tiles `PackedB::pack` must use: (tile_n, tile_k).
    pub fn pack_tiles(&self) -> (usize, usize) {
        match self {
            GemmKernel::Mma(c) => c.pack_tiles(),
            GemmKernel::Wgmma(c) => c.pack_tiles(),
        }
    }

    /// The variant's name (`scaled_mm_mma`, `scaled_mm_wgmma`).
    pub fn variant(&self) -> &'static str {
        match self {
            GemmKernel::Mma(_) => "scaled_mm_mma",
            GemmKernel::Wgmma(_) => super::wgmma::NAME,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm::Scaling;
    use crate::DType;

    #[test]
    fn kernels_parse_from_their_display_form_and_bad_ones_say_why() {
        let spec = ScaledMmSpec::new(512, 512, 512, Scaling::RowWise, DType::Bf16, false).unwrap();
        let all = MmaConfig::space()
            .into_iter()
            .map(GemmKernel::Mma)
            .chain(WgmmaConfig::space().into_iter().map(GemmKernel::Wgmma))
            .chain(GemmKernel::ladder(&spec));
        for k in all {
            assert_eq!(k.to_string().parse::<GemmKernel>().unwrap(), k);
            assert!(k.to_string().starts_with(k.variant()));
        }
        for (text, says) in [
            ("naive:block=128", "not 'naive'"),
            (
                "scaled_mm_mma:bm=64,bn=64,bk=32,warps_m=2",
                "missing warps_n",
            ),
            (
                "scaled_mm_wgmma:bn=128,consumers=2,stages=4,group_m=8,splits=1,x=1",
                "no parameter 'x'",
            ),
            (
                "scaled_mm_wgmma:bn=-128,consumers=2,stages=4,group_m=8,splits=1",
                "bn must be positive",
            ),
        ] {
            let e = text.parse::<GemmKernel>().unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
