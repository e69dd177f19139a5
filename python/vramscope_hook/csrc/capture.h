// Shared event buffer of the capture shim. Producers: the CPU allocator wrapper
// (capture_cpu.cpp) and the CUDA caching allocator's trace tracker (capture_cuda.cpp).
#pragma once
#include <cstdint>
#include <cstddef>

extern "C" {
// Same layout as `capture::RawEvent` in Rust.
struct VsRawEvent {
  uint64_t t_ns;
  uint64_t addr;
  uint64_t size;
  int64_t stream;
  uint32_t step;
  uint32_t scope;
  uint8_t action;  // c10 TraceEntry::Action numbering; the CPU wrapper uses 0 alloc, 2 free, 8 oom
  uint8_t phase;
  uint8_t device;  // 0xff = CPU
  uint8_t pad0;
  uint32_t pad1;
};
}

#include <exception>

// The torch the shim is compiled against: the engine's 2.13, or a job's own, 2.1 on.
// torch/version.h moved beside the header-only API in newer versions.
#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#else
#include <torch/version.h>
#endif
#define VS_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace vs {
// Appends one event tagged with the current step/phase/scope. Cheap; called from
// allocator paths (any thread, CUDA's under the allocator's lock), so it only takes a
// short mutex, never throws, and drops (and counts) what does not fit the bounded buffer.
void record(uint8_t action, uint64_t addr, uint64_t size, int64_t stream, uint8_t device) noexcept;
bool capture_enabled();
void set_error(const char* msg);
// Tells the host an allocation of `size` bytes on `device` (0xff: CPU) failed, before the
// error unwinds: it saves a snapshot while the memory that did not fit is still held.
void report_oom(uint8_t device, uint64_t size) noexcept;

// Runs `f`, turning a C++ exception into -1 and a message for `vs_last_error`: exceptions
// must not cross into Rust.
template <class F>
int guard(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
    return -1;
  }
}
}  // namespace vs
