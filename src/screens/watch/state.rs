//! What the watch screen shows: the devices' and host's readings as they arrive, their
//! history, the selected device and the process order the keys change.

use std::time::Duration;

use vramscope_core::source::gauges::GaugeHistory;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessSort {
    /// Most memory first.
    Memory,
    /// Highest SM utilization first.
    Util,
    Pid,
}

impl ProcessSort {
    pub fn next(self) -> ProcessSort {
        match self {
            ProcessSort::Memory => ProcessSort::Util,
            ProcessSort::Util => ProcessSort::Pid,
            ProcessSort::Pid => ProcessSort::Memory,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ProcessSort::Memory => "memory",
            ProcessSort::Util => "util",
            ProcessSort::Pid => "pid",
        }
    }
}

/// What the watch screen draws from; the app loop owns it and feeds the history.
pub struct WatchState {
    pub history: GaugeHistory,
    pub sort: ProcessSort,
    pub interval: Duration,
    /// The key list is open.
    pub help: bool,
}

impl WatchState {
    pub fn new(history: GaugeHistory, interval: Duration) -> Self {
        WatchState {
            history,
            sort: ProcessSort::Memory,
            interval,
            help: false,
        }
    }

    /// There are processes to sort (GPUs that list some).
    pub fn can_sort(&self) -> bool {
        self.history.latest_devices().iter().any(|d| !d.processes.is_empty())
    }

    /// There is more than one GPU to select.
    pub fn can_select(&self) -> bool {
        self.history.latest_devices().len() > 1
    }

    /// The keys this screen offers now, as (key, what it does).
    pub fn keys(&self) -> Vec<(String, &'static str)> {
        let mut keys = vec![("q".to_string(), "quit")];
        if self.can_sort() {
            keys.push(("s".into(), "sort processes: memory, util, pid"));
        }
        if self.can_select() {
            keys.push(("↑ ↓".into(), "select a GPU for the graphs"));
        }
        keys.push(("?".into(), "this help"));
        keys
    }

    /// Moves the device selection by `delta` rows, staying within the list.
    pub fn move_selection(&mut self, delta: i32) {
        let devices = self.history.latest_devices();
        let Some(pos) = devices
            .iter()
            .position(|d| d.index == self.history.selected_device())
            .or((!devices.is_empty()).then_some(0))
        else {
            return;
        };
        let new = (pos as i64 + i64::from(delta)).clamp(0, devices.len() as i64 - 1) as usize;
        let index = devices[new].index;
        self.history.set_selected_device(index);
    }
}
