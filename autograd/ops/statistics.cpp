// Order statistics and the NaN-skipping and logical reductions, as compositions (see the
// header). The positions an order statistic picks are found below autograd (sort's indices,
// counts of NaN); the values are then gathered from x, so only the picked elements get a
// gradient.
#include "autograd/ops/statistics.h"

#include <algorithm>
#include <limits>
#include <string>

#include "autograd/function.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/even_share.h"
#include "autograd/ops/index.h"
#include "autograd/ops/sort.h"
#include "core/instrument.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/dims.h"
#include "tensor/ops/index.h"
#include "tensor/ops/reduce.h"
#include "tensor/ops/sort.h"
#include "tensor/ops/unary.h"

namespace frugal {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// x seen along one dim: at least 1-d (a 0-d x is one element along dim 0 or -1), dim wrapped.
struct Along {
  Tensor x;
  int64_t dim = 0;
  bool scalar = false;  // x was 0-d: the result is 0-d whatever keepdim says, as in PyTorch
};

Along along(const char* op, const Tensor& x, int64_t dim) {
  FRUGAL_CHECK(x.defined(), op, ": undefined input");
  FRUGAL_CHECK(is_floating(x.dtype()) || is_integral(x.dtype()), op,
               ": expects a floating-point or integer tensor, got ", x.describe());
  const int64_t nd = std::max<int64_t>(x.dim(), 1);
  FRUGAL_CHECK(dim >= -nd && dim < nd, op, ": dim ", dim, " out of range for ", x.describe(), " (expected ", -nd, "..",
               nd - 1, ")");
  return {x.dim() == 0 ? x.reshape({1}) : x, dim < 0 ? dim + nd : dim, x.dim() == 0};
}

/// The elements of each slice at `index` (int64, a's shape with 1 at a.dim): their values,
/// gathered from x (so differentiable), and the index itself, keepdim or not.
ValuesIndices pick(const Along& a, Tensor index, bool keepdim) {
  Tensor values = gather(a.x, a.dim, index);
  if (a.scalar) return {values.reshape({}), index.reshape({})};
  if (!keepdim) values = values.squeeze(a.dim), index = index.squeeze(a.dim);
  return {values, index};
}

/// How many NaN each slice of a.x holds, as float64 (a.x's shape with 1 at a.dim).
Tensor nan_counts(const Along& a) { return ops::sum(ops::isnan(a.x), {a.dim}, true).to(kFloat64); }

/// median and nanmedian along a dim (Note in the header: the lower median).
ValuesIndices median_along(const char* op, const Tensor& x, int64_t dim, bool keepdim, bool skip_nan) {
  core::OpScope scope(op);
  const Along a = along(op, x, dim);
  const int64_t n = a.x.size(a.dim);
  FRUGAL_CHECK(n > 0, op, ": cannot take the median over dim ", dim, " of size 0 of ", x.describe());
  const Tensor index = autograd::raw([&] {
    const Tensor order = ops::sort(a.x, a.dim).indices;  // NaN last, in input order
    Shape one = a.x.sizes();
    one[size_t(a.dim)] = 1;
    Tensor position = full(one, double((n - 1) / 2), {kFloat64, x.device()});
    if (is_floating(x.dtype())) {
      const Tensor nans = nan_counts(a);
      // median: a slice with NaN takes its first NaN, at position n - nans of the order;
      // nanmedian: the lower median of the n - nans others (position 0, a NaN, when none).
      position = skip_nan ? ops::clamp(ops::floor(ops::div(ops::add(ops::neg(nans), double(n - 1)), 2.0)), 0.0, kInf)
                          : ops::where(ops::gt(nans, 0.0), ops::add(ops::neg(nans), double(n)), position);
    }
    return ops::gather(order, a.dim, position.to(kInt64));
  });
  return pick(a, index, keepdim);
}

/// median(x) and nanmedian(x): the slice's value over every element, 0-d.
Tensor median_all(const char* op, const Tensor& x, bool skip_nan) {
  core::OpScope scope(op);
  FRUGAL_CHECK(x.defined(), op, ": undefined input");
  if (x.numel() == 0) {
    FRUGAL_CHECK(is_floating(x.dtype()), op, ": the median of an empty ", x.describe(), " is NaN, which ",
                 dtype_name(x.dtype()), " cannot hold");
    return full({}, std::numeric_limits<double>::quiet_NaN(), x.options());
  }
  Tensor out = autograd::raw([&] { return median_along(op, x.reshape({-1}), 0, false, skip_nan).values.contiguous(); });
  autograd::record_even_share(skip_nan ? "NanmedianBackward" : "MedianBackward", out, x, {});
  return out;
}

enum class Interpolation { Linear, Lower, Higher, Midpoint, Nearest };

Interpolation parse_interpolation(const char* op, std::string_view name) {
  if (name == "linear") return Interpolation::Linear;
  if (name == "lower") return Interpolation::Lower;
  if (name == "higher") return Interpolation::Higher;
  if (name == "midpoint") return Interpolation::Midpoint;
  if (name == "nearest") return Interpolation::Nearest;
  FRUGAL_FAIL(op, ": interpolation must be 'linear', 'lower', 'higher', 'midpoint' or 'nearest', got '",
              std::string(name), "'");
}

/// The positions quantile q takes in each sorted line (the last dim of `sorted`), as PyTorch's
/// quantile computes them: q (n - 1), or q (m - 1) for m values that are not NaN (skip_nan;
/// 0 when there is none), or n - 1 (a NaN) when a line holds one; then rounded as the
/// interpolation says. Float32 or wider; shape: sorted's with q's entries last.
Tensor ranks_of(const Tensor& sorted, const Tensor& q, Interpolation mode, bool skip_nan) {
  const int64_t n = sorted.size(-1);
  Shape q_shape(size_t(sorted.dim()), 1);
  q_shape.back() = std::max<int64_t>(q.numel(), 1);
  const Tensor qv = q.to(opmath_dtype(q.dtype())).reshape(q_shape);
  const Tensor nans = ops::sum(ops::isnan(sorted), {-1}, true).to(qv.dtype());
  Tensor ranks =
      skip_nan ? ops::clamp(ops::mul(qv, ops::add(ops::neg(nans), double(n - 1))), 0.0, kInf)
               : ops::where(ops::gt(nans, 0.0), full({}, double(n - 1), qv.options()), ops::mul(qv, double(n - 1)));
  if (mode == Interpolation::Lower) ranks = ops::floor(ranks);
  if (mode == Interpolation::Higher) ranks = ops::ceil(ranks);
  if (mode == Interpolation::Nearest) ranks = ops::round(ranks);
  return ranks;  // the NaN counts (sorted's shape, 1 last) broadcast against q (q's entries last)
}

Tensor quantile_impl(const char* op, const Tensor& x, const Tensor& q, std::optional<int64_t> dim, bool keepdim,
                     std::string_view interpolation, bool skip_nan) {
  core::OpScope scope(op);
  FRUGAL_CHECK(x.defined() && q.defined(), op, ": undefined input");
  FRUGAL_CHECK(is_floating(x.dtype()), op, ": expects a floating-point input, got ", x.describe());
  FRUGAL_CHECK(is_floating(q.dtype()) && q.device() == x.device() && q.dim() <= 1, op,
               ": q must be a 0-d or 1-d floating tensor on the input's device, got q ", q.describe(), " and input ",
               x.describe());
  FRUGAL_CHECK(x.numel() > 0, op, ": the input must be non-empty, got ", x.describe());
  const Interpolation mode = parse_interpolation(op, interpolation);
  if (q.numel() > 0) {
    const bool in_range =
        autograd::raw([&] { return ops::amin(ops::logical_and(ops::ge(q, 0.0), ops::le(q, 1.0))).item<bool>(); });
    FRUGAL_CHECK(in_range, op, ": q values must be in [0, 1], got ", q.describe());
  }
  // Each slice as a line along the last dim; the reduced dim stays as 1 (for keepdim).
  const Along a = dim ? along(op, x, *dim) : Along{x.reshape({-1}), 0, false};
  const Tensor lines = dim ? a.x.unsqueeze(-1).transpose(a.dim, -1) : a.x;
  const Tensor sorted = sort(lines, -1).values;
  Tensor below, above, weight;
  autograd::raw([&] {
    const Tensor ranks = ranks_of(sorted.detach(), q, mode, skip_nan);
    below = ops::floor(ranks).to(kInt64);
    above = ops::ceil(ranks).to(kInt64);
    weight = (mode == Interpolation::Midpoint ? full(ranks.sizes(), 0.5, ranks.options())
                                              : ops::sub(ranks, ops::floor(ranks)))
                 .to(x.dtype());
  });
  Tensor out = gather(sorted, -1, below);
  if (mode == Interpolation::Linear || mode == Interpolation::Midpoint)
    out = lerp(out, gather(sorted, -1, above), weight);
  // The quantiles last -> first (a 1-d q) or gone (a 0-d one).
  out = q.dim() == 1 ? out.unsqueeze(0).transpose(0, -1).squeeze(-1) : out.squeeze(-1);
  const int64_t lead = q.dim();  // the dims before x's
  if (!dim) {
    if (!keepdim) return out;
    Shape shape(size_t(lead + x.dim()), 1);
    if (lead == 1) shape[0] = q.numel();
    return out.reshape(shape);
  }
  if (a.scalar) return lead == 1 ? out.reshape({q.numel()}) : out.reshape({});
  return keepdim ? out : out.squeeze(lead + a.dim);
}

/// One 0-d q on x's device, its value checked: float64, or float32 for a narrower x (a 16-bit
/// q would move the ranks).
Tensor scalar_q(const char* op, const Tensor& x, double q) {
  FRUGAL_CHECK(x.defined(), op, ": undefined input");
  FRUGAL_CHECK(q >= 0.0 && q <= 1.0, op, ": q must be in [0, 1], got ", q);
  return full({}, q, {x.dtype() == kFloat64 ? kFloat64 : kFloat32, x.device()});
}

/// A tensor q has x's dtype, as torch.quantile asks.
const Tensor& same_dtype_q(const char* op, const Tensor& x, const Tensor& q) {
  FRUGAL_CHECK(!x.defined() || !q.defined() || q.dtype() == x.dtype(), op, ": q must have the input's dtype, got q ",
               q.describe(), " and input ", x.describe());
  return q;
}

/// any and all: amax and amin of x != 0, with their values over an empty slice.
Tensor any_all(const char* op, bool is_any, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  core::OpScope scope(op);
  FRUGAL_CHECK(x.defined(), op, ": undefined input");
  const std::vector<bool> mask = ops::dims_mask(op, x, dims, /*empty_means_all=*/true);
  if (ops::reduced_count(x, mask) == 0)
    return full(ops::reduced_shape(x, mask, keepdim), is_any ? 0.0 : 1.0, {kBool, x.device()});
  const Tensor nonzero = x.dtype() == kBool ? x : ops::ne(x, 0.0);
  return is_any ? ops::amax(nonzero, dims, keepdim) : ops::amin(nonzero, dims, keepdim);
}

}  // namespace

