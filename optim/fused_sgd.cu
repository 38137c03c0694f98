// The fused multi-tensor SGD step (Note [Multi-tensor launch]): one kernel over
// every parameter of one (device, dtype), the rule of detail::sgd_update.
#include "optim/multi_tensor_apply.cuh"
#include "optim/update_math.h"
#include "tensor/dispatch.h"

namespace frugal::optim::cuda {

namespace {

using detail::SgdEntry;

// entries: (count) SgdEntry, chunks numbered as in upload(). Per entry, param and grad
// are (numel) in T; momentum_buffer is (numel) in M = opmath_t<T>, or null. skip_if: null,
// or a flag whose nonzero value skips the whole step (GradScaler's found_inf in a graph).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    sgd_kernel(const SgdEntry* entries, int count, int64_t chunks, const float* skip_if) {
  using M = opmath_t<T>;
  if (skip_if != nullptr && *skip_if != 0.0f) return;
  for_each_chunk(entries, count, chunks, [&](const SgdEntry& e, int64_t, int64_t begin, int64_t n) {
    const detail::SgdCoeffs<M> c(e);
    const bool has_buf = e.momentum_buffer != nullptr;
    const bool read_buf = has_buf && !c.fresh;
    int64_t done = 0;
    if (e.flags & detail::kVec4) {
      done = n / 4 * 4;
      for (int64_t k = int64_t(threadIdx.x) * 4; k < done; k += int64_t(blockDim.x) * 4) {
        const int64_t i = begin + k;
        Vec4<T> p = load4<T>(e.param, i);
        const Vec4<T> g = load4<T>(e.grad, i);
        Vec4<M> buf = {};
        if (read_buf) buf = load4<M>(e.momentum_buffer, i);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          M pj = M(p.v[j]);
          detail::sgd_update<M>(pj, M(g.v[j]), buf.v[j], c);
          p.v[j] = T(pj);
        }
        store4<T>(e.param, i, p);
        if (has_buf) store4<M>(e.momentum_buffer, i, buf);
      }
    }
    // Unaligned entries, and the last (numel % 4) elements of aligned ones.
    T* param = static_cast<T*>(e.param);
    const T* grad = static_cast<const T*>(e.grad);
    M* momentum_buffer = static_cast<M*>(e.momentum_buffer);
    for (int64_t k = done + threadIdx.x; k < n; k += blockDim.x) {
      const int64_t i = begin + k;
      M p = M(param[i]), buf = read_buf ? momentum_buffer[i] : M(0);
      detail::sgd_update<M>(p, M(grad[i]), buf, c);
      param[i] = T(p);
      if (has_buf) momentum_buffer[i] = buf;
    }
  });
}

}  // namespace

void sgd_step(Device device, DType dtype, std::vector<SgdEntry>& entries, const float* skip_if) {
  if (entries.empty()) return;
  DeviceGuard guard(device);
  dispatch_floating(dtype, "SGD.step", device, [&]<typename T>() {
    using M = opmath_t<T>;
    for (SgdEntry& e : entries) {
      const bool vec = vec4_aligned<T>(e.param) && vec4_aligned<T>(e.grad) && vec4_aligned<M>(e.momentum_buffer);
      e.flags = vec ? (e.flags | detail::kVec4) : (e.flags & ~detail::kVec4);
    }
    launch_fused(device, entries, sgd_kernel<T>, skip_if);
  });
}

}  // namespace frugal::optim::cuda
