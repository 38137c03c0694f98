// CPU masked softmax (see Note [Masked softmax]): rows in parallel, each row's
// masked, scaled logits formed once in a float/double buffer, the sum in double; float32 rows
// go to the vectorized kernel of the CPU's level (Note [Vectorized masked softmax] in
// tensor/cpu/masked_softmax_kernel.cpp), the other dtypes through the generic loop below.
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "tensor/cpu/gemm.h"  // gemm_isa: the level of the softmax kernels too
#include "tensor/cpu/loops.h"
#include "tensor/cpu/masked_softmax_kernel.h"
#include "tensor/dispatch.h"
#include "tensor/ops/masked_softmax.h"

namespace frugal::ops::cpu {

namespace {

// y, x: (rows, S); mask: M* at the offsets of p (null when p.kind == 0)
template <typename T, typename M>
void masked_softmax_rows(T* y, const T* x, const M* mask, const MaskedSoftmaxParams& p) {
  using Acc = opmath_t<T>;
  const int64_t S = p.sizes[p.ndim - 1];
  const int64_t L = p.ndim >= 2 ? p.sizes[p.ndim - 2] : 1;
  const int64_t rows = numel_of(Shape(p.sizes, p.sizes + p.ndim)) / S;
  const int64_t ms = p.mask_strides[p.ndim - 1];
  const Acc scale = Acc(p.scale);
  constexpr Acc kNegInf = -std::numeric_limits<Acc>::infinity();
#pragma omp parallel if (rows * S >= kParallelGrain && rows > 1)
  {
    std::vector<Acc> z(static_cast<size_t>(S));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * S;
      const M* mr = mask ? mask + p.mask_row_offset(r) : nullptr;
      const int64_t keep_end = p.causal ? r % L + 1 : S;  // causal: keys s <= l
      Acc m = kNegInf;
      for (int64_t s = 0; s < S; ++s) {
        Acc v = Acc(xr[s]) * scale;
        if (s >= keep_end) v = kNegInf;
        if constexpr (std::is_same_v<M, bool>) {
          if (mr && !mr[s * ms]) v = kNegInf;
        } else {
          if (mr) v += Acc(mr[s * ms]);
        }
        z[size_t(s)] = v;
        m = (v > m || v != v) ? v : m;  // NaN wins
      }
      T* yr = y + r * S;
      if (m == kNegInf) {  // no key left: zeros (Note [Masked softmax])
        for (int64_t s = 0; s < S; ++s) yr[s] = T(Acc(0));
        continue;
      }
      double sum = 0;
      for (int64_t s = 0; s < S; ++s) {
        z[size_t(s)] = z[size_t(s)] == kNegInf ? Acc(0) : std::exp(z[size_t(s)] - m);
        sum += double(z[size_t(s)]);
      }
      const Acc inv = Acc(1.0 / sum);
      for (int64_t s = 0; s < S; ++s) yr[s] = T(z[size_t(s)] * inv);
    }
  }
}

using MaskedSoftmaxRowF32 = void (*)(float*, const float*, int64_t, float, int64_t, const bool*, const float*, int64_t,
                                     float*);

MaskedSoftmaxRowF32 masked_softmax_row_f32() {
  switch (gemm_isa()) {
    case GemmIsa::X86_64_V4: return v4::masked_softmax_row_f32;
    case GemmIsa::X86_64_V3: return v3::masked_softmax_row_f32;
    case GemmIsa::X86_64_V2: return v2::masked_softmax_row_f32;
  }
  return v2::masked_softmax_row_f32;
}

// y, x: (rows, S) float32; mask: bool or float at the offsets of p (null when p.kind == 0). The
// generic loop's rows and threading, each row by the level's kernel.
void masked_softmax_rows_f32(float* y, const float* x, const void* mask, const MaskedSoftmaxParams& p) {
  const int64_t S = p.sizes[p.ndim - 1];
  const int64_t L = p.ndim >= 2 ? p.sizes[p.ndim - 2] : 1;
  const int64_t rows = numel_of(Shape(p.sizes, p.sizes + p.ndim)) / S;
  const int64_t ms = p.mask_strides[p.ndim - 1];
  const float scale = float(p.scale);
  const MaskedSoftmaxRowF32 row = masked_softmax_row_f32();
#pragma omp parallel if (rows * S >= kParallelGrain && rows > 1)
  {
    std::vector<float> z(static_cast<size_t>(S));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t offset = mask ? p.mask_row_offset(r) : 0;
      const bool* bool_mask = p.kind == 1 ? static_cast<const bool*>(mask) + offset : nullptr;
      const float* add_mask = p.kind == 2 ? static_cast<const float*>(mask) + offset : nullptr;
      row(y + r * S, x + r * S, S, scale, p.causal ? r % L + 1 : S, bool_mask, add_mask, ms, z.data());
    }
  }
}

}  // namespace

void masked_softmax_kernel(const Tensor& out, const Tensor& scores, const Tensor& mask,
                           const MaskedSoftmaxParams& params) {
  if (scores.dtype() != kFloat32) return masked_softmax_kernel_generic(out, scores, mask, params);
  masked_softmax_rows_f32(out.data_ptr<float>(), scores.data_ptr<float>(), params.kind ? mask.data() : nullptr, params);
}

void masked_softmax_kernel_generic(const Tensor& out, const Tensor& scores, const Tensor& mask,
                                   const MaskedSoftmaxParams& params) {
  dispatch_floating(scores.dtype(), "masked_softmax", scores.device(), [&]<typename T>() {
    T* y = out.data_ptr<T>();
    const T* x = scores.data_ptr<T>();
    if (params.kind == 1) masked_softmax_rows<T, bool>(y, x, static_cast<const bool*>(mask.data()), params);
    else if (params.kind == 2) masked_softmax_rows<T, T>(y, x, static_cast<const T*>(mask.data()), params);
    else masked_softmax_rows<T, T>(y, x, nullptr, params);
  });
}

}  // namespace frugal::ops::cpu
