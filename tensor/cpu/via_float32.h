#pragma once
// float16/bfloat16 arrays through a float32 kernel: each chunk converted into float32 buffers
// on the stack, the kernel run on them, its result rounded once on the way back. The float32
// kernels of the x86-64 levels (GELU, dropout) then serve the 16-bit dtypes too, which the
// generic loops computed one element at a time (a bfloat16 GELU took 10x a float32 one). Both
// compute in float32 and round once (Note [Half types compute in f32]): dropout's kernel gives
// the generic loop's bits; GELU's is within one float32 ulp of glibc's erfc before the rounding,
// so a rare 16-bit result differs by one ulp (at rounding ties, and in the far tail where the
// generic loop's float32 derivative flushes to zero), the kernel's the closer to float64.
// float16 chunks convert in bulk (half_convert.h, F16C where the CPU has it), the same bits as
// Half's operators (Note [Bulk float16 conversion] in tensor/cpu/half_convert_kernel.cpp).
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "tensor/cpu/half_convert.h"
#include "tensor/half.h"

namespace frugal::ops::cpu {

/// Elements per chunk: 16 KB of float32 per buffer.
inline constexpr int64_t kViaFloat32Chunk = 4096;

/// y[0, n) = T(kernel(x[0][...], ..., x[N-1][...])) for 16-bit T: calls
/// kernel(float* y, const std::array<const float*, N>& x, int64_t count, int64_t first) on
/// chunks of kViaFloat32Chunk elements (first: the chunk's offset in [0, n)), in order.
template <typename T, size_t N, typename Kernel>
void via_float32(T* y, const std::array<const T*, N>& x, int64_t n, Kernel&& kernel) {
  float in[N][kViaFloat32Chunk];
  float out[kViaFloat32Chunk];
  std::array<const float*, N> in_ptrs;
  for (size_t k = 0; k < N; ++k) in_ptrs[k] = in[k];
  for (int64_t first = 0; first < n; first += kViaFloat32Chunk) {
    const int64_t count = std::min(kViaFloat32Chunk, n - first);
    for (size_t k = 0; k < N; ++k) {
      if constexpr (std::is_same_v<T, Half>) half_to_float(in[k], x[k] + first, count);  // F16C where the CPU has it
      else
        for (int64_t i = 0; i < count; ++i) in[k][i] = float(x[k][first + i]);
    }
    kernel(out, in_ptrs, count, first);
    if constexpr (std::is_same_v<T, Half>) float_to_half(y + first, out, count);
    else
      for (int64_t i = 0; i < count; ++i) y[first + i] = T(out[i]);
  }
}

}  // namespace frugal::ops::cpu
