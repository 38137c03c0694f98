#pragma once
// PyTorch's optimizer updates written out in float64 from torch.optim's _single_tensor_sgd
// and _single_tensor_adam(w): the tests' independent references for SGD, Adam and AdamW.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace frugal::testing {

/// torch.optim.SGD, one parameter. `lr` may change between steps, as a scheduler would.
struct SgdReference {
  double lr = 0, momentum = 0, dampening = 0, wd = 0;
  bool nesterov = false, maximize = false;
  std::vector<double> buf = {};  // empty until the first step with momentum (torch's None)
  void step(std::vector<double>& p, const std::vector<double>& grad) {
    const bool fresh = buf.empty();
    if (fresh) buf.assign(p.size(), 0.0);
    for (size_t i = 0; i < p.size(); ++i) {
      double d = maximize ? -grad[i] : grad[i];
      if (wd != 0) d += wd * p[i];
      if (momentum != 0) {
        if (fresh) buf[i] = d;  // torch: buf = clone(d_p), not (1 - dampening) * d_p
        else buf[i] = momentum * buf[i] + (1 - dampening) * d;
        d = nesterov ? d + momentum * buf[i] : buf[i];
      }
      p[i] -= lr * d;
    }
  }
};

/// torch.optim.Adam (decoupled false) and AdamW (decoupled true), one parameter.
struct AdamReference {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0;
  bool decoupled = false, amsgrad = false, maximize = false;
  int64_t t = 0;
  std::vector<double> m = {}, v = {}, vmax = {};
  void step(std::vector<double>& p, const std::vector<double>& grad) {
    if (m.empty()) m.assign(p.size(), 0.0), v.assign(p.size(), 0.0), vmax.assign(p.size(), 0.0);
    ++t;
    const double bc1 = 1 - std::pow(beta1, double(t)), bc2 = 1 - std::pow(beta2, double(t));
    for (size_t i = 0; i < p.size(); ++i) {
      double g = maximize ? -grad[i] : grad[i];
      if (decoupled) p[i] *= 1 - lr * wd;
      else g += wd * p[i];
      m[i] = beta1 * m[i] + (1 - beta1) * g;
      v[i] = beta2 * v[i] + (1 - beta2) * g * g;
      vmax[i] = std::max(vmax[i], v[i]);  // the raw v, not the corrected one
      const double denom = std::sqrt(amsgrad ? vmax[i] : v[i]) / std::sqrt(bc2) + eps;
      p[i] -= lr / bc1 * m[i] / denom;
    }
  }
};

}  // namespace frugal::testing
