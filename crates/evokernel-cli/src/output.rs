//! Progress spinners and JSON reports written to files.

use std::path::PathBuf;

use evokernel::Error;
use indicatif::{ProgressBar, ProgressStyle};

pub fn spinner(msg: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(msg.to_string());
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

/// A tuning candidate's line for logs, printed past `bar`: where the output is not a
/// terminal (a GPU job's log, a pipe), each timed candidate is printed as it finishes, so
/// that a search cut short (a job's time limit) still leaves what it measured. Nothing on
/// a terminal, where the progress bar says it.
pub fn log_trial(
    bar: &ProgressBar,
    case: &str,
    done: usize,
    planned: usize,
    t: &evokernel::tune::Trial,
) {
    use std::io::IsTerminal;
    if std::io::stdout().is_terminal() {
        return;
    }
    let outcome = match (t.ms, &t.error) {
        (Some(ms), _) => format!("{ms:.5} ms"),
        (None, Some(e)) => format!("failed: {e}"),
        (None, None) => "failed".into(),
    };
    bar.suspend(|| println!("trial {case} {done}/{planned} {} {outcome}", t.config));
}

/// Writes a report after a run; if that fails the result is not lost: it goes to a file
/// in the temp folder, and the failure is reported without changing the exit status.
pub fn write_json_or_keep<T: serde::Serialize>(path: &PathBuf, report: &T) {
    if let Err(e) = write_json(path, report) {
        let fallback =
            std::env::temp_dir().join(format!("evokernel-report-{}.json", std::process::id()));
        match write_json(&fallback, report) {
            Ok(()) => eprintln!(
                "warning: {e}; the report was written to {} instead",
                fallback.display()
            ),
            Err(e2) => eprintln!(
                "warning: {e}; writing it to {} failed too: {e2}",
                fallback.display()
            ),
        }
    } else {
        println!("report written to {}", path.display());
    }
}

pub fn write_json<T: serde::Serialize>(path: &PathBuf, report: &T) -> Result<(), Error> {
    let text = serde_json::to_string_pretty(report).map_err(|e| Error::Io {
        action: "cannot serialize report for",
        path: path.clone(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(path, text + "\n").map_err(|source| Error::Io {
        action: "cannot write JSON report",
        path: path.clone(),
        source,
    })
}
