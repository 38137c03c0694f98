#pragma once
// Inclusive scans along one dim: prefix sums and products (torch.cumsum, torch.cumprod), running
// maxima and minima with their indices (torch.cummax, torch.cummin) and running log-sum-exps
// (torch.logcumsumexp); the differentiable forms are in autograd/ops/cumsum.h. All run through
// one kernel per backend, which combines with +, *, max, min or log-add-exp (Cumulative below);
// everything the Notes say of sums holds for the others with their combine in place of +.
//
// Note [Cumulative sum dtypes]
// Floating inputs keep their dtype and round each prefix once from the running total's
// type, CumsumAcc: float64 for float32 and float64, float32 for float16 and bfloat16, as
// PyTorch's CPU kernel (a float32 running total of 10^7 entries of 0.1f ends at 1087937, 9%
// high). int32, int64 and bool inputs sum in int64 and give an int64 result (PyTorch's
// promotion of integral inputs to cumsum). A `dtype` argument converts the
// input first, as torch.cumsum(dtype=): float16 summed with dtype = float32 gives float32
// prefixes, int64 with dtype = int32 wraps as int32 does.
//
// Note [Cumulative sum order]
// A line is cut into chunks of kCumsumChunk entries, and the chunks into spans of
// kCumsumSpan chunks, a split fixed for every backend and line length. Each chunk has its
// own running total `local`; `chunk_carry` is the sum of the totals of the chunks before
// it in its span, added in order; `span_carry` the sum of the totals of the spans before
// it (each span's total being its chunks' totals added in order), added in order. The
// entry stored is (span_carry + chunk_carry) + local, rounded once. A line no longer than
// a chunk is thus summed strictly in order, and a long one can be summed chunk by chunk in
// parallel (the CUDA kernel does so when there are few lines), its carries found in
// parallel span by span, while every backend computes the same floating-point
// operations: CPU and CUDA results agree to the bit, run after run. (One fold over all
// chunks' totals, 65536 of them in a line of 2^26, ran one dependent add at a time on
// the GPU and set the pace of the whole sum.)
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>

#include "tensor/half.h"  // FRUGAL_HD
#include "tensor/wrapping.h"
#include "tensor/ops/reduce.h"  // ValuesIndices

#include "tensor/tensor.h"

