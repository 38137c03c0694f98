#include "tensor/ops/cumsum.h"

#include <algorithm>

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/unary.h"  // isnan

namespace frugal::ops {

namespace {

// Note [Cumulative sum dtypes]: `dtype` converts x before the sums (or products).
Tensor running_totals(const char* op, Cumulative kind, const Tensor& x_in, int64_t dim, bool reverse,
                      std::optional<DType> dtype) {
  FRUGAL_CHECK(x_in.defined(), op, ": undefined input");
  FRUGAL_CHECK(dtype.value_or(x_in.dtype()) != kUInt8, op, ": uint8 is a storage-only dtype, got ", x_in.describe(),
               dtype ? " and dtype uint8" : "", "; convert it with .to(kInt64) first");
  const int64_t nd = std::max<int64_t>(x_in.dim(), 1);  // a 0-d input takes dim 0 or -1, as in PyTorch
  FRUGAL_CHECK(dim >= -nd && dim < nd, op, ": dim ", dim, " out of range for ", x_in.describe(), " (expected ", -nd,
               "..", nd - 1, ")");
  const Tensor x = dtype ? x_in.to(*dtype).contiguous() : x_in.contiguous();
  const int64_t d = dim < 0 ? dim + nd : dim;
  CumsumShape s;
  s.reverse = reverse;
  s.op = kind;
  for (int64_t k = 0; k < x.dim(); ++k) {
    if (k < d) s.outer *= x.size(k);
    else if (k == d) s.D = x.size(k);
    else s.inner *= x.size(k);
  }
  Tensor out = empty(x.sizes(), {is_floating(x.dtype()) ? x.dtype() : kInt64, x.device()});
  if (out.numel() > 0) FRUGAL_DEVICE_DISPATCH(op, x.device(), cumsum_kernel, out, x, s);
  return dtype && out.dtype() != *dtype ? out.to(*dtype) : out;  // an integral dtype: summed in int64
}

/// cummax and cummin (the header's rule for the indices).
ValuesIndices running_extreme(Cumulative kind, const Tensor& x, int64_t dim) {
  const char* op = cumulative_name(kind);
  Tensor values = running_totals(op, kind, x, dim, false, {});     // checks x and dim
  if (values.dtype() != x.dtype()) values = values.to(x.dtype());  // integers ran in int64: exact
  if (x.numel() == 0) return {values, empty(x.sizes(), {kInt64, x.device()})};
  // The running value changes only where an element sets it (equals it, or is a NaN), so each
  // entry's index is the last such position so far: a running max over those positions.
  const int64_t nd = std::max<int64_t>(x.dim(), 1), d = dim < 0 ? dim + nd : dim;
  Shape along(size_t(x.dim()), 1);
  if (x.dim() > 0) along[size_t(d)] = x.size(d);
  const Tensor positions = arange(x.dim() > 0 ? x.size(d) : 1, {kInt64, x.device()}).reshape(along);
  Tensor sets = eq(x, values);
  if (is_floating(x.dtype())) sets = logical_or(sets, isnan(x));
  const Tensor marks = where(sets, positions, full({}, -1.0, {kInt64, x.device()}));
  return {values, running_totals(op, Cumulative::Max, marks, dim, false, {})};
}

}  // namespace

ValuesIndices cummax(const Tensor& x, int64_t dim) { return running_extreme(Cumulative::Max, x, dim); }
ValuesIndices cummin(const Tensor& x, int64_t dim) { return running_extreme(Cumulative::Min, x, dim); }

Tensor logcumsumexp(const Tensor& x, int64_t dim) {
  FRUGAL_CHECK(!x.defined() || is_floating(x.dtype()), "logcumsumexp: expects a floating-point tensor, got ",
               x.describe());
  return running_totals("logcumsumexp", Cumulative::LogAddExp, x, dim, false, {});
}

Tensor reverse_logcumsumexp(const Tensor& x, int64_t dim) {
  FRUGAL_CHECK(!x.defined() || is_floating(x.dtype()), "reverse_logcumsumexp: expects a floating-point tensor, got ",
               x.describe());
  return running_totals("reverse_logcumsumexp", Cumulative::LogAddExp, x, dim, true, {});
}

Tensor cumsum(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  return running_totals("cumsum", Cumulative::Sum, x, dim, false, dtype);
}

Tensor cumprod(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  return running_totals("cumprod", Cumulative::Prod, x, dim, false, dtype);
}

Tensor reverse_cumsum(const Tensor& x, int64_t dim) {
  return running_totals("reverse_cumsum", Cumulative::Sum, x, dim, true, {});
}

}  // namespace frugal::ops
