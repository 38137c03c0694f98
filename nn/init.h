#pragma once
// Parameter initialisation, matching torch.nn.init (in place, not recorded by autograd).
#include "tensor/random.h"
#include "tensor/tensor.h"

namespace frugal::nn::init {

/// fan_in = size(1) * receptive field, fan_out = size(0) * receptive field (torch's rule).
std::pair<int64_t, int64_t> fans(const Tensor& t);

void uniform_(const Tensor& t, double low, double high, Generator* gen = nullptr);
void normal_(const Tensor& t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
/// Normal(mean, std) truncated to [a, b], by inverse-CDF sampling as
/// torch.nn.init.trunc_normal_ (used by ViT). [a, b] must come within 6 std of the mean:
/// farther out the CDF is 0 or 1 to double precision and every value would land on one
/// bound (torch's do, with a warning), so that throws.
void trunc_normal_(const Tensor& t, double mean = 0.0, double std = 1.0, double a = -2.0, double b = 2.0,
                   Generator* gen = nullptr);
void constant_(const Tensor& t, double value);
void zeros_(const Tensor& t);
void ones_(const Tensor& t);

enum class FanMode { FanIn, FanOut };
/// He uniform: bound = gain * sqrt(3 / fan), gain = sqrt(2 / (1 + a^2)) (leaky_relu).
/// a = sqrt(5) is what nn.Linear and nn.Conv2d use by default.
void kaiming_uniform_(const Tensor& t, double a = 0.0, FanMode mode = FanMode::FanIn, Generator* gen = nullptr);
void kaiming_normal_(const Tensor& t, double a = 0.0, FanMode mode = FanMode::FanIn, Generator* gen = nullptr);
void xavier_uniform_(const Tensor& t, double gain = 1.0, Generator* gen = nullptr);
void xavier_normal_(const Tensor& t, double gain = 1.0, Generator* gen = nullptr);

}  // namespace frugal::nn::init
