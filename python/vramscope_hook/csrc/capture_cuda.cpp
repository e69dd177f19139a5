// CUDA side of the capture shim: the caching allocator's own trace (every alloc, free and
// segment event, OOMs), its counters, and PyTorch's snapshot. Compiled whenever libtorch has
// CUDA (VS_WITH_CUDA), which is every CI run; it only runs where a GPU is present.
#include "capture.h"

#include <atomic>
#include <cstdio>
#include <dlfcn.h>
#include <cstdlib>
#include <stdexcept>
#include <cstring>
#include <string>

#ifdef VS_WITH_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/csrc/cuda/memory_snapshot.h>
#include <cuda_runtime_api.h>

namespace cca = c10::cuda::CUDACachingAllocator;

namespace {
// Parts of libtorch that came and went across the versions a job may bring (2.1 on): each
// is detected on the type, not by version number, and the fallback says what is missing.

// The allocator's trace hooks (torch 2.2 on). `tracker` is a generic lambda, so its body
// (which reads TraceEntry fields 2.1 does not have) is compiled only where this is chosen.
template <class A, class T>
auto attach_tracker(A* a, T tracker, int) -> decltype(a->attachAllocatorTraceTracker(tracker), bool()) {
  a->attachAllocatorTraceTracker(std::move(tracker));
  return true;
}
template <class A, class T>
bool attach_tracker(A*, T, long) {
  return false;
}

// Requests refused before cudaMalloc is tried (throw_on_cudamalloc_oom, 2.13 on).
template <class A, class O>
auto attach_rejection(A* a, O observer, int) -> decltype(a->attachOomRejectionObserver(observer), void()) {
  a->attachOomRejectionObserver(std::move(observer));
}
template <class A, class O>
void attach_rejection(A*, O, long) {}

template <class C>
auto lazy_init_cuda(C& c, int) -> decltype(c.lazyInitDevice(c10::DeviceType::CUDA), void()) {
  c.lazyInitDevice(c10::DeviceType::CUDA);
}
template <class C>
void lazy_init_cuda(C& c, long) {
  c.lazyInitCUDA();  // before the device-generic call
}
}  // namespace
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

// Lazy CUDA init, as the first CUDA tensor would do it: makes the caching allocator's
// per-device allocators, which trackers attach to. Creates no context.
int vs_cuda_init() {
  return vs::guard([] { lazy_init_cuda(at::globalContext(), 0); });
}

// Why the caching allocator cannot be traced now, or null when it can.
static const char* untraceable() {
  cca::CUDAAllocator* a = cca::get();
  if (a == nullptr) return "libtorch has no CUDA allocator";
  // cudaMallocAsync throws from attachAllocatorTraceTracker: it keeps no trace.
  if (a->name() == "cudaMallocAsync") {
    return "PYTORCH_CUDA_ALLOC_CONF selects backend:cudaMallocAsync, which has no trace hooks: "
           "vramscope shows the device's own readings only";
  }
  // NativeCachingAllocator forwards trackers to the per-device allocators that exist when
  // they are attached; before lazy CUDA init there are none, and init does not replay them.
  if (!a->initialized()) {
    return "CUDA's caching allocator is not initialised yet (attach after the job's first "
           "CUDA use: trackers attached earlier see nothing)";
  }
  return nullptr;
}

// Starts forwarding the caching allocator's trace into the event buffer, for every
// device. Only once lazy CUDA init has made the allocators (see `untraceable`); a second
// call does nothing.
int vs_cuda_attach() {
  static std::atomic<bool> attached{false};
  if (attached.load()) return 0;
  return vs::guard([&] {
    if (const char* why = untraceable()) throw std::runtime_error(why);
    // Under the allocator's lock: never throws, never calls back into Python.
    const bool traced = attach_tracker(cca::get(), [](const auto& te) noexcept {
      if (!vs::capture_enabled()) return;
      vs::record(static_cast<uint8_t>(te.action_), static_cast<uint64_t>(te.addr_),
                 static_cast<uint64_t>(te.size_),
                 static_cast<int64_t>(reinterpret_cast<uintptr_t>(te.stream_)),
                 static_cast<uint8_t>(te.device_));
    }, 0);
    if (!traced) throw std::runtime_error("torch " TORCH_VERSION " has no allocator trace hooks (torch 2.2 on has)");
    // Called without the allocator's lock, so the host may take PyTorch's snapshot in it.
    cca::attachOutOfMemoryObserver([](int64_t device, size_t allocated, size_t, size_t) {
      vs::report_oom(static_cast<uint8_t>(device), static_cast<uint64_t>(allocated));
    });
    // 2.13 may refuse a request before trying cudaMalloc (throw_on_cudamalloc_oom); that
    // is an OOM to the job too, said by its own observer.
    attach_rejection(cca::get(), [](int64_t device, size_t alloc_size, size_t, size_t) {
      vs::report_oom(static_cast<uint8_t>(device), static_cast<uint64_t>(alloc_size));
    }, 0);
    attached.store(true);
  });
}

