//! Categories for any snapshot, from its stack frames: rules that name words a frame's
//! function or file holds (`attention`, `torch/optim/`, `all_reduce`...). Frames are read
//! innermost first, and the first frame any rule matches decides (rules in order within a
//! frame), so a Linear inside an attention block counts as attention, not as a bare matmul.
//! A snapshot that records categories (vramscope's own) keeps them; one no rule matches at
//! all keeps its breakdown by top frame.
//!
//! Rules are data: defaults in code, a TOML file on top (`--categories FILE`):
//!
//! ```toml
//! [[rule]]
//! category = "moe_experts"
//! match = ["expert", "moe.py", "grouped_mm"]
//! ```
//!
//! A file's rules come before the defaults, and one that names a default's category
//! replaces it; `defaults = false` drops the defaults.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use crate::snapshot::model::{Frame, FrameId, RuleCoverage, Snapshot, StackId, Text};

/// What allocations no rule matched are called.
pub const UNMATCHED: &str = "unmatched";

#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Rule {
    pub category: String,
    /// Words, any of which in a frame's `file:line function` (any case) makes the match.
    #[serde(rename = "match")]
    pub words: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct FrameRules {
    rules: Vec<Rule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RulesFile {
    #[serde(default = "yes")]
    defaults: bool,
    #[serde(default)]
    rule: Vec<Rule>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("cannot read {path}: {err}")]
    Io { path: String, err: std::io::Error },
    #[error("{path}: {err}")]
    Toml { path: String, err: String },
    #[error("{path}: rule for \"{category}\" matches nothing (give it words in `match`)")]
    Empty { path: String, category: String },
}

