//! The benchmark-suite file format (`shared/suite/public.json`): named cases, each one
//! depthwise convolution.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::spec::{ConvParams, ConvSpec};

/// One named case of a suite, validated.
#[derive(Clone, Debug)]
pub struct SuiteCase {
    pub name: String,
    pub spec: ConvSpec,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    name: String,
    n: i64,
    c: i64,
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

#[derive(Deserialize)]
struct RawSuite {
    #[serde(default)]
    #[allow(dead_code)]
    about: String,
    cases: Vec<serde_json::Value>,
}

/// The public suite (`suite/public.json`), embedded so it is there wherever the binary is.
pub const PUBLIC_SUITE: &str = include_str!("../../../suite/public.json");

/// The embedded public suite's cases.
pub fn public_suite() -> Result<Vec<SuiteCase>> {
    parse_suite(PUBLIC_SUITE, Path::new("<embedded public suite>"))
}

/// Channels-last shapes beyond the seed (`suite/channels-last.json`), embedded too.
pub const CHANNELS_LAST_SUITE: &str = include_str!("../../../suite/channels-last.json");

/// The embedded channels-last suite's cases.
pub fn channels_last_suite() -> Result<Vec<SuiteCase>> {
    parse_suite(
        CHANNELS_LAST_SUITE,
        Path::new("<embedded channels-last suite>"),
    )
}

/// Depthwise convolutions as real models run them (`suite/models.json`, a copy of
/// shared/suite/models.json), embedded: `--suite models`.
pub const MODELS_SUITE: &str = include_str!("../../../suite/models.json");

/// The embedded models suite's cases.
pub fn models_suite() -> Result<Vec<SuiteCase>> {
    parse_suite(MODELS_SUITE, Path::new("<embedded models suite>"))
}

/// The spec of case `name` of an embedded suite (tests).
#[cfg(test)]
fn case_of(cases: Result<Vec<SuiteCase>>, suite: &str, name: &str) -> ConvSpec {
    cases
        .unwrap()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no {suite} case {name}"))
        .spec
}

/// The spec of the public-suite case `name` (tests).
#[cfg(test)]
pub(crate) fn public_case(name: &str) -> ConvSpec {
    case_of(public_suite(), "public", name)
}

/// The spec of the channels-last-suite case `name` (tests).
#[cfg(test)]
pub(crate) fn channels_last_case(name: &str) -> ConvSpec {
    case_of(channels_last_suite(), "channels-last", name)
}

/// The spec of the models-suite case `name` (tests).
#[cfg(test)]
pub(crate) fn models_case(name: &str) -> ConvSpec {
    case_of(models_suite(), "models", name)
}

/// Reads and validates every case of a suite file; the first bad case is an error
/// naming the case and the field. The names `public`, `channels-last` and `models`
/// mean the embedded suites (unless a file of that name exists).
pub fn load_suite(path: &Path) -> Result<Vec<SuiteCase>> {
    if !path.exists() {
        if path == Path::new("public") {
            return public_suite();
        }
        if path == Path::new("channels-last") {
            return channels_last_suite();
        }
        if path == Path::new("models") {
            return models_suite();
        }
    }
    parse_suite(&read_suite_text(path)?, path)
}

/// A suite file's text, bounded: a suite is a few KiB; /dev/zero or a log file must not
/// be read forever.
pub(crate) fn read_suite_text(path: &Path) -> Result<String> {
    let io = |source| Error::Io {
        action: "cannot read suite file",
        path: path.to_path_buf(),
        source,
    };
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .map_err(io)?
        .take(MAX_SUITE_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(io)?;
    if text.len() as u64 > MAX_SUITE_BYTES {
        return Err(Error::Suite {
            path: path.to_path_buf(),
            message: format!(
                "is larger than {MAX_SUITE_BYTES} bytes; a suite file lists cases, a few KiB"
            ),
        });
    }
    Ok(text)
}

/// The largest suite file read (1 MiB).
pub const MAX_SUITE_BYTES: u64 = 1 << 20;

pub fn parse_suite(text: &str, path: &Path) -> Result<Vec<SuiteCase>> {
    let err = |message: String| Error::Suite {
        path: PathBuf::from(path),
        message,
    };
    let raw: RawSuite = serde_json::from_str(text).map_err(|e| {
        err(format!(
            "not a suite file ({e}); expected {{\"cases\": [...]}}"
        ))
    })?;
    if raw.cases.is_empty() {
        return Err(err("has no cases".into()));
    }
    let cases: Vec<SuiteCase> = raw
        .cases
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let case: RawCase =
                serde_json::from_value(v).map_err(|e| err(format!("case #{}: {e}", i + 1)))?;
            let params = ConvParams {
                n: case.n,
                c: case.c,
                input: case.input,
                kernel: case.kernel,
                stride: case.stride,
                dilation: case.dilation,
                padding: case.padding,
                layout: case
                    .layout
                    .parse()
                    .map_err(|e| err(format!("case '{}': {e}", case.name)))?,
                dtype: case
                    .dtype
                    .parse()
                    .map_err(|e| err(format!("case '{}': {e}", case.name)))?,
            };
            let spec = params
                .validate()
                .map_err(|e| err(format!("case '{}': {e}", case.name)))?;
            Ok(SuiteCase {
                name: case.name,
                spec,
            })
        })
        .collect::<Result<_>>()?;
    for (i, c) in cases.iter().enumerate() {
        if cases[..i].iter().any(|o| o.name == c.name) {
            return Err(err(format!(
                "has two cases named '{}'; names pick cases (--case) and must be unique",
                c.name
            )));
        }
    }
    Ok(cases)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cases_and_names_bad_ones() {
        let p = Path::new("s.json");
        let ok = r#"{"cases": [{"name": "a", "n": 1, "c": 4, "input": [9], "kernel": [4],
            "padding": [[3, 0]], "layout": "channels-first", "dtype": "bf16"}]}"#;
        let cases = parse_suite(ok, p).unwrap();
        assert_eq!(cases[0].name, "a");
        assert_eq!(cases[0].spec.output_dims(), &[9]);

        let bad = ok.replace("\"bf16\"", "\"bf15\"");
        let e = parse_suite(&bad, p).unwrap_err().to_string();
        assert!(e.contains("case 'a'") && e.contains("bf15"), "{e}");
        let bad = ok.replace("[9]", "[-9]");
        let e = parse_suite(&bad, p).unwrap_err().to_string();
        assert!(e.contains("input size along w: -9"), "{e}");
        assert!(parse_suite("{}", p).is_err());
        assert!(parse_suite(r#"{"cases": []}"#, p).is_err());
        let e = parse_suite(&ok.replace("\"n\"", "\"batch\""), p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("case #1"), "{e}");
        let twice = ok.replace("}]}", "}, {\"name\": \"a\", \"n\": 1, \"c\": 1, \"input\": [4], \"kernel\": [1], \"layout\": \"cf\", \"dtype\": \"f32\"}]}");
        let e = parse_suite(&twice, p).unwrap_err().to_string();
        assert!(e.contains("two cases named 'a'"), "{e}");
    }

    #[test]
    fn endless_files_are_refused() {
        let e = load_suite(Path::new("/dev/zero")).unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
    }

    /// The models suite loads by name, and the GPU grad-weight kernel takes every case,
    /// RepLKNet's 31x31 included (31 tap rows: its groups split over blocks along z).
    #[test]
    fn models_suite_parses_and_grad_weight_takes_every_case() {
        use crate::variants::Variant;
        let cases = load_suite(Path::new("models")).unwrap();
        assert_eq!(cases.len(), 9);
        let wgrad = crate::variants::Wgrad;
        for c in &cases {
            let takes = wgrad.applies(&c.spec);
            assert!(takes.is_ok(), "{}: {takes:?}", c.name);
            let config = wgrad.default_config(&c.spec);
            wgrad.launch(&c.spec, &config, 132).unwrap();
        }
    }

    #[test]
    fn public_suite_parses() {
        let cases = public_suite().unwrap();
        assert_eq!(cases.len(), 10);
        let seed = cases.iter().find(|c| c.name == "seed-bf16").unwrap();
        assert_eq!(seed.spec, ConvParams::seed().validate().unwrap());
    }
}
