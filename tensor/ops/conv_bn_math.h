#pragma once
// batch_norm_finalize's per-channel formula, compiled for the host (tensor/cpu/conv_bn.cpp) and
// the device (tensor/cuda/conv_bn.cu) from this one file (Note [One formula, two backends] in
// tensor/ops/unary_math.h; Note [Convolution batch-norm fusion] in tensor/ops/conv_bn.h).
#include <math.h>

#include <cstdint>

#include "tensor/half.h"

namespace frugal::ops::math {

/// One channel's finalize, in double: in training mean and the biased variance from the sums
/// of `count` values (variance clamped at 0) and the running statistics' update in place
/// (when rm is not null); in eval the running statistics. Writes mean, invstd and the folded
/// scale = weight invstd, shift = bias - mean scale (rounded to float16 values when
/// half_affine). w, b: null for weight 1, bias 0.
template <typename Acc>
FRUGAL_HD void finalize_channel(int64_t c, Acc* mean, Acc* invstd, Acc* scale, Acc* shift, Acc* rm, Acc* rv,
                                const Acc* sum, const Acc* sq_sum, const Acc* w, const Acc* b, int64_t count,
                                bool training, double momentum, double eps, bool half_affine) {
  double m, var;
  if (training) {
    m = double(sum[c]) / double(count);
    var = fmax(0.0, double(sq_sum[c]) / double(count) - m * m);
    if (rm != nullptr) {
      rm[c] = Acc((1.0 - momentum) * double(rm[c]) + momentum * m);
      rv[c] = Acc((1.0 - momentum) * double(rv[c]) + momentum * var * double(count) / double(count - 1));
    }
  } else {
    m = double(rm[c]);
    var = double(rv[c]);
  }
  const double is = 1.0 / sqrt(var + eps);
  const double sc = (w != nullptr ? double(w[c]) : 1.0) * is;
  const double sh = (b != nullptr ? double(b[c]) : 0.0) - m * sc;
  mean[c] = Acc(m);
  invstd[c] = Acc(is);
  scale[c] = half_affine ? Acc(float(Half(float(sc)))) : Acc(sc);
  shift[c] = half_affine ? Acc(float(Half(float(sh)))) : Acc(sh);
}

}  // namespace frugal::ops::math
