// The vectorized float32 masked softmax and softmax gradient of every x86-64 level this CPU runs
// (Note [Vectorized masked softmax] in tensor/cpu/masked_softmax_kernel.cpp) against the generic
// path (masked_softmax_kernel_generic, softmax_backward_kernel_generic) within a float rounding:
// row lengths around every vector width and rows of length 1; no mask, bool and additive masks
// (-inf entries, rows with every key masked: zeros, Note [Masked softmax]), causal, masks read
// with a stride other than 1 or broadcast along the row; NaN and infinite scores; size 0;
// non-contiguous scores and gradients; the same bits at 1 and 2 threads.
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tensor/cpu/gemm.h"
#include "tensor/factory.h"
#include "tensor/ops/masked_softmax.h"
#include "tensor/ops/softmax.h"
#include "tests/cpu_scopes.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::ops::cpu;
using namespace frugal::testing;

namespace {

std::vector<float> to_vector(const Tensor& t) {
  const Tensor c = t.contiguous();
  const float* p = c.data_ptr<float>();
  return std::vector<float>(p, p + c.numel());
}

/// ops::masked_softmax's parameters (as its front end builds them), run by the generic loop.
Tensor generic_masked_softmax(const Tensor& scores, const Tensor& mask, bool causal, double scale) {
  ops::MaskedSoftmaxParams p;
  p.ndim = int(scores.dim());
  p.causal = causal;
  p.scale = scale;
  for (int d = 0; d < p.ndim; ++d) p.sizes[d] = scores.size(d);
  Tensor mask_view;
  if (mask.defined()) {
    p.kind = mask.dtype() == kBool ? 1 : 2;
    mask_view = mask.expand(scores.sizes());
    for (int d = 0; d < p.ndim; ++d) p.mask_strides[d] = mask_view.stride(d);
  }
  Tensor out = empty(scores.sizes(), scores.options());
  if (out.numel() > 0) masked_softmax_kernel_generic(out, scores.contiguous(), mask_view, p);
  return out;
}

/// The generic softmax gradient along the last dim.
Tensor generic_softmax_backward(const Tensor& g, const Tensor& y) {
  Tensor out = empty(y.sizes(), y.options());
  if (out.numel() == 0) return out;
  const int64_t D = y.size(-1);
  softmax_backward_kernel_generic(out, g.contiguous(), y.contiguous(), {y.numel() / D, D, 1}, false);
  return out;
}

/// Elements of `got` farther than `ulps` float roundings of `want` (NaN matches only NaN);
/// `floor` is an absolute allowance (results near the denormal range).
int mismatches(const std::vector<float>& got, const std::vector<float>& want, double ulps, double floor = 1e-44) {
  REQUIRE(got.size() == want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i]) || std::isnan(got[i])) {
      bad += std::isnan(want[i]) != std::isnan(got[i]);
      continue;
    }
    bad += std::fabs(double(got[i]) - double(want[i])) > ulps * FLT_EPSILON * std::fabs(double(want[i])) + floor;
  }
  return bad;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Scores (B, H, L, S) in [-6, 6) with -inf (masked by the caller), +inf and NaN entries when `specials`.
Tensor scores_of(int64_t B, int64_t H, int64_t L, int64_t S, uint64_t seed, bool specials) {
  std::vector<double> v = random_values(B * H * L * S, seed, -6.0, 6.0);
  if (specials && v.size() > 40) {
    v[3] = -INFINITY;             // one -inf score: weight 0
    v[size_t(S * 2 + 1)] = NAN;   // a row of NaN
    v[size_t(S * 4)] = INFINITY;  // a row with +inf: NaN (inf - inf), as the generic path
  }
  return make_tensor(v, {B, H, L, S}, kFloat32);
}

/// A bool mask (B, 1, 1, S) keeping ~70% of the keys, with batch 0's keys all masked.
Tensor bool_mask_of(int64_t B, int64_t S, uint64_t seed) {
  std::vector<double> v = random_values(B * S, seed, 0.0, 1.0);
  for (int64_t i = 0; i < B * S; ++i) v[size_t(i)] = (i >= S && v[size_t(i)] < 0.7) ? 1.0 : 0.0;
  return make_tensor(v, {B, 1, 1, S}, kFloat32).to(kBool);
}

