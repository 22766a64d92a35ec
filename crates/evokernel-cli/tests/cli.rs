//! The CLI's contract with users: bad input exits 2 with one clear line and no panic;
//! good input prints a table and, with --json, a report.

use std::process::{Command, Output};

/// A scratch directory under the system's temp dir, removed when the test ends, passed
/// or panicked (tests used to leave one per run in /tmp).
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl std::ops::Deref for Scratch {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for Scratch {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

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
    rejects(
        &with(&["--backend", "tpu"]),
        "expected auto, cpu, cuda or vulkan",
    );
    rejects(
        &["verify", "--suite", "/no/such/suite.json"],
        "cannot read suite file",
    );
    let dir = Scratch::new("evokernel-cli");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"cases\": [{\"name\": 3}]}").unwrap();
    rejects(&["verify", "--suite", bad.to_str().unwrap()], "case #1");
    rejects(
        &["verify", "--suite", &suite_path(), "--case", "nope"],
        "has no case 'nope'",
    );
    rejects(&["run", "--iters", "many"], "invalid value");
    // A shard splits an exhaustive search, refused before any device is opened.
    rejects(&["tune", "--shard", "1/2"], "--search exhaustive");
    rejects(
        &["tune", "--shard", "3/2", "--search", "exhaustive"],
        "expected K/N with 1 <= K <= N",
    );
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
    let dir = Scratch::new("evokernel-cli-ok");
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

/// `--pass all` checks the forward, grad-input and grad-weight (with grad-bias under
/// --bias) of a strided, dilated, asymmetrically padded spec; the report says each pass.
#[test]
fn verify_every_pass_on_the_cpu() {
    let dir = Scratch::new("evokernel-cli-pass");
    let json = dir.join("r.json");
    let out = evokernel(&[
        "verify",
        "--backend",
        "cpu",
        "--pass",
        "all",
        "--bias",
        "--activation",
        "silu",
        "--json",
        json.to_str().unwrap(),
        "--input",
        "6x11x13",
        "--channels",
        "5",
        "--batch",
        "2",
        "--kernel",
        "3x3x4",
        "--stride",
        "1x2x1",
        "--dilation",
        "1x1x2",
        "--padding",
        "2:0,1,3:1",
        "--layout",
        "channels-last",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text.matches("PASS").count(), 3, "{text}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let passes: Vec<&str> = report["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["pass"].as_str().unwrap())
        .collect();
    assert_eq!(passes, ["forward", "dgrad", "wgrad"]);
    assert!(report["cases"][2]["key"]
        .as_str()
        .unwrap()
        .ends_with("+wgrad+bias"));
    rejects(&["verify", "--pass", "backward"], "--pass");
}

#[test]
fn plots_a_recorded_h100_report() {
    // A real report from the H100 machine (docs/results), embedded so the staged test runs anywhere.
    let dir = Scratch::new("evokernel-cli-plot");
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
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("only on a CUDA GPU"), "{err}");
}

#[test]
fn bench_of_the_fp8_gemm_checks_its_flags_before_any_gpu_work() {
    let gemm = |extra: &[&'static str]| {
        let mut v = vec!["bench", "--op", "scaled-mm"];
        v.extend(extra);
        v
    };
    rejects(&gemm(&["--m", "64", "--n", "64"]), "give --m M --n N --k K");
    rejects(
        &gemm(&["--m", "64", "--n", "64", "--k", "20"]),
        "multiple of 16",
    );
    rejects(&gemm(&["--m", "0", "--n", "64", "--k", "64"]), "m");
    rejects(&gemm(&["--suite", "gemm", "--case", "nope"]), "square-4096");
    rejects(
        &gemm(&["--m", "64", "--n", "64", "--k", "64", "--scaling", "x"]),
        "rowwise",
    );
    rejects(
        &gemm(&["--m", "64", "--n", "64", "--k", "64", "--only", "naive"]),
        "applies to convolutions",
    );
    rejects(
        &gemm(&["--input", "6x7", "--kernel", "3"]),
        "--m, --n and --k",
    );
    rejects(
        &gemm(&[
            "--m",
            "64",
            "--n",
            "64",
            "--k",
            "64",
            "--config",
            "naive:block=128",
        ]),
        "scaled_mm_wgmma, not 'naive'",
    );
    rejects(&["bench", "--m", "64"], "need --op scaled-mm");
    rejects(&["tune", "--m", "64"], "need --op scaled-mm");
    rejects(&["profile", "--m", "64"], "need --op scaled-mm");
    rejects(
        &["profile", "--op", "scaled-mm", "--m", "64", "--n", "64"],
        "give --m M --n N --k K",
    );
    rejects(
        &[
            "tune",
            "--op",
            "scaled-mm",
            "--m",
            "64",
            "--n",
            "64",
            "--k",
            "64",
            "--config",
            "scaled_mm_wgmma:bn=64,consumers=1,stages=3,group_m=1,splits=1,persistent=0,cluster=1",
        ],
        "tune searches the configs itself",
    );
    rejects(
        &[
            "tune",
            "--op",
            "scaled-mm",
            "--suite",
            "gemm",
            "--case",
            "x",
        ],
        "square-4096",
    );
    rejects(
        &gemm(&["--m", "64", "--n", "64", "--k", "64", "--iters", "0"]),
        "--iters",
    );
    // Both rungs' configs parse (no convolution variant check on them).
    let out = evokernel(&gemm(&[
        "--m",
        "64",
        "--n",
        "64",
        "--k",
        "64",
        "--backend",
        "cpu",
        "--config",
        "scaled_mm_wgmma:bn=64,consumers=1,stages=3,group_m=1,splits=1,persistent=1,cluster=2,fold=1",
        "--config",
        "scaled_mm_mma:bm=64,bn=64,bk=32,warps_m=2,warps_n=2",
    ]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("CUDA GPU only"), "{err}");
}

/// Runs evokernel with at most `mb` MiB of address space: a problem that is not refused
/// before it allocates aborts there instead of exiting with a clear line.
fn evokernel_capped(args: &[&str], env: &[(&str, &str)], mb: u64) -> Output {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!("ulimit -v {}; exec \"$0\" \"$@\"", mb * 1024))
        .arg(binary())
        .args(args)
        .env("RUST_BACKTRACE", "1")
        // Few threads and malloc arenas, so the cap measures allocations, not the
        // address space each thread reserves on a many-core machine; evokernel's own
        // budget set below the cap, so the answer is the same on any machine.
        .env("EVOKERNEL_MEMORY_LIMIT", (mb * 1024 * 1024 / 2).to_string())
        .env("RAYON_NUM_THREADS", "2")
        .env("MALLOC_ARENA_MAX", "2");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("sh runs")
}

/// Issue 15's reproducers: each one exits 2 (bad input or too big) or 3 (no backend)
/// with one clear line, inside a 400 MiB address space, or runs correctly (the strided
/// ones, whose scratch no longer grows with the stride).
#[test]
fn resource_reproducers_are_refused_before_allocating() {
    let cpu = |a: &[&'static str]| {
        let mut v = vec!["verify", "--backend", "cpu"];
        v.extend_from_slice(a);
        v
    };
    // (arguments, environment, exit status, what stderr says)
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, i32, &'a str);
    let cases: Vec<Case> = vec![
        (
            cpu(&["--input", "8", "--kernel", "1", "--stride", "2147483647"]),
            vec![],
            0,
            "",
        ),
        (
            cpu(&["--input", "64x64", "--kernel", "1", "--stride", "1048576"]),
            vec![],
            0,
            "",
        ),
        (
            cpu(&["--input", "1024x1024x1024", "-c", "512", "--kernel", "3"]),
            vec![],
            2,
            "of host memory",
        ),
        (
            cpu(&["--input", "65536x65536", "--kernel", "1"]),
            vec![],
            2,
            "of host memory",
        ),
        (
            cpu(&["--input", "1", "--kernel", "1", "-n", "2147483648"]),
            vec![],
            2,
            "of host memory",
        ),
        (
            cpu(&[
                "--input",
                "1",
                "--kernel",
                "2",
                "--dilation",
                "2147483647",
                "--padding",
                "2147483647",
            ]),
            vec![],
            2,
            "of host memory",
        ),
        (cpu(&["--suite", "/dev/zero"]), vec![], 2, "larger than"),
        (
            cpu(&["--input", "8", "--kernel", "3", "--config", "naive:nokey=5"]),
            vec![],
            2,
            "no parameter 'nokey'",
        ),
        (
            cpu(&[
                "--input",
                "8",
                "--kernel",
                "3",
                "--config",
                "naive:block=-1",
            ]),
            vec![],
            2,
            "--config",
        ),
        (
            cpu(&[
                "--input",
                "8",
                "--kernel",
                "3",
                "--config",
                "naive:block=999999",
            ]),
            vec![],
            2,
            "not one of",
        ),
        (
            cpu(&[
                "--input",
                "8",
                "--kernel",
                "3",
                "--config",
                "naive:block=128,block=256",
            ]),
            vec![],
            2,
            "given twice",
        ),
        (
            cpu(&["--input", "8", "--kernel", "3"]),
            vec![("EVOKERNEL_CONFIG", "naive:block=-1")],
            2,
            "EVOKERNEL_CONFIG",
        ),
        (cpu(&["--case", "seed-bf16"]), vec![], 2, "--suite"),
        (
            cpu(&["--suite", "public", "--stride", "7"]),
            vec![],
            2,
            "cannot be used with",
        ),
        (
            vec![
                "bench",
                "--backend",
                "cpu",
                "--input",
                "8",
                "--kernel",
                "3",
                "--iters",
                "18446744073709551615",
            ],
            vec![],
            2,
            "--iters",
        ),
        (
            vec![
                "bench",
                "--backend",
                "cpu",
                "--input",
                "8",
                "--kernel",
                "3",
                "--json",
                "/no/such/dir/r.json",
            ],
            vec![],
            2,
            "cannot write to",
        ),
        (
            vec![
                "verify",
                "--backend",
                "cuda",
                "--input",
                "8",
                "--kernel",
                "3",
            ],
            vec![],
            3,
            "not available",
        ),
    ];
    for (args, env, code, needle) in cases {
        // The CUDA driver reserves far more address space than it uses: no cap there.
        let cap = if code == 3 { 1 << 30 } else { 400 };
        let out = evokernel_capped(&args, &env, cap);
        let err = String::from_utf8_lossy(&out.stderr);
        if code == 3 && matches!(out.status.code(), Some(0 | 1)) {
            continue; // a machine with a GPU runs it
        }
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("memory allocation"),
            "{err}"
        );
        if code != 0 {
            assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
            assert!(err.contains(needle), "{args:?}: '{err}' lacks '{needle}'");
        }
    }
    // devices lists what it found and exits 0 with or without a GPU.
    let out = evokernel(&["devices"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("CPU backend"));
}

/// `plot --from` refuses values that would never finish drawing on log axes.
#[test]
fn plot_refuses_absurd_reports() {
    let good = include_str!("../../../docs/results/h100-run-722363d.json");
    let dir = Scratch::new("evokernel-plot-bad");
    let mut v: serde_json::Value = serde_json::from_str(good).unwrap();
    v["cases"][0]["rows"][0]["timing"]["median_ms"] = serde_json::json!(0.0);
    let zero = dir.join("zero.json");
    std::fs::write(&zero, v.to_string()).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(good).unwrap();
    v["ceilings"]["copy_gbps"] = serde_json::json!(1e308);
    let huge = dir.join("huge.json");
    std::fs::write(&huge, v.to_string()).unwrap();
    for f in [zero, huge] {
        rejects(
            &[
                "plot",
                "--from",
                f.to_str().unwrap(),
                "--out",
                dir.to_str().unwrap(),
            ],
            "run report",
        );
    }
}

mod random_flags {
    use super::*;
    use proptest::prelude::*;

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("3".to_string()),
            Just("1".to_string()),
            Just("0".to_string()),
            Just("-1".to_string()),
            Just("5x4".to_string()),
            Just("2x3x4".to_string()),
            Just("2:1".to_string()),
            Just("2147483648".to_string()),
            Just("x".to_string()),
            Just("".to_string()),
            (1u32..12).prop_map(|v| v.to_string()),
        ]
    }

    fn flag() -> impl Strategy<Value = Vec<String>> {
        let with_value = prop_oneof![
            Just("--input"),
            Just("--kernel"),
            Just("--stride"),
            Just("--dilation"),
            Just("--padding"),
            Just("--channels"),
            Just("--batch"),
            Just("--iters"),
            Just("--seed"),
        ];
        prop_oneof![
            (with_value, value()).prop_map(|(f, v)| vec![f.to_string(), v]),
            prop_oneof![Just("channels-first"), Just("nhwc"), Just("sideways")]
                .prop_map(|v| vec!["--layout".into(), v.into()]),
            prop_oneof![Just("bf16"), Just("f32"), Just("f8")]
                .prop_map(|v| vec!["--dtype".into(), v.into()]),
            prop_oneof![Just("silu"), Just("relu"), Just("tanh")]
                .prop_map(|v| vec!["--activation".into(), v.into()]),
            prop_oneof![
                Just("naive:block=128,waves=4"),
                Just("naive:block=7"),
                Just("warp:x=1")
            ]
            .prop_map(|v| vec!["--config".into(), v.into()]),
            Just(vec!["--bias".to_string()]),
            Just(vec!["--residual".to_string()]),
            Just(vec!["--case".to_string(), "seed-bf16".to_string()]),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Random flag sets, valid and not: never a panic, always a documented status
        /// (0 ok, 1 a check failed, 2 bad input), one line on stderr for bad input.
        #[test]
        fn random_flags_exit_with_a_documented_status(
            flags in proptest::collection::vec(flag(), 0..7),
            base in prop_oneof![Just(vec!["--input", "6x5", "--kernel", "3"]), Just(vec![])],
        ) {
            let mut args: Vec<String> = vec!["verify".into(), "--backend".into(), "cpu".into()];
            args.extend(base.iter().map(|s| s.to_string()));
            args.extend(flags.into_iter().flatten());
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = evokernel_capped(&refs, &[], 1024);
            let err = String::from_utf8_lossy(&out.stderr);
            let code = out.status.code();
            prop_assert!(matches!(code, Some(0..=2)), "{args:?}: {code:?} {err}");
            prop_assert!(!err.contains("panicked"), "{args:?}: {err}");
            if code == Some(2) {
                prop_assert_eq!(err.trim_end().lines().count(), 1, "{:?}: {}", args, err);
            }
        }
    }
}

