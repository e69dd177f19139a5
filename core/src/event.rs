//! What producers (live engine, replay, snapshot traces) send to consumers (store, headless
//! printer, recorder). One shape for every mode, so the UI never knows where data came from.

use serde::{Deserialize, Serialize};

pub use crate::snapshot::model::Action;

/// Where in the training step an event happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[repr(u8)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Model construction, input creation, anything outside a step.
    Other = 0,
    Forward = 1,
    Backward = 2,
    Optimizer = 3,
    ZeroGrad = 4,
}

impl Phase {
    pub const ALL: [Phase; 5] = [
        Phase::Other,
        Phase::Forward,
        Phase::Backward,
        Phase::Optimizer,
        Phase::ZeroGrad,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Other => "other",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
            Phase::ZeroGrad => "zero_grad",
        }
    }

    pub fn from_u8(v: u8) -> Phase {
        Phase::ALL.get(v as usize).copied().unwrap_or(Phase::Other)
    }

    /// The annotation a snapshot marks this phase of `step` with: "forward (step 3)".
    pub fn annotation(self, step: impl std::fmt::Display) -> String {
        format!("{} (step {step})", self.as_str())
    }

    /// "forward (step 3)" → (Forward, 3).
    pub fn of_annotation(name: &str) -> Option<(Phase, u32)> {
        let (phase, rest) = name.split_once(" (step ")?;
        let step = rest.strip_suffix(')')?.parse().ok()?;
        Phase::ALL.into_iter().find(|p| p.as_str() == phase).map(|p| (p, step))
    }
}

/// What an allocation holds, after torch.profiler's memory-timeline categories.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[repr(u8)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Parameter = 0,
    OptimizerState = 1,
    Input = 2,
    Temporary = 3,
    Activation = 4,
    Gradient = 5,
    AutogradDetail = 6,
    Unknown = 7,
}

impl Category {
    pub const ALL: [Category; 8] = [
        Category::Parameter,
        Category::OptimizerState,
        Category::Input,
        Category::Temporary,
        Category::Activation,
        Category::Gradient,
        Category::AutogradDetail,
        Category::Unknown,
    ];

    /// torch.profiler's names (memory_viz colours entries by these).
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::OptimizerState => "optimizer_state",
            Category::Input => "input",
            Category::Temporary => "temporary",
            Category::Activation => "activation",
            Category::Gradient => "gradient",
            Category::AutogradDetail => "autograd_detail",
            Category::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<Category> {
        let s = s.to_ascii_lowercase();
        Category::ALL.into_iter().find(|c| c.as_str() == s)
    }

    pub fn from_u8(v: u8) -> Category {
        Category::ALL
            .get(v as usize)
            .copied()
            .unwrap_or(Category::Unknown)
    }

    /// The category an allocation gets when it is made, before the loop knows more:
    /// forward allocations are presumed saved activations, the rest scratch.
    pub fn provisional(phase: Phase) -> Category {
        match phase {
            Phase::Forward => Category::Activation,
            Phase::Backward | Phase::Optimizer | Phase::ZeroGrad => Category::Temporary,
            Phase::Other => Category::Unknown,
        }
    }
}

/// One allocator event as the GPU's caching allocator would report it. On CPU the
/// allocator model rewrites libtorch's CPU requests into this form (modelled addresses,
/// segment events), so every consumer sees the same stream on every device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemEvent {
    /// Nanoseconds since the session started.
    pub t_ns: u64,
    pub addr: u64,
    /// Requested bytes for alloc/free events, segment bytes for segment events.
    pub size: u64,
    pub stream: i64,
    pub step: u32,
    /// Interned module scope (`ScopeTable`), 0 = no module.
    pub scope: u32,
    pub action: Action,
    pub phase: Phase,
    pub device: u8,
    pub category: Category,
}

/// A phase boundary inside the stream: `seq` is the index of the first event after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseMark {
    pub seq: u64,
    pub t_ns: u64,
    pub step: u32,
    pub phase: Phase,
}

/// The producer learnt what a live allocation is: its category, and its name when it has
/// one (a parameter's, "exp_avg of" one) as an interned scope.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retag {
    pub addr: u64,
    pub category: Category,
    /// Interned scope naming the allocation; 0 keeps the scope it was made in.
    pub scope: u32,
}

/// A batch of stream data. Batches may be dropped under back-pressure; everything needed
/// for exact totals travels in `StepReport` instead.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    /// Sequence number of `events[0]` in the producer's stream (gaps reveal drops).
    pub first_seq: u64,
    pub events: Vec<MemEvent>,
    pub marks: Vec<PhaseMark>,
    /// Category corrections (and names) for live allocations.
    pub retags: Vec<Retag>,
    /// Newly interned scope names: (id, name).
    pub scopes: Vec<(u32, String)>,
}
