#!/usr/bin/env python3
"""Convert a PyTorch memory snapshot pickle into the JSON form of vramscope's serde
`Snapshot` (frames interned into `frames`/`stacks`). Dev/test aid until the Rust pickle
reader is available: `snapshot_to_json.py IN.pickle OUT.json`."""
import json
import os
import pickle
import sys


class Interner:
    def __init__(self):
        self.frames, self.frame_ids = [], {}
        self.stacks, self.stack_ids = [], {}

    def stack(self, frames):
        ids = []
        for f in frames or []:
            key = (f.get("name", ""), f.get("filename", ""), int(f.get("line", 0)))
            if key not in self.frame_ids:
                self.frame_ids[key] = len(self.frames)
                self.frames.append({"name": key[0], "filename": key[1], "line": key[2]})
            ids.append(self.frame_ids[key])
        key = tuple(ids)
        if key not in self.stack_ids:
            self.stack_ids[key] = len(self.stacks)
            self.stacks.append(ids)
        return self.stack_ids[key]


def camel(s):
    return "".join(p.capitalize() for p in s.split("_"))


def setting(v):
    if v is None:
        return "None"
    if isinstance(v, bool):
        return {"Bool": v}
    if isinstance(v, int):
        return {"Int": v}
    if isinstance(v, float):
        return {"Float": v}
    if isinstance(v, dict):
        return {"Dict": [[str(k), setting(x)] for k, x in v.items()]}
    return {"Str": str(v)}


def opt_str(v):
    return None if v is None else str(v)


def convert(d):
    it = Interner()
    it.stack([])  # stack 0 = no frames
    segments = []
    for s in d.get("segments", []):
        blocks = []
        addr = s["address"]
        for b in s["blocks"]:
            blocks.append({
                "address": b.get("address", addr), "size": b["size"],
                "requested_size": b.get("requested_size", b["size"]),
                "state": camel(b["state"]), "frames": it.stack(b.get("frames")),
            })
            addr += b["size"]
        segments.append({
            "device": s["device"], "address": s["address"], "total_size": s["total_size"],
            "allocated_size": s["allocated_size"], "active_size": s["active_size"],
            "requested_size": s.get("requested_size", 0), "stream": s["stream"],
            "segment_type": camel(s["segment_type"]),
            "segment_pool_id": list(s.get("segment_pool_id", (0, 0))),
            "is_expandable": bool(s.get("is_expandable", False)),
            "frames": it.stack(s.get("frames")), "blocks": blocks,
        })
    traces = []
    for tr in d.get("device_traces", []):
        out = []
        for e in tr:
            addr = e["device_free"] if e["action"] == "oom" else e.get("addr", 0)
            out.append({
                "action": camel(e["action"]), "addr": addr, "size": e["size"],
                "stream": e.get("stream", 0), "time_us": e.get("time_us", 0),
                "frames": it.stack(e.get("frames")), "category": opt_str(e.get("category")),
                "compile_context": opt_str(e.get("compile_context")),
                "user_metadata": opt_str(e.get("user_metadata")),
            })
        traces.append(out)
    settings = d.get("allocator_settings")
    return {
        "segments": segments, "device_traces": traces,
        "allocator_settings": None if settings is None else
        {"entries": [[k, setting(v)] for k, v in settings.items()]},
        "external_annotations": [
            {"name": a["name"], "stage": camel(a["stage"].lower()), "device": a["device"],
             "time_us": a["time_us"]} for a in d.get("external_annotations", [])],
        "frames": it.frames, "stacks": it.stacks,
    }


def main():
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, "rb") as f:
        snap = pickle.load(f)
    tmp = dst + ".tmp"
    with open(tmp, "w") as f:
        json.dump(convert(snap), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, dst)


if __name__ == "__main__":
    main()
