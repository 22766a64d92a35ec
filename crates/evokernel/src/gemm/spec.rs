//! The scaled fp8 GEMM as a problem: `D[M, N] = scale_a * scale_b * (A[M, K] @ B[K, N])
//! (+ bias[N])`, A and B float8 e4m3, f32 accumulation, D in bf16, f16 or f32.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::spec::DType;

/// Block size of block-wise scaling along K (and along N for B): 1x128 scales on A,
/// 128x128 on B, the form fp8 LLM training uses.
pub const SCALE_BLOCK: usize = 128;

/// How A and B are scaled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scaling {
    /// One scale for A, one for B.
    PerTensor,
    /// One scale per row of A ([M]) and per column of B ([N]).
    RowWise,
    /// One scale per 1x128 block of A ([K/128, M], M fastest) and per 128x128 block of B
    /// ([K/128, N/128]), rounded up at the edges.
    BlockWise,
}

impl Scaling {
    pub fn name(self) -> &'static str {
        match self {
            Scaling::PerTensor => "per-tensor",
            Scaling::RowWise => "rowwise",
            Scaling::BlockWise => "blockwise",
        }
    }
}

impl FromStr for Scaling {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "per-tensor" | "tensor" | "pertensor" => Ok(Scaling::PerTensor),
            "rowwise" | "row-wise" | "row" => Ok(Scaling::RowWise),
            "blockwise" | "block-wise" | "block" => Ok(Scaling::BlockWise),
            _ => Err(Error::parse(
                "scaling",
                s,
                "expected per-tensor, rowwise or blockwise",
            )),
        }
    }
}

/// A validated scaled-GEMM problem.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ScaledMmSpec {
    m: usize,
    n: usize,
    k: usize,
    scaling: Scaling,
    out: DType,
    bias: bool,
}

impl ScaledMmSpec {
    /// `Err` names the size that is wrong: every size from 1 to 2^31 - 1, and K a
    /// multiple of 16 (one fp8 MMA step; the 16-byte rows TMA loads).
    pub fn new(m: i64, n: i64, k: i64, scaling: Scaling, out: DType, bias: bool) -> Result<Self> {
        let size = |what: &str, v: i64| -> Result<usize> {
            if v < 1 || v > i32::MAX as i64 {
                return Err(Error::InvalidSpec {
                    field: what.into(),
                    value: v.to_string(),
                    expected: "a size from 1 to 2147483647".into(),
                });
            }
            Ok(v as usize)
        };
        let (m, n, k) = (size("m", m)?, size("n", n)?, size("k", k)?);
        if k % 16 != 0 {
            return Err(Error::InvalidSpec {
                field: "k".into(),
                value: k.to_string(),
                expected: "a multiple of 16 (pad K with zeros)".into(),
            });
        }
        Ok(ScaledMmSpec {
            m,
            n,
            k,
            scaling,
            out,
            bias,
        })
    }

    pub fn m(&self) -> usize {
        self.m
    }
    pub fn n(&self) -> usize {
        self.n
    }
    pub fn k(&self) -> usize {
        self.k
    }
    pub fn scaling(&self) -> Scaling {
        self.scaling
    }
    pub fn out_dtype(&self) -> DType {
        self.out
    }
    pub fn has_bias(&self) -> bool {
        self.bias
    }

    /// Shapes of A's and B's scale tensors (row-major). Block-wise: A's 1 x 128 blocks as
    /// [K/128, M], M fastest (cuBLASLt's and `torch._scaled_mm`'s layout, and the one a
    /// warp's rows read in one coalesced load), B's 128 x 128 blocks as [K/128, N/128].
    pub fn scale_shapes(&self) -> (Vec<usize>, Vec<usize>) {
        let kb = self.k.div_ceil(SCALE_BLOCK);
        match self.scaling {
            Scaling::PerTensor => (vec![1], vec![1]),
            Scaling::RowWise => (vec![self.m], vec![self.n]),
            Scaling::BlockWise => (vec![kb, self.m], vec![kb, self.n.div_ceil(SCALE_BLOCK)]),
        }
    }

    /// The scale of A at (row i, k) and of B at (k, column j): indices into the scale
    /// tensors of `scale_shapes`.
    pub fn scale_index_a(&self, i: usize, k: usize) -> usize {
        match self.scaling {
            Scaling::PerTensor => 0,
            Scaling::RowWise => i,
            Scaling::BlockWise => (k / SCALE_BLOCK) * self.m + i,
        }
    }
    pub fn scale_index_b(&self, k: usize, j: usize) -> usize {
        match self.scaling {
            Scaling::PerTensor => 0,
            Scaling::RowWise => j,
            Scaling::BlockWise => {
                (k / SCALE_BLOCK) * self.n.div_ceil(SCALE_BLOCK) + j / SCALE_BLOCK
            }
        }
    }

    /// 2 FLOPs per multiply-add.
    pub fn flops(&self) -> u64 {
        2 * (self.m * self.n * self.k) as u64
    }

