#include "autograd/gradcheck.h"

#include <cmath>
#include <cstdio>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "tensor/factory.h"

namespace frugal::autograd {

namespace {
// v . f(x) in double, on the host.
double project(const Tensor& y, const std::vector<double>& v) {
  const std::vector<double> yv = y.tolist<double>();
  double s = 0;
  for (size_t i = 0; i < yv.size(); ++i) s += yv[i] * v[i];
  return s;
}
}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                          const GradcheckOptions& opt) {
  for (const Tensor& x : inputs)
    if (x.defined() && x.requires_grad())
      FRUGAL_CHECK(x.dtype() == kFloat64 && x.device().is_cpu() && x.is_contiguous() && x.is_leaf(),
                   "gradcheck: inputs that require grad must be contiguous float64 CPU leaves, got ", x.describe());

  // Analytic: one backward of v . f(x).
  Tensor y = f(inputs);
  Generator gen(opt.seed + 1);
  const Tensor v_tensor = randn(y.sizes(), TensorOptions(kFloat64), &gen);
  const std::vector<double> v = v_tensor.tolist<double>();
  TensorList wrt;
  for (const Tensor& x : inputs)
    if (x.defined() && x.requires_grad()) wrt.push_back(x);
  FRUGAL_CHECK(!wrt.empty(), "gradcheck: no input requires grad");
  FRUGAL_CHECK(y.requires_grad(), "gradcheck: the output does not require grad (is f differentiable?)");
  // An input f does not use has a zero gradient, which the differences check too.
  const TensorList analytic = grad({y}, wrt, {v_tensor.to(y.dtype())}, /*retain_graph=*/false, /*allow_unused=*/true);

  GradcheckResult result;
  char line[256];
  int reported = 0;
  NoGradGuard no_grad;
  for (size_t k = 0; k < wrt.size(); ++k) {
    double* data = wrt[k].data_ptr<double>();
    const std::vector<double> a = analytic[k].defined() ? analytic[k].to(kFloat64).tolist<double>()
                                                        : std::vector<double>(size_t(wrt[k].numel()), 0.0);
    for (int64_t i = 0; i < wrt[k].numel(); ++i) {
      const double orig = data[i];
      data[i] = orig + opt.eps;
      const double plus = project(f(inputs), v);
      data[i] = orig - opt.eps;
      const double minus = project(f(inputs), v);
      data[i] = orig;
      const double numeric = (plus - minus) / (2 * opt.eps);
      if (std::fabs(a[i] - numeric) > opt.atol + opt.rtol * std::fabs(numeric)) {
        if (result.ok) result.report = "input  element       analytic        numeric     abs error\n";
        result.ok = false;
        if (reported++ < 10) {
          std::snprintf(line, sizeof line, "%5zu %8lld %14.8g %14.8g %13.3g\n", k, (long long)i, a[i], numeric,
                        std::fabs(a[i] - numeric));
          result.report += line;
        }
      }
    }
  }
  return result;
}

}  // namespace frugal::autograd
