// outer, kron, tensordot and cross as compositions of differentiable ops (see the header).
#include "autograd/ops/tensor_products.h"

#include <algorithm>

#include "autograd/autocast.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/join.h"
#include "autograd/ops/matmul.h"
#include "core/instrument.h"
#include "tensor/shape.h"

namespace frugal {

namespace {

/// Both defined, on one device, neither uint8 (storage only: no arithmetic).
void check_defined(const char* op, const Tensor& a, const Tensor& b) {
  FRUGAL_CHECK(a.defined() && b.defined(), op, ": undefined input");
  FRUGAL_CHECK(a.device() == b.device() && a.dtype() != kUInt8 && b.dtype() != kUInt8, op,
               ": expects two numeric tensors on one device (uint8 is storage-only), got ", a.describe(), " and ",
               b.describe());
}

/// dims wrapped for an ndim-dim tensor, each once.
std::vector<int64_t> wrapped_dims(const char* op, const std::vector<int64_t>& dims, const Tensor& t) {
  std::vector<int64_t> out;
  for (int64_t d : dims) {
    FRUGAL_CHECK(d >= -t.dim() && d < t.dim(), op, ": dim ", d, " out of range for ", t.describe());
    const int64_t w = d < 0 ? d + t.dim() : d;
    FRUGAL_CHECK(std::find(out.begin(), out.end(), w) == out.end(), op, ": dim ", d, " appears twice for ",
                 t.describe());
    out.push_back(w);
  }
  return out;
}

/// The dims of t not in `dims`, in order.
std::vector<int64_t> other_dims(const Tensor& t, const std::vector<int64_t>& dims) {
  std::vector<int64_t> out;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) out.push_back(d);
  return out;
}

}  // namespace

Tensor outer(const Tensor& a, const Tensor& b) {
  core::OpScope scope("outer");
  check_defined("outer", a, b);
  FRUGAL_CHECK(a.dim() == 1 && b.dim() == 1, "outer: expects two 1-d tensors, got ", a.describe(), " and ",
               b.describe());
  return mul(a.unsqueeze(1), b.unsqueeze(0));
}

Tensor kron(const Tensor& a, const Tensor& b) {
  core::OpScope scope("kron");
  check_defined("kron", a, b);
  // One dtype first, the one a * b has: reshaping a 0-d operand would change its part in the
  // promotion (a 0-d float32 times a float16 tensor is float16, a [1] float32 is not).
  const DType dtype = result_type(a.dtype(), a.dim() == 0, b.dtype(), b.dim() == 0);
  const Tensor x = a.to(dtype), y = b.to(dtype);
  const int64_t nd = std::max(a.dim(), b.dim());
  // a as (a_0, 1, a_1, 1, ...) and b as (1, b_0, 1, b_1, ...): their product's pairs of dims
  // merge into the result's.
  Shape as, bs, out;
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t na = d < nd - a.dim() ? 1 : a.size(d - (nd - a.dim()));
    const int64_t nb = d < nd - b.dim() ? 1 : b.size(d - (nd - b.dim()));
    as.insert(as.end(), {na, 1});
    bs.insert(bs.end(), {1, nb});
    out.push_back(na * nb);
  }
  return mul(x.reshape(as), y.reshape(bs)).reshape(out);
}

Tensor tensordot(const Tensor& a, const Tensor& b, const std::vector<int64_t>& dims_a,
                 const std::vector<int64_t>& dims_b) {
  core::OpScope scope("tensordot");
  if (auto c = autocast::cast_inputs(autocast::Policy::Lower, {&a, &b}))  // a matmul, as PyTorch's
    return tensordot((*c)[0], (*c)[1], dims_a, dims_b);
  check_defined("tensordot", a, b);
  FRUGAL_CHECK(dims_a.size() == dims_b.size(), "tensordot: ", dims_a.size(), " dims of a (", shape_str(dims_a),
               ") against ", dims_b.size(), " of b (", shape_str(dims_b), ")");
  FRUGAL_CHECK(a.dtype() == b.dtype(), "tensordot: expects one dtype (a matmul does not promote), got ", a.describe(),
               " and ", b.describe());
  const std::vector<int64_t> ca = wrapped_dims("tensordot", dims_a, a), cb = wrapped_dims("tensordot", dims_b, b);
  int64_t k = 1;
  for (size_t i = 0; i < ca.size(); ++i) {
    FRUGAL_CHECK(a.size(ca[i]) == b.size(cb[i]), "tensordot: dim ", dims_a[i], " of ", a.describe(), " has size ",
                 a.size(ca[i]), " but dim ", dims_b[i], " of ", b.describe(), " has size ", b.size(cb[i]));
    k *= a.size(ca[i]);
  }
  const std::vector<int64_t> fa = other_dims(a, ca), fb = other_dims(b, cb);
  Shape out;
  int64_t m = 1, n = 1;
  for (int64_t d : fa) out.push_back(a.size(d)), m *= a.size(d);
  for (int64_t d : fb) out.push_back(b.size(d)), n *= b.size(d);
  std::vector<int64_t> order_a = fa, order_b = cb;
  order_a.insert(order_a.end(), ca.begin(), ca.end());
  order_b.insert(order_b.end(), fb.begin(), fb.end());
  return matmul(a.permute(order_a).reshape({m, k}), b.permute(order_b).reshape({k, n})).reshape(out);
}

Tensor tensordot(const Tensor& a, const Tensor& b, int64_t dims) {
  check_defined("tensordot", a, b);
  FRUGAL_CHECK(dims >= 0 && dims <= a.dim() && dims <= b.dim(), "tensordot: cannot contract ", dims, " dims of ",
               a.describe(), " with ", b.describe());
  std::vector<int64_t> da, db;
  for (int64_t i = 0; i < dims; ++i) da.push_back(a.dim() - dims + i), db.push_back(i);
  return tensordot(a, b, da, db);
}

Tensor cross(const Tensor& a, const Tensor& b, int64_t dim) {
  core::OpScope scope("cross");
  check_defined("cross", a, b);
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), "cross");
  const int64_t nd = int64_t(shape.size());
  FRUGAL_CHECK(dim >= -nd && dim < nd, "cross: dim ", dim, " out of range for the broadcast shape ", shape_str(shape),
               " of ", a.describe(), " and ", b.describe());
  const int64_t d = dim < 0 ? dim + nd : dim;
  FRUGAL_CHECK(shape[size_t(d)] == 3, "cross: dim ", dim, " must have size 3, got ", a.describe(), " and ",
               b.describe());
  const Tensor x = a.expand(shape), y = b.expand(shape);
  const auto at = [d](const Tensor& t, int64_t i) { return t.select(d, i); };
  const auto term = [&](int64_t i, int64_t j) { return sub(mul(at(x, i), at(y, j)), mul(at(x, j), at(y, i))); };
  return stack({term(1, 2), term(2, 0), term(0, 1)}, d);
}

}  // namespace frugal
