#pragma once
// Upsampling layer: Upsample (no parameters), torch.nn.Upsample over interpolate.
#include "nn/module.h"
#include "tensor/ops/interpolate.h"  // InterpolateOptions, InterpolateMode

namespace frugal::nn {

/// torch.nn.Upsample(size=None, scale_factor=None, mode='nearest', align_corners=None):
/// resizes (N, C, H, W) inputs with interpolate (Note [Interpolation source indices] in
/// tensor/ops/interpolate.h): 'nearest', 'bilinear', 'bicubic', 'nearest-exact' or 'area';
/// and (N, C, L) inputs: 'nearest', 'linear', 'nearest-exact' or 'area'.
/// Exactly one of options.size and options.scale_factor; align_corners with bilinear and
/// bicubic only. The options are checked when the module is built.
///
///   nn::Upsample up({.scale_factor = 2.0, .mode = InterpolateMode::Bilinear});
class Upsample : public UnaryModule {
 public:
  explicit Upsample(InterpolateOptions options);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Upsample"; }
  std::string extra_repr() const override;

  const InterpolateOptions options;
};

}  // namespace frugal::nn