namespace frugal::ops {

/// out[..., j, ...] = x[..., 0, ...] + ... + x[..., j, ...] along `dim` (negative counts from
/// the end; a 0-d input takes dim 0 or -1). The output has x's shape, contiguous, in `dtype`
/// when given (x converted to it first), else x's dtype when floating, else int64.
Tensor cumsum(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);

/// out[..., j, ...] = x[..., 0, ...] * ... * x[..., j, ...] along `dim`, as torch.cumprod; shape,
/// dims and dtypes as cumsum (integer and bool inputs give int64 products, which wrap around
/// past its range as PyTorch's do).
Tensor cumprod(const Tensor& x, int64_t dim, std::optional<DType> dtype = std::nullopt);

/// torch.cummax(x, dim): the running maximum along `dim` (x's dtype) and, for each entry, the
/// index of the last element equal to it so far (int64); a NaN propagates, each NaN taking
/// the index. Integer and bool inputs too; shapes and dims as cumsum.
ValuesIndices cummax(const Tensor& x, int64_t dim);
/// torch.cummin: the running minimum and its indices, as cummax.
ValuesIndices cummin(const Tensor& x, int64_t dim);

/// torch.logcumsumexp(x, dim): log(exp(x_0) + ... + exp(x_j)) along `dim`, each step
/// max + log1p(exp(min - max)), in CumsumAcc as cumsum (an infinity or NaN as PyTorch's
/// _log_add_exp_helper gives it). Floating x.
Tensor logcumsumexp(const Tensor& x, int64_t dim);
/// The log-sum-exps run the other way, from the end of `dim`: logcumsumexp's gradient.
Tensor reverse_logcumsumexp(const Tensor& x, int64_t dim);

/// The sums run the other way: out[..., j, ...] = x[..., j, ...] + ... + x[..., D - 1, ...],
/// cumsum's gradient. Dtypes as cumsum without `dtype`.
Tensor reverse_cumsum(const Tensor& x, int64_t dim);

/// The running total's type for input T (Note [Cumulative sum dtypes]), and the output's.
template <typename T>
using CumsumOut = std::conditional_t<std::is_floating_point_v<opmath_t<T>>, T, int64_t>;
template <typename T>
inline constexpr bool kCumsumInFloat = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;
template <typename T>
using CumsumAcc = std::conditional_t<std::is_same_v<CumsumOut<T>, int64_t>, int64_t,
                                     std::conditional_t<kCumsumInFloat<T>, float, double>>;

/// The chunk length and the chunks per span of Note [Cumulative sum order].
inline constexpr int64_t kCumsumChunk = 1024;
inline constexpr int64_t kCumsumSpan = 32;

/// How running totals combine: cumsum adds, cumprod multiplies, cummax and cummin keep the
/// extreme (NaN winning), logcumsumexp adds exponentials in log space.
enum class Cumulative : uint8_t { Sum, Prod, Max, Min, LogAddExp };

/// Calls f.template operator()<op>() with the runtime op as a compile-time one.
template <typename F>
void with_cumulative(Cumulative op, F&& f) {
  switch (op) {
    case Cumulative::Sum: f.template operator()<Cumulative::Sum>(); return;
    case Cumulative::Prod: f.template operator()<Cumulative::Prod>(); return;
    case Cumulative::Max: f.template operator()<Cumulative::Max>(); return;
    case Cumulative::Min: f.template operator()<Cumulative::Min>(); return;
    case Cumulative::LogAddExp: f.template operator()<Cumulative::LogAddExp>(); return;
  }
}

/// The op's name, for errors and dispatch messages.
constexpr const char* cumulative_name(Cumulative op) {
  return op == Cumulative::Sum    ? "cumsum"
         : op == Cumulative::Prod ? "cumprod"
         : op == Cumulative::Max  ? "cummax"
         : op == Cumulative::Min  ? "cummin"
                                  : "logcumsumexp";
}

/// The combine of Cumulative op on running totals of type Acc, with its identity. Integers
/// wrap around (two's complement, as PyTorch), which a signed + or * would leave undefined.
/// LogAddExp is PyTorch's _log_add_exp_helper (floating Acc only).
template <Cumulative kOp, typename Acc>
struct CumulativeCombine {
  static FRUGAL_HD Acc identity() {
    if constexpr (kOp == Cumulative::Sum) return Acc(0);
    else if constexpr (kOp == Cumulative::Prod) return Acc(1);
    else if constexpr (kOp == Cumulative::Min) return highest();
    else return lowest();  // Max, LogAddExp: log(0) = -inf
  }
  static FRUGAL_HD Acc apply(Acc a, Acc b) {
    if constexpr (kOp == Cumulative::Sum || kOp == Cumulative::Prod) {
      if constexpr (std::is_integral_v<Acc>) {
        return kOp == Cumulative::Sum ? math::wrapping_add(a, b) : math::wrapping_mul(a, b);
      } else {
        return kOp == Cumulative::Sum ? a + b : a * b;
      }
    } else if constexpr (kOp == Cumulative::Max || kOp == Cumulative::Min) {
      if (a != a) return a;  // NaN wins (a NaN is never != itself for integers: no-op there)
      if (b != b) return b;
      return (kOp == Cumulative::Max ? a < b : b < a) ? b : a;
    } else {
      static_assert(std::is_floating_point_v<Acc>, "logcumsumexp takes floating types");
      const Acc lo = b != b ? b : (a < b ? a : b), hi = b != b ? b : (a < b ? b : a);
      if (lo != hi || std::isfinite(lo)) return std::log1p(std::exp(lo - hi)) + hi;  // NaN propagates here
      return a;                                                                      // both the same infinity
    }
  }

 private:
  static FRUGAL_HD Acc lowest() {
    if constexpr (std::is_floating_point_v<Acc>) return -std::numeric_limits<Acc>::infinity();
    else return std::numeric_limits<Acc>::lowest();
  }
  static FRUGAL_HD Acc highest() {
    if constexpr (std::is_floating_point_v<Acc>) return std::numeric_limits<Acc>::infinity();
    else return std::numeric_limits<Acc>::max();
  }
};

/// A contiguous tensor seen as (outer, D, inner), the totals running along D (from D - 1
/// down to 0 when reverse).
struct CumsumShape {
  int64_t outer = 1, D = 1, inner = 1;
  bool reverse = false;
  Cumulative op = Cumulative::Sum;
};

}  // namespace frugal::ops

// Backend kernels (running sums or products, as s.op says): x contiguous, out contiguous
// (x's dtype when floating, else int64), numel > 0.
namespace frugal::ops::cpu {
/// out, x: (outer, D, inner)
void cumsum_kernel(const Tensor& out, const Tensor& x, CumsumShape s);
}  // namespace frugal::ops::cpu
namespace frugal::ops::cuda {
void cumsum_kernel(const Tensor& out, const Tensor& x, CumsumShape s);
}  // namespace frugal::ops::cuda
