#include "tensor/ops/fill.h"

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"

namespace frugal::ops::cpu {

void fill_kernel(const Tensor& t, double value) {
  const ElementwiseLayout L = make_elementwise_layout("fill_", t, {});
  dispatch_all(t.dtype(), "fill_", t.device(), [&]<typename T>() {
    const T v = std::is_same_v<T, bool> ? T(value != 0.0) : T(static_cast<opmath_t<T>>(value));
    cpu_map<T>(L, [v]() { return v; });
  });
}

void arange_fill_kernel(const Tensor& t, double start, double step) {
  dispatch_all(t.dtype(), "arange_fill_", t.device(), [&]<typename T>() {
    T* out = t.data_ptr<T>();
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (integral_arange(start, step)) {  // Note [Integer arange]
        const uint64_t s0 = uint64_t(int64_t(start)), d = uint64_t(int64_t(step));
        for (int64_t i = 0; i < t.numel(); ++i) out[i] = T(int64_t(s0 + uint64_t(i) * d));
        return;
      }
    }
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double v = start + double(i) * step;
      out[i] = std::is_same_v<T, bool> ? T(v != 0.0) : T(static_cast<opmath_t<T>>(v));
    }
  });
}

}  // namespace frugal::ops::cpu
