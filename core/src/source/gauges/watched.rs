//! The processes whose figures the gauges report as the job's: the job's ranks, as each
//! one's stream says who it is, or this process until one has (`vramscope watch`).

use std::sync::{Arc, Mutex};

#[derive(Clone, Debug, Default)]
pub struct Watched(Arc<Mutex<Vec<u32>>>);

impl Watched {
    pub fn of(pids: &[u32]) -> Watched {
        Watched(Arc::new(Mutex::new(pids.to_vec())))
    }

    /// A rank of the job said its pid.
    pub fn add(&self, pid: u32) {
        let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if pid != 0 && !v.contains(&pid) {
            v.push(pid);
        }
    }

    /// The job's pids; this process's until the job says its own.
    pub fn pids(&self) -> Vec<u32> {
        let v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if v.is_empty() {
            vec![std::process::id()]
        } else {
            v.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_replaces_this_process_once_it_is_known() {
        let w = Watched::default();
        assert_eq!(w.pids(), [std::process::id()]);
        let shared = w.clone();
        shared.add(42);
        shared.add(42);
        shared.add(0);
        w.add(43);
        assert_eq!(w.pids(), [42, 43]);
    }
}
