#include "nn/init.h"

#include <algorithm>
#include <cmath>

#include "tensor/elementwise.h"  // check_no_internal_overlap
#include "tensor/factory.h"
#include "tensor/ops/copy.h"
#include "tensor/ops/fill.h"
#include "tensor/ops/random.h"

namespace frugal::nn::init {

std::pair<int64_t, int64_t> fans(const Tensor& t) {
  FRUGAL_CHECK(t.dim() >= 2, "init: fan in/out need a tensor of >= 2 dims, got ", t.describe());
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

// The initialisers write through a detached alias: they set values, they are not ops to differentiate.
void uniform_(const Tensor& t, double low, double high, Generator* gen) { ops::uniform_(t.detach(), low, high, gen); }
void normal_(const Tensor& t, double mean, double std, Generator* gen) { ops::normal_(t.detach(), mean, std, gen); }
void constant_(const Tensor& t, double value) { ops::fill_(t.detach(), value); }
void zeros_(const Tensor& t) { constant_(t, 0.0); }
void ones_(const Tensor& t) { constant_(t, 1.0); }

namespace {
// Inverse error function: Giles' single-precision approximation ("Approximating the
// erfinv function", GPU Computing Gems, 2011), refined by two Newton steps in double.
double erfinv(double y) {
  y = std::clamp(y, -1.0 + 1e-15, 1.0 - 1e-15);
  double w = -std::log((1.0 - y) * (1.0 + y)), p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08;
    for (double c : {3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087, -0.00125372503, -0.00417768164,
                     0.246640727, 1.50140941})
      p = c + p * w;
  } else {
    w = std::sqrt(w) - 3.0;
    p = -0.000200214257;
    for (double c : {0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613, 0.00943887047,
                     1.00167406, 2.83297682})
      p = c + p * w;
  }
  double x = p * y;
  for (int it = 0; it < 2; ++it) x -= (std::erf(x) - y) / (2.0 / std::sqrt(M_PI) * std::exp(-x * x));
  return x;
}
}  // namespace

void trunc_normal_(const Tensor& t, double mean, double std, double a, double b, Generator* gen) {
  FRUGAL_CHECK(a < b, "trunc_normal_: a ", a, " must be < b ", b);
  // Inverse-CDF sampling, as torch does: uniform in [cdf(a), cdf(b)], then erfinv.
  // Done on the host in double: initialisation runs once.
  const double sa = (a - mean) / std, sb = (b - mean) / std;
  // Beyond 6 std the uniform's range [cdf(a), cdf(b)] is under 1e-9 wide near 0 or 1, where
  // doubles are 1e-16 apart: past about 8 it holds no double at all.
  FRUGAL_CHECK(sa <= 6 && sb >= -6, "trunc_normal_: [", a, ", ", b, "] lies more than 6 std (", std, ") from the mean ",
               mean, "; inverse-CDF sampling cannot resolve it (move the mean closer)");
  // Refused before the draw, as uniform_ is: a refused call moves no generator.
  check_no_internal_overlap("trunc_normal_", t);
  auto cdf = [](double x) { return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))); };
  Tensor u = empty(t.sizes(), TensorOptions(kFloat64));
  ops::uniform_(u, 2 * cdf(sa) - 1, 2 * cdf(sb) - 1, gen);
  double* p = u.data_ptr<double>();
  for (int64_t i = 0; i < u.numel(); ++i) p[i] = std::clamp(mean + std * std::sqrt(2.0) * erfinv(p[i]), a, b);
  ops::copy_into(t.detach(), u);
  t.bump_version();  // an in-place write, as uniform_'s: a node that saved t must refuse to run
}

namespace {
double leaky_relu_gain(double a) { return std::sqrt(2.0 / (1.0 + a * a)); }
}  // namespace

// Note [Initialising zero-element tensors]
// A weight with a zero dim has a fan of 0 on one side, and its bound or std would be
// infinite (gain * sqrt(3 / 0)): uniform_ refuses such bounds (Note [Random bounds in the
// dtype]). There is nothing to fill, so kaiming_* and xavier_* return after checking the
// dims, as torch.nn.init.kaiming_uniform_ does ("Initializing zero-element tensors is a
// no-op"); PyTorch's xavier_* divide by zero on a (0, 0) weight instead.

void kaiming_uniform_(const Tensor& t, double a, FanMode mode, Generator* gen) {
  const auto [fan_in, fan_out] = fans(t);
  if (t.numel() == 0) return;  // Note [Initialising zero-element tensors]
  const double fan = double(mode == FanMode::FanIn ? fan_in : fan_out);
  const double bound = leaky_relu_gain(a) * std::sqrt(3.0 / fan);
  uniform_(t, -bound, bound, gen);
}

void kaiming_normal_(const Tensor& t, double a, FanMode mode, Generator* gen) {
  const auto [fan_in, fan_out] = fans(t);
  if (t.numel() == 0) return;  // Note [Initialising zero-element tensors]
  const double fan = double(mode == FanMode::FanIn ? fan_in : fan_out);
  normal_(t, 0.0, leaky_relu_gain(a) / std::sqrt(fan), gen);
}

void xavier_uniform_(const Tensor& t, double gain, Generator* gen) {
  const auto [fan_in, fan_out] = fans(t);
  if (t.numel() == 0) return;  // Note [Initialising zero-element tensors]
  const double bound = gain * std::sqrt(6.0 / double(fan_in + fan_out));
  uniform_(t, -bound, bound, gen);
}

void xavier_normal_(const Tensor& t, double gain, Generator* gen) {
  const auto [fan_in, fan_out] = fans(t);
  if (t.numel() == 0) return;  // Note [Initialising zero-element tensors]
  normal_(t, 0.0, gain * std::sqrt(2.0 / double(fan_in + fan_out)), gen);
}

}  // namespace frugal::nn::init
