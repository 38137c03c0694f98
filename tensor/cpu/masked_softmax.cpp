// CPU masked softmax (see Note [Masked softmax]): rows in parallel, each row's
// masked, scaled logits formed once in a float/double buffer, the sum in double.
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "tensor/cpu/loops.h"
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

}  // namespace

void masked_softmax_kernel(const Tensor& out, const Tensor& scores, const Tensor& mask,
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
