// CUDA's autocast policy (bf16 or fp16) for CPU tensors, on request (docs/autocast.md). CPU
// autocast lets exp, log, pow, rsqrt, sum, softmax and log_softmax run in the lower
// precision; CUDA autocast runs them in fp32 (`AT_FORALL_FP32`, `AT_FORALL_FP32_SET_OPT_DTYPE`). With the policy on, these
// ops under CPU autocast do what CUDA's would, so a CPU run allocates as the GPU it models;
// off (the default), each runs exactly as CPU autocast has it.
#include "capture.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <atomic>
#include <optional>

namespace {
std::atomic<bool> g_cuda_policy{false};

using at::Tensor;
// The op signatures' optional: std::optional's alias from torch 2.2, its own type before.
#if VS_TORCH_AT_LEAST(2, 2)
template <class T>
using Opt = std::optional<T>;
#else
template <class T>
using Opt = c10::optional<T>;
#endif

// Inputs CUDA's fp32 list would cast (a bf16 or fp16 tensor), cast; others as they are.
Tensor fp32(const Tensor& t) {
  return g_cuda_policy.load(std::memory_order_relaxed) ? at::autocast::cached_cast(at::kFloat, t, c10::DeviceType::CPU) : t;
}

// CUDA's `dtype=float` for a lower-precision input that gave no dtype of its own.
Opt<at::ScalarType> fp32_dtype(const Tensor& t, Opt<at::ScalarType> dtype) {
  if (g_cuda_policy.load(std::memory_order_relaxed) && !dtype && at::autocast::is_eligible(t, c10::DeviceType::CPU) &&
      (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf)) {
    return at::kFloat;
  }
  return dtype;
}

// Each kernel decides its inputs' dtypes, then runs the op below autocast.
#define VS_BELOW_AUTOCAST c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU)

Tensor exp_k(const Tensor& x) {
  auto a = fp32(x);
  VS_BELOW_AUTOCAST;
  return at::exp(a);
}
Tensor log_k(const Tensor& x) {
  auto a = fp32(x);
  VS_BELOW_AUTOCAST;
  return at::log(a);
}
Tensor rsqrt_k(const Tensor& x) {
  auto a = fp32(x);
  VS_BELOW_AUTOCAST;
  return at::rsqrt(a);
}
Tensor pow_scalar_k(const Tensor& x, const at::Scalar& e) {
  auto a = fp32(x);
  VS_BELOW_AUTOCAST;
  return at::pow(a, e);
}
Tensor pow_tensor_k(const Tensor& x, const Tensor& e) {
  auto a = fp32(x);
  auto b = fp32(e);
  VS_BELOW_AUTOCAST;
  return at::pow(a, b);
}
Tensor sum_k(const Tensor& x, Opt<at::ScalarType> dtype) {
  auto d = fp32_dtype(x, dtype);
  VS_BELOW_AUTOCAST;
  return at::sum(x, d);
}
Tensor sum_dim_k(const Tensor& x, at::OptionalIntArrayRef dim, bool keepdim, Opt<at::ScalarType> dtype) {
  auto d = fp32_dtype(x, dtype);
  VS_BELOW_AUTOCAST;
  return at::sum(x, dim, keepdim, d);
}
Tensor softmax_k(const Tensor& x, int64_t dim, Opt<at::ScalarType> dtype) {
  auto d = fp32_dtype(x, dtype);
  VS_BELOW_AUTOCAST;
  return at::softmax(x, dim, d);
}
Tensor log_softmax_k(const Tensor& x, int64_t dim, Opt<at::ScalarType> dtype) {
  auto d = fp32_dtype(x, dtype);
  VS_BELOW_AUTOCAST;
  return at::log_softmax(x, dim, d);
}
}  // namespace

TORCH_LIBRARY_IMPL(aten, AutocastCPU, m) {
  m.impl("exp", TORCH_FN(exp_k));
  m.impl("log", TORCH_FN(log_k));
  m.impl("rsqrt", TORCH_FN(rsqrt_k));
  m.impl("pow.Tensor_Scalar", TORCH_FN(pow_scalar_k));
  m.impl("pow.Tensor_Tensor", TORCH_FN(pow_tensor_k));
  m.impl("sum", TORCH_FN(sum_k));
  m.impl("sum.dim_IntList", TORCH_FN(sum_dim_k));
  m.impl("softmax.int", TORCH_FN(softmax_k));
  m.impl("log_softmax.int", TORCH_FN(log_softmax_k));
}

extern "C" {
// On: CPU autocast follows CUDA's policy for the ops above. Off: CPU autocast's own.
void vs_set_cuda_autocast_policy(bool on) { g_cuda_policy.store(on, std::memory_order_relaxed); }
}
