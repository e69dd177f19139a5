//! Several snapshots on the screen: every file's peak, read one at a time on a worker while
//! the screen shows one of them, for the header's line of peaks and skew.

use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver};

use vramscope_core::format::bytes;
use vramscope_core::report::frame_rules::FrameRules;
use vramscope_core::report::snapshot_set::skew_of;
use vramscope_core::snapshot::timeline::Timeline;

pub struct SetPeaks {
    names: Vec<String>,
    peaks: Vec<Option<Result<u64, String>>>,
    rx: Receiver<(usize, Result<u64, String>)>,
}

impl SetPeaks {
    /// Starts reading `files` (the device each shows: `device`, else its default).
    pub fn start(files: &[PathBuf], device: Option<usize>) -> SetPeaks {
        let (tx, rx) = channel();
        let list = files.to_vec();
        std::thread::Builder::new()
            .name("set-peaks".into())
            .spawn(move || {
                // Peaks need no categories.
                let rules = FrameRules::off();
                for (i, f) in list.iter().enumerate() {
                    let peak = vramscope_core::snapshot::read_device(f, device, &rules).map(|(s, d)| Timeline::from_snapshot(&s, d).peak_bytes).map_err(|e| e.to_string());
                    if tx.send((i, peak)).is_err() {
                        return;
                    }
                }
            })
            .expect("spawning the peaks reader");
        SetPeaks { names: files.iter().map(|f| vramscope_core::input::title(f)).collect(), peaks: vec![None; files.len()], rx }
    }

    /// Takes what the worker read; true when anything landed.
    pub fn poll(&mut self) -> bool {
        let mut any = false;
        while let Ok((i, p)) = self.rx.try_recv() {
            self.peaks[i] = Some(p);
            any = true;
        }
        any
    }

    /// "peaks: rank0 7.88 GiB · rank1 13.0 GiB; skew 64.7% (rank1 over rank0)", or how many
    /// are read so far.
    pub fn line(&self) -> String {
        let known: Vec<(&str, u64)> = self.names.iter().zip(&self.peaks).filter_map(|(n, p)| p.as_ref()?.as_ref().ok().map(|b| (n.as_str(), *b))).collect();
        let read = self.peaks.iter().filter(|p| p.is_some()).count();
        let each = known.iter().map(|(n, b)| format!("{} {}", n.split('.').next().unwrap_or(n), bytes(*b))).collect::<Vec<_>>().join(" · ");
        if read < self.peaks.len() {
            return format!("peaks ({read} of {} read): {each}", self.peaks.len());
        }
        match skew_of(known.iter().copied()) {
            Some(s) => format!("skew {:.1}% ({} over {}) · peaks: {each}", s.ratio * 100.0, s.highest, s.lowest),
            None => "peaks: none could be read".into(),
        }
    }
}
