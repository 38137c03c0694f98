// The vectorized float32 layer norm rows of every x86-64 level this CPU runs (Note [Vectorized
// layer norm] in tensor/cpu/norm_kernel.cpp) against the generic loops (layer_norm_kernel_generic,
// layer_norm_backward_kernel_generic): row lengths around every vector width and of 1, with and
// without weight and bias, RMS norm (no mean), the forward's statistics and output, the backward's
// dx, dweight and dbias, a non-contiguous input through the op, size 0, 1 and 2 threads.
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "tensor/cpu/gemm.h"
#include "tensor/factory.h"
#include "tensor/ops/norm.h"
#include "tests/cpu_scopes.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::ops::cpu;
using namespace frugal::testing;

namespace {

std::vector<float> to_vector(const Tensor& t) {
  if (!t.defined()) return {};
  const Tensor c = t.contiguous();
  const float* p = c.data_ptr<float>();
  return std::vector<float>(p, p + c.numel());
}

/// Elements of `got` farther than `ulps` float roundings of `want`, or than `ulps` roundings of
/// `scale` (a gradient's terms, where they cancel).
int mismatches(const std::vector<float>& got, const std::vector<float>& want, double ulps, double scale = 0) {
  REQUIRE(got.size() == want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    bad += std::fabs(double(got[i]) - double(want[i])) >
           ulps * FLT_EPSILON * std::max(std::fabs(double(want[i])), scale) + 1e-44;
  return bad;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Forward {
  Tensor out, mean, rstd;
};

/// The forward on contiguous (M, N) x, by the dispatching kernel (the level's) or the generic one.
Forward forward(bool generic, const Tensor& x, const Tensor& w, const Tensor& b, bool rms) {
  const int64_t M = x.size(0), N = x.size(1);
  Forward f{empty({M, N}), rms ? Tensor() : empty({M}), empty({M})};
  if (generic) layer_norm_kernel_generic(f.out, f.mean, f.rstd, x, w, b, M, N, 1e-5);
  else layer_norm_kernel(f.out, f.mean, f.rstd, x, w, b, M, N, 1e-5);
  return f;
}

ops::LayerNormGrads backward(bool generic, const Tensor& g, const Tensor& x, const Forward& f, const Tensor& w,
                             bool params) {
  const int64_t M = x.size(0), N = x.size(1);
  ops::LayerNormGrads d{empty({M, N}), params && w.defined() ? empty({N}) : Tensor(), params ? empty({N}) : Tensor()};
  if (generic) layer_norm_backward_kernel_generic(d.x, d.weight, d.bias, g, x, f.mean, f.rstd, w, M, N);
  else layer_norm_backward_kernel(d.x, d.weight, d.bias, g, x, f.mean, f.rstd, w, M, N);
  return d;
}

}  // namespace

TEST_CASE("layer norm simd: every level within a float rounding of the generic loops") {
  int levels = 0;
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    ++levels;
    LevelScope scope(isa);
    for (int64_t N : {1, 2, 3, 7, 8, 15, 16, 17, 33, 256, 257, 1000}) {
      for (int64_t M : {1, 6, 301}) {
        const Tensor x = random_tensor({M, N}, kFloat32, uint64_t(N * 7 + M), Layout::Contiguous, -3.0, 5.0);
        const Tensor g = random_tensor({M, N}, kFloat32, uint64_t(N * 7 + M + 1));
        const Tensor w = random_tensor({N}, kFloat32, uint64_t(N + 2), Layout::Contiguous, 0.5, 1.5);
        const Tensor b = random_tensor({N}, kFloat32, uint64_t(N + 3));
        for (int variant = 0; variant < 4; ++variant) {  // affine, weight only, none, RMS norm with weight
          const bool rms = variant == 3;
          const Tensor wv = variant == 2 ? Tensor() : w, bv = variant == 0 ? b : Tensor();
          CAPTURE(gemm_isa_name(isa));
          CAPTURE(N);
          CAPTURE(M);
          CAPTURE(variant);
          const Forward got = forward(false, x, wv, bv, rms), want = forward(true, x, wv, bv, rms);
          CHECK(mismatches(to_vector(got.rstd), to_vector(want.rstd), 1.0) == 0);
          if (!rms) CHECK(mismatches(to_vector(got.mean), to_vector(want.mean), 1.0, 1.0) == 0);
          // The output from (rarely) different float statistics: a few roundings of its size.
          CHECK(mismatches(to_vector(got.out), to_vector(want.out), 4.0, 4.0) == 0);
          // The backward from the same (generic) statistics.
          for (bool params : {true, false}) {
            CAPTURE(params);
            const ops::LayerNormGrads dg = backward(false, g, x, want, wv, params);
            const ops::LayerNormGrads dw = backward(true, g, x, want, wv, params);
            CHECK(mismatches(to_vector(dg.x), to_vector(dw.x), 8.0, 8.0) == 0);
            CHECK(same_bits(to_vector(dg.weight), to_vector(dw.weight)));  // summed in the same order
            CHECK(same_bits(to_vector(dg.bias), to_vector(dw.bias)));
          }
        }
      }
    }
  }
  CHECK(levels >= 1);
}

TEST_CASE("layer norm simd: non-contiguous input, size 0, threads") {
  const Tensor base = random_tensor({257, 64}, kFloat32, 90, Layout::Contiguous, -2.0, 6.0);
  const Tensor x = base.t();  // (64, 257), not contiguous
  const Tensor w = random_tensor({257}, kFloat32, 91), b = random_tensor({257}, kFloat32, 92);
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    CAPTURE(gemm_isa_name(isa));
    LevelScope scope(isa);
    const ops::LayerNormResult r = ops::layer_norm(x, {257}, w, b);
    const Forward want = forward(true, x.contiguous(), w, b, false);
    CHECK(mismatches(to_vector(r.out), to_vector(want.out), 4.0, 4.0) == 0);
    const ops::LayerNormResult empty_r = ops::layer_norm(zeros({0, 5}), {5}, ones({5}), zeros({5}));
    CHECK(empty_r.out.sizes() == Shape({0, 5}));
    // Big enough to thread: the same bits at 1 and 2 threads.
    const Tensor big = random_tensor({600, 300}, kFloat32, 93), gbig = random_tensor({600, 300}, kFloat32, 94);
    const Tensor wb = random_tensor({300}, kFloat32, 95);
    std::vector<float> o1, o2, d1, d2, w1, w2;
    for (int threads : {1, 2}) {
      ThreadScope t(threads);
      const Forward f = forward(false, big, wb, Tensor(), false);
      const ops::LayerNormGrads d = backward(false, gbig, big, f, wb, true);
      (threads == 1 ? o1 : o2) = to_vector(f.out);
      (threads == 1 ? d1 : d2) = to_vector(d.x);
      (threads == 1 ? w1 : w2) = to_vector(d.weight);
    }
    CHECK(same_bits(o1, o2));
    CHECK(same_bits(d1, d2));
    CHECK(same_bits(w1, w2));
  }
}
