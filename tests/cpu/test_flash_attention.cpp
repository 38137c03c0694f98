// The flash attention raw ops on the CPU against the float64 formula (tests/flash_attention_reference.h):
// masks of every kind and broadcast, causal with L != S, rows with no key, dropout (the very
// mask dropout() draws), strided inputs, f32/f16/bf16; gradcheck of frugal::flash_attention;
// scaled_dot_product_attention and flash_attention agreeing (dropout included); error paths.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/nn_functional.h"
#include "autograd/ops/reduce.h"
#include "tensor/factory.h"
#include "tensor/ops/flash_attention.h"
#include "tensor/random.h"
#include "tests/flash_attention_reference.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

struct Case {
  int64_t B, H, L, S, E;
};

enum class MaskKind { None, KeyPaddingBool, FullBool, KeyPaddingFloat, FullFloat, HeadFloat };

const char* mask_name(MaskKind m) {
  switch (m) {
    case MaskKind::None: return "none";
    case MaskKind::KeyPaddingBool: return "key padding bool (B, 1, 1, S)";
    case MaskKind::FullBool: return "bool (B, H, L, S)";
    case MaskKind::KeyPaddingFloat: return "key padding float (B, 1, 1, S)";
    case MaskKind::FullFloat: return "float (1, H, L, S)";
    default: return "float (L, S)";
  }
}

/// A mask of `kind` for case c in dtype `dt` (floating kinds) with some fully masked rows/keys.
Tensor make_mask(MaskKind kind, const Case& c, DType dt, uint64_t seed) {
  const double inf = std::numeric_limits<double>::infinity();
  auto bool_mask = [&](const Shape& sizes) {
    std::vector<double> bits = random_values(numel_of(sizes), seed, 0.0, 1.0);
    for (auto& b : bits) b = b < 0.7 ? 1.0 : 0.0;
    return make_tensor(bits, sizes, {kBool});
  };
  auto float_mask = [&](const Shape& sizes) {
    std::vector<double> m = random_values(numel_of(sizes), seed, -1.0, 1.0);
    for (size_t i = 0; i < m.size(); i += 5) m[i] = -inf;
    return make_tensor(m, sizes, {dt});
  };
  switch (kind) {
    case MaskKind::None: return Tensor();
    case MaskKind::KeyPaddingBool: {  // batch 0 keeps every key, the others lose a tail
      std::vector<double> bits(size_t(c.B * c.S), 1.0);
      for (int64_t b = 1; b < c.B; ++b)
        for (int64_t s = c.S / 2 + 1; s < c.S; ++s) bits[size_t(b * c.S + s)] = 0.0;
      return make_tensor(bits, {c.B, 1, 1, c.S}, {kBool});
    }
    case MaskKind::FullBool: return bool_mask({c.B, c.H, c.L, c.S});
    case MaskKind::KeyPaddingFloat: return float_mask({c.B, 1, 1, c.S});
    case MaskKind::FullFloat: return float_mask({1, c.H, c.L, c.S});
    default: return float_mask({c.L, c.S});
  }
}

double tolerance(DType dt) {
  switch (dt) {
    case DType::Float64: return 1e-10;
    case DType::Float32: return 2e-5;
    case DType::Float16: return 1e-2;
    default: return 6e-2;
  }
}

