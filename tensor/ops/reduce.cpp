#include "tensor/ops/reduce.h"

#include <cmath>
#include <limits>

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/dims.h"

namespace frugal::ops {

std::vector<bool> dims_mask(const char* op, const Tensor& x, const std::vector<int64_t>& dims, bool empty_means_all) {
  const int64_t nd = x.dim(), n = std::max<int64_t>(nd, 1);
  std::vector<bool> mask(size_t(nd), dims.empty() && empty_means_all);
  std::vector<bool> seen(size_t(n), false);
  for (int64_t d : dims) {
    FRUGAL_CHECK(d >= -n && d < n, op, ": dim ", d, " out of range for ", x.describe(), " (expected ", -n, "..", n - 1,
                 ")");
    const int64_t w = d < 0 ? d + n : d;
    FRUGAL_CHECK(!seen[size_t(w)], op, ": dim ", d, " appears more than once in dims ", shape_str(dims), " for ",
                 x.describe());
    seen[size_t(w)] = true;
    if (nd > 0) mask[size_t(w)] = true;
  }
  return mask;
}

Shape reduced_shape(const Tensor& x, const std::vector<bool>& mask, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (!mask[size_t(d)]) out.push_back(x.size(d));
    else if (keepdim) out.push_back(1);
  }
  return out;
}

int64_t reduced_count(const Tensor& x, const std::vector<bool>& mask) {
  int64_t r = 1;
  for (int64_t d = 0; d < x.dim(); ++d)
    if (mask[size_t(d)]) r *= x.size(d);
  return r;
}

namespace {


/// Merges dims `ds` of x (in that order) into one (size, stride); false when their
/// strides do not chain, and then `size` and `stride` are left as they were (the
/// callers try one layout after another). An empty list merges to (1, 0).
bool merge_dims(const Tensor& x, const std::vector<int64_t>& ds, int64_t& size, int64_t& stride) {
  int64_t merged = 1;
  for (size_t k = 0; k < ds.size(); ++k) {
    if (k + 1 < ds.size() && x.stride(ds[k]) != x.stride(ds[k + 1]) * x.size(ds[k + 1])) return false;
    merged *= x.size(ds[k]);
  }
  size = merged;
  stride = ds.empty() ? 0 : x.stride(ds.back());
  return true;
}

/// The (outer, R, inner) view of x of Note [Reduction geometry] (tensor/reduction.h).
/// Needs x.numel() > 0.
Tensor reduction_view(const Tensor& x, const std::vector<bool>& mask) {
  // Size-1 dims do not affect the layout; leave them out.
  std::vector<int64_t> before, reduced, after, kept;
  bool one_run = true;  // reduced dims consecutive among the dims that matter
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (x.size(d) == 1) continue;
    if (mask[size_t(d)]) {
      if (!after.empty()) one_run = false;
      reduced.push_back(d);
    } else {
      kept.push_back(d);
      (reduced.empty() ? before : after).push_back(d);
    }
  }
  int64_t outer = 1, so = 0, R = 1, sr = 0, inner = 1, si = 0;
  Tensor base = x;
  // Each layout is tried from a clean (outer, R, inner): a failed attempt may have
  // set some of them, and a stale `inner` makes the kernel write outer * inner
  // results into an output of `outer` elements.
  const auto layout_as_is = [&] {
    return one_run && merge_dims(x, before, outer, so) && merge_dims(x, reduced, R, sr) &&
           merge_dims(x, after, inner, si);
  };
  const auto layout_reduced_last = [&] {
    inner = 1, si = 0;
    return merge_dims(x, kept, outer, so) && merge_dims(x, reduced, R, sr);
  };
  if (layout_as_is()) {
    // (before, reduced, after) as is: no copy.
  } else if (layout_reduced_last()) {
    // (kept, reduced): the reduced dims permuted to the end, still no copy.
  } else {
    inner = 1, si = 0;
    std::vector<int64_t> order;
    for (int64_t d = 0; d < x.dim(); ++d)
      if (!mask[size_t(d)]) order.push_back(d);
    for (int64_t d = 0; d < x.dim(); ++d)
      if (mask[size_t(d)]) order.push_back(d);
    base = x.permute(order).contiguous();
    R = reduced_count(x, mask);
    outer = x.numel() / R;
    so = R, sr = 1;
  }
  // Two effective dims: let consecutive lanes walk the smaller stride.
  if (inner == 1 && outer > 1 && so < sr) {
    std::swap(inner, outer);
    std::swap(si, so);
  } else if (outer == 1 && inner > 1 && sr < si) {
    std::swap(inner, outer);
    std::swap(si, so);
  }
  return base.as_strided({outer, R, inner}, {so, sr, si}, base.storage_offset());
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Prod: return "prod";
    case ReduceOp::Mean: return "mean";
    case ReduceOp::Max: return "amax";
    case ReduceOp::Min: return "amin";
    case ReduceOp::Var: return "var";
  }
  return "reduce";
}

