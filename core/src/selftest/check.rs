//! A check's outcome, the whole run's results, and how they are said: lines, JSON, and the
//! report file attached to bug reports.

use std::path::Path;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
    Skipped,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "FAIL",
            Status::Skipped => "skipped",
        }
    }
}

/// What a comparison found: a pass says what was compared, a fail names the first mismatch
/// in full, a skip says why the check could not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Pass(String),
    Fail(String),
    Skipped(String),
}

impl Outcome {
    pub fn named(self, name: &str) -> Check {
        let (status, reason) = match self {
            Outcome::Pass(r) => (Status::Pass, r),
            Outcome::Fail(r) => (Status::Fail, r),
            Outcome::Skipped(r) => (Status::Skipped, r),
        };
        Check { name: name.to_string(), status, reason }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub reason: String,
}

/// Versions a bug report needs; None where this machine has no such thing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Versions {
    pub vramscope: String,
    pub torch: Option<String>,
    /// The CUDA toolkit the capture shim was compiled against.
    pub cuda: Option<String>,
    pub driver: Option<String>,
    pub gpu: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Results {
    pub checks: Vec<Check>,
    pub versions: Versions,
    /// The first failed check's mismatch, in full: what a bug report is about.
    pub first_mismatch: Option<String>,
}

impl Results {
    pub fn new(checks: Vec<Check>, versions: Versions) -> Results {
        let first_mismatch = checks.iter().find(|c| c.status == Status::Fail).map(|c| format!("{}: {}", c.name, c.reason));
        Results { checks, versions, first_mismatch }
    }

    pub fn failed(&self) -> bool {
        self.first_mismatch.is_some()
    }

    /// One line per check, then the versions.
    pub fn lines(&self) -> String {
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        let mut out = String::new();
        for c in &self.checks {
            out.push_str(&format!("{:<7}  {:<width$}  {}\n", c.status.as_str(), c.name, c.reason));
        }
        let v = &self.versions;
        let or_none = |s: &Option<String>| s.clone().unwrap_or_else(|| "none".into());
        out.push_str(&format!(
            "vramscope {}, torch {}, CUDA {}, driver {}, GPU {}\n",
            v.vramscope,
            or_none(&v.torch),
            or_none(&v.cuda),
            or_none(&v.driver),
            or_none(&v.gpu)
        ));
        let failed = self.checks.iter().filter(|c| c.status == Status::Fail).count();
        let skipped = self.checks.iter().filter(|c| c.status == Status::Skipped).count();
        out.push_str(&format!("{} checks: {} failed, {} skipped\n", self.checks.len(), failed, skipped));
        if let Some(m) = &self.first_mismatch {
            out.push_str(&format!("first mismatch: {m}\n"));
        }
        out
    }

    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).expect("results serialise")
    }

    /// Writes the JSON report to `path` through a temporary file beside it, so a reader
    /// never sees half a report.
    pub fn write_report(&self, path: &Path) -> std::io::Result<()> {
        write_atomic(path, self.json().as_bytes())
    }
}

/// Writes `path`'s temporary sibling, syncs it and renames it into place: unlike snapshots
/// (`snapshot::writer::save_atomic`), a report replaces the one a previous run wrote.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name"))?;
    let tmp = dir.join(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    written.and_then(|()| std::fs::rename(&tmp, path)).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_is_the_reports_mismatch_and_skips_are_not_failures() {
        let r = Results::new(
            vec![
                Outcome::Pass("12 events".into()).named("a"),
                Outcome::Skipped("no CUDA".into()).named("b"),
                Outcome::Fail("event #3 differs".into()).named("c"),
                Outcome::Fail("later".into()).named("d"),
            ],
            Versions::default(),
        );
        assert!(r.failed());
        assert_eq!(r.first_mismatch.as_deref(), Some("c: event #3 differs"));
        let ok = Results::new(vec![Outcome::Skipped("no CUDA".into()).named("b")], Versions::default());
        assert!(!ok.failed());
        assert!(r.lines().contains("FAIL     c  event #3 differs"), "{}", r.lines());
    }

    #[test]
    fn the_report_is_written_whole_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.json");
        let r = Results::new(vec![Outcome::Fail("x".into()).named("a")], Versions { vramscope: "0.1.0".into(), ..Versions::default() });
        r.write_report(&path).unwrap();
        let back: Results = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(back, r);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left");
        // A second run's report replaces the first's.
        let again = Results::new(vec![Outcome::Pass("y".into()).named("a")], Versions::default());
        again.write_report(&path).unwrap();
        assert_eq!(serde_json::from_str::<Results>(&std::fs::read_to_string(&path).unwrap()).unwrap(), again);
        assert!(r.write_report(&dir.path().join("missing/report.json")).is_err());
    }
}
