#include "tensor/ops/copy.h"

#include <cstring>

#include "tensor/cpu/half_convert.h"
#include "tensor/cpu/loops.h"
#include "tensor/dispatch.h"
#include "tensor/ops/copy_math.h"

namespace frugal::ops::cpu {

// Note [Reading uint8 as numbers]
// uint8 is storage only (Note [Storage-only uint8] in tensor/dtype.h), but image datasets
// store their pixels in it, so one conversion reads it as numbers: a copy from uint8 to any
// other dtype gives the values 0..255 (exact in float16, bfloat16 and wider; bool: != 0), as
// `images.to(kFloat32)` in torchvision. A copy to uint8 from another dtype stays an error
// (which rounding, which saturation?); uint8 to uint8 copies bytes in any layout. The CUDA
// copy does the same (tensor/cuda/copy.cu).

namespace {

/// dst = src converted by `bulk` (half_convert.h) on every run where both are dense, element by
/// element (Half's operators, the same bits) on strided runs; threaded as cpu_map.
template <typename D, typename S, void (*bulk)(D*, const S*, int64_t)>
void convert_runs(const ElementwiseLayout& L) {
  parallel_runs(L, [](char** p, const int64_t* s, int64_t count) {
    if (s[0] == int64_t(sizeof(D)) && s[1] == int64_t(sizeof(S)))
      return bulk(reinterpret_cast<D*>(p[0]), reinterpret_cast<const S*>(p[1]), count);
    for (int64_t i = 0; i < count; ++i)
      *reinterpret_cast<D*>(p[0] + i * s[0]) = D(*reinterpret_cast<const S*>(p[1] + i * s[1]));
  });
}

}  // namespace

void copy_kernel(const Tensor& dst, const Tensor& src) {
  const ElementwiseLayout L = make_elementwise_layout("copy_", dst, {src});
  if (L.contiguous && dst.dtype() == src.dtype()) {
    std::memcpy(L.data[0], L.data[1], size_t(L.numel) * dst.element_size());
    return;
  }
  // float16 <-> float32, the casts of autocast and of the float16 GEMM's operands and results
  // (Note [Bulk float16 conversion] in tensor/cpu/half_convert_kernel.cpp)
  if (dst.dtype() == kFloat32 && src.dtype() == kFloat16) return convert_runs<float, Half, half_to_float>(L);
  if (dst.dtype() == kFloat16 && src.dtype() == kFloat32) return convert_runs<Half, float, float_to_half>(L);
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
