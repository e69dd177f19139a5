// CPU side of the capture shim: an allocator that wraps libtorch's default CPU allocator
// and records every allocation and free, the event buffer, step/phase/scope tags, and
// CPU bf16 autocast (tch's autocast only covers CUDA).
#include "capture.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <c10/core/CPUAllocator.h>
#include <torch/headeronly/version.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace {
std::mutex g_mu;
std::vector<VsRawEvent> g_buf;
std::atomic<uint32_t> g_step{0};
std::atomic<uint32_t> g_scope{0};
std::atomic<uint8_t> g_phase{0};
std::atomic<bool> g_enabled{true};
const auto g_t0 = std::chrono::steady_clock::now();
thread_local std::string g_error;
std::atomic<void (*)(uint64_t)> g_oom_callback{nullptr};

c10::Allocator* g_inner = nullptr;
c10::DeleterFnPtr g_inner_delete = nullptr;

void vs_cpu_delete(void* p) {
  if (vs::capture_enabled()) vs::record(2, reinterpret_cast<uint64_t>(p), 0, 0, 0xff);
  g_inner_delete(p);
}

// Delegates to the default allocator (keeping its alignment, profiling hooks and
// fill options) and swaps in a deleter that reports the free first.
struct RecordingCpuAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr dp;
    try {
      dp = g_inner->allocate(n);
    } catch (...) {
      // Said before the error reaches the training code, like CUDA's OOM observer.
      if (vs::capture_enabled()) vs::record(8, 0, n, 0, 0xff);
      vs::report_oom(n);
      throw;
    }
    void* p = dp.get();
    // Zero-byte requests and any pointer whose context is not the data itself keep the
    // inner deleter: we could not free them correctly through ours.
    if (p == nullptr || dp.get_context() != p || dp.get_deleter() != g_inner_delete) return dp;
    if (!dp.compare_exchange_deleter(g_inner_delete, &vs_cpu_delete)) return dp;
    if (vs::capture_enabled()) vs::record(0, reinterpret_cast<uint64_t>(p), n, 0, 0xff);
    return dp;
  }
  c10::DeleterFnPtr raw_deleter() const override { return &vs_cpu_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

RecordingCpuAllocator g_recording;
}  // namespace

namespace vs {
void record(uint8_t action, uint64_t addr, uint64_t size, int64_t stream, uint8_t device) {
  VsRawEvent e{};
  e.t_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now() - g_t0)
                                     .count());
  e.addr = addr;
  e.size = size;
  e.stream = stream;
  e.step = g_step.load(std::memory_order_relaxed);
  e.scope = g_scope.load(std::memory_order_relaxed);
  e.phase = g_phase.load(std::memory_order_relaxed);
  e.action = action;
  e.device = device;
  std::lock_guard<std::mutex> lock(g_mu);
  g_buf.push_back(e);
}
bool capture_enabled() { return g_enabled.load(std::memory_order_relaxed); }
void set_error(const char* msg) { g_error = msg; }
void report_oom(uint64_t size) {
  if (auto cb = g_oom_callback.load()) cb(size);
}
}  // namespace vs

extern "C" {

// Installs the recording CPU allocator. Must run before any tensor the session cares about
// is created: tensors allocated earlier keep the old deleter and their frees go unseen.
int vs_install_cpu_allocator() {
  if (g_inner != nullptr) return 0;
  return vs::guard([] {
    c10::Allocator* inner = c10::GetDefaultCPUAllocator();
    if (inner->raw_deleter() == nullptr) {
      throw std::runtime_error("default CPU allocator has no raw deleter");
    }
    g_inner_delete = inner->raw_deleter();
    g_inner = inner;
    g_buf.reserve(1 << 16);
    c10::SetCPUAllocator(&g_recording, /*priority=*/10);
  });
}

void vs_set_tags(uint32_t step, uint8_t phase) {
  g_step.store(step, std::memory_order_relaxed);
  g_phase.store(phase, std::memory_order_relaxed);
}

void vs_set_scope(uint32_t scope) { g_scope.store(scope, std::memory_order_relaxed); }

void vs_set_capture_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }

// The host's out-of-memory callback (null: none).
void vs_set_oom_callback(void (*cb)(uint64_t)) { g_oom_callback.store(cb); }

// CLOCK_MONOTONIC nanoseconds at this clock's zero (steady_clock is CLOCK_MONOTONIC on
// Linux), so processes line their clocks up.
uint64_t vs_clock_zero_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(g_t0.time_since_epoch()).count());
}

uint64_t vs_now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now() - g_t0)
                                   .count());
}

// Moves up to `cap` buffered events into `out`; returns how many. Oldest first.
size_t vs_drain(VsRawEvent* out, size_t cap) {
  std::lock_guard<std::mutex> lock(g_mu);
  size_t n = g_buf.size() < cap ? g_buf.size() : cap;
  std::memcpy(out, g_buf.data(), n * sizeof(VsRawEvent));
  g_buf.erase(g_buf.begin(), g_buf.begin() + static_cast<std::ptrdiff_t>(n));
  return n;
}

size_t vs_pending() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_buf.size();
}

// device_type: 0 = CPU, 1 = CUDA. Mirrors Python's `torch.autocast.__enter__/__exit__`.
int vs_autocast(int device_type, bool enabled) {
  return vs::guard([&] {
    const auto dev = device_type == 1 ? at::kCUDA : at::kCPU;
    if (enabled) {
      at::autocast::set_autocast_dtype(dev, at::kBFloat16);
      at::autocast::set_autocast_enabled(dev, true);
      at::autocast::increment_nesting();
    } else {
      at::autocast::set_autocast_enabled(dev, false);
      // Cached low-precision weight copies must not outlive the region, or the next
      // step reads stale weights.
      if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    }
  });
}

// optimizer.zero_grad(set_to_none=True): drops the gradient tensor so its memory is freed,
// which tch's zero_grad (zero in place) does not do. `t` is tch's `torch::Tensor*`.
void vs_clear_grad(at::Tensor* t) { t->mutable_grad().reset(); }

const char* vs_last_error() { return g_error.c_str(); }

// The libtorch this shim was compiled against ("2.13.0"), for bug reports.
const char* vs_torch_version() { return TORCH_VERSION; }

}  // extern "C"