/// An additive mask (L, S): 0, -10000 (BERT's padding value), or -inf; row 1 all -inf.
Tensor add_mask_of(int64_t L, int64_t S, uint64_t seed) {
  std::vector<double> v = random_values(L * S, seed, 0.0, 1.0);
  for (int64_t i = 0; i < L * S; ++i) {
    const double u = v[size_t(i)];
    v[size_t(i)] = (i / S == 1 % L) ? -INFINITY : u < 0.6 ? 0.0 : u < 0.8 ? -10000.0 : -INFINITY;
  }
  return make_tensor(v, {L, S}, kFloat32);
}

}  // namespace

TEST_CASE("masked softmax simd: every level within a float rounding of the generic path") {
  const int64_t B = 2, H = 3, L = 5;
  int levels = 0;
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    ++levels;
    LevelScope scope(isa);
    for (int64_t S : {1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 64, 127, 128, 129, 257}) {
      for (bool specials : {false, true}) {
        const Tensor x = scores_of(B, H, L, S, uint64_t(S), specials);
        const Tensor bmask = bool_mask_of(B, S, uint64_t(S) + 1);
        const Tensor amask = add_mask_of(L, S, uint64_t(S) + 2);
        const Tensor bmask_strided = bool_mask_of(B, L * S, 5).view({B, 1, S, L}).transpose(-1, -2);  // stride L
        const Tensor amask_row = add_mask_of(L, 1, 6);  // (L, 1): broadcast along the row, stride 0
        struct Case {
          const char* name;
          Tensor mask;
          bool causal;
          double scale;
        };
        const Case cases[] = {{"no mask", Tensor(), false, 1.0},
                              {"no mask, scaled", Tensor(), false, 0.125},
                              {"bool", bmask, false, 0.125},
                              {"additive", amask, false, 0.125},
                              {"causal", Tensor(), true, 1.0},
                              {"causal + bool", bmask, true, 0.5},
                              {"causal + additive", amask, true, 1.0},
                              {"bool, stride L", bmask_strided, false, 1.0},
                              {"additive, stride 0", amask_row, false, 0.3}};
        for (const Case& c : cases) {
          CAPTURE(gemm_isa_name(isa));
          CAPTURE(S);
          CAPTURE(specials);
          CAPTURE(std::string(c.name));
          const std::vector<float> got = to_vector(ops::masked_softmax(x, c.mask, c.causal, c.scale));
          const std::vector<float> want = to_vector(generic_masked_softmax(x, c.mask, c.causal, c.scale));
          CHECK(mismatches(got, want, 2.0) == 0);
          // Rows the generic path zeroes (every key masked) are exactly +0 here too.
          int zero_rows = 0, differ = 0;
          for (int64_t r = 0; r < B * H * L; ++r) {
            bool all_zero = true;
            for (int64_t s = 0; s < S; ++s) all_zero = all_zero && want[size_t(r * S + s)] == 0.0f;
            if (!all_zero) continue;
            ++zero_rows;
            for (int64_t s = 0; s < S; ++s)
              differ += !(got[size_t(r * S + s)] == 0.0f && !std::signbit(got[size_t(r * S + s)]));
          }
          CHECK(differ == 0);
          if (std::string(c.name) == "bool") CHECK(zero_rows >= H * L);  // batch 0 masks every key
        }
      }
    }
  }
  CHECK(levels >= 1);
}

