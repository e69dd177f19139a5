//! "Read a snapshot, pick a device, check it": what every command that shows one device of
//! a snapshot does first (view, view --summary, whatif, export, replay of a snapshot).

use std::path::Path;

use super::model::Snapshot;
use super::reader::{read_snapshot_file_observed, ReadError, ReadProgress};
use crate::report::frame_rules::{categorize, FrameRules};

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{shown}: {err}")]
    Read { shown: String, err: ReadError },
    #[error("{name}: no device {device} ({})", has_devices(*devices))]
    NoDevice { name: String, device: usize, devices: usize },
}

/// The devices a file has, in words.
fn has_devices(n: usize) -> String {
    match n {
        0 => "the file has no device".into(),
        1 => "the file has device 0 only".into(),
        n => format!("the file has devices 0 to {}", n - 1),
    }
}

/// The device to show of `snap`: the one asked for, if the file has it, else the snapshot's
/// default (the first with alloc or free actions). `name` is how errors name the file.
pub fn pick_device(name: &str, snap: &Snapshot, asked: Option<usize>) -> Result<usize, OpenError> {
    let device = asked.unwrap_or_else(|| snap.default_device());
    let devices = snap.device_count();
    if device >= devices {
        return Err(OpenError::NoDevice { name: name.to_string(), device, devices });
    }
    Ok(device)
}

/// Reads the snapshot at `path`, names categories from its frames by `rules` (where it
/// records none), and picks its device as `pick_device` does.
pub fn read_device(path: &Path, asked: Option<usize>, rules: &FrameRules) -> Result<(Snapshot, usize), OpenError> {
    read_device_observed(path, asked, rules, &mut |_| {})
}

/// `read_device`, showing `observe` the read as `read_snapshot_file_observed` does.
pub fn read_device_observed(path: &Path, asked: Option<usize>, rules: &FrameRules, observe: &mut dyn FnMut(&ReadProgress<'_>)) -> Result<(Snapshot, usize), OpenError> {
    let shown = crate::input::shown(path);
    let mut snap = read_snapshot_file_observed(path, observe).map_err(|err| OpenError::Read { shown: shown.clone(), err })?;
    categorize(&mut snap, rules);
    let device = pick_device(&shown, &snap, asked)?;
    Ok((snap, device))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_device_is_refused_with_the_devices_there_are() {
        let snap = Snapshot { device_traces: vec![Vec::new(), Vec::new()], ..Snapshot::default() };
        assert_eq!(pick_device("f", &snap, Some(1)).unwrap(), 1);
        let err = pick_device("f.pickle", &snap, Some(2)).unwrap_err().to_string();
        assert_eq!(err, "f.pickle: no device 2 (the file has devices 0 to 1)");
        assert_eq!(pick_device("f", &snap, None).unwrap(), 0, "no device has entries: the first");
        let one = Snapshot { device_traces: vec![Vec::new()], ..Snapshot::default() };
        assert_eq!(pick_device("f", &one, Some(9)).unwrap_err().to_string(), "f: no device 9 (the file has device 0 only)");
    }

    #[test]
    fn an_unreadable_file_is_named_once() {
        let err = read_device(Path::new("/nonexistent/x.pickle"), None, &FrameRules::default()).unwrap_err().to_string();
        assert!(err.starts_with("/nonexistent/x.pickle: cannot read"), "{err}");
    }
}