/// Forward and backward of the raw ops against the reference, for inputs stored in dt.
void check_case(const Case& c, DType dt, MaskKind mk, bool causal, double p, Layout layout, uint64_t seed) {
  INFO("B=", c.B, " H=", c.H, " L=", c.L, " S=", c.S, " E=", c.E, " ", dtype_name(dt), " mask ", mask_name(mk),
       " causal=", causal, " p=", p, " ", layout_name(layout));
  const Tensor q = random_tensor({c.B, c.H, c.L, c.E}, {dt}, seed, layout, -1.0, 1.0);
  const Tensor k = random_tensor({c.B, c.H, c.S, c.E}, {dt}, seed + 1, layout, -1.0, 1.0);
  const Tensor v = random_tensor({c.B, c.H, c.S, c.E}, {dt}, seed + 2, layout, -1.0, 1.0);
  const Tensor g = random_tensor({c.B, c.H, c.L, c.E}, {dt}, seed + 3, layout, -1.0, 1.0);
  const Tensor mask = make_mask(mk, c, dt, seed + 4);
  const double scale = 0.7 / std::sqrt(double(c.E));
  Generator gen(seed);
  const ops::FlashAttentionOptions o{mask, causal, scale, p};
  const ops::FlashAttentionForward f = ops::flash_attention_forward(q, k, v, o, &gen);
  const std::vector<double> factors = dropout_factors({c.B, c.H, c.L, c.S}, p, f.range);
  const AttentionReference ref = attention_reference(q, k, v, mask, causal, scale, factors, g);
  const double tol = tolerance(dt);
  check_close(f.out, ref.out, tol, tol, "out");
  check_close(f.lse, ref.lse, dt == kFloat64 ? 1e-12 : 1e-5, dt == kFloat64 ? 1e-12 : 1e-5, "lse");
  const ops::FlashAttentionGrads gr = ops::flash_attention_backward(g, q, k, v, f.out, f.lse, o, f.range);
  check_close(gr.dq, ref.dq, tol, tol, "dq");
  check_close(gr.dk, ref.dk, tol, tol, "dk");
  check_close(gr.dv, ref.dv, tol, tol, "dv");
}

}  // namespace

TEST_CASE("flash_attention cpu: forward and backward vs the float64 formula") {
  const Case cases[] = {{2, 3, 7, 7, 8}, {1, 2, 5, 9, 16}, {2, 1, 9, 4, 3}, {1, 1, 1, 1, 4}, {2, 2, 13, 13, 32}};
  uint64_t seed = 10;
  for (const Case& c : cases)
    for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16})
      for (bool causal : {false, true}) check_case(c, dt, MaskKind::None, causal, 0.0, Layout::Contiguous, seed++);
}

TEST_CASE("flash_attention cpu: masks, broadcast and rows with no key") {
  const Case c{2, 3, 6, 10, 8};
  uint64_t seed = 100;
  for (MaskKind mk : {MaskKind::KeyPaddingBool, MaskKind::FullBool, MaskKind::KeyPaddingFloat, MaskKind::FullFloat,
                      MaskKind::HeadFloat})
    for (DType dt : {kFloat64, kFloat32, kBFloat16})
      for (bool causal : {false, true}) check_case(c, dt, mk, causal, 0.0, Layout::Contiguous, seed++);
  // Every key masked for one row: zeros, lse -inf, no gradient through it.
  const Tensor q = random_tensor({1, 1, 3, 4}, {kFloat64}, 1), k = random_tensor({1, 1, 5, 4}, {kFloat64}, 2);
  const Tensor v = random_tensor({1, 1, 5, 4}, {kFloat64}, 3);
  std::vector<double> bits(15, 1.0);
  for (int s = 0; s < 5; ++s) bits[size_t(5 + s)] = 0.0;  // row 1
  const Tensor mask = make_tensor(bits, {3, 5}, {kBool});
  const auto f = ops::flash_attention_forward(q, k, v, {mask, false, {}, 0.0});
  const std::vector<double> out = values_of(f.out), lse = values_of(f.lse);
  for (int e = 0; e < 4; ++e) CHECK(out[size_t(4 + e)] == 0.0);
  CHECK(std::isinf(lse[1]));
  CHECK(lse[1] < 0);
}

TEST_CASE("flash_attention cpu: dropout keeps the weights dropout() keeps") {
  uint64_t seed = 200;
  for (double p : {0.1, 0.5})
    for (bool causal : {false, true})
      for (DType dt : {kFloat64, kFloat32})
        check_case({2, 2, 9, 11, 8}, dt, MaskKind::KeyPaddingBool, causal, p, Layout::Contiguous, seed++);
}

