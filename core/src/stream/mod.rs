//! The one event stream. Every producer (the training engine process, the Python hook inside
//! a user's job, a recording, a snapshot's trace) sends these items and every consumer (the
//! store behind the screens, the headless printer, the recorder, the metrics endpoint) takes
//! them. Their byte form, chunks of records (`chunk`, `codec`), is the same in a recording
//! file and on a job's socket, and so are its bounds.

pub mod chunk;
pub mod codec;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::event::{Batch, Phase};
use crate::source::gauges::sample::GaugeBatch;
use crate::step_config::{Attention, AutocastPolicy, Checkpointing, Mode, Precision, StepConfig};

/// CLOCK_MONOTONIC now, in nanoseconds: the clock every process of a session shares (the
/// capture shim's steady_clock is the same clock).
pub fn monotonic_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to write.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Incoming {
    Batch(Batch),
    Report(Report),
    Gauges(GaugeBatch),
    /// A replay went back in time: consumers start again from an empty store.
    Restart,
}

/// A knob a producer declares: the screen's knob keys change it between steps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Knob {
    pub name: String,
    pub value: String,
}

// Here rather than in step_config, which the stream's reports use: the knobs are how the
// stream names a config's fields, and step_config needs nothing of the stream.
impl StepConfig {
    /// The step config's fields as knobs a viewer can change.
    pub fn knobs(&self) -> Vec<Knob> {
        [
            ("precision", self.precision.to_string()),
            ("ctx", self.ctx.to_string()),
            ("batch", self.batch.to_string()),
            ("mode", self.mode.to_string()),
            ("attention", self.attention.to_string()),
            ("optimizer", self.optimizer.to_string()),
            ("checkpointing", self.checkpointing.to_string()),
        ]
        .into_iter()
        .map(|(name, value)| Knob { name: name.into(), value })
        .collect()
    }
}

/// Who is producing: said once when the stream starts (and again to a viewer that attaches).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineInfo {
    pub device: String,
    pub cuda: bool,
    pub parameters: i64,
    /// vramscope's own model; None for a user's job.
    pub config: Option<StepConfig>,
    /// Said once on screen, e.g. why the CPU is used.
    pub note: Option<String>,
    /// What the header calls the job: the model preset, or the user's script.
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub pid: u32,
    /// torchrun's RANK and WORLD_SIZE, when set.
    #[serde(default)]
    pub rank: Option<u32>,
    #[serde(default)]
    pub world_size: Option<u32>,
    #[serde(default)]
    pub host: String,
    /// Declared knobs and their values now.
    #[serde(default)]
    pub knobs: Vec<Knob>,
    /// CLOCK_MONOTONIC nanoseconds at the job's clock zero (its events' `t_ns` count from
    /// there), so a viewer lines its own gauge readings up with the job's events.
    #[serde(default)]
    pub clock_zero_ns: u64,
    /// The caching-allocator settings in force (PYTORCH_CUDA_ALLOC_CONF's form; empty for
    /// the defaults). On CPU, the settings of the modelled GPU.
    #[serde(default)]
    pub alloc_conf: String,
    /// PCI bus id of the CUDA device followed: how its NVML readings are found (CUDA's
    /// ordinals are renumbered by CUDA_VISIBLE_DEVICES; NVML's are not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    /// Whose autocast op lists a bf16 step follows; None where unknown (recordings made
    /// before it was said, a job whose device the hook does not model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autocast: Option<AutocastPolicy>,
}

