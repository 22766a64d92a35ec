//! Reference times measured outside evokernel in the same GPU call: PyTorch's `F.convNd`
//! (its native kernel and its cuDNN path) and its `convolution_backward` per pass, as
//! `scripts/torch_reference.py` writes them, read with `--reference FILE`. The suite
//! summary divides by the fastest of these and the in-process cuDNN rows.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::pass::Pass;

/// The file's form: `{"source": "...", "cases": {case: {pass: {implementation: ms}}}}`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ExternalTimes {
    /// What measured them, e.g. `torch 2.11.0+cu130, cuDNN 91900, NVIDIA H100 80GB HBM3`.
    pub source: String,
    pub cases: BTreeMap<String, BTreeMap<Pass, BTreeMap<String, f64>>>,
}

/// One outside implementation's median time on a case.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReferenceTime {
    /// E.g. `pytorch-native`, `pytorch-cudnn`.
    pub name: String,
    pub median_ms: f64,
    /// `ExternalTimes::source`.
    pub source: String,
}

impl ExternalTimes {
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            action: "cannot read the reference times",
            path: path.to_path_buf(),
            source,
        })?;
        serde_json::from_slice(&bytes).map_err(|e| {
            Error::parse(
                "reference times",
                &path.display().to_string(),
                format!(
                    "expected the JSON scripts/torch_reference.py writes \
                     ({{\"source\", \"cases\": {{case: {{pass: {{impl: ms}}}}}}}}): {e}"
                ),
            )
        })
    }

    /// The times for a case of a report, named `case` or `case <pass>` (how the
    /// measuring commands name backward cases), finite and positive ones only.
    pub fn times(&self, case: &str, pass: Pass) -> Vec<ReferenceTime> {
        let base = case
            .strip_suffix(&format!(" {pass}"))
            .filter(|_| pass != Pass::Forward)
            .unwrap_or(case);
        self.cases
            .get(base)
            .and_then(|passes| passes.get(&pass))
            .map(|impls| {
                impls
                    .iter()
                    .filter(|(_, ms)| ms.is_finite() && **ms > 0.0)
                    .map(|(name, &median_ms)| ReferenceTime {
                        name: name.clone(),
                        median_ms,
                        source: self.source.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_scripts_form_and_matches_backward_case_names() {
        let json = r#"{"source": "torch 2.11", "cases": {"seed-bf16": {
            "forward": {"pytorch-native": 6.96, "pytorch-cudnn": 8.5},
            "dgrad": {"pytorch-cudnn": 19.1, "pytorch-native": null}}}}"#;
        let dir = std::env::temp_dir().join(format!("evk-ext-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ref.json");
        // A failed measurement has no entry (the script leaves it out); a NaN in its
        // place would not be JSON, and the file is refused.
        std::fs::write(&path, json.replace("null", "NaN")).unwrap();
        assert!(ExternalTimes::load(&path).is_err(), "NaN is not JSON");
        std::fs::write(&path, json.replace(", \"pytorch-native\": null", "")).unwrap();
        let t = ExternalTimes::load(&path).unwrap();
        let fwd = t.times("seed-bf16", Pass::Forward);
        assert_eq!(fwd.len(), 2);
        assert_eq!(fwd[0].name, "pytorch-cudnn");
        assert_eq!(t.times("seed-bf16 dgrad", Pass::Dgrad)[0].median_ms, 19.1);
        assert!(t.times("seed-bf16 dgrad", Pass::Wgrad).is_empty());
        assert!(t.times("other", Pass::Forward).is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_bad_file_says_what_form_it_expects() {
        let dir = std::env::temp_dir().join(format!("evk-ext-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ref.json");
        std::fs::write(&path, "[1, 2]").unwrap();
        let e = ExternalTimes::load(&path).unwrap_err().to_string();
        assert!(e.contains("torch_reference.py"), "{e}");
        assert!(ExternalTimes::load(&dir.join("missing.json")).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
