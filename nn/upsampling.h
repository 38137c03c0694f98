#pragma once
// Upsampling layers (no parameters): Upsample, torch.nn.Upsample over interpolate, and
// PixelShuffle / PixelUnshuffle, torch.nn's over pixel_shuffle / pixel_unshuffle.
#include <cstdint>
#include <string>

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

/// torch.nn.PixelShuffle(upscale_factor): (*, C r^2, H, W) to (*, C, H r, W r).
class PixelShuffle : public UnaryModule {
 public:
  explicit PixelShuffle(int64_t upscale_factor);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "PixelShuffle"; }
  std::string extra_repr() const override { return "upscale_factor=" + std::to_string(factor_); }

 private:
  int64_t factor_;
};

/// torch.nn.PixelUnshuffle(downscale_factor): (*, C, H r, W r) to (*, C r^2, H, W).
class PixelUnshuffle : public UnaryModule {
 public:
  explicit PixelUnshuffle(int64_t downscale_factor);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "PixelUnshuffle"; }
  std::string extra_repr() const override { return "downscale_factor=" + std::to_string(factor_); }

 private:
  int64_t factor_;
};

}  // namespace frugal::nn
