//! One configuration's result in a sweep: its measurements, or how it failed. The sweep
//! makes these rows; its table and the scaling fits read them.

use std::path::PathBuf;

use serde::Serialize;

use crate::step_config::StepConfig;
use crate::stream::StepReport;

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Measured {
    /// Highest allocated bytes (blocks, as PyTorch rounds requests) over the measured steps.
    pub peak_allocated_bytes: u64,
    /// The phase of the measured step with that peak where the peak was reached.
    pub peak_phase: String,
    pub phase_peak_bytes: std::collections::BTreeMap<String, u64>,
    /// What the forward pass adds at its highest over the memory live when the step starts
    /// (saved activations and forward temporaries; in bf16 also autocast's weight copies).
    /// Highest over the measured steps; None when no measured step has a step before it.
    pub activation_bytes: Option<u64>,
    pub reserved_bytes: u64,
    /// Requested live bytes averaged over time, then over the measured steps.
    pub mean_active_bytes: u64,
    /// The most requested live bytes each category held, over the measured steps.
    pub category_peak_bytes: std::collections::BTreeMap<String, u64>,
    /// Mean over the measured steps.
    pub step_time_s: f64,
    pub tokens_per_s: f64,
    pub samples_per_s: f64,
    /// Every measured step, for growth checks and fits.
    #[serde(skip)]
    pub steps: Vec<StepReport>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub enum Outcome {
    Measured(Measured),
    Oom {
        phase: String,
        /// The size the failed allocation asked for, when the message says it.
        requested_bytes: Option<u64>,
        message: String,
    },
    Failed {
        error: String,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SweepRow {
    pub config: StepConfig,
    #[serde(flatten)]
    pub outcome: Outcome,
    pub snapshot: Option<PathBuf>,
}

impl SweepRow {
    pub fn peak_bytes(&self) -> Option<u64> {
        match &self.outcome {
            Outcome::Measured(m) => Some(m.peak_allocated_bytes),
            _ => None,
        }
    }

    pub fn category_peak_bytes(&self) -> Option<&std::collections::BTreeMap<String, u64>> {
        match &self.outcome {
            Outcome::Measured(m) => Some(&m.category_peak_bytes),
            _ => None,
        }
    }

    pub fn activation_bytes(&self) -> Option<u64> {
        match &self.outcome {
            Outcome::Measured(m) => m.activation_bytes,
            _ => None,
        }
    }
}