TEST_CASE("masked softmax simd: non-contiguous scores, size 0, threads") {
  const Tensor base = scores_of(2, 4, 131, 9, 21, false);  // (B, H, S, L) in memory
  const Tensor x = base.transpose(-1, -2);                 // (2, 4, 9, 131), last-dim stride 9
  const Tensor amask = add_mask_of(9, 131, 22);
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    CAPTURE(gemm_isa_name(isa));
    LevelScope scope(isa);
    const std::vector<float> want = to_vector(generic_masked_softmax(x, amask, false, 0.125));
    CHECK(mismatches(to_vector(ops::masked_softmax(x, amask, false, 0.125)), want, 2.0) == 0);
    // Size 0, in the rows or in the row length: empty outputs.
    for (const Shape& s : {Shape{2, 0, 5}, Shape{3, 0}, Shape{0, 4, 4}}) {
      const Tensor y = ops::masked_softmax(zeros(s), Tensor(), s.size() >= 2 && s[s.size() - 1] == s[s.size() - 2]);
      CHECK(y.sizes() == s);
      CHECK(y.numel() == 0);
    }
    // Big enough to thread (32 x 131 x 128 rows): the same bits at 1 and 2 threads.
    const Tensor big = scores_of(4, 8, 128, 131, 23, true);
    std::vector<float> y1, y2;
    {
      ThreadScope t(1);
      y1 = to_vector(ops::masked_softmax(big, amask.narrow(0, 0, 1), true, 0.125));
    }
    {
      ThreadScope t(2);
      y2 = to_vector(ops::masked_softmax(big, amask.narrow(0, 0, 1), true, 0.125));
    }
    CHECK(same_bits(y1, y2));
    CHECK(mismatches(y1, to_vector(generic_masked_softmax(big, amask.narrow(0, 0, 1), true, 0.125)), 2.0) == 0);
  }
}

TEST_CASE("softmax gradient simd: every level within a float rounding of the generic path") {
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    LevelScope scope(isa);
    for (int64_t S : {1, 2, 3, 7, 16, 17, 33, 128, 129, 257}) {
      CAPTURE(gemm_isa_name(isa));
      CAPTURE(S);
      // y: softmax rows, some of them all zeros (fully masked); g: any values, transposed in memory.
      const Tensor y = ops::masked_softmax(scores_of(2, 3, 6, S, uint64_t(S) + 30, false), add_mask_of(6, S, 31));
      const Tensor g = random_tensor({2, 3, 6, S}, kFloat32, uint64_t(S) + 32, Layout::Transposed, -3.0, 3.0);
      const std::vector<float> got = to_vector(ops::softmax_backward(g, y, -1));
      const std::vector<float> want = to_vector(generic_softmax_backward(g, y));
      // gi = y (g - d) cancels where g is near d = sum(g y): bound the difference by the terms'
      // size, y (|g| + |d|), not by the result's.
      const std::vector<float> yv = to_vector(y), gv = to_vector(g);
      int bad = 0;
      for (int64_t r = 0; r < y.numel() / S; ++r) {
        double d = 0;
        for (int64_t s = 0; s < S; ++s) d += double(gv[size_t(r * S + s)]) * double(yv[size_t(r * S + s)]);
        for (int64_t s = 0; s < S; ++s) {
          const size_t i = size_t(r * S + s);
          const double size = std::fabs(double(yv[i])) * (std::fabs(double(gv[i])) + std::fabs(d));
          bad += std::fabs(double(got[i]) - double(want[i])) > 4 * FLT_EPSILON * size + 1e-44;
        }
      }
      CHECK(bad == 0);
      // Zero rows of y give zero gradients.
      int nonzero = 0;
      for (size_t i = 0; i < yv.size(); ++i) nonzero += yv[i] == 0.0f && got[i] != 0.0f;
      CHECK(nonzero == 0);
    }
    // Size 0.
    CHECK(ops::softmax_backward(zeros({3, 0}), zeros({3, 0}), -1).numel() == 0);
    // Threads: the same bits.
    const Tensor y = ops::masked_softmax(scores_of(4, 8, 64, 129, 40, false));
    const Tensor g = random_tensor({4, 8, 64, 129}, kFloat32, 41);
    std::vector<float> d1, d2;
    {
      ThreadScope t(1);
      d1 = to_vector(ops::softmax_backward(g, y, -1));
    }
    {
      ThreadScope t(2);
      d2 = to_vector(ops::softmax_backward(g, y, -1));
    }
    CHECK(same_bits(d1, d2));
  }
}
