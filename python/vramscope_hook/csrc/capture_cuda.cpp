// CUDA side of the capture shim: the caching allocator's own trace (every alloc, free and
// segment event, OOMs), its counters, and PyTorch's snapshot. Compiled whenever libtorch has
// CUDA (VS_WITH_CUDA), which is every CI run; it only runs where a GPU is present.
#include "capture.h"

#include <cstdlib>
#include <cstring>
#include <string>

#ifdef VS_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/cuda/memory_snapshot.h>
#include <cuda_runtime_api.h>

namespace cca = c10::cuda::CUDACachingAllocator;
#endif

extern "C" {

struct VsCudaStats {
  uint64_t allocated;
  uint64_t allocated_peak;
  uint64_t reserved;
  uint64_t reserved_peak;
  uint64_t active;
  uint64_t requested;
  uint64_t num_ooms;
};

void vs_free(void* p) { std::free(p); }

#ifdef VS_WITH_CUDA

int vs_cuda_compiled() { return 1; }

// The CUDA runtime this shim was compiled against ("13.0"), for bug reports.
const char* vs_cuda_version() {
  static const std::string v =
      std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
  return v.c_str();
}

// Starts forwarding the caching allocator's trace into the event buffer. With
// `history_entries` > 0 PyTorch also keeps its own trace ring (for its snapshot).
int vs_cuda_attach(int64_t history_entries) {
  return vs::guard([&] {
    cca::attachAllocatorTraceTracker([](const cca::TraceEntry& te) {
      if (!vs::capture_enabled()) return;
      vs::record(static_cast<uint8_t>(te.action_), static_cast<uint64_t>(te.addr_),
                 static_cast<uint64_t>(te.size_),
                 static_cast<int64_t>(reinterpret_cast<uintptr_t>(te.stream_)),
                 static_cast<uint8_t>(te.device_));
    });
    // Called without the allocator's lock, so the host may take PyTorch's snapshot in it.
    cca::attachOutOfMemoryObserver([](int64_t, size_t allocated, size_t, size_t) {
      vs::report_oom(static_cast<uint64_t>(allocated));
    });
    if (history_entries > 0) {
      torch::cuda::_record_memory_history(true, true, history_entries, true, false);
    }
  });
}

int vs_cuda_stats(int device, VsCudaStats* out) {
  return vs::guard([&] {
    const auto s = cca::getDeviceStats(static_cast<c10::DeviceIndex>(device));
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out->allocated = static_cast<uint64_t>(s.allocated_bytes[agg].current);
    out->allocated_peak = static_cast<uint64_t>(s.allocated_bytes[agg].peak);
    out->reserved = static_cast<uint64_t>(s.reserved_bytes[agg].current);
    out->reserved_peak = static_cast<uint64_t>(s.reserved_bytes[agg].peak);
    out->active = static_cast<uint64_t>(s.active_bytes[agg].current);
    out->requested = static_cast<uint64_t>(s.requested_bytes[agg].current);
    out->num_ooms = static_cast<uint64_t>(s.num_ooms);
  });
}

int vs_cuda_reset_peaks(int device) {
  return vs::guard([&] { cca::resetPeakStats(static_cast<c10::DeviceIndex>(device)); });
}

int vs_cuda_empty_cache() {
  return vs::guard([] { cca::emptyCache(); });
}

// PyTorch's own snapshot pickle (segments and blocks as the real allocator holds them).
// The caller frees `*out` with vs_free.
int vs_cuda_snapshot(char** out, size_t* len) {
  return vs::guard([&] {
    const std::string s = torch::cuda::_memory_snapshot_pickled();
    *out = static_cast<char*>(std::malloc(s.size()));
    if (*out == nullptr) throw std::bad_alloc();
    std::memcpy(*out, s.data(), s.size());
    *len = s.size();
  });
}

#else  // libtorch without CUDA: the same entry points, each saying why it cannot work.

static int no_cuda() {
  vs::set_error("this build's libtorch has no CUDA");
  return -1;
}
int vs_cuda_compiled() { return 0; }
const char* vs_cuda_version() { return ""; }
int vs_cuda_attach(int64_t) { return no_cuda(); }
int vs_cuda_stats(int, VsCudaStats*) { return no_cuda(); }
int vs_cuda_reset_peaks(int) { return no_cuda(); }
int vs_cuda_empty_cache() { return no_cuda(); }
int vs_cuda_snapshot(char**, size_t*) { return no_cuda(); }

#endif

}  // extern "C"