TEST_CASE("flash_attention cpu: strided inputs") {
  uint64_t seed = 300;
  for (Layout layout : {Layout::Transposed, Layout::Strided})
    for (DType dt : {kFloat64, kFloat16})
      check_case({2, 2, 5, 6, 8}, dt, MaskKind::FullFloat, false, 0.0, layout, seed++);
  // (B, L, H, E) projections viewed as (B, H, L, E), as attention layers make them.
  const Tensor x = random_tensor({2, 7, 3, 8}, {kFloat32}, 9), y = random_tensor({2, 5, 3, 8}, {kFloat32}, 10);
  const Tensor q = x.transpose(1, 2), k = y.transpose(1, 2), v = y.transpose(1, 2);
  const auto f = ops::flash_attention_forward(q, k, v, {});
  const AttentionReference ref = attention_reference(q, k, v, Tensor(), false, 1.0 / std::sqrt(8.0), {});
  check_close(f.out, ref.out, 2e-5, 2e-5, "out from transposed views");
}

TEST_CASE("flash_attention cpu: empty sizes") {
  const Tensor q = random_tensor({1, 2, 3, 4}, {kFloat32}, 1);
  const Tensor k0 = empty({1, 2, 0, 4}, {kFloat32});
  const auto f = ops::flash_attention_forward(q, k0, k0, {});
  for (double x : values_of(f.out)) CHECK(x == 0.0);
  for (double x : values_of(f.lse)) CHECK((std::isinf(x) && x < 0));
  const auto g = ops::flash_attention_backward(q, q, k0, k0, f.out, f.lse, {}, f.range);
  for (double x : values_of(g.dq)) CHECK(x == 0.0);
  CHECK(g.dk.numel() == 0);
  const Tensor q0 = empty({1, 2, 0, 4}, {kFloat32});
  const auto f0 = ops::flash_attention_forward(q0, q, q, {});
  CHECK(f0.out.numel() == 0);
  CHECK(f0.lse.sizes() == Shape{1, 2, 0});
}

TEST_CASE("flash_attention cpu: gradcheck of frugal::flash_attention") {
  const Tensor q = random_tensor({2, 2, 4, 3}, {kFloat64}, 1, Layout::Contiguous, -1.0, 1.0).requires_grad_();
  const Tensor k = random_tensor({2, 2, 5, 3}, {kFloat64}, 2, Layout::Contiguous, -1.0, 1.0).requires_grad_();
  const Tensor v = random_tensor({2, 2, 5, 3}, {kFloat64}, 3, Layout::Contiguous, -1.0, 1.0).requires_grad_();
  const Tensor float_mask = random_tensor({2, 1, 4, 5}, {kFloat64}, 4);
  std::vector<double> bits(10, 1.0);
  bits[3] = bits[4] = bits[9] = 0.0;
  const Tensor pad = make_tensor(bits, {2, 1, 1, 5}, {kBool});
  Generator gen(7);
  struct Variant {
    const char* name;
    Tensor mask;
    bool causal;
    double p;
  };
  for (const Variant& var : {Variant{"plain", Tensor(), false, 0.0}, Variant{"float mask", float_mask, false, 0.0},
                             Variant{"causal + padding", pad, true, 0.0}, Variant{"dropout", pad, false, 0.3}}) {
    CAPTURE(var.name);
    const auto f = [&](const TensorList& in) {
      gen.set_state(7, 0);  // every evaluation draws the same dropout mask
      return flash_attention(in[0], in[1], in[2], var.mask, var.causal, var.p, 0.8, &gen);
    };
    const auto r = autograd::gradcheck(f, {q, k, v});
    CHECK_MESSAGE(r.ok, r.report);
  }
  // Non-contiguous leaves: (B, L, H, E) viewed as (B, H, L, E) inside f.
  const Tensor x = random_tensor({1, 4, 2, 3}, {kFloat64}, 5).requires_grad_();
  const auto r = autograd::gradcheck(
      [](const TensorList& in) {
        const Tensor h = in[0].transpose(1, 2);
        return flash_attention(h, h, h, Tensor(), true);
      },
      {x});
  CHECK_MESSAGE(r.ok, r.report);
}

