#pragma once
// The online (max, sum of exp) state shared by the softmax, masked softmax and cross
// entropy kernels (Note [CUDA softmax kernels]). Include only from .cu files.
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

namespace frugal::ops::cuda {

template <typename Acc>
__device__ __forceinline__ Acc exp_acc(Acc v) {
  if constexpr (std::is_same_v<Acc, float>) return expf(v);
  else return ::exp(v);
}
template <typename Acc>
__device__ __forceinline__ Acc log_acc(Acc v) {
  if constexpr (std::is_same_v<Acc, float>) return logf(v);
  else return ::log(v);
}

/// Online softmax state: the running max m and sum of exp(x - m).
template <typename Acc>
struct MaxSum {
  Acc m, s;
};

template <typename Acc>
__device__ __forceinline__ MaxSum<Acc> max_sum_add(MaxSum<Acc> st, Acc x) {
  if (x != x) return {x, x};  // NaN poisons the slice
  if (st.m != st.m) return st;
  if (x > st.m) return {x, st.s * exp_acc(st.m - x) + Acc(1)};  // st.m = -inf: st.s = 0
  if (x == Acc(-INFINITY)) return st;                           // adds exp(-inf) = 0 (and avoids -inf - -inf)
  return {st.m, st.s + exp_acc(x - st.m)};
}

template <typename Acc>
__device__ __forceinline__ MaxSum<Acc> max_sum_merge(MaxSum<Acc> a, MaxSum<Acc> b) {
  if (a.m != a.m) return a;
  if (b.m != b.m) return b;
  const Acc m = a.m > b.m ? a.m : b.m;
  if (m == Acc(-INFINITY)) return {m, Acc(0)};
  return {m, a.s * exp_acc(a.m - m) + b.s * exp_acc(b.m - m)};
}

}  // namespace frugal::ops::cuda
