#include "nn/upsampling.h"

#include "autograd/ops/interpolate.h"

namespace frugal::nn {

Upsample::Upsample(InterpolateOptions o) : options(o) { check_interpolate_options(o, "Upsample"); }

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
