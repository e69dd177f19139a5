"""A CUDA torch's memory history and counters, faked for machines without a GPU: what the
hook reads where the capture shim cannot follow the caching allocator, and what an attach
learns from PyTorch's snapshot. Device 0 already holds a 2 MiB segment with 512 KiB in use."""

import time

import torch

MIB = 1 << 20


class FakeCudaMemory:
    """PyTorch's memory history and counters as a CUDA torch reports them, for a device 0
    that already holds a 2 MiB segment with 512 KiB in use when the history begins."""

    BASE = 0x7F00_0000_0000

    def __init__(self):
        self.pending = []
        self.recording = None
        self.calls = []
        self.segments = [{"device": 0, "address": 0x7E00_0000_0000, "total_size": 2 * MIB, "stream": 0,
                          "blocks": [{"size": MIB // 2, "state": "active_allocated"}, {"size": 3 * MIB // 2, "state": "inactive"}]}]
        self.allocated, self.reserved = MIB // 2, 2 * MIB

    def emit(self, action, offset, size):
        addr = self.BASE + offset
        if action == "segment_alloc":
            self.reserved += size
        elif action == "alloc":
            self.allocated += size
        elif action == "free_completed":
            self.allocated -= size
        if self.recording:
            self.pending.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": time.time_ns() // 1000})

    def free(self, offset, size):
        self.emit("free_requested", offset, size)
        self.emit("free_completed", offset, size)

    def _record_memory_history(self, enabled="all", context="all", stacks="all", max_entries=0):
        self.calls.append({"enabled": enabled, "context": context, "max_entries": max_entries})
        self.recording = enabled
        self.pending = []  # as c10 does: turning it off clears the trace

    def _snapshot(self):
        return {"segments": self.segments, "device_traces": [list(self.pending)]}

    def memory_stats(self, device=0):
        return {"allocated_bytes.all.current": self.allocated, "reserved_bytes.all.current": self.reserved,
                "active_bytes.all.current": self.allocated, "requested_bytes.all.current": self.allocated}


def install():
    """Makes torch look like a CUDA build on a GPU machine that initialised CUDA already."""
    fake = FakeCudaMemory()
    torch.cuda.is_available = lambda: True
    torch.cuda.is_initialized = lambda: True
    torch.cuda._lazy_call = lambda fn, **kw: fn()
    torch.cuda.memory._record_memory_history = fake._record_memory_history
    torch.cuda.memory._snapshot = fake._snapshot
    torch.cuda.memory_stats = fake.memory_stats
    torch.cuda.get_device_properties = lambda d: type("P", (), {"pci_domain_id": 0, "pci_bus_id": 0x3B, "pci_device_id": 0})()
    return fake
