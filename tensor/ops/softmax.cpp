#include "tensor/ops/softmax.h"

#include "tensor/device_dispatch.h"
#include "tensor/factory.h"

namespace frugal::ops {

namespace {

/// Checks x and dim; returns x's (outer, D, inner) around the wrapped dim.
SoftmaxShape softmax_shape(const char* op, const Tensor& x, int64_t dim) {
  FRUGAL_CHECK(x.defined(), op, ": undefined tensor");
  FRUGAL_CHECK(is_floating(x.dtype()), op, ": expects a floating-point tensor, got ", x.describe());
  const int64_t n = std::max<int64_t>(x.dim(), 1);
  FRUGAL_CHECK(dim >= -n && dim < n, op, ": dim ", dim, " out of range for ", x.describe(), " (expected ", -n, "..",
               n - 1, ")");
  const int64_t d = dim < 0 ? dim + n : dim;
  SoftmaxShape s;
  for (int64_t k = 0; k < x.dim(); ++k) {
    if (k < d) s.outer *= x.size(k);
    else if (k == d) s.D = x.size(k);
    else s.inner *= x.size(k);
  }
  return s;
}

Tensor softmax_forward(const char* op, const Tensor& x, int64_t dim, bool log) {
  const SoftmaxShape s = softmax_shape(op, x, dim);
  Tensor out = empty(x.sizes(), x.options());
  if (out.numel() == 0) return out;
  FRUGAL_DEVICE_DISPATCH(op, x.device(), softmax_kernel, out, x.contiguous(), s, log);
  return out;
}

Tensor softmax_backward_impl(const char* op, const Tensor& grad_out, const Tensor& out, int64_t dim, bool log) {
  FRUGAL_CHECK(grad_out.defined() && out.defined(), op, ": undefined tensor");
  const SoftmaxShape s = softmax_shape(op, out, dim);
  FRUGAL_CHECK(grad_out.sizes() == out.sizes(), op, ": grad_out ", grad_out.describe(),
               " does not match the forward output ", out.describe());
  FRUGAL_CHECK(grad_out.dtype() == out.dtype(), op, ": dtype mismatch: grad_out ", grad_out.describe(), " vs output ",
               out.describe());
  check_same_device(op, grad_out, out);
  Tensor grad_in = empty(out.sizes(), out.options());
  if (grad_in.numel() == 0) return grad_in;
  FRUGAL_DEVICE_DISPATCH(op, out.device(), softmax_backward_kernel, grad_in, grad_out.contiguous(), out.contiguous(), s,
                         log);
  return grad_in;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_forward("softmax", x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_forward("log_softmax", x, dim, true); }

Tensor softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim) {
  return softmax_backward_impl("softmax_backward", grad_out, out, dim, false);
}
Tensor log_softmax_backward(const Tensor& grad_out, const Tensor& out, int64_t dim) {
  return softmax_backward_impl("log_softmax_backward", grad_out, out, dim, true);
}

}  // namespace frugal::ops
