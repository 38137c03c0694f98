// CPU loops for the optimizer entries (optim/multi_tensor.h): one parallel loop per
// parameter, the element rule from optim/update_math.h.
#include <algorithm>
#include <atomic>
#include <type_traits>

#include "core/threads.h"
#include "optim/cpu_adam.h"  // offload_adam_chunk: AdamW's vectorised float32 loop
#include "optim/multi_tensor.h"
#include "optim/update_math.h"
#include "tensor/cpu/loops.h"  // parallel_for_if
#include "tensor/dispatch.h"

namespace frugal::optim {

namespace detail {
namespace {
std::atomic<int64_t> g_fused_launches{0};
}
int64_t fused_launch_count() { return g_fused_launches.load(std::memory_order_relaxed); }
void count_fused_launch() { g_fused_launches.fetch_add(1, std::memory_order_relaxed); }
}  // namespace detail

namespace cpu {

namespace {

constexpr int64_t kGrain = 1 << 16;  // elements below which threads cost more than they save

/// A float32 AdamW entry without amsgrad through OffloadAdamW's loop (optim/cpu_adam.cpp), which
/// vectorises: the same adam_update, so the same bits as the loop below, which GCC keeps scalar
/// here (std::sqrt's errno call).
void adamw_float32(const detail::AdamEntry& e) {
  float* m = static_cast<float*>(e.exp_avg);
  float* v = static_cast<float*>(e.exp_avg_sq);
  if ((e.flags & detail::kAdamFreshMoments) != 0) {  // not read: the first step starts them at 0
    std::fill(m, m + e.numel, 0.0f);
    std::fill(v, v + e.numel, 0.0f);
  }
  const OffloadAdamChunk chunk{static_cast<float*>(e.param), m, v, e.grad, nullptr, e.numel};
  offload_adam_chunk(kFloat32, chunk, detail::AdamCoeffs<float>(e), get_num_threads());
}

}  // namespace

void adam_step(DType dtype, const std::vector<detail::AdamEntry>& entries) {
  dispatch_floating(dtype, "Adam.step", kCPU, [&]<typename T>() {
    using M = opmath_t<T>;
    for (const detail::AdamEntry& e : entries) {
      if (std::is_same_v<T, float> && (e.flags & detail::kAdamDecoupled) && !(e.flags & detail::kAdamAmsgrad)) {
        adamw_float32(e);
        continue;
      }
      // param, grad: (numel) in T; exp_avg, exp_avg_sq, max_exp_avg_sq: (numel) in M
      T* p = static_cast<T*>(e.param);
      const T* g = static_cast<const T*>(e.grad);
      M* m = static_cast<M*>(e.exp_avg);
      M* v = static_cast<M*>(e.exp_avg_sq);
      M* vmax = static_cast<M*>(e.max_exp_avg_sq);
      const detail::AdamCoeffs<M> c(e);
      const bool fresh = (e.flags & detail::kAdamFreshMoments) != 0;
      const bool fresh_max = (e.flags & detail::kAdamFreshMax) != 0;
      const int64_t n = e.numel;
      ops::cpu::parallel_for_if(n >= 2 * kGrain, n, [&](int64_t i) {
        M pi = M(p[i]), mi = fresh ? M(0) : m[i], vi = fresh ? M(0) : v[i];
        M vmi = vmax ? (fresh_max ? M(0) : vmax[i]) : M(0);
        detail::adam_update<M>(pi, M(g[i]), mi, vi, vmi, c);
        p[i] = T(pi);
        m[i] = mi;
        v[i] = vi;
        if (vmax) vmax[i] = vmi;
      });
    }
  });
}

void sgd_step(DType dtype, const std::vector<detail::SgdEntry>& entries) {
  dispatch_floating(dtype, "SGD.step", kCPU, [&]<typename T>() {
    using M = opmath_t<T>;
    for (const detail::SgdEntry& e : entries) {
      // param, grad: (numel) in T; momentum_buffer: (numel) in M, or null
      T* p = static_cast<T*>(e.param);
      const T* g = static_cast<const T*>(e.grad);
      M* buf = static_cast<M*>(e.momentum_buffer);
      const detail::SgdCoeffs<M> c(e);
      const int64_t n = e.numel;
      ops::cpu::parallel_for_if(n >= 2 * kGrain, n, [&](int64_t i) {
        M pi = M(p[i]), bi = buf && !c.fresh ? buf[i] : M(0);
        detail::sgd_update<M>(pi, M(g[i]), bi, c);
        p[i] = T(pi);
        if (buf) buf[i] = bi;
      });
    }
  });
}

}  // namespace cpu
}  // namespace frugal::optim