ValuesIndices kthvalue(const Tensor& x, int64_t k, int64_t dim, bool keepdim) {
  core::OpScope scope("kthvalue");
  const Along a = along("kthvalue", x, dim);
  const int64_t n = a.x.size(a.dim);
  FRUGAL_CHECK(k >= 1 && k <= n, "kthvalue: k = ", k, " is out of range for dim ", dim, " of size ", n, " of ",
               x.describe(), " (expected 1..", n, ")");
  const Tensor index =
      autograd::raw([&] { return ops::topk(a.x, k, a.dim, /*largest=*/false).indices.narrow(a.dim, k - 1, 1); });
  return pick(a, index.contiguous(), keepdim);
}

ValuesIndices median(const Tensor& x, int64_t dim, bool keepdim) {
  return median_along("median", x, dim, keepdim, false);
}
Tensor median(const Tensor& x) { return median_all("median", x, false); }
ValuesIndices nanmedian(const Tensor& x, int64_t dim, bool keepdim) {
  return median_along("nanmedian", x, dim, keepdim, true);
}
Tensor nanmedian(const Tensor& x) { return median_all("nanmedian", x, true); }

Tensor quantile(const Tensor& x, const Tensor& q, std::optional<int64_t> dim, bool keepdim,
                std::string_view interpolation) {
  return quantile_impl("quantile", x, same_dtype_q("quantile", x, q), dim, keepdim, interpolation, false);
}
Tensor quantile(const Tensor& x, double q, std::optional<int64_t> dim, bool keepdim, std::string_view interpolation) {
  return quantile_impl("quantile", x, scalar_q("quantile", x, q), dim, keepdim, interpolation, false);
}
Tensor nanquantile(const Tensor& x, const Tensor& q, std::optional<int64_t> dim, bool keepdim,
                   std::string_view interpolation) {
  return quantile_impl("nanquantile", x, same_dtype_q("nanquantile", x, q), dim, keepdim, interpolation, true);
}
Tensor nanquantile(const Tensor& x, double q, std::optional<int64_t> dim, bool keepdim,
                   std::string_view interpolation) {
  return quantile_impl("nanquantile", x, scalar_q("nanquantile", x, q), dim, keepdim, interpolation, true);
}

