//! The CLI's contract with users: bad input exits 2 with one clear line and no panic;
//! good input prints a table and, with --json, a report.

use std::process::{Command, Output};

/// The binary cargo built, or (in a staged copy on the GPU machine) the one beside
/// the tests folder.
fn binary() -> std::path::PathBuf {
    let built = std::path::PathBuf::from(env!("CARGO_BIN_EXE_evokernel"));
    if built.exists() {
        return built;
    }
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("staged layout")
        .join("evokernel")
}

fn evokernel(args: &[&str]) -> Output {
    Command::new(binary())
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the evokernel binary runs")
}

/// The embedded public suite (the CLI's `--suite public`).
fn suite_path() -> String {
    "public".to_string()
}

/// Asserts a user error: status 2, one line on stderr mentioning `needle`, no panic.
fn rejects(args: &[&str], needle: &str) {
    let out = evokernel(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: '{err}' lacks '{needle}'");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
}

const SMALL: [&str; 6] = ["--input", "6x7", "--channels", "3", "--kernel", "3x3"];

fn with(extra: &[&'static str]) -> Vec<&'static str> {
    let mut v = vec!["verify"];
    v.extend(SMALL);
    v.extend(extra);
    v
}

#[test]
fn bad_spec_values_exit_2_with_one_line() {
    rejects(
        &["verify", "--input", "0x7", "--kernel", "3x3"],
        "input size along h: 0",
    );
    rejects(
        &[
            "verify",
            "--input",
            "6x7",
            "--channels",
            "-4",
            "--kernel",
            "3x3",
        ],
        "channels c: -4",
    );
    rejects(&with(&["--batch", "0"]), "batch n: 0");
    rejects(
        &["verify", "--input", "6x7", "--kernel", "3x3x3"],
        "kernel has 3 entries",
    );
    rejects(
        &["verify", "--input", "6x7", "--kernel", "9x3"],
        "kernel along h",
    );
    rejects(&with(&["--stride", "1,0"]), "stride along w: 0");
    rejects(&with(&["--padding", "-1,1"]), "padding before along h: -1");
    rejects(&with(&["--padding", "1:2:3"]), "BEFORE:AFTER");
    rejects(&with(&["--padding", "1,1,1"]), "padding has 3 entries");
    rejects(&with(&["--dilation", "2x"]), "is not an integer");
    rejects(&with(&["--dtype", "int8"]), "expected bf16, f16 or f32");
    rejects(&with(&["--layout", "nchwc"]), "expected channels-first");
    rejects(
        &["verify", "--input", "6x7x8x9", "--kernel", "1x1x1x1"],
        "4 spatial dims",
    );
    rejects(
        &[
            "verify",
            "--input",
            "2000000000x2000000000x2000000000",
            "--kernel",
            "1",
        ],
        "element count",
    );
    rejects(
        &["verify", "--input", "99999999999x7", "--kernel", "1"],
        "input size along h",
    );
}

#[test]
fn bad_flags_files_and_backends_exit_2() {
    rejects(&["verify", "--frobnicate"], "--frobnicate");
    rejects(&["launch"], "launch");
    rejects(&["verify", "--kernel", "3"], "--input");
    rejects(&with(&["--backend", "tpu"]), "expected auto, cpu or cuda");
    rejects(
        &["verify", "--suite", "/no/such/suite.json"],
        "cannot read suite file",
    );
    let dir = std::env::temp_dir().join(format!("evokernel-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"cases\": [{\"name\": 3}]}").unwrap();
    rejects(&["verify", "--suite", bad.to_str().unwrap()], "case #1");
    rejects(
        &["verify", "--suite", &suite_path(), "--case", "nope"],
        "has no case 'nope'",
    );
    rejects(&["run", "--iters", "many"], "invalid value");
}

#[test]
fn help_explains_every_command_with_an_example() {
    for cmd in ["run", "verify", "bench", "tune", "profile"] {
        let out = evokernel(&[cmd, "--help"]);
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Example"), "{cmd}: {text}");
        assert!(
            text.contains("--json") && text.contains("--backend"),
            "{cmd}: {text}"
        );
    }
}

#[test]
fn verify_and_bench_a_small_spec_on_the_cpu() {
    let dir = std::env::temp_dir().join(format!("evokernel-cli-ok-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("r.json");
    let plots = dir.join("plots");
    let mut args = vec![
        "bench",
        "--backend",
        "cpu",
        "--iters",
        "3",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        plots.to_str().unwrap(),
    ];
    args.extend([
        "--input",
        "5x9x33",
        "--channels",
        "10",
        "--kernel",
        "3x3x3",
        "--padding",
        "1:0,1,1",
    ]);
    let out = evokernel(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("PASS") && text.contains("median ms"),
        "{text}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let row = &report["cases"][0]["rows"][0];
    assert_eq!(row["verdict"]["passed"], true);
    assert!(row["timing"]["median_ms"].as_f64().unwrap() > 0.0);
    assert!(report["commit"].as_str().is_some());
    for f in [
        "ladder-spec.png",
        "ladder-spec.svg",
        "roofline.png",
        "roofline.svg",
    ] {
        let bytes = std::fs::read(plots.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(bytes.len() > 1000, "{f} is {} bytes", bytes.len());
    }

    let out = evokernel(&[
        "verify",
        "--backend",
        "cpu",
        "--suite",
        &suite_path(),
        "--case",
        "odd-dilated",
        "--case",
        "causal-conv1d",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(text.matches("PASS").count(), 2, "{text}");
}

#[test]
fn plots_a_recorded_h100_report() {
    // A real report from the H100 machine (docs/results), embedded so the staged test runs anywhere.
    let dir = std::env::temp_dir().join(format!("evokernel-cli-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("run.json");
    std::fs::write(
        &json,
        include_str!("../../../docs/results/h100-run-722363d.json"),
    )
    .unwrap();
    let out = evokernel(&[
        "plot",
        "--from",
        json.to_str().unwrap(),
        "--out",
        dir.join("p").to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let png = std::fs::read(dir.join("p/ladder-seed.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let svg = std::fs::read_to_string(dir.join("p/roofline.svg")).unwrap();
    assert!(
        svg.contains("<svg") && svg.contains("streaming"),
        "roofline lacks the streaming point"
    );
    assert!(dir.join("p/ladder-seed-ndhwc.svg").exists());
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{}").unwrap();
    rejects(
        &[
            "plot",
            "--from",
            bad.to_str().unwrap(),
            "--out",
            dir.to_str().unwrap(),
        ],
        "run report",
    );
}

#[test]
fn profile_on_the_cpu_says_it_needs_a_gpu() {
    let out = evokernel(&["profile", "--backend", "cpu", "--no-counters"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("only on a CUDA GPU"), "{err}");
}
