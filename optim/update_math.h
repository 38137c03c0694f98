#pragma once
// The per-element update rules of SGD and Adam/AdamW, shared by the CPU loops
// (optim/cpu_kernels.cpp) and the fused CUDA kernels (optim/fused_*.cu), so both
// backends compute the same expression in the same order. M is the math type:
// float for float32/float16/bfloat16 parameters, double for float64 ones.
//
// Note [Adam update]
// torch.optim.Adam/AdamW (single-tensor path), per element, at step t:
//   g = maximize ? -grad : grad
//   AdamW: p *= 1 - lr * wd                   Adam: g += wd * p   (each only when wd != 0)
//   m = lerp(m, g, 1 - beta1)                  v = beta2 * v + (1 - beta2) * g * g
//   v_max = max(v_max, v) (amsgrad; the denominator then uses v_max)
//   p -= step_size * (m / (sqrt(v) / sqrt(1 - beta2^t) + eps)),   step_size = lr / (1 - beta1^t)
// It is llm.c's adamw.cuh update (one pass, fp32 math, m_hat / (sqrt(v_hat) + eps)) with
// PyTorch's placement of the bias corrections, which this rearranges exactly in real
// arithmetic: lr * (m / c1) / (sqrt(v / c2) + eps) = (lr / c1) * m / (sqrt(v) / sqrt(c2) + eps).
#include "optim/multi_tensor.h"
#include "tensor/half.h"

#if defined(__CUDACC__)
#define FRUGAL_OPTIM_SQRT(x) ::sqrt(x)
#define FRUGAL_OPTIM_POW(x, y) ::pow(x, y)
#else
#include <cmath>
#define FRUGAL_OPTIM_SQRT(x) std::sqrt(x)
#define FRUGAL_OPTIM_POW(x, y) std::pow(x, y)
#endif

namespace frugal::optim::detail {

/// Sets e.step_size and e.bias_correction2_sqrt for step t (>= 1), in double: on the host
/// for every Adam step, in the kernel for a capturable one (Note [Capturable Adam]).
FRUGAL_HD void set_bias_corrections(AdamEntry& e, int64_t t) {
  e.step_size = e.lr / (1.0 - FRUGAL_OPTIM_POW(e.beta1, double(t)));
  e.bias_correction2_sqrt = FRUGAL_OPTIM_SQRT(1.0 - FRUGAL_OPTIM_POW(e.beta2, double(t)));
}

/// torch.lerp: start + weight * (end - start), computed from the nearer end.
template <typename M>
FRUGAL_HD M lerp(M start, M end, M weight) {
  return weight < M(0.5) ? start + weight * (end - start) : end - (end - start) * (M(1) - weight);
}

/// The scalars of one AdamEntry in the math type.
template <typename M>
struct AdamCoeffs {
  M decay, wd, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, bias_correction2_sqrt;
  bool decoupled, maximize, amsgrad, use_wd;

  FRUGAL_HD explicit AdamCoeffs(const AdamEntry& e)
      : decay(M(1.0 - e.lr * e.weight_decay)),
        wd(M(e.weight_decay)),
        one_minus_beta1(M(1.0 - e.beta1)),
        beta2(M(e.beta2)),
        one_minus_beta2(M(1.0 - e.beta2)),
        eps(M(e.eps)),
        step_size(M(e.step_size)),
        bias_correction2_sqrt(M(e.bias_correction2_sqrt)),
        decoupled((e.flags & kAdamDecoupled) != 0),
        maximize((e.flags & kAdamMaximize) != 0),
        amsgrad((e.flags & kAdamAmsgrad) != 0),
        use_wd(e.weight_decay != 0.0) {}
};

/// One element of Note [Adam update]: updates p, m, v and (amsgrad) vmax in place.
template <typename M>
FRUGAL_HD void adam_update(M& p, M g, M& m, M& v, M& vmax, const AdamCoeffs<M>& c) {
  if (c.maximize) g = -g;
  if (c.use_wd) {
    if (c.decoupled) p = p * c.decay;
    else g = g + c.wd * p;
  }
  m = lerp(m, g, c.one_minus_beta1);
  v = v * c.beta2 + c.one_minus_beta2 * g * g;
  M second = v;
  if (c.amsgrad) {
    vmax = vmax > v ? vmax : v;  // torch.maximum; a NaN v propagates
    second = vmax;
  }
  const M denom = FRUGAL_OPTIM_SQRT(second) / c.bias_correction2_sqrt + c.eps;
  p = p + (-c.step_size) * (m / denom);
}

/// The scalars of one SgdEntry in the math type.
template <typename M>
struct SgdCoeffs {
  M neg_lr, momentum, one_minus_dampening, wd;
  bool use_momentum, nesterov, maximize, use_wd, fresh;

  FRUGAL_HD explicit SgdCoeffs(const SgdEntry& e)
      : neg_lr(M(-e.lr)),
        momentum(M(e.momentum)),
        one_minus_dampening(M(1.0 - e.dampening)),
        wd(M(e.weight_decay)),
        use_momentum(e.momentum != 0.0),
        nesterov((e.flags & kSgdNesterov) != 0),
        maximize((e.flags & kSgdMaximize) != 0),
        use_wd(e.weight_decay != 0.0),
        fresh((e.flags & kSgdFreshBuffer) != 0) {}
};

/// torch.optim.SGD for one element:
///   g = maximize ? -grad : grad;  g += wd * p;
///   buf = first step ? g : momentum * buf + (1 - dampening) * g;
///   g = nesterov ? g + momentum * buf : buf;   p -= lr * g.
template <typename M>
FRUGAL_HD void sgd_update(M& p, M g, M& buf, const SgdCoeffs<M>& c) {
  if (c.maximize) g = -g;
  if (c.use_wd) g = g + c.wd * p;
  if (c.use_momentum) {
    buf = c.fresh ? g : buf * c.momentum + c.one_minus_dampening * g;
    g = c.nesterov ? g + c.momentum * buf : buf;
  }
  p = p + c.neg_lr * g;
}

}  // namespace frugal::optim::detail
