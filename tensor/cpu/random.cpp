#include "tensor/ops/random.h"

#include "tensor/dispatch.h"
#include "tensor/philox.h"

namespace frugal::ops::cpu {

void random_kernel(const Tensor& t, const RandomFill& f) {
  require_host_range(f.range, "A random fill on the CPU");
  dispatch_numeric(t.dtype(), "random", t.device(), [&]<typename T>() {
    T* out = t.data_ptr<T>();
    const int64_t n = t.numel();
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; ++i) out[i] = random_element<T>(f, f.range.counter, uint64_t(i));
  });
}

}  // namespace frugal::ops::cpu
