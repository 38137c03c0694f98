// CPU dropout: four elements per Philox call (see Note [Dropout mask from counters]).
#include "tensor/ops/dropout.h"

#include <algorithm>

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/philox.h"

namespace frugal::ops::cpu {

void dropout_kernel(const Tensor& out, const Tensor& x, double p, Generator::Range range) {
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
        yp[i] = philox_uniform(r.x[w]) < keep_below ? T(Acc(xp[i]) * scale) : T(Acc(0));
      }
    }
  });
}

}  // namespace frugal::ops::cpu
