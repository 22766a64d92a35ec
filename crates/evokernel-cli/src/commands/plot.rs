//! `evokernel plot`: the ladder and roofline plots of a saved run report.

use std::path::Path;

use evokernel::session::RunReport;
use evokernel::Error;

use crate::plot;

pub fn run(from: &Path, out: &Path) -> Result<bool, Error> {
    let text = std::fs::read_to_string(from).map_err(|source| Error::Io {
        action: "cannot read report",
        path: from.to_path_buf(),
        source,
    })?;
    let report: RunReport = serde_json::from_str(&text).map_err(|e| Error::Parse {
        what: "run report",
        text: from.display().to_string(),
        expected: format!("a JSON report from evokernel run/bench --json ({e})"),
    })?;
    for f in plot::write_all(&report, out)? {
        println!("wrote {}", f.display());
    }
    Ok(true)
}
