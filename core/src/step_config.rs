//! What a training step runs: model size, sequence/batch shape, precision, mode, attention,
//! device. Parsed from flags and changed by keys between steps.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

pub const VOCAB_SIZE: i64 = 10_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelDims {
    pub d_model: i64,
    pub d_ff: i64,
    pub layers: i64,
    pub heads: i64,
    pub vocab: i64,
}

/// CS336 BasicsTransformerLM sizes, plus `tiny` for CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Preset {
    Tiny,
    Small,
    Medium,
    Large,
    Xl,
    B2_7,
    B10,
}

impl Preset {
    pub const ALL: [Preset; 7] = [
        Preset::Tiny,
        Preset::Small,
        Preset::Medium,
        Preset::Large,
        Preset::Xl,
        Preset::B2_7,
        Preset::B10,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Preset::Tiny => "tiny",
            Preset::Small => "small",
            Preset::Medium => "medium",
            Preset::Large => "large",
            Preset::Xl => "xl",
            Preset::B2_7 => "2.7B",
            Preset::B10 => "10B",
        }
    }

    pub fn dims(self) -> ModelDims {
        let (d_model, d_ff, layers, heads) = match self {
            // Small enough that a CPU step takes about a second at ctx 256.
            Preset::Tiny => (256, 1024, 4, 4),
            Preset::Small => (768, 3072, 12, 12),
            Preset::Medium => (1024, 4096, 24, 16),
            Preset::Large => (1280, 5120, 36, 20),
            Preset::Xl => (1600, 6400, 48, 25),
            Preset::B2_7 => (2560, 10240, 32, 32),
            Preset::B10 => (4608, 12288, 50, 36),
        };
        ModelDims { d_model, d_ff, layers, heads, vocab: VOCAB_SIZE }
    }
}

impl FromStr for Preset {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let l = s.to_ascii_lowercase();
        Preset::ALL
            .into_iter()
            .find(|p| p.name().to_ascii_lowercase() == l || (l == "2.7b" && *p == Preset::B2_7))
            .ok_or_else(|| format!("unknown model preset '{s}' (allowed: {})", Preset::names()))
    }
}

impl Preset {
    pub fn names() -> String {
        Preset::ALL.iter().map(|p| p.name()).collect::<Vec<_>>().join(", ")
    }
}

macro_rules! choice_enum {
    ($name:ident, $what:literal, { $($var:ident => $s:literal),+ $(,)? }) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "lowercase")]
        pub enum $name { $($var),+ }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$var),+];
            pub fn as_str(self) -> &'static str { match self { $($name::$var => $s),+ } }
            pub fn names() -> String { [$($s),+].join(", ") }
        }
        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s.to_ascii_lowercase().as_str() {
                    $($s => Ok($name::$var),)+
                    _ => Err(format!("unknown {} '{}' (allowed: {})", $what, s, $name::names())),
                }
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.as_str()) }
        }
    };
}

// fp16 is autocast to float16 with a GradScaler, as on GPUs without bf16 (V100, T4).
choice_enum!(Precision, "precision", { Fp32 => "fp32", Bf16 => "bf16", Fp16 => "fp16" });
choice_enum!(Mode, "mode", { Forward => "forward", Train => "train" });
choice_enum!(Attention, "attention", { Naive => "naive", Fused => "fused" });
// `reference`: the CS336 reference's AdamW (new moment tensors every step); `torch`:
// torch.optim.AdamW's (moments updated in place).
choice_enum!(Optimizer, "optimizer", { Reference => "reference", Torch => "torch" });
// Whose bf16 autocast op lists a run follows: on a CUDA device always CUDA's (autocast runs
// there); on CPU, `cuda` (the default) models the GPU, `cpu` is what a CPU run measures.
choice_enum!(AutocastPolicy, "autocast policy", { Cuda => "cuda", Cpu => "cpu" });

#[allow(clippy::derivable_impls)]
impl Default for AutocastPolicy {
    fn default() -> Self {
        AutocastPolicy::Cuda
    }
}