    /// A and B read once (1 byte each), D written once, the scales and bias read.
    pub fn min_bytes(&self) -> u64 {
        let (sa, sb) = self.scale_shapes();
        let scales: usize = sa.iter().product::<usize>() + sb.iter().product::<usize>();
        (self.m * self.k
            + self.k * self.n
            + self.m * self.n * self.out.size_bytes()
            + 4 * scales
            + if self.bias {
                self.n * self.out.size_bytes()
            } else {
                0
            }) as u64
    }

    /// A stable identifier for caches and reports.
    pub fn key(&self) -> String {
        format!(
            "smm-m{}-n{}-k{}-{}-{}{}",
            self.m,
            self.n,
            self.k,
            self.scaling.name(),
            self.out,
            if self.bias { "+bias" } else { "" }
        )
    }
}

impl fmt::Display for ScaledMmSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "scaled-mm {}x{}x{} e4m3 {} -> {}{}",
            self.m,
            self.n,
            self.k,
            self.scaling.name(),
            self.out,
            if self.bias { " +bias" } else { "" }
        )
    }
}

/// The embedded GEMM suite (`suite/gemm.json`): squares and LLM projection shapes.
pub const GEMM_SUITE: &str = include_str!("../../../../suite/gemm.json");

/// The GEMM suite's cases with one scaling mode and output dtype, as (name, spec).
pub fn gemm_suite(scaling: Scaling, out: DType) -> Result<Vec<(String, ScaledMmSpec)>> {
    parse_gemm_suite(
        GEMM_SUITE,
        Path::new("suite/gemm.json"),
        scaling,
        out,
        false,
    )
}

/// A GEMM suite file (the format of suite/gemm.json; `gemm` names the embedded one),
/// every case with one scaling mode, output dtype and bias choice.
pub fn load_gemm_suite(
    path: &Path,
    scaling: Scaling,
    out: DType,
    bias: bool,
) -> Result<Vec<(String, ScaledMmSpec)>> {
    if path == Path::new("gemm") && !path.exists() {
        return parse_gemm_suite(GEMM_SUITE, Path::new("suite/gemm.json"), scaling, out, bias);
    }
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        action: "cannot read GEMM suite",
        path: path.to_path_buf(),
        source,
    })?;
    parse_gemm_suite(&text, path, scaling, out, bias)
}

fn parse_gemm_suite(
    text: &str,
    path: &Path,
    scaling: Scaling,
    out: DType,
    bias: bool,
) -> Result<Vec<(String, ScaledMmSpec)>> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Case {
        name: String,
        m: i64,
        n: i64,
        k: i64,
    }
    #[derive(Deserialize)]
    struct Suite {
        cases: Vec<Case>,
    }
    let suite: Suite = serde_json::from_str(text).map_err(|e| Error::Suite {
        path: path.to_path_buf(),
        message: format!("{e} (expected {{\"cases\": [{{\"name\", \"m\", \"n\", \"k\"}}]}})"),
    })?;
    suite
        .cases
        .into_iter()
        .map(|c| {
            Ok((
                c.name,
                ScaledMmSpec::new(c.m, c.n, c.k, scaling, out, bias)?,
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gemm_suite_has_the_issues_shapes() {
        let cases = gemm_suite(Scaling::RowWise, DType::Bf16).unwrap();
        assert_eq!(cases.len(), 3 + 4 * 5);
        assert!(cases
            .iter()
            .any(|(_, s)| (s.m(), s.n(), s.k()) == (16, 28672, 8192)));
        assert!(cases.iter().all(|(_, s)| s.k() % SCALE_BLOCK == 0));
    }

    #[test]
    fn sizes_are_validated_with_the_field_named() {
        let e = ScaledMmSpec::new(0, 8, 16, Scaling::RowWise, DType::Bf16, false).unwrap_err();
        assert!(e.to_string().contains('m'), "{e}");
        let e = ScaledMmSpec::new(8, 8, 20, Scaling::RowWise, DType::Bf16, false).unwrap_err();
        assert!(e.to_string().contains("multiple of 16"), "{e}");
        assert!(e.is_user_input());
        let s = ScaledMmSpec::new(16, 4096, 4096, Scaling::BlockWise, DType::Bf16, true).unwrap();
        assert_eq!(s.scale_shapes(), (vec![32, 16], vec![32, 32]));
        assert_eq!(s.scale_index_a(5, 300), 2 * 16 + 5);
        assert_eq!(s.key(), "smm-m16-n4096-k4096-blockwise-bf16+bias");
        assert_eq!(s.flops(), 2 * 16 * 4096 * 4096);
        assert_eq!(s.scale_index_b(300, 129), 2 * 32 + 1);
        for name in ["per-tensor", "rowwise", "blockwise"] {
            assert_eq!(name.parse::<Scaling>().unwrap().name(), name);
        }
    }
}
