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
#include "autograd/ops/attention.h"
#include "autograd/ops/binary.h"
#include "autograd/ops/dropout.h"
#include "autograd/ops/flash_attention.h"
#include "autograd/ops/join.h"
#include "autograd/ops/reduce.h"
#include "memory/allocator.h"
#include "tensor/factory.h"
#include "tensor/ops/flash_attention.h"
#include "tensor/random.h"
#include "tests/flash_attention_reference.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

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
Tensor make_mask(MaskKind kind, const AttentionCase& c, DType dt, uint64_t seed) {
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
void check_case(const AttentionCase& c, DType dt, MaskKind mk, bool causal, double p, Layout layout, uint64_t seed) {
  INFO("B=", c.B, " H=", c.H, " L=", c.L, " S=", c.S, " E=", c.E, " ", std::string(dtype_name(dt)), " mask ", std::string(mask_name(mk)),
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
  const AttentionCase cases[] = {
      {2, 3, 7, 7, 8}, {1, 2, 5, 9, 16}, {2, 1, 9, 4, 3}, {1, 1, 1, 1, 4}, {2, 2, 13, 13, 32}};
  uint64_t seed = 10;
  for (const AttentionCase& c : cases)
    for (DType dt : {kFloat64, kFloat32, kFloat16, kBFloat16})
      for (bool causal : {false, true}) check_case(c, dt, MaskKind::None, causal, 0.0, Layout::Contiguous, seed++);
}

TEST_CASE("flash_attention cpu: masks, broadcast and rows with no key") {
  const AttentionCase c{2, 3, 6, 10, 8};
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
  // A mask cuDNN's RNG drew can be drawn again only there: never our kernels' other mask.
  Generator::Range by_cudnn{7, 0};
  by_cudnn.drawn_by = Generator::kCudnnRng;
  check_error(
      [&] {
        ops::flash_attention_backward(q, q, k, k, f.out, f.lse, {Tensor(), false, {}, 0.1}, by_cudnn);
      },
      {"flash_attention_backward", "drawn by cuDNN", "not on a GPU"});
  const Tensor m = zeros({3, 5}, {kFloat32}).requires_grad_();
  check_error([&] { flash_attention(q, k, k, m); }, {"flash_attention", "requires grad"});
  CHECK_FALSE(ops::flash_attention_fused(q, k, k, Tensor()));  // CPU: the composed path
}

// ---- Note [Flash attention layouts]: results in the inputs' memory order -------------------

namespace {

/// q, k, v as nn::MultiheadAttention makes them: chunk(x, 3, -1) of x (B, T, 3 H E), each
/// split into heads, (B, H, T, E) views with strides (T 3 H E, E, 3 H E, 1).
struct Packed {
  Tensor q, k, v;
};
Packed packed_heads(const Tensor& x, int64_t H) {
  const int64_t D = x.size(2) / 3;
  auto piece = [&](int64_t i) { return x.narrow(2, i * D, D).unflatten(-1, {H, D / H}).transpose(1, 2); };
  return {piece(0), piece(1), piece(2)};
}

Shape sequence_major_strides(const Tensor& t) {  // (B, N, H, E) memory viewed as (B, H, N, E)
  const int64_t N = t.size(2), H = t.size(1), E = t.size(3);
  return {N * H * E, E, H * E, 1};
}

}  // namespace

TEST_CASE("flash_attention cpu: packed qkv views give sequence-major out and one packed grad buffer") {
  const int64_t B = 2, T = 6, H = 3, E = 4, D = H * E;
  uint64_t seed = 500;
  for (DType dt : {kFloat64, kFloat32, kBFloat16})
    for (bool causal : {false, true})
      for (bool masked : {false, true}) {
        INFO(std::string(dtype_name(dt)), " causal=", causal, " masked=", masked);
        const Tensor x = random_tensor({B, T, 3 * D}, {dt}, seed++, Layout::Contiguous, -1.0, 1.0);
        const Tensor g = random_tensor({B, H, T, E}, {dt}, seed++, Layout::Contiguous, -1.0, 1.0);
        const Tensor mask = masked ? make_mask(MaskKind::FullFloat, {B, H, T, T, E}, dt, seed++) : Tensor();
        const Packed p = packed_heads(x, H);
        const ops::FlashAttentionOptions o{mask, causal, 0.6, 0.0};
        const auto f = ops::flash_attention_forward(p.q, p.k, p.v, o);
        CHECK(f.out.strides() == sequence_major_strides(f.out));
        const auto gr = ops::flash_attention_backward(g, p.q, p.k, p.v, f.out, f.lse, o, f.range);
        // One buffer (B, T, 3, H, E): dq, dk, dv with exactly q, k, v's strides, D apart.
        CHECK(gr.dq.shares_storage(gr.dk));
        CHECK(gr.dq.shares_storage(gr.dv));
        CHECK(gr.dq.strides() == p.q.strides());
        CHECK(gr.dk.strides() == p.k.strides());
        CHECK(gr.dv.strides() == p.v.strides());
        CHECK(gr.dk.storage_offset() - gr.dq.storage_offset() == D);
        CHECK(gr.dv.storage_offset() - gr.dk.storage_offset() == D);
        // The same values as contiguous copies of the same inputs, and as the float64 formula.
        const Tensor qc = p.q.contiguous(), kc = p.k.contiguous(), vc = p.v.contiguous();
        const auto fc = ops::flash_attention_forward(qc, kc, vc, o);
        CHECK(fc.out.is_contiguous());
        const auto gc = ops::flash_attention_backward(g, qc, kc, vc, fc.out, fc.lse, o, fc.range);
        CHECK((gc.dq.is_contiguous() && gc.dk.is_contiguous() && gc.dv.is_contiguous()));
        const double same = dt == kFloat64 ? 1e-12 : 0.0;  // identical arithmetic, identical roundings
        check_close(f.out, values_of(fc.out), same, same, "out packed vs contiguous");
        check_close(gr.dq, values_of(gc.dq), same, same, "dq packed vs contiguous");
        check_close(gr.dk, values_of(gc.dk), same, same, "dk packed vs contiguous");
        check_close(gr.dv, values_of(gc.dv), same, same, "dv packed vs contiguous");
        const AttentionReference ref = attention_reference(p.q, p.k, p.v, mask, causal, 0.6, {}, g);
        const double tol = tolerance(dt);
        check_close(f.out, ref.out, tol, tol, "out");
        check_close(gr.dq, ref.dq, tol, tol, "dq");
        check_close(gr.dk, ref.dk, tol, tol, "dk");
        check_close(gr.dv, ref.dv, tol, tol, "dv");
      }
}

TEST_CASE("flash_attention cpu: mixed layouts keep their own order and values") {
  const int64_t B = 2, T = 5, S = 7, H = 2, E = 3, D = H * E;
  const Tensor x = random_tensor({B, T, 3 * D}, {kFloat64}, 600, Layout::Contiguous, -1.0, 1.0);
  const Tensor y = random_tensor({B, S, 2 * D}, {kFloat64}, 601, Layout::Contiguous, -1.0, 1.0);
  const Tensor kc = random_tensor({B, H, S, E}, {kFloat64}, 602, Layout::Contiguous, -1.0, 1.0);
  const Tensor vc = random_tensor({B, H, S, E}, {kFloat64}, 603, Layout::Contiguous, -1.0, 1.0);
  const Tensor g = random_tensor({B, H, T, E}, {kFloat64}, 604, Layout::Contiguous, -1.0, 1.0);
  const Packed p = packed_heads(x, H);
  const Tensor ks = y.narrow(2, 0, D).unflatten(-1, {H, E}).transpose(1, 2);
  const Tensor vs = y.narrow(2, D, D).unflatten(-1, {H, E}).transpose(1, 2);
  struct Variant {
    const char* name;
    Tensor q, k, v;
    bool q_seq, k_seq, v_seq;
  };
  const Variant variants[] = {
      {"only q packed-looking, contiguous k v", p.q, kc, vc, true, false, false},
      {"q from one buffer, k v from another (L != S)", p.q, ks, vs, true, true, true},
      {"chunks out of order (k, q, v)", p.k, p.q, p.v, true, true, true},
      {"one tensor as q, k and v", p.q, p.q, p.q, true, true, true},
      {"contiguous q, sequence-major k v", p.q.contiguous(), ks, vs, false, true, true},
  };
  for (const Variant& var : variants) {
    CAPTURE(var.name);
    const Tensor gq = g.narrow(2, 0, var.q.size(2));
    const ops::FlashAttentionOptions o{Tensor(), false, {}, 0.0};
    const auto f = ops::flash_attention_forward(var.q, var.k, var.v, o);
    CHECK(f.out.strides() == (var.q_seq ? sequence_major_strides(f.out) : contiguous_strides(f.out.sizes())));
    const auto gr = ops::flash_attention_backward(gq, var.q, var.k, var.v, f.out, f.lse, o, f.range);
    CHECK(!(gr.dq.shares_storage(gr.dk) || gr.dk.shares_storage(gr.dv)));
    CHECK(gr.dq.strides() == (var.q_seq ? sequence_major_strides(gr.dq) : contiguous_strides(gr.dq.sizes())));
    CHECK(gr.dk.strides() == (var.k_seq ? sequence_major_strides(gr.dk) : contiguous_strides(gr.dk.sizes())));
    CHECK(gr.dv.strides() == (var.v_seq ? sequence_major_strides(gr.dv) : contiguous_strides(gr.dv.sizes())));
    const AttentionReference ref =
        attention_reference(var.q, var.k, var.v, Tensor(), false, 1.0 / std::sqrt(double(E)), {}, gq);
    check_close(f.out, ref.out, 1e-10, 1e-10, "out");
    check_close(gr.dq, ref.dq, 1e-10, 1e-10, "dq");
    check_close(gr.dk, ref.dk, 1e-10, 1e-10, "dk");
    check_close(gr.dv, ref.dv, 1e-10, 1e-10, "dv");
  }
}

TEST_CASE("flash_attention cpu: a backward given a contiguous out reads it through its strides") {
  // The forward's out is sequence-major for packed inputs; the backward takes any layout of it.
  const Tensor x = random_tensor({1, 4, 3 * 8}, {kFloat64}, 700, Layout::Contiguous, -1.0, 1.0);
  const Tensor g = random_tensor({1, 2, 4, 4}, {kFloat64}, 701, Layout::Contiguous, -1.0, 1.0);
  const Packed p = packed_heads(x, 2);
  const auto f = ops::flash_attention_forward(p.q, p.k, p.v, {});
  const auto a = ops::flash_attention_backward(g, p.q, p.k, p.v, f.out, f.lse, {}, f.range);
  const auto b = ops::flash_attention_backward(g.transpose(1, 2).contiguous().transpose(1, 2), p.q, p.k, p.v,
                                               f.out.contiguous(), f.lse, {}, f.range);
  check_close(b.dq, values_of(a.dq), 1e-14, 1e-14, "dq");
  check_close(b.dk, values_of(a.dk), 1e-14, 1e-14, "dk");
  check_close(b.dv, values_of(a.dv), 1e-14, 1e-14, "dv");
}

TEST_CASE("flash_attention cpu: gradcheck through chunk + split heads (packed grads, split without cat)") {
  const int64_t B = 2, T = 4, H = 2, E = 3, D = H * E;
  const Tensor x = random_tensor({B, T, 3 * D}, {kFloat64}, 800, Layout::Contiguous, -1.0, 1.0).requires_grad_();
  const Tensor pad = make_tensor({1, 1, 1, 0, 1, 1, 1, 1}, {B, 1, 1, T}, {kBool});
  auto attend = [&](const Tensor& in, bool copies, bool causal) {
    std::vector<Tensor> qkv = chunk(in, 3, -1);
    for (Tensor& t : qkv) {
      t = t.unflatten(-1, {H, E}).transpose(1, 2);
      if (copies) t = t.contiguous();
    }
    return flash_attention(qkv[0], qkv[1], qkv[2], pad, causal).transpose(1, 2).reshape({B, T, D});
  };
  for (bool causal : {false, true}) {
    CAPTURE(causal);
    const auto r = autograd::gradcheck([&](const TensorList& in) { return attend(in[0], false, causal); }, {x});
    CHECK_MESSAGE(r.ok, r.report);
    // The same gradient as with contiguous copies of q, k, v (the cat path).
    const Tensor w = random_tensor({B, T, D}, {kFloat64}, 801);
    const Tensor packed = autograd::grad({sum(mul(attend(x, false, causal), w))}, {x})[0];
    const Tensor copied = autograd::grad({sum(mul(attend(x, true, causal), w))}, {x})[0];
    check_close(packed, values_of(copied), 1e-12, 1e-12, "x's grad, packed vs copies");
  }
}

TEST_CASE("flash_attention cpu: the attention block's layout changes around the kernels are views") {
  // nn::MultiheadAttention's graph: proj (B, T, 3D) -> chunk -> split heads -> flash ->
  // merge heads. The merge is a view of out; in the backward, proj's grad is the buffer of
  // dq, dk, dv itself: against contiguous copies of q, k, v (the old layout), the backward
  // saves the (B, T, D) copies of the three head merges and the (B, T, 3D) cat.
  const int64_t B = 2, T = 5, H = 2, E = 4, D = H * E;
  const Tensor x = random_tensor({B, T, 3 * D}, {kFloat32}, 900).requires_grad_();
  auto backward_bytes = [&](bool copies) {
    std::vector<Tensor> qkv = chunk(mul(x, 1.0), 3, -1);  // mul: a non-leaf standing in for linear
    for (Tensor& t : qkv) {
      t = t.unflatten(-1, {H, E}).transpose(1, 2);
      if (copies) t = t.contiguous();
    }
    const Tensor out = flash_attention(qkv[0], qkv[1], qkv[2], Tensor(), true);
    const Tensor merged = out.transpose(1, 2).reshape({B, T, D});
    CHECK(merged.shares_storage(out) == !copies);
    const Tensor loss = sum(merged);
    const int64_t before = memory::stats(kCPU).allocated_bytes.allocated;
    const Tensor gx = autograd::grad({loss}, {x})[0];
    return std::pair{memory::stats(kCPU).allocated_bytes.allocated - before, values_of(gx)};
  };
  const auto [packed_bytes, packed_grad] = backward_bytes(false);
  const auto [copies_bytes, copies_grad] = backward_bytes(true);
  MESSAGE("backward allocations: packed ", packed_bytes, " bytes, contiguous copies ", copies_bytes);
  CHECK(copies_bytes - packed_bytes >= 2 * B * T * 3 * D * int64_t(sizeof(float)));
  check_close(packed_grad, copies_grad, 0, 0, "x's grad");
}

TEST_CASE("flash_attention cpu: an empty head dim still gives every row's lse") {
  // E = 0: out is empty, but every score is 0 (plus the mask), so row l's lse is the log
  // of its number of visible keys. The forward returned before the kernel whenever out
  // was empty, leaving lse uninitialized.
  const Tensor q = empty({1, 2, 3, 0}), k = empty({1, 2, 4, 0});
  const auto f = ops::flash_attention_forward(q, k, k, {.mask = {}, .is_causal = true, .scale = 1.0});
  CHECK(f.out.numel() == 0);
  const std::vector<double> lse = values_of(f.lse);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t l = 0; l < 3; ++l) CHECK(lse[size_t(h * 3 + l)] == doctest::Approx(std::log(double(l + 1))));
}

TEST_CASE("flash_attention cpu: the attention backend setting") {
  // Note [cuDNN attention]: the setting only ever sends CUDA calls to cuDNN; the CPU kernels
  // take every CPU call, whatever it says, and compute the same numbers under each.
  const Tensor q = random_tensor({1, 2, 5, 8}, {kFloat32}, 1, Layout::Contiguous, -1.0, 1.0);
  const Tensor k = random_tensor({1, 2, 6, 8}, {kFloat32}, 2, Layout::Contiguous, -1.0, 1.0);
  const Tensor v = random_tensor({1, 2, 6, 8}, {kFloat32}, 3, Layout::Contiguous, -1.0, 1.0);
  const ops::FlashAttentionOptions o{Tensor(), true, {}, 0.0};
  const AttentionReference ref = attention_reference(q, k, v, Tensor(), true, 1.0 / std::sqrt(8.0), {});
  const ops::AttentionBackend before = ops::attention_backend();
  for (ops::AttentionBackend b :
       {ops::AttentionBackend::Auto, ops::AttentionBackend::Cudnn, ops::AttentionBackend::Flash}) {
    INFO(ops::attention_backend_name(b));
    {
      const ops::AttentionBackendGuard guard(b);
      CHECK(ops::attention_backend() == b);
      CHECK(ops::attention_backend_for(q, k, v, o) == ops::AttentionBackend::Flash);
      check_close(values_of(ops::flash_attention_forward(q, k, v, o).out), ref.out, 1e-5, 1e-6, "out");
    }
    CHECK(ops::attention_backend() == before);
  }
  CHECK(std::string(ops::attention_backend_name(ops::AttentionBackend::Cudnn)) == "cudnn");
  check_error([&] { ops::attention_backend_for(q, k.narrow(3, 0, 4), v, o); }, {"attention_backend_for", "E"});
}