// The PCI bus id of CUDA device `device`, as NVML writes it ("00000000:3B:00.0"): how a
// CUDA ordinal (renumbered by CUDA_VISIBLE_DEVICES) finds its NVML readings, as PyTorch
// does. The runtime's own call, whose signature no CUDA version changes, found in the
// runtime libtorch already loaded (linking one would pin a CUDA version).
int vs_cuda_pci_bus_id(int device, char* out, size_t len) {
  return vs::guard([&] {
    using PciBusId = int (*)(char*, int, int);
    void* f = dlsym(RTLD_DEFAULT, "cudaDeviceGetPCIBusId");
    for (const char* so : {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"}) {
      if (f != nullptr) break;
      if (void* h = dlopen(so, RTLD_NOW | RTLD_NOLOAD)) f = dlsym(h, "cudaDeviceGetPCIBusId");
    }
    if (f == nullptr) throw std::runtime_error("the CUDA runtime is not loaded");
    char id[32] = {0};
    const int e = reinterpret_cast<PciBusId>(f)(id, static_cast<int>(sizeof id), device);
    if (e != 0) throw std::runtime_error("cudaDeviceGetPCIBusId failed with error " + std::to_string(e));
    unsigned domain = 0, bus = 0, dev = 0;
    if (std::sscanf(id, "%x:%x:%x", &domain, &bus, &dev) != 3) throw std::runtime_error(id);
    std::snprintf(out, len, "%08X:%02X:%02X.0", domain, bus, dev);
  });
}

// PyTorch keeps its own trace ring of `entries` (for its snapshot, the selftest's
// comparison).
int vs_cuda_record_history(int64_t entries) {
  return vs::guard([&] { torch::cuda::_record_memory_history(true, true, entries, true, false); });
}

int vs_cuda_stats(int device, VsCudaStats* out) {
  return vs::guard([&] {
    const auto s = cca::getDeviceStats(static_cast<c10::DeviceIndex>(device));
    const size_t agg = 0;  // StatType::AGGREGATE, in c10::CachingAllocator or (before 2.3) cca
    out->allocated = static_cast<uint64_t>(s.allocated_bytes[agg].current);
    out->allocated_peak = static_cast<uint64_t>(s.allocated_bytes[agg].peak);
    out->reserved = static_cast<uint64_t>(s.reserved_bytes[agg].current);
    out->reserved_peak = static_cast<uint64_t>(s.reserved_bytes[agg].peak);
    out->active = static_cast<uint64_t>(s.active_bytes[agg].current);
    out->requested = static_cast<uint64_t>(s.requested_bytes[agg].current);
    out->num_ooms = static_cast<uint64_t>(s.num_ooms);
  });
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
  vs::set_error(
      "this capture shim was built without CUDA (libtorch without CUDA, or no CUDA headers "
      "at build time: pip install nvidia-cuda-runtime nvidia-cuda-crt, or set CUDA_HOME)");
  return -1;
}
int vs_cuda_compiled() { return 0; }
const char* vs_cuda_version() { return ""; }
int vs_cuda_attach() { return no_cuda(); }
int vs_cuda_record_history(int64_t) { return no_cuda(); }
int vs_cuda_pci_bus_id(int, char*, size_t) { return no_cuda(); }
int vs_cuda_stats(int, VsCudaStats*) { return no_cuda(); }
int vs_cuda_init() { return no_cuda(); }
int vs_cuda_empty_cache() { return no_cuda(); }
int vs_cuda_snapshot(char**, size_t*) { return no_cuda(); }

#endif

}  // extern "C"