Tensor reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, DType out_dtype,
              int64_t correction) {
  const char* name = op_name(op);
  FRUGAL_CHECK(x.defined(), name, ": undefined tensor");
  const std::vector<bool> mask = dims_mask(name, x, dims, /*empty_means_all=*/true);
  Tensor out = empty(reduced_shape(x, mask, keepdim), {out_dtype, x.device()});
  if (reduced_count(x, mask) == 0) {
    FRUGAL_CHECK(op != ReduceOp::Max && op != ReduceOp::Min, name, ": cannot reduce over a zero-size dim of ",
                 x.describe(), " (dims ", shape_str(dims), "): the operation has no identity");
    const double empty_value = op == ReduceOp::Sum ? 0.0 : op == ReduceOp::Prod ? 1.0 : std::nan("");
    if (out.numel() > 0) out = full(out.sizes(), empty_value, out.options());
    return out;
  }
  if (out.numel() == 0) return out;
  FRUGAL_DEVICE_DISPATCH(name, x.device(), reduce_kernel, op, out, reduction_view(x, mask), correction);
  return out;
}

void check_floating(const char* op, const Tensor& x) {
  FRUGAL_CHECK(x.defined(), op, ": undefined tensor");
  FRUGAL_CHECK(is_floating(x.dtype()), op, ": expects a floating-point tensor, got ", x.describe(),
               " (as in PyTorch; convert integers with .to(kFloat32) first)");
}

ValuesIndices arg_reduce(const char* name, bool is_max, const Tensor& x, int64_t dim, bool keepdim, bool want_values) {
  FRUGAL_CHECK(x.defined(), name, ": undefined tensor");
  const std::vector<bool> mask = dims_mask(name, x, {dim}, /*empty_means_all=*/true);
  const Shape shape = reduced_shape(x, mask, keepdim);
  FRUGAL_CHECK(reduced_count(x, mask) > 0, name, ": cannot reduce over dim ", dim, " of size 0 of ", x.describe());
  ValuesIndices r;
  if (want_values) r.values = empty(shape, x.options());
  r.indices = empty(shape, {kInt64, x.device()});
  if (r.indices.numel() == 0) return r;
  FRUGAL_DEVICE_DISPATCH(name, x.device(), arg_reduce_kernel, is_max, r.values, r.indices, reduction_view(x, mask));
  return r;
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  FRUGAL_CHECK(x.defined(), "sum: undefined tensor");
  return reduce(ReduceOp::Sum, x, dims, keepdim, is_floating(x.dtype()) ? x.dtype() : kInt64, 0);
}

Tensor prod(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  FRUGAL_CHECK(x.defined(), "prod: undefined tensor");
  return reduce(ReduceOp::Prod, x, dims, keepdim, is_floating(x.dtype()) ? x.dtype() : kInt64, 0);
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_floating("mean", x);
  return reduce(ReduceOp::Mean, x, dims, keepdim, x.dtype(), 0);
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  FRUGAL_CHECK(x.defined(), "amax: undefined tensor");
  return reduce(ReduceOp::Max, x, dims, keepdim, x.dtype(), 0);
}

Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  FRUGAL_CHECK(x.defined(), "amin: undefined tensor");
  return reduce(ReduceOp::Min, x, dims, keepdim, x.dtype(), 0);
}

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  check_floating("var", x);
  FRUGAL_CHECK(correction >= 0, "var: correction must be >= 0, got ", correction);
  return reduce(ReduceOp::Var, x, dims, keepdim, x.dtype(), correction);
}

ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim) { return arg_reduce("max", true, x, dim, keepdim, true); }
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim) {
  return arg_reduce("min", false, x, dim, keepdim, true);
}
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return arg_reduce("argmax", true, x, dim, keepdim, false).indices;
}
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) {
  return arg_reduce("argmin", false, x, dim, keepdim, false).indices;
}

}  // namespace frugal::ops
