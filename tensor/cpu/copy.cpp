#include "tensor/ops/copy.h"

#include <cstring>

#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/ops/copy_math.h"

namespace frugal::ops::cpu {

// Note [Reading uint8 as numbers]
// uint8 is storage only (Note [Storage-only uint8] in tensor/dtype.h), but image datasets
// store their pixels in it, so one conversion reads it as numbers: a copy from uint8 to any
// other dtype gives the values 0..255 (exact in float16, bfloat16 and wider; bool: != 0), as
// `images.to(kFloat32)` in torchvision. A copy to uint8 from another dtype stays an error
// (which rounding, which saturation?); uint8 to uint8 copies bytes in any layout. CPU only.

void copy_kernel(const Tensor& dst, const Tensor& src) {
  const ElementwiseLayout L = make_elementwise_layout("copy_", dst, {src});
  if (L.contiguous && dst.dtype() == src.dtype()) {
    std::memcpy(L.data[0], L.data[1], size_t(L.numel) * dst.element_size());
    return;
  }
  if (src.dtype() == DType::UInt8) {  // Note [Reading uint8 as numbers]
    if (dst.dtype() == DType::UInt8) return cpu_map<uint8_t, uint8_t>(L, [](uint8_t v) { return v; });
    dispatch_all(dst.dtype(), "copy_", dst.device(), [&]<typename D>() {
      cpu_map<D, uint8_t>(L, [](uint8_t v) {
        if constexpr (std::is_same_v<D, bool>) return D(v != 0);
        else return D(static_cast<float>(v));  // 0..255: exact in every floating dtype
      });
    });
    return;
  }
  dispatch_all(dst.dtype(), "copy_", dst.device(), [&]<typename D>() {
    dispatch_all(src.dtype(), "copy_", src.device(), [&]<typename S>() {
      cpu_map<D, S>(L, [](S v) { return convert_element<D, S>(v); });  // Note [Float to integer conversion]
    });
  });
}

}  // namespace frugal::ops::cpu
