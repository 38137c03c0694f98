// The fused multi-tensor Adam/AdamW step (Note [Multi-tensor launch]): one kernel
// over every parameter of one (device, dtype), the rule of Note [Adam update].
#include "optim/multi_tensor_apply.cuh"
#include "optim/update_math.h"
#include "tensor/dispatch.h"

namespace frugal::optim::cuda {

namespace {

using detail::AdamEntry;

// entries: (count) AdamEntry, chunks numbered as in upload(). Per entry, param and grad
// are (numel) in T; exp_avg, exp_avg_sq, max_exp_avg_sq are (numel) in M = opmath_t<T>.
// skip_if: null, or a device float; when nonzero the kernel returns at once.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    adam_kernel(const AdamEntry* entries, int count, int64_t chunks, const float* skip_if) {
  using M = opmath_t<T>;
  if (skip_if != nullptr && *skip_if != 0.0f) return;
  for_each_chunk(entries, count, chunks, [&](AdamEntry e, int64_t, int64_t begin, int64_t n) {
    if (e.device_step != nullptr) detail::set_bias_corrections(e, *e.device_step + 1);
    const detail::AdamCoeffs<M> c(e);
    const bool fresh = (e.flags & detail::kAdamFreshMoments) != 0;
    const bool fresh_max = (e.flags & detail::kAdamFreshMax) != 0;
    const bool amsgrad = e.max_exp_avg_sq != nullptr;
    int64_t done = 0;
    if (e.flags & detail::kVec4) {
      done = n / 4 * 4;
      for (int64_t k = int64_t(threadIdx.x) * 4; k < done; k += int64_t(blockDim.x) * 4) {
        const int64_t i = begin + k;
        Vec4<T> p = load4<T>(e.param, i);
        const Vec4<T> g = load4<T>(e.grad, i);
        Vec4<M> m = {}, v = {}, vmax = {};
        if (!fresh) {
          m = load4<M>(e.exp_avg, i);
          v = load4<M>(e.exp_avg_sq, i);
        }
        if (amsgrad && !fresh_max) vmax = load4<M>(e.max_exp_avg_sq, i);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          M pj = M(p.v[j]);
          detail::adam_update<M>(pj, M(g.v[j]), m.v[j], v.v[j], vmax.v[j], c);
          p.v[j] = T(pj);
        }
        store4<T>(e.param, i, p);
        store4<M>(e.exp_avg, i, m);
        store4<M>(e.exp_avg_sq, i, v);
        if (amsgrad) store4<M>(e.max_exp_avg_sq, i, vmax);
      }
    }
    // Unaligned entries, and the last (numel % 4) elements of aligned ones.
    T* param = static_cast<T*>(e.param);
    const T* grad = static_cast<const T*>(e.grad);
    M* exp_avg = static_cast<M*>(e.exp_avg);
    M* exp_avg_sq = static_cast<M*>(e.exp_avg_sq);
    M* max_exp_avg_sq = static_cast<M*>(e.max_exp_avg_sq);
    for (int64_t k = done + threadIdx.x; k < n; k += blockDim.x) {
      const int64_t i = begin + k;
      M p = M(param[i]), m = fresh ? M(0) : exp_avg[i], v = fresh ? M(0) : exp_avg_sq[i];
      M vmax = amsgrad && !fresh_max ? max_exp_avg_sq[i] : M(0);
      detail::adam_update<M>(p, M(grad[i]), m, v, vmax, c);
      param[i] = T(p);
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      if (amsgrad) max_exp_avg_sq[i] = vmax;
    }
  });
}

// After adam_kernel has read them: each entry's device step raised by one, unless skipped.
__global__ void count_steps_kernel(const AdamEntry* entries, int count, const float* skip_if) {
  if (skip_if != nullptr && *skip_if != 0.0f) return;
  for (int i = int(threadIdx.x); i < count; i += int(blockDim.x))
    if (entries[i].device_step != nullptr) ++*const_cast<int64_t*>(entries[i].device_step);
}

}  // namespace

void adam_step(Device device, DType dtype, std::vector<AdamEntry>& entries, const float* skip_if) {
  if (entries.empty()) return;
  DeviceGuard guard(device);
  dispatch_floating(dtype, "Adam.step", device, [&]<typename T>() {
    using M = opmath_t<T>;
    for (AdamEntry& e : entries) {
      const bool vec = vec4_aligned<T>(e.param) && vec4_aligned<T>(e.grad) && vec4_aligned<M>(e.exp_avg) &&
                       vec4_aligned<M>(e.exp_avg_sq) && vec4_aligned<M>(e.max_exp_avg_sq);
      e.flags = vec ? (e.flags | detail::kVec4) : (e.flags & ~detail::kVec4);
    }
    const DeviceTable<AdamEntry> table = launch_fused(device, entries, adam_kernel<T>, skip_if);
    if (std::any_of(entries.begin(), entries.end(), [](const AdamEntry& e) { return e.device_step != nullptr; })) {
      count_steps_kernel<<<1, kThreads, 0, stream_for(device)>>>(table.entries, table.count, skip_if);
      FRUGAL_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace frugal::optim::cuda
