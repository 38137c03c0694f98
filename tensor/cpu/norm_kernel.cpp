// One instruction-set level's float32 layer norm rows: built once per level, each time with that
// level's -march, FRUGAL_KERNEL_ISA naming it (v2, v3, v4), -fopenmp-simd, -ffp-contract=off and
// -fno-trapping-math, and nothing but its own header in the translation unit (Note [GEMM kernels
// per instruction set] in tensor/cpu/gemm.cpp; tools/check_gemm_objects.py checks it).
//
// Note [Vectorized layer norm]
// norm.cpp's generic rows accumulate their sums in double in order, one element after another,
// which the compiler must keep scalar (double addition does not reassociate): 0.4 ms for each of
// bert_mlm's (1024, 256) layer norms and as much for its backward, against 0.15 ms in PyTorch.
// Here the same operations run at the level's width: the row sums (mean, sum of squared
// deviations, and the backward's sum(dxhat) and sum(dxhat xhat)) in double, each lane
// accumulating its own partial sums, and the elementwise writes in float in the generic path's
// order, from the same float statistics. Only the sums' order differs, so the statistics are the
// generic path's within a double rounding, and equal once rounded to float but for results within
// that of a float rounding boundary (tests/cpu/test_norm_simd.cpp). The parameter gradients'
// partial sums run across the row (column j into pw[j]), in the generic order.
#include "tensor/cpu/norm_kernel.h"

#ifndef FRUGAL_KERNEL_ISA
#error "norm_kernel.cpp is built with -DFRUGAL_KERNEL_ISA=v2|v3|v4 (tensor/meson.build)"
#endif

namespace frugal::ops::cpu::FRUGAL_KERNEL_ISA {

void layer_norm_row_f32(float* y, float* mean, float* rstd, const float* x, const float* w, const float* b, int64_t N,
                        double eps) {
  double mu = 0;  // RMS norm: deviations from zero
  if (mean) {
#pragma omp simd reduction(+ : mu)
    for (int64_t j = 0; j < N; ++j) mu += double(x[j]);
    mu /= double(N);
  }
  double ss = 0;
#pragma omp simd reduction(+ : ss)
  for (int64_t j = 0; j < N; ++j) {
    const double d = double(x[j]) - mu;
    ss += d * d;
  }
  const float m = float(mu), rs = float(1.0 / __builtin_sqrt(ss / double(N) + eps));
  if (mean) *mean = m;
  *rstd = rs;
  if (w && b) {
#pragma omp simd
    for (int64_t j = 0; j < N; ++j) y[j] = (x[j] - m) * rs * w[j] + b[j];
  } else {
#pragma omp simd
    for (int64_t j = 0; j < N; ++j) {
      float v = (x[j] - m) * rs;
      if (w) v *= w[j];
      if (b) v += b[j];
      y[j] = v;
    }
  }
}

void layer_norm_backward_row_f32(float* gx, double* pw, double* pb, const float* g, const float* x, float m, float rs,
                                 const float* w, int64_t N, bool with_mean) {
  if (pw) {
#pragma omp simd
    for (int64_t j = 0; j < N; ++j) {
      const double gv = double(g[j]);
      pw[j] += gv * double((x[j] - m) * rs);
      pb[j] += gv;
    }
  }
  if (!gx) return;
  double s1 = 0, s2 = 0;  // sum(dxhat), sum(dxhat * xhat)
#pragma omp simd reduction(+ : s1, s2)
  for (int64_t j = 0; j < N; ++j) {
    const double dxhat = double(g[j]) * (w ? double(w[j]) : 1.0);
    s1 += dxhat;
    s2 += dxhat * double((x[j] - m) * rs);
  }
  // RMS norm: no mean was subtracted, so no mean(dxhat) term.
  const float c1 = with_mean ? float(s1 / double(N)) : 0.0f, c2 = float(s2 / double(N));
#pragma omp simd
  for (int64_t j = 0; j < N; ++j) {
    const float dxhat = w ? g[j] * w[j] : g[j];
    const float xhat = (x[j] - m) * rs;
    gx[j] = rs * (dxhat - c1 - xhat * c2);
  }
}

}  // namespace frugal::ops::cpu::FRUGAL_KERNEL_ISA
