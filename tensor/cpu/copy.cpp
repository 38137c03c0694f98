#include "tensor/ops/copy.h"

#include <cstring>

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"

namespace frugal::ops::cpu {

void copy_kernel(const Tensor& dst, const Tensor& src) {
  const ElementwiseLayout L = make_elementwise_layout("copy_", dst, {src});
  if (L.contiguous && dst.dtype() == src.dtype()) {
    std::memcpy(L.data[0], L.data[1], size_t(L.numel) * dst.element_size());
    return;
  }
  dispatch_all(dst.dtype(), "copy_", dst.device(), [&]<typename D>() {
    dispatch_all(src.dtype(), "copy_", src.device(), [&]<typename S>() {
      cpu_map<D, S>(L, [](S v) {
        if constexpr (std::is_same_v<D, bool>) return D(static_cast<double>(v) != 0.0);
        else return D(static_cast<opmath_t<S>>(v));
      });
    });
  });
}

}  // namespace frugal::ops::cpu
