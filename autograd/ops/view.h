#pragma once
namespace frugal::autograd {
/// Makes Tensor's view/clone/to methods record their backward (Note [Derived tensors]).
/// Called whenever a tensor first gets autograd metadata, so it is in place before any
/// such tensor can be viewed.
void install_derived_hook();
}  // namespace frugal::autograd