impl AutocastPolicy {
    /// How the header names it beside the precision: "CUDA autocast".
    pub fn label(self) -> &'static str {
        match self {
            AutocastPolicy::Cuda => "CUDA autocast",
            AutocastPolicy::Cpu => "CPU autocast",
        }
    }
}

// The enum comes from `choice_enum!`, which gives no variant `#[default]`.
#[allow(clippy::derivable_impls)]
impl Default for Optimizer {
    fn default() -> Self {
        Optimizer::Reference
    }
}

/// Where the engine trains: `auto` (the first CUDA device if there is one, else the CPU),
/// `cpu`, or a CUDA device by its ordinal (`cuda` is `cuda:0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceChoice {
    Auto,
    Cpu,
    Cuda(u8),
}

impl DeviceChoice {
    pub const NAMES: &'static str = "auto, cpu, cuda, cuda:N";

    /// The CUDA ordinal a CUDA run uses.
    pub fn cuda_ordinal(self) -> u8 {
        match self {
            DeviceChoice::Cuda(n) => n,
            DeviceChoice::Auto | DeviceChoice::Cpu => 0,
        }
    }
}

impl FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let l = s.to_ascii_lowercase();
        match l.as_str() {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" => Ok(DeviceChoice::Cuda(0)),
            _ => l
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(DeviceChoice::Cuda)
                .ok_or_else(|| format!("unknown device '{s}' (allowed: {})", DeviceChoice::NAMES)),
        }
    }
}

/// Serialized as its flag spells it ("cuda:1", "every-2"), so an engine's options and a
/// recording's configs read as written.
macro_rules! serde_as_flag {
    ($name:ident) => {
        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

serde_as_flag!(DeviceChoice);

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Auto => f.write_str("auto"),
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl Precision {
    /// As the header and reports name it: bf16 and fp16 say whose autocast policy they
    /// follow, where known ("bf16 (CUDA autocast)").
    pub fn label(self, policy: Option<AutocastPolicy>) -> String {
        match (self, policy) {
            (Precision::Bf16 | Precision::Fp16, Some(p)) => format!("{self} ({})", p.label()),
            _ => self.to_string(),
        }
    }

    /// The next one, round (the `p` key): fp32, bf16, fp16.
    pub fn next(self) -> Self {
        match self {
            Precision::Fp32 => Precision::Bf16,
            Precision::Bf16 => Precision::Fp16,
            Precision::Fp16 => Precision::Fp32,
        }
    }

    /// Runs under autocast (bf16 or fp16).
    pub fn is_autocast(self) -> bool {
        self != Precision::Fp32
    }
}
impl Mode {
    pub fn toggled(self) -> Self {
        match self {
            Mode::Forward => Mode::Train,
            Mode::Train => Mode::Forward,
        }
    }
}
impl Attention {
    pub fn toggled(self) -> Self {
        match self {
            Attention::Naive => Attention::Fused,
            Attention::Fused => Attention::Naive,
        }
    }
}

/// Activation checkpointing, per transformer block: none, every block, or every k-th block
/// (blocks 0, k, 2k, …), as `torch.utils.checkpoint(block, x, use_reentrant=True)` does it:
/// a checkpointed block keeps only its input through forward and runs its forward again in
/// backward, trading recompute time for the activations it would have saved.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Checkpointing {
    #[default]
    None,
    /// Every k-th block, k ≥ 1 (1: every block).
    Every(u32),
}

impl Checkpointing {
    pub const NAMES: &'static str = "none, all, every-K";
    /// A k past this checkpoints block 0 alone, as any larger k would.
    const MAX_K: u32 = 1 << 16;

    /// Whether block `i` (from 0) is checkpointed.
    pub fn covers(self, i: i64) -> bool {
        match self {
            Checkpointing::None => false,
            Checkpointing::Every(k) => i % i64::from(k.max(1)) == 0,
        }
    }

    /// How many of `layers` blocks are checkpointed.
    pub fn blocks(self, layers: i64) -> i64 {
        (0..layers).filter(|&i| self.covers(i)).count() as i64
    }

    /// The next one, round (the `k` key): none, every block, every 2nd block.
    pub fn next(self) -> Self {
        match self {
            Checkpointing::None => Checkpointing::Every(1),
            Checkpointing::Every(1) => Checkpointing::Every(2),
            Checkpointing::Every(_) => Checkpointing::None,
        }
    }

    /// As the header and reports say it: "no checkpointing", "checkpoint every block",
    /// "checkpoint every 2nd block".
    pub fn label(self) -> String {
        match self {
            Checkpointing::None => "no checkpointing".into(),
            Checkpointing::Every(1) => "checkpoint every block".into(),
            Checkpointing::Every(k) => format!("checkpoint every {} block", crate::format::ordinal(u64::from(k))),
        }
    }
}

impl FromStr for Checkpointing {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let l = s.to_ascii_lowercase();
        let bad = || format!("unknown checkpointing '{s}' (allowed: {}, K from 1 to {})", Checkpointing::NAMES, Checkpointing::MAX_K);
        match l.as_str() {
            "none" => Ok(Checkpointing::None),
            "all" => Ok(Checkpointing::Every(1)),
            _ => match l.strip_prefix("every-").and_then(|k| k.parse::<u32>().ok()) {
                Some(k) if (1..=Checkpointing::MAX_K).contains(&k) => Ok(Checkpointing::Every(k)),
                _ => Err(bad()),
            },
        }
    }
}