TEST_CASE("flash_attention cpu: agrees with the composed scaled_dot_product_attention") {
  const Tensor q = random_tensor({2, 3, 6, 4}, {kFloat64}, 1).requires_grad_();
  const Tensor k = random_tensor({2, 3, 8, 4}, {kFloat64}, 2).requires_grad_();
  const Tensor v = random_tensor({2, 3, 8, 4}, {kFloat64}, 3).requires_grad_();
  std::vector<double> bits(16, 1.0);
  bits[6] = bits[7] = bits[15] = 0.0;
  const Tensor pad = make_tensor(bits, {2, 1, 1, 8}, {kBool});
  for (double p : {0.0, 0.25}) {
    CAPTURE(p);
    Generator g1(11), g2(11);
    const Tensor a = scaled_dot_product_attention(q, k, v, pad, false, p, {}, &g1);
    const Tensor b = flash_attention(q, k, v, pad, false, p, {}, &g2);
    check_close(b, values_of(a), 1e-12, 1e-12, "out");
    CHECK(g1.offset() == g2.offset());
    const Tensor w = random_tensor(a.sizes(), {kFloat64}, 4);
    const TensorList ga = autograd::grad({sum(mul(a, w))}, {q, k, v});
    const TensorList gb = autograd::grad({sum(mul(b, w))}, {q, k, v});
    for (int i = 0; i < 3; ++i) check_close(gb[size_t(i)], values_of(ga[size_t(i)]), 1e-10, 1e-12, "grad");
  }
}

TEST_CASE("flash_attention cpu: errors") {
  const Tensor q = random_tensor({1, 2, 3, 4}, {kFloat32}, 1), k = random_tensor({1, 2, 5, 4}, {kFloat32}, 2);
  const std::string op = "flash_attention_forward";
  check_error([&] { ops::flash_attention_forward(q.reshape({2, 3, 4}), k, k, {}); }, {op, "4-D", "[2, 3, 4]"});
  check_error([&] { ops::flash_attention_forward(q, k.to(kFloat64), k, {}); }, {op, "dtype", "float64"});
  check_error([&] { ops::flash_attention_forward(q, k.narrow(3, 0, 2), k.narrow(3, 0, 2), {}); },
              {op, "agree", "[1, 2, 5, 2]"});
  check_error([&] { ops::flash_attention_forward(q, k, k.narrow(2, 0, 4), {}); }, {op, "agree"});
  check_error(
      [&] {
        ops::flash_attention_forward(q, k, k, {zeros({3, 4}, {kFloat32}), false, {}, 0.0});
      },
      {op, "does not broadcast", "[3, 4]", "[1, 2, 3, 5]"});
  check_error(
      [&] {
        ops::flash_attention_forward(q, k, k, {zeros({3, 5}, {kFloat64}), false, {}, 0.0});
      },
      {op, "bool or of the query's dtype", "float64"});
  check_error([&] { ops::flash_attention_forward(q, k, k, {Tensor(), false, {}, 1.0}); }, {op, "dropout_p", "[0, 1)"});
  const auto f = ops::flash_attention_forward(q, k, k, {});
  check_error([&] { ops::flash_attention_backward(q, q, k, k, f.out, f.lse.to(kFloat64), {}, f.range); },
              {"flash_attention_backward", "lse", "float32"});
  check_error([&] { ops::flash_attention_backward(q.narrow(2, 0, 2), q, k, k, f.out, f.lse, {}, f.range); },
              {"flash_attention_backward", "dout", "[1, 2, 2, 4]"});
  const Tensor m = zeros({3, 5}, {kFloat32}).requires_grad_();
  check_error([&] { flash_attention(q, k, k, m); }, {"flash_attention", "requires grad"});
  CHECK_FALSE(ops::flash_attention_fused(q, k, k, Tensor()));  // CPU: the composed path
}