impl EngineInfo {
    pub fn knob(&self, name: &str) -> Option<&str> {
        self.knobs.iter().find(|k| k.name == name).map(|k| k.value.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepReport {
    pub step: u64,
    pub mode: Mode,
    pub precision: Precision,
    /// vramscope's own model's attention; None for a user's job.
    pub attention: Option<Attention>,
    /// vramscope's own model's activation checkpointing; None for a user's job (and for
    /// steps recorded before it was a knob).
    #[serde(default)]
    pub checkpointing: Option<Checkpointing>,
    pub ctx: i64,
    pub batch: i64,
    /// Peak of the allocator's allocated bytes (block sizes) during the step.
    pub peak_allocated_bytes: u64,
    /// Reserved (segment) bytes at the end of the step.
    pub reserved_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Peak of requested live bytes (what memory_viz's active timeline stacks).
    pub peak_active_bytes: u64,
    pub phase_peak_bytes: BTreeMap<String, u64>,
    /// Peak of requested live bytes in each phase.
    #[serde(default)]
    pub phase_active_peak_bytes: BTreeMap<String, u64>,
    /// Requested live bytes averaged over the step's time.
    #[serde(default)]
    pub mean_active_bytes: u64,
    /// The most requested live bytes each category held during the step.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub category_peak_bytes: BTreeMap<String, u64>,
    /// Live requested bytes per category at the end of the step.
    pub category_bytes: BTreeMap<String, u64>,
    pub live_bytes: u64,
    pub step_time_s: f64,
    /// ctx × batch per second (0 for a job whose inputs have no sequence length).
    pub tokens_per_s: f64,
    /// Samples (every micro-batch's) per second.
    #[serde(default)]
    pub samples_per_s: f64,
    /// None where the job's loss was not read (a CUDA loss: reading it would wait for the
    /// GPU). A diverged loss (NaN, ±inf) is kept: JSON has no such numbers, so it travels
    /// as a string.
    #[serde(default, with = "loss_value")]
    pub loss: Option<f64>,
    /// Batches and events this viewer did not get (its queue was full), since it attached.
    pub dropped_batches: u64,
    pub dropped_events: u64,
    /// torchrun's RANK of the job that ran the step, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// The CUDA device these figures are of, for a job's devices after its first (whose
    /// figures say nothing here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<u8>,
}

impl StepReport {
    /// A training step's report with `peak` allocated bytes and nothing else of note (tests,
    /// and the steps of a profiler trace).
    pub(crate) fn of_peak(step: u64, peak: u64) -> StepReport {
        StepReport {
            step,
            mode: Mode::Train,
            precision: Precision::Fp32,
            attention: None,
            checkpointing: None,
            ctx: 8,
            batch: 2,
            peak_allocated_bytes: peak,
            reserved_bytes: 0,
            peak_reserved_bytes: 0,
            peak_active_bytes: 0,
            phase_peak_bytes: BTreeMap::new(),
            phase_active_peak_bytes: BTreeMap::new(),
            mean_active_bytes: 0,
            category_peak_bytes: BTreeMap::new(),
            category_bytes: BTreeMap::new(),
            live_bytes: 0,
            step_time_s: 1.0,
            tokens_per_s: 16.0,
            samples_per_s: 2.0,
            loss: Some(0.0),
            dropped_batches: 0,
            dropped_events: 0,
            rank: None,
            device: None,
        }
    }

    /// How fast the step went, in tokens where its inputs are sequences, else samples.
    pub fn throughput(&self) -> String {
        if self.ctx > 0 || self.samples_per_s == 0.0 {
            format!("{:.0} tok/s", self.tokens_per_s)
        } else {
            format!("{:.0} samples/s", self.samples_per_s)
        }
    }

    /// The step's shape: "ctx 128 batch 4", or "batch 128" where there is no sequence.
    pub fn shape(&self) -> String {
        if self.ctx > 0 {
            format!("ctx {} batch {}", self.ctx, self.batch)
        } else {
            format!("batch {}", self.batch)
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KnobChange {
    /// First step that runs with the new value.
    pub step: u64,
    pub knob: String,
    pub from: String,
    pub to: String,
}

/// The job ran out of memory (the error as it reached the job); `report::oom::OomReport`
/// is the analysis of an `oom` entry in a snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OutOfMemory {
    pub step: u64,
    pub phase: Phase,
    pub message: String,
    /// The snapshot written before the error reached the job, when one was.
    #[serde(default)]
    pub snapshot: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Report {
    Started(EngineInfo),
    Knob(KnobChange),
    Step(StepReport),
    SnapshotSaved { step: u64, path: PathBuf },
    SnapshotFailed { step: u64, error: String },
    Oom(OutOfMemory),
    Paused(bool),
    /// A step failed for a reason other than OOM; the loop pauses.
    Error(String),
    /// Something the producer wants said once (a control it refused, a knob it lacks).
    Note(String),
    Finished,
    /// How a job vramscope started ended ("exited with code 1"), said by the viewer's side
    /// once its process is gone.
    Exited { how: String, success: bool },
}

/// What a viewer asks of a producer. Knob changes, pauses and snapshots apply at the next
/// step boundary. Nothing here names a path: a job writes only where its owner said when
/// starting it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Control {
    SetKnob { name: String, value: String },
    Pause,
    Resume,
    /// Run one step while paused.
    StepOnce,
    /// Write a snapshot at the next step boundary.
    Snapshot,
    /// End the run (vramscope's own engine; a user's job is stopped by signal).
    Stop,
}

/// `StepReport::loss` in JSON: a number, null (not read), or "NaN", "inf", "-inf" (a
/// diverged job, which serde_json would otherwise write as null and then refuse to read).
mod loss_value {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            None => s.serialize_none(),
            Some(x) if x.is_finite() => s.serialize_some(x),
            Some(x) if x.is_nan() => s.serialize_str("NaN"),
            Some(x) => s.serialize_str(if *x > 0.0 { "inf" } else { "-inf" }),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Loss {
            Number(f64),
            Text(String),
        }
        Ok(match Option::<Loss>::deserialize(d)? {
            None => None,
            Some(Loss::Number(x)) => Some(x),
            Some(Loss::Text(t)) => Some(match t.as_str() {
                "NaN" => f64::NAN,
                "inf" => f64::INFINITY,
                "-inf" => f64::NEG_INFINITY,
                _ => return Err(D::Error::custom(format!("a loss of \"{t}\" (numbers, null, \"NaN\", \"inf\" and \"-inf\" are losses)"))),
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(loss: Option<f64>) -> Option<f64> {
        let mut r = StepReport::of_peak(1, 10);
        r.loss = loss;
        let text = serde_json::to_string(&Report::Step(r)).unwrap();
        match serde_json::from_str::<Report>(&text).unwrap() {
            Report::Step(s) => s.loss,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_loss_a_job_can_have_survives_the_stream() {
        assert_eq!(round_trip(Some(2.5)), Some(2.5));
        // A CUDA job's loss is not read: it stays unknown, not zero.
        assert_eq!(round_trip(None), None);
        // A diverged job's loss must not break its viewer's stream.
        assert!(round_trip(Some(f64::NAN)).unwrap().is_nan());
        assert_eq!(round_trip(Some(f64::INFINITY)), Some(f64::INFINITY));
        assert_eq!(round_trip(Some(f64::NEG_INFINITY)), Some(f64::NEG_INFINITY));
    }

    #[test]
    fn a_report_from_before_the_loss_could_be_unknown_still_reads() {
        let mut v = serde_json::to_value(Report::Step(StepReport::of_peak(1, 10))).unwrap();
        v["Step"]["loss"] = serde_json::json!(1.25);
        let r: Report = serde_json::from_value(v.clone()).unwrap();
        assert!(matches!(r, Report::Step(s) if s.loss == Some(1.25)));
        v["Step"]["loss"] = serde_json::json!("1.25");
        assert!(serde_json::from_value::<Report>(v).is_err());
    }
}
