// The vectorized float32 dropout of every x86-64 level this CPU runs (Note [Vectorized dropout] in
// tensor/cpu/dropout_kernel.cpp) against the generic path (dropout_kernel_generic, the scalar
// loop over philox.h) bit for bit: lengths around the kernel's 64-element blocks and the op's
// 4096-element chunks, counters that carry into the high word, seeds with both halves set,
// several p, NaN and infinite inputs, nothing written past the end, a size-0 input,
// non-contiguous inputs, 1 and 2 threads, and the backward's replay of the same mask.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "autograd/ops/dropout.h"
#include "tensor/cpu/dropout_kernel.h"
#include "tensor/cpu/gemm.h"
#include "tensor/factory.h"
#include "tensor/ops/dropout.h"
#include "tensor/philox.h"
#include "tests/cpu_scopes.h"

using namespace frugal;
using namespace frugal::ops::cpu;
using namespace frugal::testing;

namespace {

/// The level's kernel called directly on arrays.
void level_dropout(GemmIsa isa, float* y, const float* x, int64_t n, uint64_t seed, uint64_t counter, float keep_below,
                   float scale) {
  switch (isa) {
    case GemmIsa::X86_64_V4: return v4::dropout_f32(y, x, n, seed, counter, keep_below, scale);
    case GemmIsa::X86_64_V3: return v3::dropout_f32(y, x, n, seed, counter, keep_below, scale);
    case GemmIsa::X86_64_V2: return v2::dropout_f32(y, x, n, seed, counter, keep_below, scale);
  }
}

std::vector<float> to_vector(const Tensor& t) {
  const Tensor c = t.contiguous();
  const float* p = c.data_ptr<float>();
  return std::vector<float>(p, p + c.numel());
}

/// Random floats in [-3, 3) with NaN, +-inf and -0 among them.
std::vector<float> inputs(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = u(rng);
  const float specials[] = {NAN, INFINITY, -INFINITY, -0.0f};
  for (int64_t i = 0; i < n; i += 37) x[size_t(i)] = specials[(i / 37) % 4];
  return x;
}

/// The generic path's output for x under `range`.
std::vector<float> generic(const std::vector<float>& x, double p, Generator::Range range) {
  const int64_t n = int64_t(x.size());
  const Tensor xt = from_vector<float>(x, {n}), out = empty({n}, kFloat32);
  if (n > 0) dropout_kernel_generic(out, xt, p, range);
  return to_vector(out);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("dropout simd: every level gives the generic path's bits, any length, nothing past the end") {
  const Generator::Range ranges[] = {{0, 0}, {0x0123456789ABCDEFull, 77}, {42, 0xFFFFFFF0ull}};  // a carry into c1
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    CAPTURE(gemm_isa_name(isa));
    for (double p : {0.1, 0.5, 0.9}) {
      for (const Generator::Range& range : ranges) {
        for (int64_t n : {1, 2, 3, 4, 5, 7, 63, 64, 65, 127, 128, 129, 1000, 4095, 4096, 4097, 4100}) {
          CAPTURE(p);
          CAPTURE(range.counter);
          CAPTURE(n);
          const std::vector<float> x = inputs(n + 1, uint32_t(n));
          const std::vector<float> x0(x.begin() + 1, x.end());
          // Misaligned by one element, with sentinels on both sides.
          std::vector<float> y(size_t(n) + 70, -123.0f);
          level_dropout(isa, y.data() + 1, x.data() + 1, n, range.seed, range.counter, float(1.0 - p),
                        float(1.0 / (1.0 - p)));
          const std::vector<float> got(y.begin() + 1, y.begin() + 1 + n);
          CHECK(same_bits(got, generic(x0, p, range)));
          CHECK(y[0] == -123.0f);
          int past = 0;
          for (size_t i = size_t(n) + 1; i < y.size(); ++i) past += y[i] != -123.0f;
          CHECK(past == 0);
        }
      }
    }
  }
}

TEST_CASE("dropout simd: through the op at every level and thread count, non-contiguous, size 0, the replay") {
  const int64_t rows = 301, cols = 257;  // 77357 elements: threaded in 4096-element chunks, with a tail
  const std::vector<float> xs = inputs(rows * cols, 11);
  const Tensor x = from_vector<float>(xs, {rows, cols});
  const double p = 0.3;
  const Generator::Range range{0xDEADBEEF12345678ull, 1000};
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    CAPTURE(gemm_isa_name(isa));
    LevelScope scope(isa);
    for (int threads : {1, 2}) {
      CAPTURE(threads);
      ThreadScope t(threads);
      CHECK(same_bits(to_vector(ops::dropout_with_range(x, p, range)), generic(xs, p, range)));
      // Transposed and narrowed views: the mask is row-major in the view's shape (Note [Dropout
      // mask from counters]), applied to its contiguous copy.
      for (const Tensor& view : {x.t(), x.narrow(1, 5, 100)}) {
        const Tensor y = ops::dropout_with_range(view, p, range);
        CHECK(y.sizes() == view.sizes());
        CHECK(same_bits(to_vector(y), generic(to_vector(view), p, range)));
      }
    }
    // Size 0 draws no counters and writes nothing.
    Generator gen(5);
    const ops::DropoutResult empty_out = ops::dropout(zeros({0, 7}), p, &gen);
    CHECK(empty_out.out.numel() == 0);
    CHECK(empty_out.out.sizes() == Shape({0, 7}));
    CHECK(gen.offset() == 0);
    // The differentiable op: forward from the generator, backward replaying its range, both
    // the generic path's mask.
    gen.set_state(99, 12345);
    const Tensor leaf = x.clone();
    leaf.requires_grad_();
    const Tensor y = dropout(leaf, p, /*training=*/true, &gen);
    y.backward(ones({rows, cols}));
    CHECK(same_bits(to_vector(y), generic(xs, p, {99, 12345})));
    CHECK(same_bits(to_vector(leaf.grad()), generic(std::vector<float>(xs.size(), 1.0f), p, {99, 12345})));
  }
}

TEST_CASE("dropout simd: the kept elements are philox.h's, element by element") {
  // The generic path itself against the spec, so that the test above compares with the stream
  // checkpoints replay (Note [Counter-based RNG]).
  const int64_t n = 1029;
  const std::vector<float> x(size_t(n), 1.0f);
  const std::vector<float> y = generic(x, 0.25, {7, 3});
  for (GemmIsa isa : kLevels) {
    if (!cpu_supports(isa)) continue;
    std::vector<float> yl(static_cast<size_t>(n));
    level_dropout(isa, yl.data(), x.data(), n, 7, 3, 0.75f, float(1.0 / 0.75));
    CHECK(same_bits(yl, y));
  }
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = philox_uniform(philox4x32(7, 3 + uint64_t(i) / 4).x[i % 4]) < 0.75f;
    bad += y[size_t(i)] != (keep ? float(1.0 / 0.75) : 0.0f);
  }
  CHECK(bad == 0);
}
