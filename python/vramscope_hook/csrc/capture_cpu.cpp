// CPU side of the capture shim: an allocator that wraps libtorch's default CPU allocator
// and records every allocation and free, the event buffer, step/phase/scope tags, and
// CPU bf16 autocast (tch's autocast only covers CUDA).
#include "capture.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/variable.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <pthread.h>
#include <stdexcept>
#include <string>
#include <vector>

extern "C" void vs_after_fork_in_child();

namespace {
// Events waiting for the host's drain. At most this many are held (48 MiB): past it new
// events are dropped and counted, so a host that stops draining (a forked child, a stuck
// viewer) never grows the job's memory without bound.
constexpr size_t kMaxPending = size_t{1} << 20;
// `vs_mark`'s phase, tag and step-end records (the Rust side's RAW_MARK_PHASE,
// RAW_MARK_TAG, RAW_MARK_STEP_END).
constexpr uint8_t kMarkPhase = 0x80;
constexpr uint8_t kMarkTag = 0x81;
constexpr uint8_t kMarkStepEnd = 0x82;
// The phase slot's value while the host says phases only through `vs_mark`.
constexpr uint8_t kPhasesByMark = 0xff;

struct Buffer {
  std::mutex mu;
  std::vector<VsRawEvent> events;
  uint64_t dropped = 0;
  // The phase the last phase record said, and the step the next one made here belongs to
  // (after a step's end, the next step's).
  uint8_t phase_marked = 0;
  uint32_t mark_step = 0;
};

// Never destroyed: allocator callbacks (CUDA's cache being released, CPU tensors freed by
// other static destructors) can still arrive while the process's statics are torn down.
Buffer& buffer() {
  static Buffer* b = [] {
    auto* fresh = new Buffer();
    fresh->events.reserve(1 << 16);
    // A fork while another thread holds the mutex would leave it locked forever in the
    // child: hold it across fork, and in the child stop recording (it has no host to drain).
    pthread_atfork([] { buffer().mu.lock(); }, [] { buffer().mu.unlock(); },
                   [] {
                     buffer().mu.unlock();
                     vs_after_fork_in_child();
                   });
    return fresh;
  }();
  return *b;
}

std::atomic<uint32_t> g_step{0};
std::atomic<uint32_t> g_scope{0};
std::atomic<uint8_t> g_phase{0};
// The phase a host writes in place (`vs_phase_slot`) while it says phases in band: its
// thread stores a byte at each boundary instead of calling in (issue 35: a Python hook's
// call through ctypes costs microseconds inside a step), and the first event or record
// after a change is preceded by the phase's record, stamped with that event's time.
std::atomic<uint8_t> g_phase_wanted{kPhasesByMark};
// A tensor a host names in place (`vs_tag_slot`) while it says phases in band, in one word
// its thread stores instead of calling in: the address in the low 48 bits, the category in
// the next 4, the interned name in the top 12 (0: none waits). Recorded as a tag before
// the next record, then cleared; a host finding it still set calls in instead.
std::atomic<uint64_t> g_tag_wanted{0};
std::atomic<bool> g_enabled{true};
// Whether the CPU wrapper records: off until installed, and again once removed (a CUDA
// job, a failed start, a forked child), while tensors made through it still free through it.
std::atomic<bool> g_cpu_recording{false};
const auto g_t0 = std::chrono::steady_clock::now();

uint64_t since_t0_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - g_t0).count());
}
thread_local std::string g_error;
std::atomic<void (*)(uint8_t, uint64_t)> g_oom_callback{nullptr};

c10::Allocator* g_inner = nullptr;
c10::DeleterFnPtr g_inner_delete = nullptr;
constexpr int kPriority = 10;

bool cpu_recording() { return g_cpu_recording.load(std::memory_order_relaxed) && vs::capture_enabled(); }

void vs_cpu_delete(void* p) {
  if (cpu_recording()) vs::record(2, reinterpret_cast<uint64_t>(p), 0, 0, 0xff);
  g_inner_delete(p);
}

