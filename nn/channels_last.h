#pragma once
// Module-wide channels-last conversion, as PyTorch's model.to(memory_format=torch.channels_last).
#include "nn/module.h"

namespace frugal::nn {

/// Converts every 4-D parameter of `module` (and its gradient, when it has one) to
/// channels-last storage in place: the same tensors, now with NHWC memory, so the modules'
/// handles and an optimizer's parameter list keep working. Convolutions then take their
/// weights without converting them per call (Note [Channels-last convolution] in
/// tensor/ops/conv.h); feed the model channels-last inputs (frugal::to_channels_last) to
/// run it NHWC end to end. Tensors of other ranks are left alone.
void to_channels_last(Module& module);

}  // namespace frugal::nn