Tensor nansum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  core::OpScope scope("nansum");
  FRUGAL_CHECK(x.defined(), "nansum: undefined input");
  FRUGAL_CHECK(x.dtype() != kUInt8, "nansum: uint8 is a storage-only dtype, got ", x.describe(),
               "; convert it with .to(kInt64) first");
  if (!is_floating(x.dtype())) return sum(x, dims, keepdim);
  const Tensor is_nan = autograd::raw([&] { return ops::isnan(x); });
  return sum(where(is_nan, zeros({}, x.options()), x), dims, keepdim);
}

Tensor nanmean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  core::OpScope scope("nanmean");
  FRUGAL_CHECK(x.defined() && is_floating(x.dtype()), "nanmean: expects a floating-point input, got ",
               x.defined() ? x.describe() : std::string("an undefined tensor"));
  const Tensor count = autograd::raw([&] { return ops::sum(ops::logical_not(ops::isnan(x)), dims, keepdim); });
  return div(nansum(x, dims, keepdim), count.to(x.dtype()));
}

Tensor any(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return autograd::raw([&] { return any_all("any", true, x, dims, keepdim); });
}
Tensor all(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return autograd::raw([&] { return any_all("all", false, x, dims, keepdim); });
}
Tensor count_nonzero(const Tensor& x, const std::vector<int64_t>& dims) {
  core::OpScope scope("count_nonzero");
  FRUGAL_CHECK(x.defined(), "count_nonzero: undefined input");
  ops::dims_mask("count_nonzero", x, dims, /*empty_means_all=*/true);  // its errors name this op
  return autograd::raw([&] { return ops::sum(x.dtype() == kBool ? x : ops::ne(x, 0.0), dims); });
}

}  // namespace frugal