// Delegates to the default allocator (keeping its alignment, profiling hooks and
// fill options) and swaps in a deleter that reports the free first.
struct RecordingCpuAllocator final : c10::Allocator {
#if VS_TORCH_AT_LEAST(2, 3)
  c10::DataPtr allocate(size_t n) override {
#else  // const before 2.3
  c10::DataPtr allocate(size_t n) const override {
#endif
    c10::DataPtr dp;
    try {
      dp = g_inner->allocate(n);
    } catch (...) {
      // Said before the error reaches the training code, like CUDA's OOM observer.
      if (cpu_recording()) {
        vs::record(8, 0, n, 0, 0xff);
        vs::report_oom(0xff, n);
      }
      throw;
    }
    void* p = dp.get();
    // Zero-byte requests and any pointer whose context is not the data itself keep the
    // inner deleter: we could not free them correctly through ours.
    if (p == nullptr || dp.get_context() != p || dp.get_deleter() != g_inner_delete) return dp;
    if (!dp.compare_exchange_deleter(g_inner_delete, &vs_cpu_delete)) return dp;
    if (cpu_recording()) vs::record(0, reinterpret_cast<uint64_t>(p), n, 0, 0xff);
    return dp;
  }
  c10::DeleterFnPtr raw_deleter() const override { return &vs_cpu_delete; }
#if VS_TORCH_AT_LEAST(2, 3)
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
};

RecordingCpuAllocator g_recording;

// Appends `e` whatever the bound: a host's record is never dropped (a lost boundary would
// put every later event in the wrong phase).
void push_record(Buffer& b, const VsRawEvent& e) noexcept {
  try {
    b.events.push_back(e);
  } catch (...) {  // bad_alloc: counted like a lost event, never thrown into the job
    ++b.dropped;
  }
}

// A phase record said by `vs_mark` or `vs_set_tags`: what is recorded next is stamped with
// it, and a host writing phases in place goes on from it. Under `b.mu`.
void phase_said(Buffer& b, uint32_t step, uint8_t phase) {
  g_step.store(step, std::memory_order_relaxed);
  g_phase.store(phase, std::memory_order_relaxed);
  b.phase_marked = phase;
  b.mark_step = step;
  if (g_phase_wanted.load(std::memory_order_relaxed) != kPhasesByMark) {
    g_phase_wanted.store(phase, std::memory_order_relaxed);
  }
}

// The phase written in place, if it changed, becomes a record at `t_ns`. Under `b.mu`.
void mark_wanted_phase(Buffer& b, uint64_t t_ns) {
  uint8_t want = g_phase_wanted.load(std::memory_order_relaxed);
  if (want == kPhasesByMark || want == b.phase_marked) return;
  VsRawEvent m{};
  m.t_ns = t_ns;
  m.action = kMarkPhase;
  m.step = b.mark_step;
  m.phase = want;
  m.device = 0xff;
  push_record(b, m);
  b.phase_marked = want;
  g_step.store(b.mark_step, std::memory_order_relaxed);
  g_phase.store(want, std::memory_order_relaxed);
}

// The tag stored in place, if any, becomes a record at `t_ns`. Under `b.mu`.
void mark_wanted_tag(Buffer& b, uint64_t t_ns) {
  if (g_tag_wanted.load(std::memory_order_relaxed) == 0) return;
  const uint64_t want = g_tag_wanted.exchange(0, std::memory_order_acquire);
  VsRawEvent m{};
  m.t_ns = t_ns;
  m.action = kMarkTag;
  m.addr = want & ((uint64_t{1} << 48) - 1);
  m.phase = static_cast<uint8_t>((want >> 48) & 0xf);
  m.scope = static_cast<uint32_t>(want >> 52);
  m.device = 0xff;
  push_record(b, m);
}

// What a host wrote in place, recorded before what comes now. Under `b.mu`.
void mark_wanted(Buffer& b, uint64_t t_ns) {
  mark_wanted_phase(b, t_ns);
  mark_wanted_tag(b, t_ns);
}
}  // namespace

namespace vs {
void record(uint8_t action, uint64_t addr, uint64_t size, int64_t stream, uint8_t device) noexcept {
  VsRawEvent e{};
  e.t_ns = since_t0_ns();
  e.addr = addr;
  e.size = size;
  e.stream = stream;
  e.scope = g_scope.load(std::memory_order_relaxed);
  e.action = action;
  e.device = device;
  Buffer& b = buffer();
  std::lock_guard<std::mutex> lock(b.mu);
  mark_wanted(b, e.t_ns);
  e.step = g_step.load(std::memory_order_relaxed);
  e.phase = g_phase.load(std::memory_order_relaxed);
  if (b.events.size() >= kMaxPending) {
    ++b.dropped;
    return;
  }
  try {
    b.events.push_back(e);
  } catch (...) {  // bad_alloc: the event is lost, never the job
    ++b.dropped;
  }
}
bool capture_enabled() { return g_enabled.load(std::memory_order_relaxed); }
void set_error(const char* msg) { g_error = msg; }
void report_oom(uint8_t device, uint64_t size) noexcept {
  if (auto cb = g_oom_callback.load()) cb(device, size);
}
}  // namespace vs

