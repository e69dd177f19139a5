//! A device query that replays recorded raw readings, for tests and demos without a GPU.

use serde::{Deserialize, Serialize};

use super::raw::{DeviceQuery, Raw, RawDevice};

/// Replays `frames` in order, then starts over.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RecordedQuery {
    pub frames: Vec<Raw<Vec<RawDevice>>>,
    #[serde(skip)]
    next: usize,
}

impl RecordedQuery {
    /// Panics on an empty recording: there would be nothing to replay.
    pub fn new(frames: Vec<Raw<Vec<RawDevice>>>) -> Self {
        assert!(!frames.is_empty(), "a recording needs at least one frame");
        RecordedQuery { frames, next: 0 }
    }
}

impl DeviceQuery for RecordedQuery {
    fn read_devices(&mut self) -> Raw<Vec<RawDevice>> {
        let frame = self.frames[self.next % self.frames.len()].clone();
        self.next += 1;
        frame
    }
}
