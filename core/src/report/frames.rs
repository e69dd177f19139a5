//! Which frames of an allocation's stack a person is shown, and how they are labelled.

use serde::Serialize;

use crate::snapshot::model::{Frame, FrameId, Snapshot, StackId};

/// Frames that say nothing about who allocated: unsymbolized addresses, the unwinder and
/// the caching allocator's own call path.
pub fn is_noise_frame(f: &Frame) -> bool {
    const NOISE: [&str; 9] = [
        "torch::unwind::",
        "torch::CapturedTraceback",
        "gather_with_cpp",
        "c10::cuda::CUDACachingAllocator",
        "_Unwind_",
        "__libc_start",
        "c10::Allocator",
        "at::detail::empty_",
        "at::detail::_empty_",
    ];
    f.name.is_empty() || f.name == "??" || f.name == "_start" || NOISE.iter().any(|n| f.name.contains(n))
}

/// A run of identical consecutive frames, shown once.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ShownFrame {
    pub name: String,
    pub filename: String,
    pub line: i64,
    pub repeats: usize,
    /// The FX node behind generated code (`augment_with_fx_traces`): "op name (target)".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fx: Option<String>,
}

/// A frame's FX keys in one line: "call_function linear_1 (aten.mm)".
fn fx_label(fx: &[(String, String)]) -> Option<String> {
    let get = |k: &str| fx.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
    let (op, name) = (get("fx_node_op"), get("fx_node_name"));
    let mut s = [op, name].into_iter().flatten().collect::<Vec<_>>().join(" ");
    if let Some(t) = get("fx_node_target") {
        s += &format!(" ({t})");
    }
    (!s.trim().is_empty()).then(|| s.trim().to_string())
}

impl ShownFrame {
    /// Python code (a `.py` file, or generated code such as `<eval_with_key>.3`), as
    /// against C++/native frames.
    pub fn is_python(&self) -> bool {
        self.filename.ends_with(".py") || self.filename.starts_with('<')
    }
}

/// A stack's frames, innermost first; noise dropped unless `all`, consecutive repeats
/// merged.
pub fn shown_frames(snap: &Snapshot, stack: StackId, all: bool) -> Vec<ShownFrame> {
    let mut out: Vec<ShownFrame> = Vec::new();
    let ids: &[FrameId] = snap.stacks.get(stack as usize).map_or(&[], Vec::as_slice);
    for &id in ids {
        let f = &snap.frames[id as usize];
        if !all && is_noise_frame(f) {
            continue;
        }
        match out.last_mut() {
            Some(l) if !all && l.name == f.name && l.filename == f.filename && l.line == f.line => l.repeats += 1,
            _ => out.push(ShownFrame { name: f.name.clone(), filename: f.filename.clone(), line: f.line, repeats: 1, fx: fx_label(snap.frame_fx(id)) }),
        }
    }
    out
}

/// "name (file.py:12)" with only the file's last path component.
pub fn frame_label(name: &str, filename: &str, line: i64) -> String {
    let file = filename.rsplit(['/', '\\']).next().unwrap_or(filename);
    match (file, line) {
        ("" | "??", _) => name.to_string(),
        (f, 0) => format!("{name} ({f})"),
        (f, l) => format!("{name} ({f}:{l})"),
    }
}

fn is_framework_file(filename: &str) -> bool {
    let f = filename.replace('\\', "/");
    f.contains("/torch/") || f.contains("/site-packages/") || f.starts_with("<")
}

/// The frame a person would name as the allocation's origin: the innermost Python frame
/// outside torch and installed packages, else the innermost Python frame, else the
/// innermost frame that is not noise.
pub fn top_frame(snap: &Snapshot, stack: StackId) -> Option<&Frame> {
    let py = |f: &&Frame| f.filename.ends_with(".py");
    snap.stack(stack)
        .find(|f| py(f) && !is_framework_file(&f.filename))
        .or_else(|| snap.stack(stack).find(py))
        .or_else(|| snap.stack(stack).find(|f| !is_noise_frame(f)))
}

pub fn top_frame_label(snap: &Snapshot, stack: StackId) -> Option<String> {
    top_frame(snap, stack).map(|f| frame_label(&f.name, &f.filename, f.line))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str, filename: &str, line: i64) -> Frame {
        Frame { name: name.into(), filename: filename.into(), line }
    }

    #[test]
    fn noise_is_dropped_and_repeats_merge() {
        let frames = [
            frame("torch::unwind::unwind()", "??", 0),
            frame("??", "??", 0),
            frame("_call_impl", "/x/torch/nn/modules/module.py", 1790),
            frame("_call_impl", "/x/torch/nn/modules/module.py", 1790),
            frame("forward", "/home/me/cs336_basics/model.py", 102),
        ];
        let mut snap = Snapshot { frames: frames.to_vec(), stacks: vec![vec![0, 1, 2, 3, 4]], ..Default::default() };
        let shown = shown_frames(&snap, 0, false);
        assert_eq!(shown.len(), 2);
        assert_eq!((shown[0].name.as_str(), shown[0].repeats), ("_call_impl", 2));
        assert_eq!(shown_frames(&snap, 0, true).len(), 5);
        assert_eq!(top_frame_label(&snap, 0).unwrap(), "forward (model.py:102)");
        // FX keys of generated code name the graph node beside the frame.
        let fx = |k: &str, v: &str| (k.to_string(), v.to_string());
        snap.details.frame_fx = vec![(4, vec![fx("fx_node_op", "call_function"), fx("fx_node_name", "linear_1"), fx("fx_node_target", "aten.mm")])];
        assert_eq!(shown_frames(&snap, 0, false)[1].fx.as_deref(), Some("call_function linear_1 (aten.mm)"));
        assert_eq!(frame_label("f", "C:\\a\\b.py", 3), "f (b.py:3)");
    }
}
