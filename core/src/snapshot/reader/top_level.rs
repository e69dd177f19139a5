//! The snapshot from the top-level value: its records and traces, the tables kept during
//! the read moved in, then frames and stacks renumbered in traversal order.

use super::error::ReadError;
use super::keys::{classify, Kind};
use super::records::{key_list, ENTRY};
use super::value::{check_depth, EntryList, ListData, Value};
use super::vm::Vm;
use crate::snapshot::model::{AllocatorSettings, Frame, FrameId, PoolRun, SettingValue, Snapshot, StackId, HOST_TRACE};

impl<'a> Vm<'a> {
    /// The snapshot from the top-level value: the dict `_dump_snapshot` writes, or the
    /// bare list of segments `torch.cuda.memory_snapshot()` returns.
    pub(super) fn into_snapshot(mut self, top: Value<'a>) -> Result<Snapshot, ReadError> {
        let mut snap = Snapshot::default();
        let mut seq = match self.resolve(top) {
            Value::Dict(seq) => seq,
            list @ Value::List(_) => {
                snap.segments = self.records("segments", list)?;
                return Ok(self.finish(snap));
            }
            other => {
                return Err(ReadError::Schema {
                    detail: format!(
                        "the top-level value is {}: a snapshot is a dict with `segments` (or a list of segments)",
                        other.kind()
                    ),
                })
            }
        };
        let mut have_segments = false;
        let keys = key_list(&seq.items);
        for kv in seq.items.chunks_exact_mut(2) {
            let Value::Str(k) = kv[0] else { continue };
            let v = std::mem::take(&mut kv[1]);
            match k {
                "segments" => {
                    snap.segments = self.records(k, v)?;
                    have_segments = true;
                }
                "device_traces" => {
                    for (d, trace) in self.traces(k, v)?.into_iter().enumerate() {
                        let runs = trace.pools.iter().map(|&(from, pool)| PoolRun { trace: d as u32, from, pool });
                        snap.details.pools.extend(runs);
                        snap.device_traces.push(trace.entries);
                    }
                }
                "host_segments" => snap.host_segments = self.records(k, v)?,
                "host_traces" => {
                    for trace in self.traces(k, v)? {
                        let base = snap.host_trace.len() as u32;
                        let runs = trace.pools.iter().map(|&(from, pool)| PoolRun { trace: HOST_TRACE, from: base + from, pool });
                        snap.details.pools.extend(runs);
                        snap.host_trace.extend(trace.entries);
                    }
                }
                "external_annotations" => snap.external_annotations = self.records(k, v)?,
                "allocator_settings" => {
                    snap.allocator_settings = match self.setting_value(v, 0)? {
                        Some(SettingValue::None) => None,
                        Some(SettingValue::Dict(entries)) => Some(AllocatorSettings { entries }),
                        _ => {
                            return Err(ReadError::Schema {
                                detail: "`allocator_settings` is not a dict".into(),
                            })
                        }
                    }
                }
                _ => self.skip_key("snapshot", k),
            }
        }
        if !have_segments {
            return Err(ReadError::Schema {
                detail: format!("the top-level dict has no `segments` (it has {keys})"),
            });
        }
        Ok(self.finish(snap))
    }

    /// One trace: its entries and their pools (entries of unknown actions left out).
    fn trace(&mut self, key: &str, v: Value<'a>) -> Result<EntryList, ReadError> {
        let items = match self.resolve(v) {
            Value::List(ListData::Entries(list)) => return Ok(list),
            v => self.list_items(key, v)?,
        };
        let mut out = EntryList::default();
        for (i, item) in items.into_iter().enumerate() {
            match self.resolve(item) {
                Value::Entry(e) => out.push(e.0, e.1),
                Value::Skipped => {}
                Value::Dict(mut seq) if classify(&seq.items, &self.keys) == Some(Kind::Entry) => {
                    if let Some((e, pool)) = self.entry_from(&mut seq.items)? {
                        out.push(e, pool);
                    }
                }
                other => return Err(self.not_a(key, i, &other, ENTRY, "an `action`")),
            }
        }
        Ok(out)
    }

