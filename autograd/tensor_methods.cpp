// The autograd methods declared on Tensor (tensor/tensor.h), defined here so the
// tensor layer stays free of autograd.
#include "autograd/engine.h"
#include "autograd/meta.h"

namespace frugal {

using autograd::AutogradMeta;
using autograd::meta_of;
using autograd::TensorList;

bool Tensor::requires_grad() const { return autograd::requires_grad(*this); }

const Tensor& Tensor::requires_grad_(bool on) const {
  AutogradMeta* m = meta_of(*this);
  FRUGAL_CHECK(!(m && m->grad_fn) || on, "requires_grad_: cannot turn off requires_grad on a non-leaf tensor (",
               describe(), "); use detach()");
  if (on)
    FRUGAL_CHECK(is_floating(dtype()), "requires_grad_: only floating tensors can require grad, got ", describe());
  if (on || m) autograd::ensure_meta(*this).requires_grad = on;
  return *this;
}

Tensor Tensor::grad() const {
  const AutogradMeta* m = meta_of(*this);
  return m ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined())
    FRUGAL_CHECK(g.sizes() == sizes() && g.device() == device(), "set_grad: gradient ", g.describe(),
                 " does not match tensor ", describe());
  autograd::ensure_meta(*this).grad = g;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph, bool create_graph) const {
  autograd::backward({*this}, gradient.defined() ? TensorList{gradient} : TensorList{},
                     autograd::BackwardOptions{.retain_graph = retain_graph, .create_graph = create_graph});
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>(this->impl());
  impl->autograd_meta.reset();
  return Tensor(std::move(impl));
}

bool Tensor::is_leaf() const {
  const AutogradMeta* m = meta_of(*this);
  return !m || !m->grad_fn;
}

void Tensor::retain_grad() const {
  AutogradMeta* m = meta_of(*this);
  FRUGAL_CHECK(m && (m->grad_fn || m->requires_grad), "retain_grad: ", describe(), " does not require grad");
  if (m->grad_fn && !m->retains_grad) m->grad_fn->retained_outputs.emplace_back(m->output_nr, impl_ptr());
  m->retains_grad = true;
}

std::string Tensor::grad_fn_name() const {
  const AutogradMeta* m = meta_of(*this);
  return m && m->grad_fn ? m->grad_fn->name() : "";
}

}  // namespace frugal