#[test]
fn only_help_names_every_registered_variant() {
    let out = evokernel(&["bench", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    // Every name is followed by a comma (cudnn ends the list), so `wgrad` is not found
    // inside `wgrad_cl`.
    for v in evokernel::variants::registry() {
        assert!(
            help.contains(&format!(" {},", v.name())),
            "`--only` help lacks {}",
            v.name()
        );
    }
}

/// `--reference`: outside times reach the report beside their case (by name, per pass),
/// the summary divides by the fastest and names the cases slower than it; a bad file is
/// a user error.
#[test]
fn reference_times_reach_the_report_and_the_summary() {
    let dir = Scratch::new("evokernel-cli-ref");
    let refs = dir.join("torch.json");
    // A reference far faster than the CPU for odd-dilated, none for causal-conv1d's
    // forward, one for its grad-input.
    std::fs::write(
        &refs,
        r#"{"source": "test torch", "cases": {
            "odd-dilated": {"forward": {"pytorch-native": 0.000001, "pytorch-cudnn": 0.000002}},
            "causal-conv1d": {"dgrad": {"pytorch-native": 1000000.0}}}}"#,
    )
    .unwrap();
    // Two small cases under the public suite's names.
    let suite = dir.join("suite.json");
    std::fs::write(
        &suite,
        r#"{"cases": [
            {"name": "odd-dilated", "n": 1, "c": 3, "input": [9, 11], "kernel": [3, 3],
             "stride": [2, 1], "dilation": [1, 2], "padding": [[1, 1], [2, 2]],
             "layout": "channels-first", "dtype": "f32"},
            {"name": "causal-conv1d", "n": 2, "c": 4, "input": [40], "kernel": [4],
             "stride": [1], "dilation": [1], "padding": [[3, 0]],
             "layout": "channels-last", "dtype": "bf16"}]}"#,
    )
    .unwrap();
    let json = dir.join("r.json");
    let out = evokernel(&[
        "bench",
        "--backend",
        "cpu",
        "--suite",
        suite.to_str().unwrap(),
        "--pass",
        "all",
        "--iters",
        "1",
        "--reference",
        refs.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("odd-dilated: pytorch-native 0.000 ms (--reference)"),
        "{text}"
    );
    assert!(
        text.contains("reference times measured by: test torch"),
        "{text}"
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let cases = report["cases"].as_array().unwrap();
    let refs_of = |name: &str| {
        cases
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no case {name}"))["references"]
            .as_array()
            .unwrap()
            .len()
    };
    assert_eq!(refs_of("odd-dilated"), 2);
    assert_eq!(refs_of("odd-dilated dgrad"), 0);
    assert_eq!(refs_of("causal-conv1d"), 0);
    assert_eq!(refs_of("causal-conv1d dgrad"), 1);
    rejects(
        &["bench", "--backend", "cpu", "--reference", "/no/such.json"],
        "reference times",
    );
    std::fs::write(&refs, "[]").unwrap();
    rejects(
        &[
            "bench",
            "--backend",
            "cpu",
            "--reference",
            refs.to_str().unwrap(),
        ],
        "torch_reference.py",
    );
}

/// `bench --op dense-conv` on the CPU (no device needed): a grouped spec verified and
/// timed, the JSON report written; its flags checked before any work.
#[test]
fn dense_conv_bench_runs_on_the_cpu_and_checks_its_flags() {
    let dir = Scratch::new("evk-cli-dense");
    let json = dir.join("dense.json");
    let out = evokernel(&[
        "bench",
        "--op",
        "dense-conv",
        "--backend",
        "cpu",
        "--input",
        "9x10",
        "-c",
        "8",
        "--out-channels",
        "12",
        "--groups",
        "4",
        "--kernel",
        "3x3",
        "--padding",
        "1:0,2",
        "--stride",
        "2,1",
        "--layout",
        "channels-last",
        "--dtype",
        "f32",
        "--iters",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("-> 12 g4") && text.contains("cpu") && text.contains("pass"),
        "{text}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let case = &report["cases"][0];
    assert_eq!(case["candidates"][0]["passed"], true, "{case}");
    assert!(
        case["candidates"][0]["timing"]["median_ms"]
            .as_f64()
            .unwrap()
            > 0.0
    );

    let dense = ["bench", "--op", "dense-conv", "--backend", "cpu"];
    let with_dense = |extra: &[&'static str]| {
        let mut v = dense.to_vec();
        v.extend(extra);
        v
    };
    rejects(
        &with_dense(&["--input", "8", "-c", "6", "--groups", "4", "--kernel", "3"]),
        "groups",
    );
    rejects(
        &with_dense(&["--suite", "dense", "--case", "nope"]),
        "resnet50-3x3-56",
    );
    rejects(
        &with_dense(&["--input", "8", "-c", "4", "--kernel", "3", "--bias"]),
        "--bias",
    );
    rejects(
        &with_dense(&[
            "--input",
            "8",
            "-c",
            "4",
            "--kernel",
            "3",
            "--config",
            "dense_direct:threads_x=3",
        ]),
        "dense_direct",
    );
    rejects(
        &with_dense(&[
            "--input",
            "8",
            "-c",
            "4",
            "--kernel",
            "3",
            "--only",
            "streaming",
        ]),
        "dense_naive",
    );
    rejects(
        &with_dense(&[
            "--input",
            "8",
            "-c",
            "8",
            "--kernel",
            "3",
            "--config",
            "dense_coopmat:sg_m=3,sg_n=1,tm=1,tn=1",
        ]),
        "sg_m=N,sg_n=N,tm=N,tn=N",
    );
    // tune's --only names the shaders it searches.
    rejects(
        &[
            "tune",
            "--op",
            "dense-conv",
            "--input",
            "8",
            "-c",
            "8",
            "--kernel",
            "3",
            "--only",
            "bogus",
        ],
        "dense_coopmat",
    );
    // Output channels and groups belong to the dense convolution.
    rejects(
        &[
            "bench",
            "--input",
            "6x7",
            "-c",
            "3",
            "--kernel",
            "3x3",
            "--out-channels",
            "6",
        ],
        "--op dense-conv",
    );
}

/// `tune --op dense-conv` on the Vulkan device (lavapipe in CI) with its output piped: a
/// shard of the exhaustive search logs each candidate as it finishes (what a job cut
/// short by its time limit leaves), the table names the shard, and no cache is written.
#[test]
fn a_piped_tune_logs_each_trial_of_its_shard() {
    let dir = Scratch::new("evk-cli-shard");
    let out = Command::new(binary())
        .args([
            "tune",
            "--op",
            "dense-conv",
            "--backend",
            "vulkan",
            "--input",
            "6x7",
            "-c",
            "8",
            "--out-channels",
            "8",
            "--kernel",
            "3x3",
            "--padding",
            "1",
            "--layout",
            "channels-last",
            "--dtype",
            "f32",
            "--only",
            "dense_direct",
            "--search",
            "exhaustive",
            "--shard",
            "1/40",
            "--iters",
            "2",
        ])
        .env("EVOKERNEL_CACHE_DIR", dir.join("cache"))
        .output()
        .expect("the evokernel binary runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trials: Vec<&str> = text.lines().filter(|l| l.starts_with("trial ")).collect();
    assert!(!trials.is_empty(), "{text}");
    // "trial CASE k/N CONFIG MS ms": one line a candidate, k counting to N.
    for (i, line) in trials.iter().enumerate() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (k, n) = fields[2].split_once('/').expect("k/N");
        assert_eq!(k.parse::<usize>().unwrap(), i + 1, "{line}");
        assert_eq!(n.parse::<usize>().unwrap(), trials.len(), "{line}");
        assert!(fields[3].starts_with("dense_direct:"), "{line}");
        assert!(line.ends_with(" ms"), "{line}");
    }
    assert!(text.contains("shard 1/40"), "{text}");
    assert!(
        !dir.join("cache").join("tune.json").exists(),
        "a shard records nothing"
    );
}
