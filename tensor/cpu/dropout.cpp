// CPU dropout: four elements per Philox call (see Note [Dropout mask from counters]); float32,
// float16 and bfloat16 through the vectorized kernel of the CPU's level, the same bits (Note
// [Vectorized dropout] in tensor/cpu/dropout_kernel.cpp).
#include "tensor/ops/dropout.h"

#include <algorithm>
#include <type_traits>

#include "tensor/cpu/dropout_kernel.h"
#include "tensor/cpu/gemm.h"  // gemm_isa: the level of the dropout kernels too
#include "tensor/cpu/loops.h"
#include "tensor/cpu/via_float32.h"
#include "tensor/dispatch.h"
#include "tensor/philox.h"

namespace frugal::ops::cpu {

namespace {

constexpr int64_t kChunkGroups = 1024;  // Philox blocks (4096 elements) per call of the float32 kernel

void level_dropout_f32(GemmIsa isa, float* y, const float* x, int64_t count, uint64_t seed, uint64_t counter,
                       float keep_below, float scale) {
  switch (isa) {
    case GemmIsa::X86_64_V4: return v4::dropout_f32(y, x, count, seed, counter, keep_below, scale);
    case GemmIsa::X86_64_V3: return v3::dropout_f32(y, x, count, seed, counter, keep_below, scale);
    case GemmIsa::X86_64_V2: return v2::dropout_f32(y, x, count, seed, counter, keep_below, scale);
  }
}

// y, x: (n) contiguous; float16 and bfloat16 through float32 buffers (via_float32.h): the
// product in float32 rounded once, the generic path's bits
template <typename T>
void dropout_dense(T* y, const T* x, int64_t n, double p, Generator::Range range) {
  static_assert(kChunkGroups * 4 % kViaFloat32Chunk == 0 && kViaFloat32Chunk % 4 == 0);
  const float keep_below = float(1.0 - p), scale = float(1.0 / (1.0 - p));
  const int64_t chunks = (n + 4 * kChunkGroups - 1) / (4 * kChunkGroups);
  const GemmIsa isa = gemm_isa();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t first = c * 4 * kChunkGroups, count = std::min(4 * kChunkGroups, n - first);
    const uint64_t counter = range.counter + uint64_t(c * kChunkGroups);
    if constexpr (std::is_same_v<T, float>) {
      level_dropout_f32(isa, y + first, x + first, count, range.seed, counter, keep_below, scale);
    } else {
      via_float32<T, 1>(y + first, {x + first}, count, [&](float* out, const auto& in, int64_t m, int64_t at) {
        level_dropout_f32(isa, out, in[0], m, range.seed, counter + uint64_t(at / 4), keep_below, scale);
      });
    }
  }
}

}  // namespace

void dropout_kernel(const Tensor& out, const Tensor& x, double p, Generator::Range range) {
  require_host_range(range, "Dropout on the CPU");
  switch (x.dtype()) {
    case kFloat32: return dropout_dense(out.data_ptr<float>(), x.data_ptr<float>(), x.numel(), p, range);
    case kFloat16: return dropout_dense(out.data_ptr<Half>(), x.data_ptr<Half>(), x.numel(), p, range);
    case kBFloat16: return dropout_dense(out.data_ptr<BFloat16>(), x.data_ptr<BFloat16>(), x.numel(), p, range);
    default: return dropout_kernel_generic(out, x, p, range);
  }
}

void dropout_kernel_generic(const Tensor& out, const Tensor& x, double p, Generator::Range range) {
  require_host_range(range, "Dropout on the CPU");
  dispatch_floating(x.dtype(), "dropout", x.device(), [&]<typename T>() {
    using Acc = opmath_t<T>;
    const T* xp = x.data_ptr<T>();
    T* yp = out.data_ptr<T>();
    const int64_t n = x.numel(), groups = (n + 3) / 4;
    const float keep_below = float(1.0 - p);
    const Acc scale = Acc(1.0 / (1.0 - p));
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
    for (int64_t k = 0; k < groups; ++k) {
      const PhiloxResult r = philox4x32(range.seed, range.counter + uint64_t(k));
      const int64_t end = std::min<int64_t>(4, n - 4 * k);
      for (int64_t w = 0; w < end; ++w) {
        const int64_t i = 4 * k + w;
        yp[i] = T(Acc(xp[i]) * (philox_uniform(r.x[w]) < keep_below ? scale : Acc(0)));
      }
    }
  });
}

}  // namespace frugal::ops::cpu
