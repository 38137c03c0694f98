// CPU kernel of batch_norm_finalize (Note [Convolution batch-norm fusion]): a loop over
// the channels in double.
#include <algorithm>
#include <cmath>

#include "tensor/ops/conv_bn.h"

namespace frugal::ops::cpu {

void batch_norm_finalize_kernel(const BatchNormAffine& out, const Tensor& sum, const Tensor& sq_sum, int64_t count,
                                const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                                const Tensor& bias, bool training, double momentum, double eps) {
  const int64_t C = out.mean.numel();
  auto run = [&]<typename Acc>() {
    Acc* mean = out.mean.data_ptr<Acc>();
    Acc* invstd = out.invstd.data_ptr<Acc>();
    Acc* scale = out.scale.data_ptr<Acc>();
    Acc* shift = out.shift.data_ptr<Acc>();
    Acc* rm = running_mean.defined() ? running_mean.data_ptr<Acc>() : nullptr;
    Acc* rv = running_var.defined() ? running_var.data_ptr<Acc>() : nullptr;
    const Acc* w = weight.defined() ? weight.data_ptr<Acc>() : nullptr;
    const Acc* b = bias.defined() ? bias.data_ptr<Acc>() : nullptr;
    for (int64_t c = 0; c < C; ++c) {
      double m, var;
      if (training) {
        m = double(sum.data_ptr<Acc>()[c]) / double(count);
        var = std::max(0.0, double(sq_sum.data_ptr<Acc>()[c]) / double(count) - m * m);
        if (rm != nullptr) {
          rm[c] = Acc((1.0 - momentum) * double(rm[c]) + momentum * m);
          rv[c] = Acc((1.0 - momentum) * double(rv[c]) + momentum * var * double(count) / double(count - 1));
        }
      } else {
        m = double(rm[c]);
        var = double(rv[c]);
      }
      const double is = 1.0 / std::sqrt(var + eps);
      const double sc = (w != nullptr ? double(w[c]) : 1.0) * is;
      mean[c] = Acc(m);
      invstd[c] = Acc(is);
      scale[c] = Acc(sc);
      shift[c] = Acc((b != nullptr ? double(b[c]) : 0.0) - m * sc);
    }
  };
  if (out.mean.dtype() == kFloat64) run.template operator()<double>();
  else run.template operator()<float>();
}

}  // namespace frugal::ops::cpu
