#include "autograd/gradcheck.h"

#include <cmath>
#include <cstdio>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/join.h"
#include "autograd/ops/reduce.h"
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
  // The differences run f with grad mode as the caller has it: f may take a gradient itself
  // (a gradient penalty), which grad mode off would refuse.
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

GradcheckResult gradgradcheck(const std::function<Tensor(const TensorList&)>& f, const TensorList& inputs,
                              const GradcheckOptions& opt) {
  std::vector<size_t> wrt;  // the inputs that require grad
  for (size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].defined() && inputs[k].requires_grad()) wrt.push_back(k);
  FRUGAL_CHECK(!wrt.empty(), "gradgradcheck: no input requires grad");
  const Shape out_sizes = f(inputs).sizes();  // with grad on: f may itself take a gradient
  Generator gen(opt.seed + 2);
  const Tensor u = randn(out_sizes, TensorOptions(kFloat64), &gen).requires_grad_();
  // (inputs..., u) -> every first-order gradient, flattened and joined; recorded also when
  // gradcheck's differences call it under NoGradGuard (its values are what they read).
  auto first_order = [&](const TensorList& args) {
    EnableGradGuard with_grad;
    const TensorList xs(args.begin(), args.end() - 1);
    TensorList requested;
    for (size_t k : wrt) requested.push_back(xs[k]);
    const TensorList grads = grad({f(xs)}, requested, {args.back()}, {.create_graph = true, .allow_unused = true});
    TensorList flat;
    for (size_t i = 0; i < grads.size(); ++i)
      flat.push_back(grads[i].defined() ? grads[i].reshape({-1})
                                        : zeros({requested[i].numel()}, TensorOptions(kFloat64)));
    const Tensor joined = frugal::cat(flat, 0);
    if (joined.requires_grad()) return joined;
    // Gradients constant in everything (an empty output's): every second derivative is 0, which
    // the differences then check; the 0 u term gives gradcheck a graph to run.
    return frugal::add(joined, frugal::mul(frugal::sum(args.back()), 0.0));
  };
  TensorList args = inputs;
  args.push_back(u);
  return gradcheck(first_order, args, opt);
}

}  // namespace frugal::autograd
