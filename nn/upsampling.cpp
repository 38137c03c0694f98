#include "nn/upsampling.h"

#include "autograd/ops/interpolate.h"
#include "autograd/ops/rearrange.h"

namespace frugal::nn {

Upsample::Upsample(InterpolateOptions o) : options(o) { check_interpolate_options(o, "Upsample"); }

Tensor Upsample::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return interpolate(x, options);
}

PixelShuffle::PixelShuffle(int64_t upscale_factor) : factor_(upscale_factor) {
  FRUGAL_CHECK(upscale_factor > 0, "PixelShuffle: upscale_factor must be positive, got ", upscale_factor);
}
Tensor PixelShuffle::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return pixel_shuffle(x, factor_);
}

PixelUnshuffle::PixelUnshuffle(int64_t downscale_factor) : factor_(downscale_factor) {
  FRUGAL_CHECK(downscale_factor > 0, "PixelUnshuffle: downscale_factor must be positive, got ", downscale_factor);
}
Tensor PixelUnshuffle::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return pixel_unshuffle(x, factor_);
}

std::string Upsample::extra_repr() const {
  // As torch: "scale_factor=2.0, mode='nearest'" or "size=(4, 6), mode='bilinear'".
  std::string s = options.scale_factor ? "scale_factor=" + options.scale_factor->str()
                                       : "size=" + (options.size->h == options.size->w ? std::to_string(options.size->h)
                                                                                       : options.size->str());
  return s + ", mode='" + interpolate_mode_name(options.mode) + "'";
}

}  // namespace frugal::nn
