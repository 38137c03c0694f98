#include "autograd/function.h"

#include "tensor/ops/reduce.h"

namespace frugal::autograd {

// Every input is looked at, not only up to the first that requires grad: a view whose
// storage was written since it was taken is refused wherever it is (Note [Views without
// history] in autograd/ops/view_history.h).
bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!is_grad_enabled()) {
    if (probing_grad_use())
      for (const Tensor* x : inputs)
        if (x && x->defined()) {
          detail::note_checkpoint_read(*x);
          if (requires_grad(*x)) note_grad_use();
        }
    return false;
  }
  bool any = false;
  for (const Tensor* x : inputs) {
    if (!x || !x->defined()) continue;
    check_untracked_view("an operation", *x);
    any = any || requires_grad(*x);
  }
  return any;
}

bool needs_grad(const TensorList& inputs) {
  if (!is_grad_enabled()) {
    if (probing_grad_use()) detail::probe_inputs(inputs);
    return false;
  }
  bool any = false;
  for (const Tensor& x : inputs) {
    if (!x.defined()) continue;
    check_untracked_view("an operation", x);
    any = any || requires_grad(x);
  }
  return any;
}

void record(const std::shared_ptr<Node>& node, const TensorList& outputs) {
  node->outputs.clear();
  node->outputs.reserve(outputs.size());
  for (uint32_t k = 0; k < outputs.size(); ++k) {
    const Tensor& out = outputs[k];
    node->outputs.push_back({out.sizes(), out.dtype(), out.device()});
    set_history(out, node, k);
  }
}

std::vector<int64_t> stretched_dims(const Shape& sizes, const Shape& shape) {
  const int64_t lead = int64_t(sizes.size()) - int64_t(shape.size());
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < int64_t(sizes.size()); ++d)
    if (d < lead || (shape[d - lead] == 1 && sizes[d] != 1)) dims.push_back(d);
  return dims;
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.sizes() == shape) return grad;
  const std::vector<int64_t> dims = stretched_dims(grad.sizes(), shape);
  Tensor r = dims.empty() ? grad : ops::sum(grad, dims, /*keepdim=*/true);
  return r.reshape(shape);
}

}  // namespace frugal::autograd