extern "C" {

// Installs the recording CPU allocator. Must run before any tensor the session cares about
// is created: tensors allocated earlier keep the old deleter and their frees go unseen.
int vs_install_cpu_allocator() {
  if (g_cpu_recording.load()) return 0;
  return vs::guard([] {
    if (g_inner == nullptr) {
      c10::Allocator* inner = c10::GetDefaultCPUAllocator();
      if (inner->raw_deleter() == nullptr) {
        throw std::runtime_error("default CPU allocator has no raw deleter");
      }
      g_inner_delete = inner->raw_deleter();
      g_inner = inner;
    }
    buffer();
    c10::SetCPUAllocator(&g_recording, kPriority);
    g_cpu_recording.store(true);
  });
}

// Puts libtorch's own CPU allocator back and stops recording CPU events (a CUDA job's CPU
// tensors are not device memory; a failed start must leave nothing behind). Tensors made
// while it was installed still free through its deleter, which then only forwards.
void vs_remove_cpu_allocator() {
  if (!g_cpu_recording.exchange(false)) return;
  c10::SetCPUAllocator(g_inner, kPriority);
}

// The CPU allocator libtorch hands out now, for the storage Python makes itself:
// `torch.UntypedStorage(n)` (a tensor's deepcopy, `TypedStorage`) asks for the default one
// by name, past the allocator set here, unless handed one.
uintptr_t vs_cpu_allocator() {
  return reinterpret_cast<uintptr_t>(c10::GetCPUAllocator());
}

// Whether the memory of the storage at `storage_impl` (a StorageImpl*, Python's
// `UntypedStorage._cdata`) came through the recording allocator, so its allocation is on
// record already: an attach learns only what was made before it (its seeds would count the
// rest twice).
bool vs_storage_recorded(uintptr_t storage_impl) {
  auto* s = reinterpret_cast<c10::StorageImpl*>(storage_impl);
  return s != nullptr && s->data_ptr().get_deleter() == &vs_cpu_delete;
}

// Whether the recording CPU allocator is the one libtorch hands out now.
bool vs_cpu_allocator_installed() {
  return g_cpu_recording.load() && c10::GetCPUAllocator() == &g_recording;
}

// Events dropped because the buffer was full (or memory ran out), since the start.
uint64_t vs_dropped() {
  Buffer& b = buffer();
  std::lock_guard<std::mutex> lock(b.mu);
  return b.dropped;
}

// In a forked child (a DataLoader worker): nothing drains the buffer there, so record
// nothing and hold nothing the parent had buffered.
void vs_after_fork_in_child() {
  g_cpu_recording.store(false);
  g_enabled.store(false);
  g_phase_wanted.store(kPhasesByMark);
  g_tag_wanted.store(0);
  g_oom_callback.store(nullptr);
  Buffer& b = buffer();
  b.events.clear();
  b.events.shrink_to_fit();
}

void vs_set_tags(uint32_t step, uint8_t phase) {
  Buffer& b = buffer();
  std::lock_guard<std::mutex> lock(b.mu);
  phase_said(b, step, phase);
}

// Appends a record of the host's own (action 0x80 and up: a phase begins, a tensor is named,
// a step ends) among the allocator's events, so the host's thread never waits while they
// are processed and they still land in order. Never dropped: a lost boundary would put
// every later event in the wrong phase. A phase mark also stamps what is recorded next.
void vs_mark(const VsRawEvent* rec) {
  VsRawEvent e = *rec;
  e.t_ns = since_t0_ns();
  Buffer& b = buffer();
  std::lock_guard<std::mutex> lock(b.mu);
  if (e.action == kMarkPhase) {
    mark_wanted_tag(b, e.t_ns);
    phase_said(b, e.step, e.phase);
  } else {
    mark_wanted(b, e.t_ns);
  }
  push_record(b, e);
  if (e.action == kMarkStepEnd) b.mark_step = e.step + 1;
}

// Phases written in place (`on`) or said only by `vs_mark` and `vs_set_tags`. A phase
// written but not yet recorded is recorded first (CUDA followed mid-phase goes on in it).
void vs_phases_in_place(bool on) {
  Buffer& b = buffer();
  std::lock_guard<std::mutex> lock(b.mu);
  if (!on) {
    mark_wanted(b, since_t0_ns());
  }
  g_phase_wanted.store(on ? b.phase_marked : kPhasesByMark, std::memory_order_relaxed);
}

// The phase slot (`g_phase_wanted`): one byte, 0xff while phases are said by mark.
uint8_t* vs_phase_slot() { return reinterpret_cast<uint8_t*>(&g_phase_wanted); }

// The tag slot (`g_tag_wanted`): one word, written only while phases are in place.
uint64_t* vs_tag_slot() { return reinterpret_cast<uint64_t*>(&g_tag_wanted); }

void vs_set_scope(uint32_t scope) { g_scope.store(scope, std::memory_order_relaxed); }

// Where the scope lives, for a host that writes it in place: a Python hook's function
// call through ctypes costs its thread microseconds inside a step (issue 35), a store none.
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free &&
                  sizeof(std::atomic<uint8_t>) == 1 && std::atomic<uint8_t>::is_always_lock_free &&
                  sizeof(std::atomic<uint64_t>) == 8 && std::atomic<uint64_t>::is_always_lock_free,
              "the scope, phase and tag slots are plain words");
