// CPU softmax / log_softmax and their backward formulas (Note [Stable softmax]).
//
// Note [CPU softmax layout]
// Work is cut into slices of contiguous memory so Eigen's vectorized exp applies:
// along the last dim (inner == 1) a work item is one row of D elements; along another
// dim it is a block of up to kBlock neighbouring slices, read as D contiguous segments
// (one per j) with one max/sum per slice kept in small arrays. Three passes: max, sum
// of exp (accumulated in double), write. 16-bit types are converted to float segment
// by segment (Eigen computes in float and double only). The float32 softmax gradient along the
// last dim runs on the vectorized rows of the CPU's level (Note [Vectorized masked softmax] in
// tensor/cpu/masked_softmax_kernel.cpp): attention's backward.
#include "tensor/ops/softmax.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "tensor/cpu/gemm.h"  // gemm_isa: the level of the softmax kernels too
#include "tensor/cpu/loops.h"
#include "tensor/cpu/masked_softmax_kernel.h"
#include "tensor/dispatch.h"

namespace frugal::ops::cpu {

namespace {

constexpr int64_t kBlock = 256;  // slices per work item when softmax is not along the last dim

template <typename Acc>
using Arr = Eigen::Array<Acc, Eigen::Dynamic, 1>;
template <typename Acc>
using ConstMap = Eigen::Map<const Arr<Acc>>;
using ArrD = Eigen::Array<double, Eigen::Dynamic, 1>;

/// n contiguous elements at p as an Eigen array in opmath_t<T>: in place for float and
/// double, converted into `buf` for the 16-bit types.
template <typename T>
ConstMap<opmath_t<T>> load(const T* p, int64_t n, Arr<opmath_t<T>>& buf) {
  using Acc = opmath_t<T>;
  if constexpr (std::is_same_v<T, Acc>) {
    return ConstMap<Acc>(p, n);
  } else {
    buf.resize(n);
    for (int64_t j = 0; j < n; ++j) buf[j] = Acc(p[j]);
    return ConstMap<Acc>(buf.data(), n);
  }
}

/// exp of an Eigen expression, exactly 0 below the smallest normal result. Eigen's
/// vectorized exp clamps its argument, so exp(-inf) (a masked entry) would otherwise be
/// ~1e-39 instead of 0; the flushed results are all below 1.2e-38 (float).
template <typename E>
auto exp0(const E& d) {
  using Acc = typename E::Scalar;
  static const Acc lo = std::log(std::numeric_limits<Acc>::min());
  return (d < lo).select(Acc(0), d.exp());
}

/// Writes an Eigen expression to n contiguous T at p, rounding once.
template <typename T, typename Expr>
void store(T* p, int64_t n, const Expr& e) {
  using Acc = opmath_t<T>;
  if constexpr (std::is_same_v<T, Acc>) {
    Eigen::Map<Arr<Acc>>(p, n) = e;
  } else {
    const Arr<Acc> v = e;
    for (int64_t j = 0; j < n; ++j) p[j] = T(v[j]);
  }
}

// x, y: (outer, D, inner); the work item is slices [i0, i0 + n) of outer index o (a whole
// row when inner == 1, then n == 1 and the segment is the row).
template <typename T>
void softmax_item(const T* x, T* y, const SoftmaxShape& s, int64_t o, int64_t i0, int64_t n, bool log) {
  using Acc = opmath_t<T>;
  Arr<Acc> buf;
  if (s.inner == 1) {
    const T* xr = x + o * s.D;
    const ConstMap<Acc> v = load(xr, s.D, buf);
    const Acc m = v.template maxCoeff<Eigen::PropagateNaN>();
    if (log) {
      const double sum = exp0(v - m).template cast<double>().sum();
      store(y + o * s.D, s.D, (v - m) - Acc(std::log(sum)));
    } else {
      const Arr<Acc> e = exp0(v - m);
      store(y + o * s.D, s.D, e * Acc(1.0 / e.template cast<double>().sum()));
    }
    return;
  }
  // Segment j of the block: n contiguous elements at (o, j, i0).
  const auto at = [&](int64_t j) { return (o * s.D + j) * s.inner + i0; };
  Arr<Acc> m = Arr<Acc>::Constant(n, -std::numeric_limits<Acc>::infinity());
  for (int64_t j = 0; j < s.D; ++j) {
    const ConstMap<Acc> v = load(x + at(j), n, buf);
    for (int64_t k = 0; k < n; ++k) m[k] = (v[k] > m[k] || v[k] != v[k]) ? v[k] : m[k];  // NaN wins
  }
  ArrD sum = ArrD::Zero(n);
  for (int64_t j = 0; j < s.D; ++j) sum += exp0(load(x + at(j), n, buf) - m).template cast<double>();
  const Arr<Acc> c = log ? Arr<Acc>(sum.log().template cast<Acc>()) : Arr<Acc>(sum.inverse().template cast<Acc>());
  for (int64_t j = 0; j < s.D; ++j) {
    const ConstMap<Acc> v = load(x + at(j), n, buf);
    if (log) store(y + at(j), n, (v - m) - c);
    else store(y + at(j), n, exp0(v - m) * c);
  }
}

// gi, g, y: (outer, D, inner). softmax: gi = y * (g - sum(g * y)); log: gi = g - exp(y) * sum(g).
template <typename T>
void softmax_backward_item(T* gi, const T* g, const T* y, const SoftmaxShape& s, int64_t o, int64_t i0, int64_t n,
                           bool log) {
  using Acc = opmath_t<T>;
  Arr<Acc> gbuf, ybuf;
  const int64_t len = s.inner == 1 ? s.D : n;  // contiguous elements per segment
  const int64_t segments = s.inner == 1 ? 1 : s.D;
  const auto at = [&](int64_t j) { return s.inner == 1 ? o * s.D : (o * s.D + j) * s.inner + i0; };
  ArrD dot = ArrD::Zero(s.inner == 1 ? 1 : n);
  for (int64_t j = 0; j < segments; ++j) {
    const ConstMap<Acc> gv = load(g + at(j), len, gbuf);
    if (s.inner == 1) {
      const ConstMap<Acc> yv = load(y + at(j), len, ybuf);
      dot[0] = log ? gv.template cast<double>().sum() : (gv.template cast<double>() * yv.template cast<double>()).sum();
    } else if (log) {
      dot += gv.template cast<double>();
    } else {
      dot += gv.template cast<double>() * load(y + at(j), len, ybuf).template cast<double>();
    }
  }
  for (int64_t j = 0; j < segments; ++j) {
    const ConstMap<Acc> gv = load(g + at(j), len, gbuf);
    const ConstMap<Acc> yv = load(y + at(j), len, ybuf);
    if (s.inner == 1) {
      const Acc d = Acc(dot[0]);
      if (log) store(gi + at(j), len, gv - exp0(yv) * d);
      else store(gi + at(j), len, yv * (gv - d));
    } else {
      const Arr<Acc> d = dot.template cast<Acc>();
      if (log) store(gi + at(j), len, gv - exp0(yv) * d);
      else store(gi + at(j), len, yv * (gv - d));
    }
  }
}

/// Calls f(o, i0, n) for every work item (rows, or blocks of kBlock slices), in parallel.
template <typename F>
void for_each_item(const SoftmaxShape& s, F&& f) {
  const int64_t blocks = s.inner == 1 ? 1 : (s.inner + kBlock - 1) / kBlock;
  const int64_t items = s.outer * blocks;
#pragma omp parallel for schedule(static) if (items > 1 && s.outer * s.D * s.inner >= kParallelGrain)
  for (int64_t t = 0; t < items; ++t) {
    const int64_t o = t / blocks, i0 = (t % blocks) * kBlock;
    f(o, i0, s.inner == 1 ? int64_t(1) : std::min(kBlock, s.inner - i0));
  }
}

}  // namespace

void softmax_kernel(const Tensor& out, const Tensor& x, SoftmaxShape s, bool log) {
  dispatch_floating(x.dtype(), log ? "log_softmax" : "softmax", x.device(), [&]<typename T>() {
    const T* xp = x.data_ptr<T>();
    T* yp = out.data_ptr<T>();
    for_each_item(s, [&](int64_t o, int64_t i0, int64_t n) { softmax_item(xp, yp, s, o, i0, n, log); });
  });
}

void softmax_backward_kernel(const Tensor& grad_in, const Tensor& grad_out, const Tensor& out, SoftmaxShape s,
                             bool log) {
  if (out.dtype() != kFloat32 || s.inner != 1 || log)
    return softmax_backward_kernel_generic(grad_in, grad_out, out, s, log);
  float* gi = grad_in.data_ptr<float>();
  const float* g = grad_out.data_ptr<float>();
  const float* y = out.data_ptr<float>();
  const GemmIsa isa = gemm_isa();
  for_each_item(s, [&](int64_t o, int64_t, int64_t) {  // rows of D: gi, g, y (outer, D)
    const int64_t at = o * s.D;
    switch (isa) {
      case GemmIsa::X86_64_V4: return v4::softmax_backward_rows_f32(gi + at, g + at, y + at, 1, s.D);
      case GemmIsa::X86_64_V3: return v3::softmax_backward_rows_f32(gi + at, g + at, y + at, 1, s.D);
      case GemmIsa::X86_64_V2: return v2::softmax_backward_rows_f32(gi + at, g + at, y + at, 1, s.D);
    }
  });
}

void softmax_backward_kernel_generic(const Tensor& grad_in, const Tensor& grad_out, const Tensor& out, SoftmaxShape s,
                                     bool log) {
  dispatch_floating(out.dtype(), log ? "log_softmax_backward" : "softmax_backward", out.device(), [&]<typename T>() {
    T* gi = grad_in.data_ptr<T>();
    const T* g = grad_out.data_ptr<T>();
    const T* y = out.data_ptr<T>();
    for_each_item(s, [&](int64_t o, int64_t i0, int64_t n) { softmax_backward_item(gi, g, y, s, o, i0, n, log); });
  });
}

}  // namespace frugal::ops::cpu