impl fmt::Display for Checkpointing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Checkpointing::None => f.write_str("none"),
            Checkpointing::Every(1) => f.write_str("all"),
            Checkpointing::Every(k) => write!(f, "every-{k}"),
        }
    }
}

serde_as_flag!(Checkpointing);

/// The knobs of one step. Model dims are fixed for a session; the rest can change
/// between steps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepConfig {
    pub model_name: String,
    pub dims: ModelDims,
    pub ctx: i64,
    pub batch: i64,
    pub precision: Precision,
    pub mode: Mode,
    pub attention: Attention,
    /// Configurations recorded before the optimizer was a knob ran `torch`'s pattern, but
    /// read as today's default; the recording's steps say what ran.
    #[serde(default)]
    pub optimizer: Optimizer,
    /// Recorded before checkpointing was a knob: none ran.
    #[serde(default)]
    pub checkpointing: Checkpointing,
}

impl StepConfig {
    pub fn tokens(&self) -> i64 {
        self.ctx * self.batch
    }
}

/// Sets the knob `name` of `c` to `value` (ctx and batch clamped to their bounds), or says
/// why not, leaving `c` as it was; the engine's knobs are its step config's fields.
pub fn apply_knob(c: &mut StepConfig, name: &str, value: &str) -> Result<(), String> {
    let bad = |e: String| format!("knob {name}: {e}");
    let int = |v: &str| v.parse::<i64>().map_err(|e| bad(e.to_string()));
    match name {
        "precision" => c.precision = value.parse().map_err(bad)?,
        "ctx" => c.ctx = int(value)?.clamp(1, MAX_CTX),
        "batch" => c.batch = int(value)?.clamp(1, MAX_BATCH),
        "mode" => c.mode = value.parse().map_err(bad)?,
        "attention" => c.attention = value.parse().map_err(bad)?,
        "optimizer" => c.optimizer = value.parse().map_err(bad)?,
        "checkpointing" => c.checkpointing = value.parse().map_err(bad)?,
        _ => {
            let names: Vec<String> = c.knobs().into_iter().map(|k| k.name).collect();
            return Err(format!("vramscope's model has no knob '{name}' (it has {})", names.join(", ")));
        }
    }
    Ok(())
}

/// Largest context length a key may double to: keeps a stray keypress from asking for
/// petabytes of attention scores.
pub const MAX_CTX: i64 = 1 << 17;
pub const MAX_BATCH: i64 = 4096;

