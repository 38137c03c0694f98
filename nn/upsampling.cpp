#include "nn/upsampling.h"

#include "autograd/ops/interpolate.h"

namespace frugal::nn {

Upsample::Upsample(InterpolateOptions o) : options(o) {
  constexpr const char* op = "Upsample";
  FRUGAL_CHECK(o.mode == InterpolateMode::Nearest || o.mode == InterpolateMode::Bilinear, op, ": unknown mode ",
               int(o.mode), " (expected nearest or bilinear)");
  FRUGAL_CHECK(o.size.has_value() != o.scale_factor.has_value(), op,
               ": exactly one of size and scale_factor must be given, got ",
               o.size ? "size=" + o.size->str() : "neither",
               o.scale_factor ? " and scale_factor=" + o.scale_factor->str() : "");
  FRUGAL_CHECK(!o.size || (o.size->h > 0 && o.size->w > 0), op, ": size must be positive, got ", o.size->str());
  FRUGAL_CHECK(!o.scale_factor || (o.scale_factor->h > 0 && o.scale_factor->w > 0), op,
               ": scale_factor must be positive, got ", o.scale_factor->str());
  FRUGAL_CHECK(!(o.mode == InterpolateMode::Nearest && o.align_corners.has_value()), op,
               ": align_corners can only be set with the interpolating modes (bilinear), not with nearest");
}

Tensor Upsample::forward(const Tensor& x) {
  core::ModuleScope scope(this);  // Note [Module attribution]
  return interpolate(x, options);
}

std::string Upsample::extra_repr() const {
  // As torch: "scale_factor=2.0, mode='nearest'" or "size=(4, 6), mode='bilinear'".
  std::string s = options.scale_factor ? "scale_factor=" + options.scale_factor->str()
                                       : "size=" + (options.size->h == options.size->w ? std::to_string(options.size->h)
                                                                                       : options.size->str());
  return s + ", mode='" + interpolate_mode_name(options.mode) + "'";
}

}  // namespace frugal::nn
