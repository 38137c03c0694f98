#pragma once
// RMSNorm: RMS normalization over the trailing dims with a learned scale (torch.nn.RMSNorm).
#include <optional>

#include "nn/module.h"

namespace frugal::nn {

/// torch.nn.RMSNorm's settings.
struct RMSNormOptions {
  /// nullopt: the epsilon of the input's compute type, as torch's eps=None (see
  /// frugal::rms_norm in autograd/ops/rms_norm.h).
  std::optional<double> eps;
  bool elementwise_affine = true;  // a learnable "weight" of normalized_shape, ones
};

/// torch.nn.RMSNorm: x / sqrt(mean(x^2) + eps) * weight over the trailing `normalized_shape`
/// dims (Note [RMS norm is layer norm around zero]).
class RMSNorm : public UnaryModule {
 public:
  explicit RMSNorm(Shape normalized_shape, RMSNormOptions options = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "RMSNorm"; }
  /// "[4], eps=None, elementwise_affine=true"
  std::string extra_repr() const override;

  Tensor weight;  // undefined without elementwise_affine

 private:
  Shape shape_;
  std::optional<double> eps_;
};

}  // namespace frugal::nn
