#include "autograd/saved_tensor.h"

namespace frugal::autograd {

namespace {
// A new handle onto the same storage, sizes and strides, without autograd meta.
Tensor detached_alias(const Tensor& t) {
  auto impl = std::make_shared<TensorImpl>(t.impl());
  impl->autograd_meta.reset();
  return Tensor(std::move(impl));
}
}  // namespace

SavedTensor::SavedTensor(const Tensor& t) : was_defined_(t.defined()) {
  if (!t.defined()) return;
  data_ = detached_alias(t);
  version_ = t.version();
}

Tensor SavedTensor::unpack(const std::string& node_name) const {
  if (!was_defined_) return Tensor();
  FRUGAL_CHECK(data_.defined(), node_name,
               ": its saved tensors were freed by an earlier backward; call backward(..., retain_graph=true) "
               "the first time to backward through the graph twice");
  FRUGAL_CHECK(data_.version() == version_, node_name, ": a tensor it saved for backward (", data_.describe(),
               ") was modified by an in-place operation (version ", data_.version(), ", saved at version ", version_,
               "); clone it before the in-place op, or make that op out-of-place");
  return data_;
}

void SavedTensor::reset() { data_ = Tensor(); }

}  // namespace frugal::autograd
