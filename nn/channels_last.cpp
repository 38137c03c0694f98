#include "nn/channels_last.h"

#include "autograd/grad_mode.h"
#include "tensor/memory_format.h"

namespace frugal::nn {

namespace {
// Replaces t's storage and strides in place (same TensorImpl), so every handle to t sees them.
void to_channels_last_in_place(const Tensor& t) {
  if (!t.defined() || t.dim() != 4 || is_channels_last(t)) return;
  Tensor converted;
  {
    autograd::NoGradGuard no_grad;
    converted = to_channels_last(t.detach());
  }
  TensorImpl& impl = t.impl();
  impl.storage = converted.impl().storage;
  impl.offset = converted.impl().offset;
  impl.strides = converted.impl().strides;
}
}  // namespace

void to_channels_last(Module& module) {
  for (auto& [name, p] : module.named_parameters()) {
    to_channels_last_in_place(p);
    if (p.grad().defined()) to_channels_last_in_place(p.grad());
  }
}

}  // namespace frugal::nn
