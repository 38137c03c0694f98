#include "tensor/ops/masked.h"

#include "core/graph_capture.h"
#include "tensor/device_dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/cumsum.h"

namespace frugal::ops {

namespace {

/// The mask in the row-major order of `shape`, flat and contiguous (a copy only when it
/// is broadcast or strided).
Tensor flat_mask(const Tensor& mask, const Shape& shape) {
  return mask.expand(shape).contiguous().view({numel_of(shape)});
}

/// pos = cumsum(mask) of a flat bool mask (Note [Data-dependent output sizes]).
Tensor positions(const Tensor& flat) { return cumsum(flat, 0); }

/// pos[n - 1], read on the host: the one synchronization of nonzero and masked_select.
int64_t count_of(const Tensor& pos) {
  const int64_t n = pos.numel();
  return n == 0 ? 0 : pos.narrow(0, n - 1, 1).item<int64_t>();
}

void refuse_in_capture(const char* op) {
  core::refuse_in_graph_capture(op,
                                "its output size is the number of true (nonzero) elements, which the host reads "
                                "from the device, and a replay would reuse the count of the capture");
}

}  // namespace

Tensor nonzero(const Tensor& x) {
  constexpr const char* op = "nonzero";
  FRUGAL_CHECK(x.defined(), op, ": undefined input tensor");
  refuse_in_capture(op);
  const Shape& sizes = x.sizes();
  // NaN != 0 is true and -0 != 0 false, as torch.nonzero; uint8 compares as int32.
  const Tensor truth = x.dtype() == kBool ? x : ne(x.dtype() == kUInt8 ? x.to(kInt32) : x, 0.0);
  const Tensor m = flat_mask(truth, sizes);
  const Tensor pos = positions(m);
  const int64_t count = count_of(pos);
  Tensor out = empty({count, int64_t(sizes.size())}, {kInt64, x.device()});
  if (out.numel() > 0) FRUGAL_DEVICE_DISPATCH(op, x.device(), nonzero_kernel, out, m, pos, sizes);
  return out;
}

Tensor masked_select(const Tensor& x, const Tensor& mask) {
  constexpr const char* op = "masked_select";
  FRUGAL_CHECK(x.defined() && mask.defined(), op, ": undefined input tensor (input ", x.describe(), ", mask ",
               mask.describe(), ")");
  FRUGAL_CHECK(mask.dtype() == kBool, op, ": mask must be bool, got mask ", mask.describe(), " for input ",
               x.describe());
  check_same_device(op, x, mask);
  const Shape shape = broadcast_shapes(x.sizes(), mask.sizes(), op);
  refuse_in_capture(op);
  const Tensor m = flat_mask(mask, shape);
  const Tensor pos = positions(m);
  const int64_t count = count_of(pos);
  Tensor out = empty({count}, x.options());
  if (count > 0) {
    const Tensor flat_x = x.expand(shape).contiguous().view({numel_of(shape)});
    FRUGAL_DEVICE_DISPATCH(op, x.device(), masked_select_kernel, out, flat_x, m, pos);
  }
  return out;
}

Tensor masked_select_backward(const Tensor& grad, const Tensor& mask, const Shape& shape) {
  constexpr const char* op = "masked_select_backward";
  FRUGAL_CHECK(grad.defined() && mask.defined(), op, ": undefined input tensor");
  FRUGAL_CHECK(mask.dtype() == kBool, op, ": mask must be bool, got ", mask.describe());
  FRUGAL_CHECK(grad.dim() == 1, op, ": expects a 1-D gradient, got ", grad.describe());
  check_same_device(op, grad, mask);
  FRUGAL_CHECK(broadcast_shapes(shape, mask.sizes(), op) == shape, op, ": mask ", mask.describe(),
               " does not broadcast to ", shape_str(shape));
  const Tensor m = flat_mask(mask, shape);
  const int64_t n = m.numel();
  Tensor out = empty({n}, grad.options());
  if (n > 0) {
    const Tensor pos = positions(m);
    // On the CPU the count costs nothing to check; on CUDA it would cost a synchronization.
    if (!grad.device().is_cuda())
      FRUGAL_CHECK(count_of(pos) == grad.numel(), op, ": the gradient ", grad.describe(), " must have one element per ",
                   "true mask element (", count_of(pos), ")");
    FRUGAL_DEVICE_DISPATCH(op, grad.device(), masked_scatter_kernel, out, m, pos, grad.contiguous());
  }
  return out.view(shape);
}

}  // namespace frugal::ops
