"""CUDA memory from PyTorch's own memory history, where the capture shim cannot follow the
caching allocator (built without CUDA headers, or not built at all).

PyTorch records the allocator's trace itself once `torch.cuda.memory._record_memory_history`
is on (no stacks: the cheapest setting). At every phase boundary the trace is read with
`torch.cuda.memory._snapshot()`, handed to vramscope's core, and cleared by turning the
history off and on again, so each read costs what happened since the last one. The first
read also hands over what was allocated before recording began. What is lost against the
shim: each phase's events arrive at its end (the screen moves phase by phase, not
allocation by allocation), an allocation made by another thread between a read and the
restart, and a job that records its own history has it restarted under it.
"""

import ctypes
import pickle

# c10's TraceEntry::Action numbering (what the shim's tracker forwards).
_ACTIONS = {
    "alloc": 0,
    "free_requested": 1,
    "free_completed": 2,
    "segment_alloc": 3,
    "segment_free": 4,
    "segment_map": 5,
    "segment_unmap": 6,
    "snapshot": 7,
    "oom": 8,
}
# Entries PyTorch keeps between two reads: a phase with more allocations than this loses
# its oldest (counted as dropped).
MAX_ENTRIES = 200_000


class Entry(ctypes.Structure):
    """hook/src/history.rs's HistoryEntry."""

    _fields_ = [
        ("time_us", ctypes.c_int64),
        ("addr", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("stream", ctypes.c_int64),
        ("action", ctypes.c_uint8),
        ("device", ctypes.c_uint8),
    ]


class Stats(ctypes.Structure):
    """vramscope_core's CudaStats."""

    _fields_ = [(name, ctypes.c_uint64) for name in ("allocated", "allocated_peak", "reserved", "reserved_peak", "active", "requested", "num_ooms")]


SNAPSHOT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t))


def entries_of(snapshot, first):
    """The trace entries of `snapshot` as (device, action, addr, size, stream, time_us),
    oldest first; with `first`, preceded by what was live before the history began: each
    segment, then each block in use."""
    out = []
    if first:
        for seg in snapshot.get("segments", []):
            device = seg.get("device", 0)
            stream = seg.get("stream", 0)
            out.append((device, _ACTIONS["segment_alloc"], seg["address"], seg["total_size"], stream, 0))
            addr = seg["address"]
            for block in seg.get("blocks", []):
                if block.get("state") == "active_allocated":
                    # What the job asked for, as the trace's later free says it (the block's
                    # size is rounded up): else its active bytes stay overstated.
                    requested = block.get("requested_size") or block["size"]
                    out.append((device, _ACTIONS["alloc"], addr, requested, stream, 0))
                addr += block["size"]
    for device, trace in enumerate(snapshot.get("device_traces", [])):
        for e in trace:
            action = _ACTIONS.get(e.get("action"))
            if action is not None:
                out.append((device, action, e.get("addr", 0), e.get("size", 0), e.get("stream", 0), e.get("time_us", 0)))
    return out


def stats_of(memory_stats):
    """vramscope's counters from `torch.cuda.memory_stats(device)`."""
    g = lambda key: int(memory_stats.get(key, 0))  # noqa: E731
    return Stats(
        g("allocated_bytes.all.current"),
        g("allocated_bytes.all.peak"),
        g("reserved_bytes.all.current"),
        g("reserved_bytes.all.peak"),
        g("active_bytes.all.current"),
        g("requested_bytes.all.current"),
        g("num_ooms"),
    )


def _bus_id(props):
    """NVML's spelling of a device's PCI address ("00000000:3B:00.0"), where torch knows it."""
    try:
        return f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
    except AttributeError:
        return None


class History:
    def __init__(self, torch, core):
        self.torch = torch
        self.core = core
        self.first = True
        self.devices = set()
        self.pickled = None  # the last snapshot handed to the core, alive until the next
        self.snapshot_fn = SNAPSHOT_FN(self._snapshot)

    def _record(self, on):
        memory = self.torch.cuda.memory
        if on:
            memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=MAX_ENTRIES)
        else:
            memory._record_memory_history(enabled=None)

    def start(self, why):
        """Turns the core over to CUDA (the job's CPU tensors are not device memory) and the
        history on; raises where this torch cannot record one."""
        if self.core.vsh_history_start(self.snapshot_fn, why.encode()) != 0:
            raise RuntimeError(self.core.vsh_last_error().decode())
        self._record(True)

    def stop(self):
        """Turns the history off (the hook is leaving the job)."""
        self._record(False)

    def read(self):
        """Hands the core what happened since the last read (call at a phase boundary)."""
        cuda = self.torch.cuda
        snapshot = cuda.memory._snapshot()
        # Off and on again: the trace starts empty for the next read.
        self._record(False)
        self._record(True)
        entries = entries_of(snapshot, self.first)
        self.first = False
        if entries:
            arr = (Entry * len(entries))(*(Entry(t, a, s, st, act, d) for d, act, a, s, st, t in entries))
            self.core.vsh_history_push(arr, len(entries))
        traces = snapshot.get("device_traces", [])
        for device in {e[0] for e in entries} | self.devices:
            if device not in self.devices:
                self.devices.add(device)
                bus = _bus_id(cuda.get_device_properties(device))
                if bus:
                    self.core.vsh_history_bus_id(device, bus.encode())
            full = device < len(traces) and len(traces[device]) >= MAX_ENTRIES
            self.core.vsh_history_stats(device, ctypes.byref(stats_of(cuda.memory_stats(device))), 1 if full else 0)

    def _snapshot(self, out_ptr, out_len):
        # Called by the core, on the job's thread, when a snapshot is cut.
        try:
            self.pickled = pickle.dumps(self.torch.cuda.memory._snapshot())
            out_ptr[0] = ctypes.cast(ctypes.c_char_p(self.pickled), ctypes.c_void_p).value
            out_len[0] = len(self.pickled)
            return 0
        except Exception:
            return -1