pub fn validate_ctx(ctx: i64) -> Result<i64, String> {
    if (1..=MAX_CTX).contains(&ctx) {
        Ok(ctx)
    } else {
        Err(format!("--ctx must be between 1 and {MAX_CTX}, got {ctx}"))
    }
}

pub fn validate_batch(batch: i64) -> Result<i64, String> {
    if (1..=MAX_BATCH).contains(&batch) {
        Ok(batch)
    } else {
        Err(format!("--batch must be between 1 and {MAX_BATCH}, got {batch}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_by_name_and_reject_unknown_with_the_list() {
        assert_eq!("2.7B".parse::<Preset>().unwrap(), Preset::B2_7);
        assert_eq!("2.7b".parse::<Preset>().unwrap(), Preset::B2_7);
        assert_eq!("XL".parse::<Preset>().unwrap(), Preset::Xl);
        let e = "huge".parse::<Preset>().unwrap_err();
        assert!(e.contains("huge") && e.contains("tiny, small"), "{e}");
    }

    #[test]
    fn cs336_table_dimensions() {
        let d = Preset::B2_7.dims();
        assert_eq!((d.d_model, d.d_ff, d.layers, d.heads), (2560, 10240, 32, 32));
        let d = Preset::B10.dims();
        assert_eq!((d.d_model, d.d_ff, d.layers, d.heads), (4608, 12288, 50, 36));
    }

    #[test]
    fn devices_parse_by_name_and_cuda_ordinal() {
        let parsed: Vec<DeviceChoice> = ["auto", "CPU", "cuda", "cuda:3"].iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(parsed, [DeviceChoice::Auto, DeviceChoice::Cpu, DeviceChoice::Cuda(0), DeviceChoice::Cuda(3)]);
        assert_eq!(DeviceChoice::Cuda(3).to_string(), "cuda:3");
        assert_eq!((DeviceChoice::Cuda(3).cuda_ordinal(), DeviceChoice::Auto.cuda_ordinal()), (3, 0));
    }

    #[test]
    fn checkpointing_every_k_covers_blocks_0_k_2k() {
        let covered = |c: Checkpointing| (0..6).filter(|&i| c.covers(i)).collect::<Vec<_>>();
        assert_eq!(covered(Checkpointing::None), Vec::<i64>::new());
        assert_eq!(covered(Checkpointing::Every(1)), [0, 1, 2, 3, 4, 5]);
        assert_eq!(covered(Checkpointing::Every(2)), [0, 2, 4]);
        assert_eq!(Checkpointing::Every(4).blocks(6), 2);
        assert_eq!(Checkpointing::Every(2).label(), "checkpoint every 2nd block");
    }

    #[test]
    fn knob_values_reject_with_allowed_list() {
        assert!("fp8".parse::<Precision>().unwrap_err().contains("fp32, bf16, fp16"));
        assert_eq!(Precision::Fp32.next().next().next(), Precision::Fp32, "p goes round all three");
        assert!("tpu".parse::<DeviceChoice>().unwrap_err().contains("auto, cpu, cuda, cuda:N"));
        assert!("cuda:x".parse::<DeviceChoice>().unwrap_err().contains("'cuda:x'"));
        assert!("cuda:256".parse::<DeviceChoice>().is_err());
        let parsed: Vec<Checkpointing> = ["none", "ALL", "every-3"].iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(parsed, [Checkpointing::None, Checkpointing::Every(1), Checkpointing::Every(3)]);
        assert_eq!(parsed.iter().map(ToString::to_string).collect::<Vec<_>>(), ["none", "all", "every-3"], "printed as typed");
        for bad in ["every-0", "every-", "some", "every-x"] {
            assert!(bad.parse::<Checkpointing>().unwrap_err().contains("none, all, every-K"), "{bad}");
        }
        assert_eq!(Checkpointing::None.next().next().next(), Checkpointing::None, "k goes round");
        assert!(validate_ctx(0).unwrap_err().contains("--ctx"));
        assert!(validate_batch(0).unwrap_err().contains("--batch"));
    }
}