const DEFAULTS: &[(&str, &[&str])] = &[
    ("communication", &["nccl", "c10d", "torch/distributed/", "all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "all_to_all", "alltoall"]),
    ("fsdp", &["fsdp", "fully_shard", "flat_param", "flatparam"]),
    ("moe_experts", &["expert", "moe", "router", "grouped_mm"]),
    ("optimizer_state", &["torch/optim/", "optimizer", "adamw", "_init_group"]),
    ("gradient", &["backward", "autograd::engine"]),
    ("attention", &["attention", "attn", "scaled_dot_product", "sdpa", "rotary"]),
    ("mlp", &["mlp", "feed_forward", "feedforward", "ffn", "swiglu", "gelu", "silu"]),
    ("embedding", &["embedding", "embed", "wte", "wpe"]),
    ("norm", &["layer_norm", "layernorm", "rms_norm", "rmsnorm", "batch_norm", "norm.py"]),
    ("loss", &["loss", "cross_entropy", "nll", "log_softmax"]),
];

impl Default for FrameRules {
    fn default() -> Self {
        FrameRules {
            rules: DEFAULTS.iter().map(|(c, w)| Rule { category: c.to_string(), words: w.iter().map(|s| s.to_string()).collect() }).collect(),
        }
    }
}

impl FrameRules {
    /// No rules: every snapshot keeps what it records (`--categories off`).
    pub fn off() -> FrameRules {
        FrameRules { rules: Vec::new() }
    }

    /// The defaults, with the file at `path` on top when one is given; `off` for none.
    pub fn load(path: Option<&Path>) -> Result<FrameRules, RulesError> {
        let Some(path) = path else { return Ok(FrameRules::default()) };
        if path == Path::new("off") {
            return Ok(FrameRules::off());
        }
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|err| RulesError::Io { path: shown.clone(), err })?;
        let file: RulesFile = toml::from_str(&text).map_err(|e| RulesError::Toml { path: shown.clone(), err: e.message().to_string() })?;
        if let Some(r) = file.rule.iter().find(|r| r.words.iter().all(|w| w.trim().is_empty())) {
            return Err(RulesError::Empty { path: shown, category: r.category.clone() });
        }
        let mut rules: Vec<Rule> = file.rule.iter().map(|r| Rule { category: r.category.clone(), words: r.words.iter().map(|w| w.to_lowercase()).collect() }).collect();
        if file.defaults {
            rules.extend(FrameRules::default().rules.into_iter().filter(|d| !file.rule.iter().any(|r| r.category == d.category)));
        }
        Ok(FrameRules { rules })
    }

    /// The rule a frame matches first.
    fn rule_of(&self, f: &Frame) -> Option<usize> {
        let text = format!("{}:{} {}", f.filename, f.line, f.name).to_lowercase();
        self.rules.iter().position(|r| r.words.iter().any(|w| text.contains(w.as_str())))
    }

    /// The rule of the first frame (innermost first) a rule matches; each frame is matched
    /// once (`frames`), as stacks share most of theirs.
    fn category_of(&self, snap: &Snapshot, stack: StackId, frames: &mut HashMap<FrameId, Option<usize>>) -> Option<usize> {
        snap.stacks.get(stack as usize)?.iter().find_map(|&f| *frames.entry(f).or_insert_with(|| self.rule_of(&snap.frames[f as usize])))
    }
}

/// Names every trace entry's category by the rules, unless the snapshot records categories
/// or no rule matches any allocation. Returns what was matched, when it did.
pub fn categorize(snap: &mut Snapshot, rules: &FrameRules) -> Option<RuleCoverage> {
    // A file that records categories records one in every entry (torch.profiler's): the
    // first says so before any rule is looked at.
    if snap.device_traces.iter().flatten().chain(&snap.host_trace).next().is_some_and(|e| e.category.is_some()) {
        return None;
    }
    // Each stack's rule once, by index: a map lookup per entry was most of this pass.
    let mut frames = HashMap::new();
    let by_stack: Vec<Option<usize>> = (0..snap.stacks.len()).map(|s| rules.category_of(snap, s as StackId, &mut frames)).collect();
    let rule_of = |e: &crate::snapshot::model::TraceEntry| by_stack.get(e.frames as usize).copied().flatten();
    // One shared copy of each name: a string per entry was most of this pass (issue 29).
    let names: Vec<Text> = rules.rules.iter().map(|r| Text::from(r.category.as_str())).collect();
    let unmatched = Text::from(UNMATCHED);
    // Named in the pass that finds what the rules match, and taken back where that says
    // not to: an entry that records a category (no other did), or no allocation matched.
    // A second pass over 1.5 M entries was some 5 ms (issue 29).
    let mut coverage = RuleCoverage::default();
    let mut named = 0;
    for e in snap.device_traces.iter_mut().flatten().chain(&mut snap.host_trace) {
        if e.category.is_some() {
            break;
        }
        let rule = rule_of(e);
        if e.action == crate::snapshot::model::Action::Alloc {
            *if rule.is_some() { &mut coverage.matched_bytes } else { &mut coverage.unmatched_bytes } += e.size;
        }
        e.category = Some(rule.map_or_else(|| unmatched.clone(), |i| names[i].clone()));
        named += 1;
    }
    let all = snap.device_traces.iter().map(Vec::len).sum::<usize>() + snap.host_trace.len();
    if named < all || coverage.matched_bytes == 0 {
        for e in snap.device_traces.iter_mut().flatten().chain(&mut snap.host_trace).take(named) {
            e.category = None;
        }
        return None;
    }
    snap.frame_rules = Some(coverage.clone());
    Some(coverage)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::model::{Action, Frame, StackInterner, TraceEntry};

    /// A snapshot with one allocation per stack (frames innermost first) of `size` bytes.
    fn snapshot(stacks: &[(&[(&str, &str)], u64)]) -> Snapshot {
        let mut snap = Snapshot::default();
        let mut interner = StackInterner::default();
        let mut entries = Vec::new();
        for (i, (frames, size)) in stacks.iter().enumerate() {
            let ids = frames.iter().map(|(file, name)| interner.frame(&mut snap, Frame { name: name.to_string(), filename: file.to_string(), line: 7 })).collect();
            let stack = interner.stack(&mut snap, ids);
            entries.push(TraceEntry { frames: stack, ..TraceEntry::new(Action::Alloc, 0x1000 * (i as u64 + 1), *size) });
        }
        snap.device_traces = vec![entries];
        snap
    }

    #[test]
    fn the_innermost_frame_a_rule_matches_decides() {
        let mut snap = snapshot(&[
            // A Linear inside attention: the bare matmul matches nothing, attention does.
            (&[("torch/nn/modules/linear.py", "forward"), ("model.py", "scaled_dot_product_attention"), ("train.py", "main")], 100),
            (&[("torch/optim/adamw.py", "_init_group"), ("train.py", "main")], 50),
            (&[("nn_utils.py", "cross_entropy"), ("train.py", "main")], 30),
            (&[("data.py", "collate"), ("train.py", "main")], 20),
        ]);
        let c = categorize(&mut snap, &FrameRules::default()).expect("rules matched");
        assert_eq!((c.matched_bytes, c.unmatched_bytes), (180, 20));
        let got: Vec<&str> = snap.device_traces[0].iter().map(|e| e.category.as_deref().unwrap()).collect();
        assert_eq!(got, ["attention", "optimizer_state", "loss", UNMATCHED]);
        assert_eq!(snap.frame_rules, Some(c));
    }

    #[test]
    fn recorded_categories_stay_and_frames_no_rule_knows_leave_the_snapshot_alone() {
        let mut recorded = snapshot(&[(&[("model.py", "attention")], 8)]);
        recorded.device_traces[0][0].category = Some("activation".into());
        assert_eq!(categorize(&mut recorded, &FrameRules::default()), None);
        assert_eq!(recorded.device_traces[0][0].category.as_deref(), Some("activation"));
        let mut unknown = snapshot(&[(&[("data.py", "collate")], 8)]);
        assert_eq!(categorize(&mut unknown, &FrameRules::default()), None);
        assert_eq!(unknown.device_traces[0][0].category, None, "the breakdown stays by top frame");
        // A category recorded past the first entry: the rules name none, even where they
        // match.
        let mut later = snapshot(&[(&[("model.py", "scaled_dot_product_attention")], 8), (&[("model.py", "attention")], 4)]);
        later.device_traces[0][1].category = Some("activation".into());
        assert_eq!(categorize(&mut later, &FrameRules::default()), None);
        let got: Vec<Option<&str>> = later.device_traces[0].iter().map(|e| e.category.as_deref()).collect();
        assert_eq!(got, [None, Some("activation")]);
        assert_eq!(later.frame_rules, None);
    }

    #[test]
    fn a_rules_file_comes_first_and_replaces_the_defaults_it_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("categories.toml");
        std::fs::write(&path, "[[rule]]\ncategory = \"data\"\nmatch = [\"Collate\"]\n[[rule]]\ncategory = \"attention\"\nmatch = [\"my_attn\"]\n").unwrap();
        let rules = FrameRules::load(Some(&path)).unwrap();
        let mut snap = snapshot(&[(&[("data.py", "collate")], 8), (&[("model.py", "my_attn_core")], 8), (&[("model.py", "scaled_dot_product_attention")], 8)]);
        categorize(&mut snap, &rules).unwrap();
        let got: Vec<&str> = snap.device_traces[0].iter().map(|e| e.category.as_deref().unwrap()).collect();
        assert_eq!(got, ["data", "attention", UNMATCHED], "the file's attention rule replaced the default's words");
        std::fs::write(&path, "defaults = false\n[[rule]]\ncategory = \"x\"\nmatch = []\n").unwrap();
        assert!(FrameRules::load(Some(&path)).unwrap_err().to_string().ends_with("rule for \"x\" matches nothing (give it words in `match`)"));
        std::fs::write(&path, "[[rules]]\n").unwrap();
        assert!(FrameRules::load(Some(&path)).unwrap_err().to_string().contains("unknown field `rules`"));
    }
}