    /// Traces as a list of per-device lists (`device_traces`, `host_traces`); a list of
    /// entries is one trace.
    fn traces(&mut self, key: &str, v: Value<'a>) -> Result<Vec<EntryList>, ReadError> {
        let v = self.resolve(v);
        if let Value::List(ListData::Entries(list)) = v {
            return Ok(vec![list]);
        }
        let items = self.list_items(key, v)?;
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let item = self.resolve(item);
            if let Value::Entry(_) | Value::Skipped = item {
                return Err(self.schema("snapshot", format!("`{key}` mixes trace entries and lists of them")));
            }
            let k = format!("{key}[{}]", out.len());
            out.push(self.trace(&k, item)?);
        }
        Ok(out)
    }

    /// A settings value; `None` for shapes `SettingValue` cannot hold (ignored like
    /// unknown keys elsewhere).
    pub(super) fn setting_value(
        &mut self,
        v: Value<'a>,
        depth: u32,
    ) -> Result<Option<SettingValue>, ReadError> {
        check_depth(depth, self.at)?;
        Ok(Some(match self.resolve(v) {
            Value::None => SettingValue::None,
            Value::Bool(b) => SettingValue::Bool(b),
            Value::Int(i) => SettingValue::Int(i),
            Value::Float(f) => SettingValue::Float(f),
            Value::Str(s) => SettingValue::Str(s.to_owned()),
            Value::Dict(seq) => {
                let mut entries: Vec<(String, SettingValue)> = Vec::new();
                let mut it = seq.items.into_iter();
                while let (Some(k), Some(v)) = (it.next(), it.next()) {
                    let Value::Str(k) = k else { continue };
                    if let Some(v) = self.setting_value(v, depth + 1)? {
                        match entries.iter_mut().find(|(e, _)| e == k) {
                            Some(slot) => slot.1 = v,
                            None => entries.push((k.to_owned(), v)),
                        }
                    }
                }
                SettingValue::Dict(entries)
            }
            _ => return Ok(None),
        }))
    }

    /// Moves the tables and counts kept during the read into `snap`.
    fn finish(self, mut snap: Snapshot) -> Snapshot {
        snap.frames = self.frames;
        snap.stacks = self.stacks.stacks;
        snap.details.frame_fx = self.frame_fx.into_iter().collect();
        snap.details.forward_frames = self.forward_frames;
        for ((record, key), n) in self.skipped_keys {
            *snap.skipped.keys.entry(format!("{record}.{key}")).or_default() += n;
        }
        for (action, n) in self.skipped_actions {
            *snap.skipped.actions.entry(action.to_owned()).or_default() += n;
        }
        snap
    }
}

/// Renumber stacks and frames in traversal order (segments with their blocks and their
/// forward frames, then traces; the host's last), dropping unused ones. The result
/// depends only on the data, not on the order records happened to complete in the file,
/// so `read(write(s)) == s` holds.
pub(super) fn canonicalize_tables(snap: &mut Snapshot) {
    const UNSEEN: u32 = u32::MAX;
    let mut stack_map = vec![UNSEEN; snap.stacks.len()];
    let mut order: Vec<StackId> = Vec::new();
    let mut visit = |id: &mut StackId| {
        let slot = &mut stack_map[*id as usize];
        if *slot == UNSEEN {
            *slot = order.len() as StackId;
            order.push(*id);
        }
        *id = *slot;
    };
    let forward = &mut snap.details.forward_frames;
    forward.sort_by_key(|f| f.0);
    let mut kept = vec![false; forward.len()];
    for seg in snap.segments.iter_mut().chain(&mut snap.host_segments) {
        visit(&mut seg.frames);
        for b in &mut seg.blocks {
            visit(&mut b.frames);
            if let Ok(i) = forward.binary_search_by_key(&b.address, |f| f.0) {
                visit(&mut forward[i].1);
                kept[i] = true;
            }
        }
    }
    for e in snap.device_traces.iter_mut().flatten().chain(&mut snap.host_trace) {
        visit(&mut e.frames);
    }
    // Forward frames of blocks no segment holds (PyTorch writes none) are dropped.
    let mut kept = kept.into_iter();
    forward.retain(|_| kept.next().unwrap_or(false));
    let mut old_stacks = std::mem::take(&mut snap.stacks);
    let mut old_frames = std::mem::take(&mut snap.frames);
    let mut frame_map = vec![UNSEEN; old_frames.len()];
    for old in order {
        let mut st = std::mem::take(&mut old_stacks[old as usize]);
        for f in &mut st {
            let slot = &mut frame_map[*f as usize];
            if *slot == UNSEEN {
                *slot = snap.frames.len() as FrameId;
                let of = &mut old_frames[*f as usize];
                snap.frames.push(Frame {
                    name: std::mem::take(&mut of.name),
                    filename: std::mem::take(&mut of.filename),
                    line: of.line,
                });
            }
            *f = *slot;
        }
        snap.stacks.push(st);
    }
    let fx = &mut snap.details.frame_fx;
    fx.retain(|(f, _)| frame_map[*f as usize] != UNSEEN);
    for (f, _) in fx.iter_mut() {
        *f = frame_map[*f as usize];
    }
    fx.sort_by_key(|(f, _)| *f);
}
