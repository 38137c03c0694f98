// CPU kernel of batch_norm_finalize (Note [Convolution batch-norm fusion]): a loop over
// the channels of the shared formula (tensor/ops/conv_bn_math.h).
#include "tensor/ops/conv_bn.h"
#include "tensor/ops/conv_bn_math.h"

namespace frugal::ops::cpu {

void batch_norm_finalize_kernel(const BatchNormAffine& out, const Tensor& sum, const Tensor& sq_sum, int64_t count,
                                const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                                const Tensor& bias, bool training, double momentum, double eps, bool half_affine) {
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
    for (int64_t c = 0; c < C; ++c)
      math::finalize_channel(c, mean, invstd, scale, shift, rm, rv, sum.defined() ? sum.data_ptr<Acc>() : nullptr,
                             sq_sum.defined() ? sq_sum.data_ptr<Acc>() : nullptr, w, b, count, training, momentum, eps,
                             half_affine);
  };
  if (out.mean.dtype() == kFloat64) run.template operator()<double>();
  else run.template operator()<float>();
}

}  // namespace frugal::ops::cpu
