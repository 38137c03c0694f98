#pragma once
// Reduction geometry and the reducers shared by the CPU and CUDA reduction kernels
// (tensor/cpu/reduce.cpp, tensor/cuda/reduce.cu), as elementwise.h is for maps.
//
// Note [Reduction geometry]
// Every reduction is computed on a 3-d strided view (outer, R, inner) of its input:
// R elements are folded into each of the outer * inner outputs, and output (o, i)
// lands at o * inner + i of a contiguous output, which is the order of the kept
// dims. The front-end (tensor/ops/reduce.cpp) finds this view without copying when
// the reduced dims form one run whose dims merge (stride[d] == size[d+1] * stride[d+1]),
// as do the kept dims before and after it: reducing dim 0 of a contiguous (B, T, C)
// is (1, B, T*C), the column reduction a bias gradient needs. Otherwise it permutes
// the reduced dims to the end and tries (kept, reduced) the same way, and only when
// that fails too does it make a contiguous copy. A 2-d case (outer or inner is 1)
// is canonicalized so that the dim with the smaller stride is the one walked by
// consecutive lanes: inner == 1 means a "row" reduction along R, anything else a
// "column" reduction whose consecutive threads read consecutive inner elements.
//
// Note [Reducers]
// A reducer says how to fold one element (step), merge two partial results
// (combine) and write the final one (store). Kernels are generic over it; the CUDA
// kernels split long reductions across blocks and merge partials with combine, the
// CPU kernels fold 8 interleaved lanes and merge those. Because the merge order varies,
// combine must be order-independent, so arg reductions carry the index and break ties
// toward the smaller one: that reproduces PyTorch's "first occurrence" on any split.
// step, by contrast, may assume that one accumulator sees increasing indices.
#include <cstdint>
#include <limits>
#include <type_traits>

#include "tensor/half.h"
#include "tensor/tensor.h"
#include "tensor/wrapping.h"

