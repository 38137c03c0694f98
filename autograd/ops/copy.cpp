// Tensor::copy_, differentiable: the tensor layer's copy_into below autograd, recorded
// by the in-place rules of Note [In-place ops and autograd] (autograd/ops/inplace.h).
#include "tensor/ops/copy.h"
#include "autograd/function.h"
#include "autograd/graph_backward.h"
#include "autograd/ops/inplace.h"
#include "core/instrument.h"
#include "tensor/factory.h"

namespace frugal {

namespace {

// self.copy_(src): self's new value is src, broadcast to self's shape and converted to
// self's dtype and device. So self's old history gets zeros (its values are gone, as
// PyTorch's CopyBackwards says) and src gets the gradient converted to its own dtype and
// device, then summed over the broadcast to its shape: in that order, as PyTorch's (whose
// engine sums the converted gradient), so a float32 source's sum is not rounded to a
// float16 destination's dtype first.
class CopyBackward final : public autograd::Node {
 public:
  Shape src_sizes;
  DType src_dtype = kFloat32;
  Device src_device = kCPU;

  std::string name() const override { return "CopyBackward"; }
  bool saves_tensors() const override { return false; }

  autograd::TensorList apply(autograd::TensorList&& grads) override {
    const Tensor& g = grads[0];  // g: self's shape
    autograd::TensorList out(2);
    if (autograd::wants_grad(*this, 0)) out[0] = zeros(g.sizes(), g.options());
    if (autograd::wants_grad(*this, 1)) out[1] = autograd::sum_to(g.to(src_device, src_dtype), src_sizes);
    return out;
  }
  bool has_graph_backward() const override { return true; }
  autograd::TensorList apply_graph(autograd::TensorList&& grads) override {
    const Tensor& g = grads[0];
    autograd::TensorList out(2);
    if (autograd::wants_grad(*this, 0)) out[0] = zeros(g.sizes(), g.options());
    if (autograd::wants_grad(*this, 1)) out[1] = autograd::graph::sum_to(g.to(src_device, src_dtype), src_sizes);
    return out;
  }
};

}  // namespace

const Tensor& Tensor::copy_(const Tensor& src) const {
  core::OpScope scope("copy_");
  FRUGAL_CHECK(src.defined(), "copy_: undefined source tensor (destination ", describe(), ")");
  // An integer or bool destination carries no gradient: the copy is not recorded and the
  // result does not require grad, as in PyTorch (copying a float that requires grad into an
  // int64 buffer is a plain conversion).
  const bool record = autograd::must_record_inplace("copy_", *this, is_floating(dtype()) ? &src : nullptr);
  std::shared_ptr<CopyBackward> node;
  if (record) {
    node = autograd::make_node<CopyBackward>({*this, src});
    node->src_sizes = src.sizes();
    node->src_dtype = src.dtype();
    node->src_device = src.device();
  }
  autograd::raw([&] { ops::copy_into(*this, src); });
  bump_version();
  if (node) autograd::rebase_history(*this, node);
  return *this;
}

}  // namespace frugal
