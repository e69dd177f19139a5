// CUDA side of the capture shim: the caching allocator's own trace (every alloc, free and
// segment event, OOMs), its counters, and PyTorch's snapshot. Compiled whenever libtorch has
// CUDA (VS_WITH_CUDA), which is every CI run; it only runs where a GPU is present.
#include "capture.h"

#include <cstdlib>
#include <cstring>
#include <string>

#ifdef VS_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/cuda/memory_snapshot.h>

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

int vs_cuda_compiled() {
#ifdef VS_WITH_CUDA
  return 1;
#else
  return 0;
#endif
}

// Starts forwarding the caching allocator's trace into the event buffer. With
// `history_entries` > 0 PyTorch also keeps its own trace ring (for its snapshot).
int vs_cuda_attach(int64_t history_entries) {
#ifdef VS_WITH_CUDA
  try {
    cca::attachAllocatorTraceTracker([](const cca::TraceEntry& te) {
      if (!vs::capture_enabled()) return;
      vs::record(static_cast<uint8_t>(te.action_), static_cast<uint64_t>(te.addr_),
                 static_cast<uint64_t>(te.size_),
                 static_cast<int64_t>(reinterpret_cast<uintptr_t>(te.stream_)),
                 static_cast<uint8_t>(te.device_));
    });
    if (history_entries > 0) {
      torch::cuda::_record_memory_history(true, true, history_entries, true, false);
    }
    return 0;
  } catch (const std::exception& e) {
    vs::set_error(e.what());
    return -1;
  }
#else
  (void)history_entries;
  vs::set_error("this build's libtorch has no CUDA");
  return -1;
#endif
}

int vs_cuda_stats(int device, VsCudaStats* out) {
#ifdef VS_WITH_CUDA
  try {
    const auto s = cca::getDeviceStats(static_cast<c10::DeviceIndex>(device));
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out->allocated = static_cast<uint64_t>(s.allocated_bytes[agg].current);
    out->allocated_peak = static_cast<uint64_t>(s.allocated_bytes[agg].peak);
    out->reserved = static_cast<uint64_t>(s.reserved_bytes[agg].current);
    out->reserved_peak = static_cast<uint64_t>(s.reserved_bytes[agg].peak);
    out->active = static_cast<uint64_t>(s.active_bytes[agg].current);
    out->requested = static_cast<uint64_t>(s.requested_bytes[agg].current);
    out->num_ooms = static_cast<uint64_t>(s.num_ooms);
    return 0;
  } catch (const std::exception& e) {
    vs::set_error(e.what());
    return -1;
  }
#else
  (void)device;
  (void)out;
  vs::set_error("this build's libtorch has no CUDA");
  return -1;
#endif
}

int vs_cuda_reset_peaks(int device) {
#ifdef VS_WITH_CUDA
  try {
    cca::resetPeakStats(static_cast<c10::DeviceIndex>(device));
    return 0;
  } catch (const std::exception& e) {
    vs::set_error(e.what());
    return -1;
  }
#else
  (void)device;
  vs::set_error("this build's libtorch has no CUDA");
  return -1;
#endif
}

int vs_cuda_empty_cache() {
#ifdef VS_WITH_CUDA
  try {
    cca::emptyCache();
    return 0;
  } catch (const std::exception& e) {
    vs::set_error(e.what());
    return -1;
  }
#else
  vs::set_error("this build's libtorch has no CUDA");
  return -1;
#endif
}

// PyTorch's own snapshot pickle (segments and blocks as the real allocator holds them).
// The caller frees `*out` with vs_free.
int vs_cuda_snapshot(char** out, size_t* len) {
#ifdef VS_WITH_CUDA
  try {
    const std::string s = torch::cuda::_memory_snapshot_pickled();
    *out = static_cast<char*>(std::malloc(s.size()));
    if (*out == nullptr) {
      vs::set_error("out of host memory for the snapshot");
      return -1;
    }
    std::memcpy(*out, s.data(), s.size());
    *len = s.size();
    return 0;
  } catch (const std::exception& e) {
    vs::set_error(e.what());
    return -1;
  }
#else
  (void)out;
  (void)len;
  vs::set_error("this build's libtorch has no CUDA");
  return -1;
#endif
}

void vs_free(void* p) { std::free(p); }

}  // extern "C"