namespace frugal::reduction {

/// The (outer, R, inner) view of Note [Reduction geometry], strides in elements.
struct Geometry {
  int64_t outer = 1, R = 1, inner = 1;
  int64_t so = 0, sr = 0, si = 0;
  static Geometry of(const Tensor& in3) {
    return {in3.size(0), in3.size(1), in3.size(2), in3.stride(0), in3.stride(1), in3.stride(2)};
  }
};

template <typename A>
FRUGAL_HD bool is_nan(A v) {
  if constexpr (std::is_floating_point_v<A>) return v != v;
  else return false;
}

/// sum (divisor 1) and mean (divisor R).
template <typename In, typename Acc, typename Out>
struct SumReducer {
  using in_t = In;
  using acc_t = Acc;
  Out* out;
  Acc divisor;
  FRUGAL_HD Acc identity() const { return Acc(0); }
  FRUGAL_HD Acc step(Acc a, In v, int64_t) const { return add(a, Acc(v)); }
  FRUGAL_HD Acc combine(Acc a, Acc b) const { return add(a, b); }
  FRUGAL_HD void store(int64_t o, Acc a) const { out[o] = Out(a / divisor); }
  /// a + b; an int64 sum wraps around past its range (two's complement, as PyTorch).
  static FRUGAL_HD Acc add(Acc a, Acc b) {
    if constexpr (std::is_integral_v<Acc>) return ops::math::wrapping_add(a, b);
    else return a + b;
  }
};

/// prod; an int64 product wraps around past its range, as sum's does.
template <typename In, typename Acc, typename Out>
struct ProdReducer {
  using in_t = In;
  using acc_t = Acc;
  Out* out;
  FRUGAL_HD Acc identity() const { return Acc(1); }
  FRUGAL_HD Acc step(Acc a, In v, int64_t) const { return mul(a, Acc(v)); }
  FRUGAL_HD Acc combine(Acc a, Acc b) const { return mul(a, b); }
  FRUGAL_HD void store(int64_t o, Acc a) const { out[o] = Out(a); }
  static FRUGAL_HD Acc mul(Acc a, Acc b) {
    if constexpr (std::is_integral_v<Acc>) return ops::math::wrapping_mul(a, b);
    else return a * b;
  }
};

/// amax / amin: a NaN anywhere makes the result NaN.
template <typename In, typename Acc, bool IsMax>
struct MinMaxReducer {
  using in_t = In;
  using acc_t = Acc;
  In* out;
  Acc init;  // -inf / +inf (lowest / highest for integers)
  FRUGAL_HD Acc identity() const { return init; }
  FRUGAL_HD Acc combine(Acc a, Acc b) const {
    const bool take_b = IsMax ? (b > a) : (b < a);
    return (take_b || is_nan(b)) ? b : a;
  }
  FRUGAL_HD Acc step(Acc a, In v, int64_t) const { return combine(a, Acc(v)); }
  FRUGAL_HD void store(int64_t o, Acc a) const { out[o] = In(a); }
};

template <typename Acc>
struct ValueIndex {
  Acc value;
  int64_t index;  // -1: nothing seen yet
};

/// max/min with indices (argmax/argmin): NaN beats numbers; ties go to the smaller index.
template <typename In, typename Acc, bool IsMax>
struct ArgReducer {
  using in_t = In;
  using acc_t = ValueIndex<Acc>;
  In* values;  // may be null (argmax)
  int64_t* indices;
  FRUGAL_HD acc_t identity() const { return {Acc(0), -1}; }
  FRUGAL_HD acc_t combine(acc_t a, acc_t b) const {
    if (a.index < 0) return b;
    if (b.index < 0) return a;
    const bool an = is_nan(a.value), bn = is_nan(b.value);
    if (an || bn) {
      if (an && bn) return a.index <= b.index ? a : b;
      return an ? a : b;
    }
    if (IsMax ? (b.value > a.value) : (b.value < a.value)) return b;
    if (b.value == a.value && b.index < a.index) return b;
    return a;
  }
  // Each accumulator sees increasing r (every kernel walks R in order), so a strict
  // comparison keeps the first of equal values, and a NaN, once held, is never replaced.
  FRUGAL_HD acc_t step(acc_t a, In v, int64_t r) const {
    const Acc x = Acc(v);
    const bool better = IsMax ? (x > a.value) : (x < a.value);
    return (a.index < 0 || better || (is_nan(x) && !is_nan(a.value))) ? acc_t{x, r} : a;
  }
  FRUGAL_HD void store(int64_t o, acc_t a) const {
    if (values) values[o] = In(a.value);
    indices[o] = a.index;
  }
};

template <typename Acc>
struct WelfordState {
  Acc mean;
  Acc m2;  // sum of squared deviations from mean
  int64_t n;
};

/// var: Welford's online update, merged with Chan et al.'s pairwise formula.
template <typename In, typename Acc>
struct VarReducer {
  using in_t = In;
  using acc_t = WelfordState<Acc>;
  In* out;
  int64_t correction;
  FRUGAL_HD acc_t identity() const { return {Acc(0), Acc(0), 0}; }
  FRUGAL_HD acc_t step(acc_t a, In v, int64_t) const {
    const Acc x = Acc(v);
    a.n += 1;
    const Acc delta = x - a.mean;
    a.mean += delta / Acc(a.n);
    a.m2 += delta * (x - a.mean);
    return a;
  }
  FRUGAL_HD acc_t combine(acc_t a, acc_t b) const {
    if (a.n == 0) return b;
    if (b.n == 0) return a;
    const int64_t n = a.n + b.n;
    const Acc delta = b.mean - a.mean;
    const Acc wb = Acc(b.n) / Acc(n);
    return {a.mean + delta * wb, a.m2 + b.m2 + delta * delta * Acc(a.n) * wb, n};
  }
  FRUGAL_HD void store(int64_t o, acc_t a) const {
    const int64_t dof = a.n - correction > 0 ? a.n - correction : 0;
    out[o] = In(a.m2 / Acc(dof));
  }
};

/// Calls f.template operator()<b>() with the runtime flag as a compile-time one.
template <typename F>
void with_bool(bool b, F&& f) {
  if (b) f.template operator()<true>();
  else f.template operator()<false>();
}

/// The starting value of a max (IsMax) or min reduction in Acc: -inf/+inf, or the
/// lowest/highest value for types without infinity.
template <typename Acc, bool IsMax>
Acc extreme_identity() {
  using L = std::numeric_limits<Acc>;
  if constexpr (L::has_infinity) return IsMax ? -L::infinity() : L::infinity();
  else return IsMax ? L::lowest() : L::max();
}

}  // namespace frugal::reduction