uint32_t* vs_scope_slot() { return reinterpret_cast<uint32_t*>(&g_scope); }

void vs_set_capture_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }

// The host's out-of-memory callback, given the device (0xff: CPU) and the bytes asked for
// (null: none).
void vs_set_oom_callback(void (*cb)(uint8_t, uint64_t)) { g_oom_callback.store(cb); }

// CLOCK_MONOTONIC nanoseconds at this clock's zero (steady_clock is CLOCK_MONOTONIC on
// Linux), so processes line their clocks up.
uint64_t vs_clock_zero_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(g_t0.time_since_epoch()).count());
}

uint64_t vs_now_ns() {
  return since_t0_ns();
}

// Moves up to `cap` buffered events into `out`; returns how many. Oldest first.
size_t vs_drain(VsRawEvent* out, size_t cap) {
  Buffer& b = buffer();
  std::lock_guard<std::mutex> lock(b.mu);
  size_t n = b.events.size() < cap ? b.events.size() : cap;
  std::memcpy(out, b.events.data(), n * sizeof(VsRawEvent));
  b.events.erase(b.events.begin(), b.events.begin() + static_cast<std::ptrdiff_t>(n));
  return n;
}

size_t vs_pending() {
  Buffer& b = buffer();
  std::lock_guard<std::mutex> lock(b.mu);
  return b.events.size();
}

// device_type: 0 = CPU, 1 = CUDA. Mirrors Python's `torch.autocast.__enter__/__exit__`.
int vs_autocast(int device_type, bool enabled, bool fp16) {
  return vs::guard([&] {
    const auto half = fp16 ? at::kHalf : at::kBFloat16;
#if VS_TORCH_AT_LEAST(2, 4)
    const auto dev = device_type == 1 ? at::kCUDA : at::kCPU;
    const auto set = [dev](bool on) { at::autocast::set_autocast_enabled(dev, on); };
    if (enabled) at::autocast::set_autocast_dtype(dev, half);
#else  // per-device functions before the device-generic ones
    const auto set = [device_type](bool on) {
      device_type == 1 ? at::autocast::set_enabled(on) : at::autocast::set_cpu_enabled(on);
    };
    if (enabled) {
      device_type == 1 ? at::autocast::set_autocast_gpu_dtype(half) : at::autocast::set_autocast_cpu_dtype(half);
    }
#endif
    if (enabled) {
      set(true);
      at::autocast::increment_nesting();
    } else {
      set(false);
      // Cached low-precision weight copies must not outlive the region, or the next
      // step reads stale weights.
      if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    }
  });
}

// GradScaler.unscale_'s kernel, which tch does not wrap: each gradient times `inv_scale` in
// place, `found_inf` set to 1 where one holds an inf or NaN. It allocates nothing.
int vs_amp_unscale(at::Tensor* const* grads, int n, at::Tensor* found_inf, const at::Tensor* inv_scale) {
  return vs::guard([&] {
    std::vector<at::Tensor> g;
    g.reserve(n);
    for (int i = 0; i < n; ++i) g.push_back(*grads[i]);  // handles on the same storage
    at::_amp_foreach_non_finite_check_and_unscale_(g, *found_inf, *inv_scale);
  });
}

// Backward from `t` with `grad` as its gradient (`torch.autograd.backward(t, grad)`, which
// tch does not wrap): activation checkpointing's recompute hands gradients on this way, as
// torch.utils.checkpoint does. Both handles are emptied: backward starts from `t`'s graph
// edge, so `t` (a block's input) is freed before backward runs and the gradient as soon as
// backward is done with it, as autograd frees what a node of its graph no longer needs.
int vs_backward(at::Tensor* t, at::Tensor* grad) {
  return vs::guard([&] {
    const auto edge = torch::autograd::impl::gradient_edge(*t);
    t->reset();
    torch::autograd::variable_list grads{std::move(*grad)};
    grad->reset();
    torch::autograd::Engine::get_default_engine().execute({edge}, grads, false, false, true);
  });
}

// optimizer.zero_grad(set_to_none=True): drops the gradient tensor so its memory is freed,
// which tch's zero_grad (zero in place) does not do. `t` is tch's `torch::Tensor*`.
void vs_clear_grad(at::Tensor* t) { t->mutable_grad().reset(); }

const char* vs_last_error() { return g_error.c_str(); }

// The libtorch this shim was compiled against ("2.13.0"), for bug reports.
const char* vs_torch_version() { return TORCH_VERSION; }

}  // extern "C"
