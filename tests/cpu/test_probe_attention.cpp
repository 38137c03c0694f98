// Probes for silent wrong answers in nn::MultiheadAttention at the module level, against the
// contract of torch.nn.MultiheadAttention (PyTorch 2.x docs, "MultiheadAttention" and
// torch.nn.functional.multi_head_attention_forward): torch's packed in_proj_weight (rows q | k
// | v) loaded from a state dict, batch_first both ways, key_padding_mask (N, S) / (S) and
// attn_mask (L, S) / (N*num_heads, L, S) as bool (True = not allowed) or float (added), both
// masks together (merged as torch: or-ed, or summed as additive masks), is_causal, returned
// weights averaged or per head, kdim/vdim, bias=false, dropout on the weights in training
// only, self vs cross attention, odd head dims, masks given as views, fully padded batches,
// size-0 dims, and gradients against central differences of the reference.
//
// The reference is a float64 multi-head attention written here with loops from torch's
// parameters as a torch state_dict holds them; it never calls frugal's ops.
// (tests/cpu/test_attention.cpp holds the module's own tests; the op-level flash_attention /
// scaled_dot_product_attention probes are in tests/cpu/test_probe_inputs.cpp.)
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/ops/all.h"
#include "nn/attention.h"
#include "tensor/factory.h"
#include "tensor/random.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- torch's parameters and the float64 reference -------------------------------------

/// torch.nn.MultiheadAttention's parameters, row-major float64, as its state_dict holds them.
struct TorchParams {
  int64_t E = 0, H = 0, kdim = 0, vdim = 0;
  bool packed = true;  // torch's _qkv_same_embed_dim: kdim == vdim == embed_dim
  bool bias = true;
  std::vector<double> in_proj_weight;                               // (3E, E), rows q | k | v
  std::vector<double> q_proj_weight, k_proj_weight, v_proj_weight;  // (E, E), (E, kdim), (E, vdim)
  std::vector<double> in_proj_bias;                                 // (3E): q | k | v
  std::vector<double> out_w, out_b;                                 // (E, E), (E)
};

TorchParams torch_params(int64_t E, int64_t H, uint64_t seed, bool bias = true, int64_t kdim = -1, int64_t vdim = -1) {
  TorchParams p;
  p.E = E, p.H = H, p.kdim = kdim < 0 ? E : kdim, p.vdim = vdim < 0 ? E : vdim, p.bias = bias;
  p.packed = p.kdim == E && p.vdim == E;
  if (p.packed) {
    p.in_proj_weight = random_values(3 * E * E, seed + 1, -0.8, 0.8);
  } else {
    p.q_proj_weight = random_values(E * E, seed + 2, -0.8, 0.8);
    p.k_proj_weight = random_values(E * p.kdim, seed + 3, -0.8, 0.8);
    p.v_proj_weight = random_values(E * p.vdim, seed + 4, -0.8, 0.8);
  }
  if (bias) p.in_proj_bias = random_values(3 * E, seed + 5, -0.5, 0.5);
  p.out_w = random_values(E * E, seed + 6, -0.8, 0.8);
  if (bias) p.out_b = random_values(E, seed + 7, -0.5, 0.5);
  return p;
}

/// The state dict torch would save for p (its key names, its shapes).
std::map<std::string, Tensor> state_dict_of(const TorchParams& p, DType dt) {
  const int64_t E = p.E;
  std::map<std::string, Tensor> s;
  if (p.packed) {
    s["in_proj_weight"] = make_tensor(p.in_proj_weight, {3 * E, E}, dt);
  } else {
    s["q_proj_weight"] = make_tensor(p.q_proj_weight, {E, E}, dt);
    s["k_proj_weight"] = make_tensor(p.k_proj_weight, {E, p.kdim}, dt);
    s["v_proj_weight"] = make_tensor(p.v_proj_weight, {E, p.vdim}, dt);
  }
  if (p.bias) s["in_proj_bias"] = make_tensor(p.in_proj_bias, {3 * E}, dt);
  s["out_proj.weight"] = make_tensor(p.out_w, {E, E}, dt);
  if (p.bias) s["out_proj.bias"] = make_tensor(p.out_b, {E}, dt);
  return s;
}

std::shared_ptr<nn::MultiheadAttention> module_of(const TorchParams& p, DType dt, bool batch_first,
                                                  double dropout = 0.0) {
  nn::MultiheadAttentionOptions o;
  o.dropout = dropout;
  o.bias = p.bias;
  o.batch_first = batch_first;
  if (!p.packed) o.kdim = p.kdim, o.vdim = p.vdim;
  auto m = std::make_shared<nn::MultiheadAttention>(p.E, p.H, o);
  m->to(dt);
  m->load_state_dict(state_dict_of(p, dt));  // strict: torch's keys, nothing more or less
  return m;
}

/// A mask as the test describes it: kind 0 none, 1 bool (1 = NOT allowed, torch's
/// nn.MultiheadAttention convention), 2 float (added to the scores).
struct Mask {
  int kind = 0;
  Shape shape{};
  std::vector<double> v{};
  Tensor tensor(DType float_dtype) const {
    return kind == 0 ? Tensor() : make_tensor(v, shape, TensorOptions(kind == 1 ? kBool : float_dtype));
  }
};

Mask bool_mask(const Shape& shape, uint64_t seed, double p_masked = 0.3) {
  Mask m{1, shape, random_values(numel_of(shape), seed, 0.0, 1.0)};
  for (double& x : m.v) x = x < p_masked ? 1.0 : 0.0;
  return m;
}
Mask float_mask(const Shape& shape, uint64_t seed) {
  return Mask{2, shape, random_values(numel_of(shape), seed, -1.5, 1.5)};
}

struct Ref {
  std::vector<double> out;  // (B, L, E)
  std::vector<double> w;    // (B, H, L, S), after dropout
};

/// torch.nn.functional.multi_head_attention_forward in float64 loops: q = query Wq^T + bq with
/// Wq = in_proj_weight rows [0, E), Wk rows [E, 2E), Wv rows [2E, 3E) (or the separate
/// weights); per head h (columns [h D, (h+1) D)) softmax(q_h k_h^T / sqrt(D) + masks) v_h;
/// out = concat_h(...) Wo^T + bo. Inputs are batch-first row-major: query (B, L, E),
/// key (B, S, kdim), value (B, S, vdim). A row with every key masked gets zero weights
/// (frugal's documented choice, Note [Masked softmax]). is_causal masks s > l. `keep`
/// (B, H, L, S), when given, multiplies the weights after the softmax (dropout).
Ref mha_ref(const TorchParams& p, int64_t B, int64_t L, int64_t S, const std::vector<double>& query,
            const std::vector<double>& key, const std::vector<double>& value, const Mask& pad = {},
            const Mask& attn = {}, bool causal = false, const std::vector<double>* keep = nullptr) {
  const int64_t E = p.E, H = p.H, D = E / H, KD = p.kdim, VD = p.vdim;
  auto w_in = [&](int which, int64_t e, int64_t i) -> double {
    if (p.packed) return p.in_proj_weight[size_t((which * E + e) * E + i)];
    if (which == 0) return p.q_proj_weight[size_t(e * E + i)];
    if (which == 1) return p.k_proj_weight[size_t(e * KD + i)];
    return p.v_proj_weight[size_t(e * VD + i)];
  };
  auto b_in = [&](int which, int64_t e) { return p.bias ? p.in_proj_bias[size_t(which * E + e)] : 0.0; };
  auto project = [&](int which, const std::vector<double>& x, int64_t T, int64_t in) {
    std::vector<double> y(size_t(B * T * E));
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t e = 0; e < E; ++e) {
        double s = b_in(which, e);
        for (int64_t i = 0; i < in; ++i) s += x[size_t(r * in + i)] * w_in(which, e, i);
        y[size_t(r * E + e)] = s;
      }
    return y;
  };
  const std::vector<double> Q = project(0, query, L, E), K = project(1, key, S, KD), V = project(2, value, S, VD);
  auto mask_add = [](const Mask& m, int64_t i) {
    if (m.kind == 0) return 0.0;
    if (m.kind == 1) return m.v[size_t(i)] != 0 ? -kInf : 0.0;
    return m.v[size_t(i)];
  };
  Ref r;
  r.w.assign(size_t(B * H * L * S), 0.0);
  std::vector<double> ctx(size_t(B * L * E), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < L; ++l) {
        std::vector<double> sc(static_cast<size_t>(S));
        double mx = -kInf;
        for (int64_t s = 0; s < S; ++s) {
          double d = 0;
          for (int64_t j = 0; j < D; ++j)
            d += Q[size_t((b * L + l) * E + h * D + j)] * K[size_t((b * S + s) * E + h * D + j)];
          d /= std::sqrt(double(D));
          d += mask_add(pad, b * S + s);
          d += mask_add(attn, attn.shape.size() == 2 ? l * S + s : ((b * H + h) * L + l) * S + s);
          if (causal && s > l) d = -kInf;
          sc[size_t(s)] = d;
          mx = std::max(mx, d);
        }
        double* w = &r.w[size_t(((b * H + h) * L + l) * S)];
        if (mx != -kInf) {
          double z = 0;
          for (int64_t s = 0; s < S; ++s) z += (w[s] = sc[size_t(s)] == -kInf ? 0.0 : std::exp(sc[size_t(s)] - mx));
          for (int64_t s = 0; s < S; ++s) w[s] /= z;
        }
        if (keep)
          for (int64_t s = 0; s < S; ++s) w[s] *= (*keep)[size_t(((b * H + h) * L + l) * S + s)];
        for (int64_t j = 0; j < D; ++j) {
          double acc = 0;
          for (int64_t s = 0; s < S; ++s) acc += w[s] * V[size_t((b * S + s) * E + h * D + j)];
          ctx[size_t((b * L + l) * E + h * D + j)] = acc;
        }
      }
  r.out.assign(size_t(B * L * E), 0.0);
  for (int64_t row = 0; row < B * L; ++row)
    for (int64_t o = 0; o < E; ++o) {
      double s = p.bias ? p.out_b[size_t(o)] : 0.0;
      for (int64_t e = 0; e < E; ++e) s += ctx[size_t(row * E + e)] * p.out_w[size_t(o * E + e)];
      r.out[size_t(row * E + o)] = s;
    }
  return r;
}

/// (B, H, L, S) -> (B, L, S), the mean over heads (torch's average_attn_weights=True).
std::vector<double> head_mean(const std::vector<double>& w, int64_t B, int64_t H, int64_t L, int64_t S) {
  std::vector<double> m(size_t(B * L * S), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L * S; ++i) m[size_t(b * L * S + i)] += w[size_t((b * H + h) * L * S + i)] / double(H);
  return m;
}

/// A (T, B, F) tensor holding batch-first values (B, T, F): torch's default layout.
Tensor seq_first(const std::vector<double>& v, int64_t B, int64_t T, int64_t F, DType dt) {
  return make_tensor(v, {B, T, F}, dt).transpose(0, 1).contiguous();
}

/// Module output (and weights) against the reference, in all three need_weights settings.
/// `bf`: the module is batch_first (else output is (L, B, E) and compared transposed back).
void check_module(nn::MultiheadAttention& m, const Tensor& q, const Tensor& k, const Tensor& v,
                  const nn::AttentionForwardOptions& base, const Ref& ref, int64_t B, int64_t L, int64_t S, double tol,
                  const std::string& what) {
  const bool batched = q.dim() == 3;
  auto to_bf = [&](const Tensor& t) { return batched && !m.batch_first ? t.transpose(0, 1) : t; };
  const int64_t E = m.embed_dim, H = m.num_heads;
  nn::AttentionForwardOptions o = base;
  o.need_weights = false;
  const nn::AttentionOutput r0 = m(q, k, v, o);
  CHECK_MESSAGE(r0.output.sizes() == (batched ? (m.batch_first ? Shape{B, L, E} : Shape{L, B, E}) : Shape{L, E}), what,
                ": output ", r0.output.describe());
  CHECK_FALSE(r0.weights.defined());
  check_close(to_bf(r0.output), ref.out, tol, tol, what + ": output (need_weights=false)");
  o.need_weights = true;
  for (bool average : {false, true}) {
    o.average_attn_weights = average;
    const nn::AttentionOutput r = m(q, k, v, o);
    check_close(to_bf(r.output), ref.out, tol, tol, what + ": output (need_weights=true)");
    REQUIRE(r.weights.defined());
    // torch: weights are (N, L, S) / (N, H, L, S) whatever batch_first says; unbatched (L, S) / (H, L, S).
    const Shape want =
        average ? (batched ? Shape{B, L, S} : Shape{L, S}) : (batched ? Shape{B, H, L, S} : Shape{H, L, S});
    CHECK_MESSAGE(r.weights.sizes() == want, what, ": weights ", r.weights.describe());
    check_close(r.weights, average ? head_mean(ref.w, B, H, L, S) : ref.w, tol, tol,
                what + (average ? ": averaged weights" : ": per-head weights"));
  }
}

TensorList parameters_of(nn::Module& m) {
  TensorList ps;
  for (const auto& [name, t] : m.named_parameters()) ps.push_back(t);
  return ps;
}

}  // namespace

// ==================================================================================

TEST_CASE(
    "probe attention: torch's packed in_proj_weight (rows q | k | v) loads and gives the hand-computed MHA, "
    "seq-first") {
  // torch's default layout is batch_first=False: (L, N, E). The expectation is computed from
  // the state dict's own numbers, so a module that slices in_proj_weight in another order
  // (k | q | v, columns instead of rows, heads interleaved) cannot agree.
  const int64_t B = 2, L = 3, S = 4, E = 6, H = 2;
  for (bool bias : {true, false}) {
    const TorchParams p = torch_params(E, H, bias ? 10 : 20, bias);
    auto m = module_of(p, kFloat64, /*batch_first=*/false);
    const std::vector<double> xv = random_values(B * L * E, 31), memv = random_values(B * S * E, 32),
                              vv = random_values(B * S * E, 33);
    const Tensor x = seq_first(xv, B, L, E, kFloat64), mem = seq_first(memv, B, S, E, kFloat64),
                 val = seq_first(vv, B, S, E, kFloat64);
    const std::string tag = bias ? "bias" : "no bias";
    check_module(*m, x, x, x, {}, mha_ref(p, B, L, L, xv, xv, xv), B, L, L, 1e-12,
                 tag + " self (query is key is value)");
    check_module(*m, x, mem, mem, {}, mha_ref(p, B, L, S, xv, memv, memv), B, L, S, 1e-12, tag + " key is value");
    check_module(*m, x, mem, val, {}, mha_ref(p, B, L, S, xv, memv, vv), B, L, S, 1e-12, tag + " three tensors");
    // Unbatched (L, E) inputs: torch treats them as one batch element regardless of batch_first.
    const std::vector<double> x1(xv.begin() + L * E, xv.end()), m1(memv.begin() + S * E, memv.end());
    const Tensor xu = make_tensor(x1, {L, E}, kFloat64), mu = make_tensor(m1, {S, E}, kFloat64);
    check_module(*m, xu, mu, mu, {}, mha_ref(p, 1, L, S, x1, m1, m1), 1, L, S, 1e-12, tag + " unbatched");
  }
  // Separate projections (kdim, vdim != embed_dim): q/k/v_proj_weight and the packed (3E) bias.
  const TorchParams p = torch_params(E, H, 40, true, 5, 3);
  auto m = module_of(p, kFloat64, false);
  CHECK_FALSE(m->in_proj_weight.defined());
  const std::vector<double> xv = random_values(B * L * E, 41), kv = random_values(B * S * 5, 42),
                            vv = random_values(B * S * 3, 43);
  check_module(*m, seq_first(xv, B, L, E, kFloat64), seq_first(kv, B, S, 5, kFloat64), seq_first(vv, B, S, 3, kFloat64),
               {}, mha_ref(p, B, L, S, xv, kv, vv), B, L, S, 1e-12, "kdim=5 vdim=3");
  // float32 parameters from a float64 state dict: the same numbers, rounded.
  auto m32 = module_of(torch_params(E, H, 10), kFloat32, false);
  const TorchParams p32 = torch_params(E, H, 10);
  const std::vector<double> xv2 = random_values(B * L * E, 44);
  const Tensor x32 = seq_first(xv2, B, L, E, kFloat32);
  check_module(*m32, x32, x32, x32, {}, mha_ref(p32, B, L, L, xv2, xv2, xv2), B, L, L, 2e-5, "float32");
}

TEST_CASE("probe attention: odd head dims (12/4 -> 3, 5/5 -> 1, 7/1 -> 7) on transposed and strided inputs") {
  struct Shape_ {
    int64_t E, H;
  };
  for (const Shape_ sh : {Shape_{12, 4}, Shape_{5, 5}, Shape_{7, 1}, Shape_{6, 3}}) {
    for (DType dt : {kFloat32, kFloat64}) {
      const int64_t B = 2, L = 3, S = 5, E = sh.E, H = sh.H;
      const TorchParams p = torch_params(E, H, 100 + uint64_t(E * 10 + H));
      auto m = module_of(p, dt, /*batch_first=*/true);
      CHECK(m->head_dim == E / H);
      const double tol = dt == kFloat64 ? 1e-12 : 3e-5;
      const std::string tag = "E=" + std::to_string(E) + " H=" + std::to_string(H) + " " + dtype_name(dt);
      const std::vector<double> xv = random_values(B * L * E, 51), mv = random_values(B * S * E, 52),
                                vv = random_values(B * S * E, 53);
      const Tensor xt = make_tensor(xv, {B, L, E}, dt, Layout::Transposed);
      check_module(*m, xt, xt, xt, {}, mha_ref(p, B, L, L, xv, xv, xv), B, L, L, tol, tag + " self transposed");
      const Tensor ms = make_tensor(mv, {B, S, E}, dt, Layout::Strided),
                   vs = make_tensor(vv, {B, S, E}, dt, Layout::Transposed);
      check_module(*m, xt, ms, vs, {}, mha_ref(p, B, L, S, xv, mv, vv), B, L, S, tol, tag + " cross strided");
      const Mask pad = bool_mask({B, S}, 54);
      check_module(*m, xt, ms, ms, {.key_padding_mask = pad.tensor(dt), .is_causal = true},
                   mha_ref(p, B, L, S, xv, mv, mv, pad, {}, true), B, L, S, tol, tag + " padding + causal");
    }
  }
}

TEST_CASE("probe attention: embed_dim not divisible by num_heads (or num_heads > embed_dim) is an error naming both") {
  // torch: AssertionError "embed_dim must be divisible by num_heads".
  check_error([] { nn::MultiheadAttention(12, 5); },
              {"MultiheadAttention", "embed_dim (12)", "num_heads (5)", "divisible"});
  check_error([] { nn::MultiheadAttention(3, 4); },
              {"MultiheadAttention", "embed_dim (3)", "num_heads (4)", "divisible"});
  check_error([] { nn::MultiheadAttention(12, 5, {.kdim = 4, .vdim = 4}); }, {"embed_dim (12)", "num_heads (5)"});
  check_error([] { nn::MultiheadAttention(0, 1); }, {"MultiheadAttention", "embed_dim=0"});
  check_error([] { nn::MultiheadAttention(8, -2); }, {"MultiheadAttention", "num_heads=-2"});
  // A torch state dict for another head count's embed_dim does not load silently.
  nn::MultiheadAttention m(6, 2);
  check_error([&] { m.load_state_dict(state_dict_of(torch_params(8, 2, 1), kFloat32)); },
              {"load_state_dict", "in_proj_weight", "[24, 8]", "[18, 6]"});
}

TEST_CASE(
    "probe attention: every mask combination (padding none/bool/float x attn_mask none/bool/float, 2-D/3-D x "
    "is_causal) in both paths, seq-first, L < S and L > S") {
  // torch merges key_padding_mask into attn_mask: bool masks become -inf where True, float
  // masks are added, the two are summed (F.multi_head_attention_forward, _canonical_mask).
  // is_causal: frugal applies the causal mask itself on top of the others (documented in
  // nn/attention.h; torch's hint gives the same when attn_mask is the causal mask, checked below).
  const int64_t B = 2, E = 6, H = 2;
  const TorchParams p = torch_params(E, H, 200);
  auto m = module_of(p, kFloat64, /*batch_first=*/false);
  struct LS {
    int64_t L, S;
  };
  for (const LS ls : {LS{3, 4}, LS{5, 3}}) {
    const int64_t L = ls.L, S = ls.S;
    const std::vector<double> qv = random_values(B * L * E, 201), memv = random_values(B * S * E, 202);
    const Tensor q = seq_first(qv, B, L, E, kFloat64), mem = seq_first(memv, B, S, E, kFloat64);
    Mask fpad = float_mask({B, S}, 203);
    fpad.v[1] = -kInf;  // as users write masked_fill(pad, -inf)
    const std::vector<Mask> pads = {Mask{}, bool_mask({B, S}, 204, 0.25), fpad};
    const std::vector<Mask> attns = {Mask{}, bool_mask({L, S}, 205, 0.25), bool_mask({B * H, L, S}, 206, 0.25),
                                     float_mask({L, S}, 207), float_mask({B * H, L, S}, 208)};
    for (size_t i = 0; i < pads.size(); ++i)
      for (size_t j = 0; j < attns.size(); ++j)
        for (bool causal : {false, true}) {
          const std::string tag = "L=" + std::to_string(L) + " S=" + std::to_string(S) + " pad#" + std::to_string(i) +
                                  " attn#" + std::to_string(j) + (causal ? " causal" : "");
          const Ref ref = mha_ref(p, B, L, S, qv, memv, memv, pads[i], attns[j], causal);
          check_module(*m, q, mem, mem,
                       {.key_padding_mask = pads[i].tensor(kFloat64),
                        .attn_mask = attns[j].tensor(kFloat64),
                        .is_causal = causal},
                       ref, B, L, S, 1e-12, tag);
        }
    // torch's documented use of the hint: attn_mask IS the causal mask (True above the diagonal,
    // torch.nn.Transformer.generate_square_subsequent_mask's bool form) and is_causal=True.
    Mask causal_mask{1, {L, S}, std::vector<double>(size_t(L * S), 0.0)};
    for (int64_t l = 0; l < L; ++l)
      for (int64_t s = l + 1; s < S; ++s) causal_mask.v[size_t(l * S + s)] = 1.0;
    const Ref ref = mha_ref(p, B, L, S, qv, memv, memv, pads[1], causal_mask, false);
    for (bool hint : {false, true})
      check_module(
          *m, q, mem, mem,
          {.key_padding_mask = pads[1].tensor(kFloat64), .attn_mask = causal_mask.tensor(kFloat64), .is_causal = hint},
          ref, B, L, S, 1e-12, std::string("explicit causal mask, hint ") + (hint ? "on" : "off"));
  }
}

TEST_CASE("probe attention: masks given as views (transposed, expanded, strided, narrowed) read like contiguous ones") {
  const int64_t B = 2, L = 3, S = 4, E = 6, H = 3;
  const TorchParams p = torch_params(E, H, 300);
  auto m = module_of(p, kFloat64, /*batch_first=*/true);
  const std::vector<double> qv = random_values(B * L * E, 301), memv = random_values(B * S * E, 302);
  const Tensor q = make_tensor(qv, {B, L, E}, kFloat64), mem = make_tensor(memv, {B, S, E}, kFloat64);
  auto as_mask = [](const Tensor& t) {  // the view's values, row-major
    Mask mk{t.dtype() == kBool ? 1 : 2, t.sizes(), values_of(t)};
    return mk;
  };
  // Float (L, S) attn_mask as the transpose of a dense (S, L) tensor.
  const Tensor attn_t = random_tensor({S, L}, kFloat64, 303).t();
  // Bool (B*H, L, S) attn_mask as every other column of a (B*H, L, 2S) tensor.
  const Tensor wide = make_tensor(bool_mask({B * H, L, 2 * S}, 304).v, {B * H, L, 2 * S}, kBool);
  const Tensor attn_s = wide.slice(-1, 1, 2 * S, 2);
  // Bool (B, S) key_padding_mask expanded from one row (stride 0 over the batch).
  const Tensor pad_row = make_tensor({0, 1, 0, 1}, {1, S}, kBool);
  const Tensor pad_e = pad_row.expand({B, S});
  // Float (B, S) key_padding_mask narrowed out of a (B, S + 3) tensor, and a transposed (S, B) one.
  const Tensor pad_n = random_tensor({B, S + 3}, kFloat64, 305).narrow(1, 2, S);
  const Tensor pad_t = random_tensor({S, B}, kFloat64, 306).t();
  // (L, S) bool attn_mask expanded from one row; (B*H, L, S) float expanded from (1, L, S).
  const Tensor attn_e = make_tensor({0, 0, 1, 0}, {1, S}, kBool).expand({L, S});
  const Tensor attn_e3 = random_tensor({1, L, S}, kFloat64, 307).expand({B * H, L, S});
  struct Case {
    Tensor pad, attn;
    std::string what;
  };
  const std::vector<Case> cases = {
      {Tensor(), attn_t, "transposed float attn_mask"},
      {Tensor(), attn_s, "strided bool 3-D attn_mask"},
      {pad_e, Tensor(), "expanded bool padding"},
      {pad_e, attn_s, "expanded bool padding + strided bool attn_mask"},
      {pad_n, attn_e, "narrowed float padding + expanded bool attn_mask"},
      {pad_t, attn_e3, "transposed float padding + expanded float 3-D attn_mask"},
      {pad_e, attn_t, "expanded bool padding + transposed float attn_mask"},
  };
  for (const Case& c : cases) {
    const Mask pad = c.pad.defined() ? as_mask(c.pad) : Mask{};
    const Mask attn = c.attn.defined() ? as_mask(c.attn) : Mask{};
    for (bool causal : {false, true})
      check_module(*m, q, mem, mem, {.key_padding_mask = c.pad, .attn_mask = c.attn, .is_causal = causal},
                   mha_ref(p, B, L, S, qv, memv, memv, pad, attn, causal), B, L, S, 1e-12,
                   c.what + (causal ? " causal" : ""));
  }
  // Unbatched: (S) padding as a strided view, (H, L, S) attn_mask as a transposed view.
  const std::vector<double> q1(qv.begin(), qv.begin() + L * E), m1(memv.begin(), memv.begin() + S * E);
  const Tensor pad1 = make_tensor({1, 0, 0, 0, 1, 0, 0, 1}, {2 * S}, kBool).slice(0, 0, 2 * S, 2);
  const Tensor attn1 = random_tensor({H, S, L}, kFloat64, 308).transpose(1, 2);
  check_module(*m, q.select(0, 0), mem.select(0, 0), mem.select(0, 0), {.key_padding_mask = pad1, .attn_mask = attn1},
               mha_ref(p, 1, L, S, q1, m1, m1, as_mask(pad1), as_mask(attn1)), 1, L, S, 1e-12,
               "unbatched strided (S) padding + transposed (H, L, S) mask");
}

TEST_CASE(
    "probe attention: a batch whose keys are all padded gets zero weights, out_proj.bias and zero gradients; "
    "no NaN reaches other batches") {
  // torch: with need_weights=True the math path's softmax over an all -inf row is NaN (and
  // the nested-tensor fast path gives NaN or 0); with need_weights=False torch >= 2.5's
  // math SDPA uses _safe_softmax and gives 0. frugal gives zero weights on both paths,
  // documented in nn/attention.h (MultiheadAttention) and Note [Masked softmax].
  const int64_t B = 3, L = 2, S = 3, E = 4, H = 2;
  const TorchParams p = torch_params(E, H, 400);
  for (bool bf : {true, false}) {
    auto m = module_of(p, kFloat64, bf);
    const std::vector<double> qv = random_values(B * L * E, 401), memv = random_values(B * S * E, 402),
                              G = random_values(B * L * E, 403);
    auto in = [&](const std::vector<double>& v, int64_t T) {
      return bf ? make_tensor(v, {B, T, E}, kFloat64) : seq_first(v, B, T, E, kFloat64);
    };
    for (int kind : {1, 2}) {
      Mask pad{kind,
               {B, S},
               kind == 1 ? std::vector<double>{0, 1, 0, 1, 1, 1, 0, 0, 1}
                         : std::vector<double>{0.3, -kInf, 0.0, -kInf, -kInf, -kInf, -0.5, 0.2, -kInf}};
      const Ref ref = mha_ref(p, B, L, S, qv, memv, memv, pad);
      for (bool need_weights : {false, true}) {
        const std::string tag = std::string(bf ? "batch_first " : "seq-first ") + (kind == 1 ? "bool" : "float -inf") +
                                (need_weights ? " need_weights" : "");
        const Tensor q = in(qv, L), mem = in(memv, S);
        q.requires_grad_(), mem.requires_grad_();
        Tensor pad_t = pad.tensor(kFloat64);
        if (kind == 2) pad_t.requires_grad_();
        const nn::AttentionOutput r =
            (*m)(q, mem, mem, {.key_padding_mask = pad_t, .need_weights = need_weights, .average_attn_weights = false});
        const Tensor out_bf = bf ? r.output : r.output.transpose(0, 1);
        check_close(out_bf, ref.out, 1e-12, 1e-12, tag + " output");
        // Batch 1's output is exactly out_proj.bias (its context is 0).
        check_close(
            out_bf.select(0, 1),
            [&] {
              std::vector<double> b;
              for (int64_t l = 0; l < L; ++l) b.insert(b.end(), p.out_b.begin(), p.out_b.end());
              return b;
            }(),
            0, 1e-15, tag + " fully padded batch = out_proj.bias");
        if (need_weights) {
          check_close(r.weights, ref.w, 1e-12, 1e-12, tag + " weights");
          for (double w : values_of(r.weights.select(0, 1))) CHECK(w == 0.0);
        }
        m->zero_grad();
        sum(mul(out_bf, make_tensor(G, {B, L, E}, kFloat64))).backward();
        for (const Tensor& t : {q, mem}) {
          REQUIRE(t.grad().defined());
          const Tensor g = bf ? t.grad() : t.grad().transpose(0, 1);
          for (double x : values_of(g)) CHECK(std::isfinite(x));
          for (double x : values_of(g.select(0, 1))) CHECK_MESSAGE(x == 0.0, tag, ": padded batch gradient ", x);
        }
        for (const Tensor& prm : parameters_of(*m))
          for (double x : values_of(prm.grad())) CHECK(std::isfinite(x));
        if (kind == 2) {
          const std::vector<double> gm = values_of(pad_t.grad());
          for (size_t i = 0; i < gm.size(); ++i) {
            CHECK(std::isfinite(gm[i]));
            if (pad.v[i] == -kInf) CHECK(gm[i] == 0.0);
          }
        }
      }
    }
  }
}

TEST_CASE(
    "probe attention: dropout zeroes attention weights (not outputs) and rescales by 1/(1-p), per head, in both "
    "paths; eval is exact") {
  // torch: dropout "on attn_output_weights", only when training; every outcome must be the
  // reference with some keep mask in {0, 1/(1-p)}^(H*L*S) applied to the weights.
  const int64_t B = 1, L = 1, S = 2, E = 4, H = 2, n = B * H * L * S;
  const double p_drop = 0.3;
  const TorchParams prm = torch_params(E, H, 500);
  auto m = module_of(prm, kFloat64, true, p_drop);
  const std::vector<double> qv = random_values(B * L * E, 501), memv = random_values(B * S * E, 502);
  const Tensor q = make_tensor(qv, {B, L, E}, kFloat64), mem = make_tensor(memv, {B, S, E}, kFloat64);
  std::vector<std::vector<double>> keeps;
  std::vector<Ref> refs;
  for (int bits = 0; bits < (1 << n); ++bits) {
    std::vector<double> keep(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) keep[size_t(i)] = (bits >> i) & 1 ? 1.0 / (1.0 - p_drop) : 0.0;
    keeps.push_back(keep);
    refs.push_back(mha_ref(prm, B, L, S, qv, memv, memv, {}, {}, false, &keep));
  }
  auto matches = [](const std::vector<double>& a, const std::vector<double>& b) {
    for (size_t i = 0; i < a.size(); ++i)
      if (std::fabs(a[i] - b[i]) > 1e-12 * (1 + std::fabs(b[i]))) return false;
    return true;
  };
  const Ref plain = mha_ref(prm, B, L, S, qv, memv, memv);
  for (bool need_weights : {false, true}) {
    m->eval();
    manual_seed(1);
    check_close(m->forward(q, mem, mem, {.need_weights = need_weights}).output, plain.out, 1e-12, 1e-12, "eval");
    m->train();
    std::set<int> seen;
    int64_t dropped = 0;
    for (uint64_t seed = 1; seed <= 48; ++seed) {
      manual_seed(seed);
      const nn::AttentionOutput r =
          m->forward(q, mem, mem, {.need_weights = need_weights, .average_attn_weights = false});
      const std::vector<double> out = values_of(r.output);
      int found = -1, count = 0;
      for (int bits = 0; bits < (1 << n); ++bits)
        if (matches(out, refs[size_t(bits)].out)) found = bits, ++count;
      CHECK_MESSAGE(count == 1, "seed ", seed, (need_weights ? " need_weights" : ""),
                    ": the output is not the reference with one dropout mask on the weights (", count, " matches)");
      if (count != 1) continue;
      seen.insert(found);
      for (int64_t i = 0; i < n; ++i) dropped += ((found >> i) & 1) ? 0 : 1;
      if (need_weights) check_close(r.weights, refs[size_t(found)].w, 1e-12, 1e-12, "returned weights after dropout");
    }
    CHECK(seen.size() >= 8);  // 48 draws over 16 masks: each head and key drops independently
    const double frac = double(dropped) / double(48 * n);
    CHECK_MESSAGE(frac > 0.15, "dropped fraction ", frac);
    CHECK_MESSAGE(frac < 0.45, "dropped fraction ", frac);
  }
  // dropout = 0 in training is the plain reference.
  auto m0 = module_of(prm, kFloat64, true, 0.0);
  m0->train();
  check_close(m0->forward(q, mem, mem).output, plain.out, 1e-12, 1e-12, "p=0 training");
}

TEST_CASE("probe attention: input and parameter gradients match central differences of the float64 loop reference") {
  // loss = sum(out * G). The expectation differentiates the loop reference numerically, so it
  // shares nothing with frugal's forward or backward.
  struct Setup {
    TorchParams p;
    bool batch_first, self_attn;
    int64_t B, L, S;
    Mask pad, attn;
    bool causal;
    std::string what;
  };
  std::vector<Setup> setups;
  setups.push_back({torch_params(6, 2, 600), false, true, 2, 3, 3, bool_mask({2, 3}, 601, 0.3), float_mask({3, 3}, 602),
                    false, "self, head dim 3, seq-first, bool padding + float mask"});
  setups.push_back({torch_params(6, 3, 610, /*bias=*/false, 4, 5), true, false, 2, 2, 3, Mask{},
                    bool_mask({6, 2, 3}, 611), true, "kdim=4 vdim=5, no bias, 3-D bool mask, causal"});
  setups.push_back({torch_params(4, 2, 620), true, false, 1, 3, 2, float_mask({1, 2}, 621), Mask{}, true,
                    "packed cross, float padding, causal L > S"});
  for (const Setup& st : setups) {
    const TorchParams& p = st.p;
    const int64_t B = st.B, L = st.L, S = st.S, E = p.E;
    auto m = module_of(p, kFloat64, st.batch_first);
    std::vector<double> qv = random_values(B * L * E, 630), kv = random_values(B * S * p.kdim, 631),
                        vv = random_values(B * S * p.vdim, 632);
    if (st.self_attn) kv = vv = qv;
    const std::vector<double> G = random_values(B * L * E, 633);
    auto loss_ref = [&](const TorchParams& pp, const std::vector<double>& a, const std::vector<double>& b,
                        const std::vector<double>& c) {
      const Ref r = mha_ref(pp, B, L, S, a, b, c, st.pad, st.attn, st.causal);
      double s = 0;
      for (size_t i = 0; i < G.size(); ++i) s += r.out[i] * G[i];
      return s;
    };
    // frugal's gradients.
    auto in = [&](const std::vector<double>& v, int64_t T, int64_t F) {
      Tensor t = st.batch_first ? make_tensor(v, {B, T, F}, kFloat64) : seq_first(v, B, T, F, kFloat64);
      t.requires_grad_();
      return t;
    };
    const Tensor q = in(qv, L, E), k = st.self_attn ? q : in(kv, S, p.kdim), v = st.self_attn ? q : in(vv, S, p.vdim);
    const nn::AttentionOutput r = (*m)(
        q, k, v,
        {.key_padding_mask = st.pad.tensor(kFloat64), .attn_mask = st.attn.tensor(kFloat64), .is_causal = st.causal});
    const Tensor out_bf = st.batch_first ? r.output : r.output.transpose(0, 1);
    sum(mul(out_bf, make_tensor(G, {B, L, E}, kFloat64))).backward();
    auto grad_bf = [&](const Tensor& t) { return values_of(st.batch_first ? t.grad() : t.grad().transpose(0, 1)); };

    const double h = 1e-6;
    auto numeric = [&](std::vector<double>& x, const std::function<double()>& f) {
      std::vector<double> g(x.size());
      for (size_t i = 0; i < x.size(); ++i) {
        const double x0 = x[i];
        x[i] = x0 + h;
        const double fp = f();
        x[i] = x0 - h;
        const double fm = f();
        x[i] = x0;
        g[i] = (fp - fm) / (2 * h);
      }
      return g;
    };
    TorchParams pp = p;
    auto f = [&] { return loss_ref(pp, qv, st.self_attn ? qv : kv, st.self_attn ? qv : vv); };
    const double rt = 1e-6, at = 1e-7;
    check_close(grad_bf(q), numeric(qv, f), rt, at, st.what + ": d query");
    if (!st.self_attn) {
      check_close(grad_bf(k), numeric(kv, f), rt, at, st.what + ": d key");
      check_close(grad_bf(v), numeric(vv, f), rt, at, st.what + ": d value");
    }
    if (p.packed) {
      check_close(m->in_proj_weight.grad(), numeric(pp.in_proj_weight, f), rt, at, st.what + ": d in_proj_weight");
    } else {
      check_close(m->q_proj_weight.grad(), numeric(pp.q_proj_weight, f), rt, at, st.what + ": d q_proj_weight");
      check_close(m->k_proj_weight.grad(), numeric(pp.k_proj_weight, f), rt, at, st.what + ": d k_proj_weight");
      check_close(m->v_proj_weight.grad(), numeric(pp.v_proj_weight, f), rt, at, st.what + ": d v_proj_weight");
    }
    if (p.bias) {
      check_close(m->in_proj_bias.grad(), numeric(pp.in_proj_bias, f), rt, at, st.what + ": d in_proj_bias");
      check_close(m->out_proj->bias.grad(), numeric(pp.out_b, f), rt, at, st.what + ": d out_proj.bias");
    }
    check_close(m->out_proj->weight.grad(), numeric(pp.out_w, f), rt, at, st.what + ": d out_proj.weight");
  }
}

TEST_CASE(
    "probe attention: gradcheck through differentiable float masks (key_padding_mask and 3-D attn_mask) and "
    "through dropout in training with a fixed seed") {
  const int64_t B = 2, L = 3, E = 6, H = 2;
  // Float masks are differentiable (nn/attention.h): padding (B, S) and (B*H, L, S) together, both paths.
  {
    auto m = module_of(torch_params(E, H, 700), kFloat64, /*batch_first=*/false);
    TensorList in = {leaf({L, B, E}, 701), leaf({B, L}, 702, -1, 1), leaf({B * H, L, L}, 703, -1, 1)};
    for (const Tensor& t : parameters_of(*m)) in.push_back(t);
    for (bool need_weights : {false, true})
      check_gradcheck(
          [&](const TensorList& t) {
            const nn::AttentionOutput r =
                (*m)(t[0], t[0], t[0], {.key_padding_mask = t[1], .attn_mask = t[2], .need_weights = need_weights});
            return need_weights ? cat({r.output.flatten(), r.weights.flatten()}) : r.output;
          },
          in);
    // The unbatched forms: (S) padding and (H, L, S) mask.
    TensorList in1 = {leaf({L, E}, 704), leaf({L}, 705, -1, 1), leaf({H, L, L}, 706, -1, 1)};
    check_gradcheck(
        [&](const TensorList& t) {
          return (*m)(t[0], t[0], t[0], {.key_padding_mask = t[1], .attn_mask = t[2], .is_causal = true}).output;
        },
        in1);
  }
  // Dropout in training: the same seed gives the same mask, so the function is smooth.
  {
    auto m = module_of(torch_params(E, H, 710), kFloat64, /*batch_first=*/true, 0.4);
    m->train();
    TensorList in = {leaf({B, L, E}, 711), leaf({B, 4, E}, 712)};
    for (const Tensor& t : parameters_of(*m)) in.push_back(t);
    for (bool need_weights : {false, true})
      check_gradcheck(
          [&](const TensorList& t) {
            manual_seed(99);
            return (*m)(t[0], t[1], t[1], {.need_weights = need_weights}).output;
          },
          in);
  }
}

TEST_CASE(
    "probe attention: one tensor as query, key and value vs three equal copies: same output and parameter "
    "gradients, and the shared input's gradient is the sum of the three") {
  const int64_t B = 2, L = 4, E = 6, H = 3;
  const TorchParams p = torch_params(E, H, 800);
  for (bool bf : {true, false}) {
    auto m = module_of(p, kFloat64, bf);
    const std::vector<double> xv = random_values(B * L * E, 801), G = random_values(B * L * E, 802);
    // The input is a transposed view of a leaf (non-contiguous), as x.transpose(..) in user code.
    auto make_leaf = [&] {
      // batch_first: (B, L, E) view of a (B, E, L) leaf; seq-first: (L, B, E) view of a (B, L, E) leaf.
      Tensor base =
          bf ? make_tensor(xv, {B, L, E}, kFloat64).transpose(1, 2).contiguous() : make_tensor(xv, {B, L, E}, kFloat64);
      base.requires_grad_();
      return base;
    };
    auto view_of = [&](const Tensor& base) { return bf ? base.transpose(1, 2) : base.transpose(0, 1); };
    const Mask pad = bool_mask({B, L}, 803, 0.3);
    const nn::AttentionForwardOptions o{.key_padding_mask = pad.tensor(kFloat64), .is_causal = true};
    const Ref ref = mha_ref(p, B, L, L, xv, xv, xv, pad, {}, true);
    const Tensor Gt = bf ? make_tensor(G, {B, L, E}, kFloat64) : seq_first(G, B, L, E, kFloat64);

    const Tensor x = make_leaf();
    const Tensor xvw = view_of(x);
    const Tensor out_self = (*m)(xvw, xvw, xvw, o).output;
    check_close(bf ? out_self : out_self.transpose(0, 1), ref.out, 1e-12, 1e-12, "self output");
    sum(mul(out_self, Gt)).backward();
    std::map<std::string, std::vector<double>> g_self;
    for (const auto& [name, t] : m->named_parameters()) g_self[name] = values_of(t.grad());

    m->zero_grad();
    const Tensor a = make_leaf(), b = make_leaf(), c = make_leaf();
    const Tensor out3 = (*m)(view_of(a), view_of(b), view_of(c), o).output;
    check_close(out3, values_of(out_self), 1e-13, 1e-13, "three copies output");
    sum(mul(out3, Gt)).backward();
    for (const auto& [name, t] : m->named_parameters()) check_close(t.grad(), g_self[name], 1e-12, 1e-13, "d " + name);
    std::vector<double> g3 = values_of(a.grad());
    const std::vector<double> gb = values_of(b.grad()), gc = values_of(c.grad());
    for (size_t i = 0; i < g3.size(); ++i) g3[i] += gb[i] + gc[i];
    check_close(x.grad(), g3, 1e-12, 1e-13, "shared input gradient = sum of query, key and value gradients");

    // key is value (one tensor), query separate: the same as three copies too.
    m->zero_grad();
    const Tensor q2 = make_leaf(), kv2 = make_leaf();
    const Tensor out2 = (*m)(view_of(q2), view_of(kv2), view_of(kv2), o).output;
    check_close(out2, values_of(out_self), 1e-13, 1e-13, "key is value output");
    sum(mul(out2, Gt)).backward();
    for (const auto& [name, t] : m->named_parameters())
      check_close(t.grad(), g_self[name], 1e-12, 1e-13, "key is value d " + name);
    std::vector<double> g2 = values_of(q2.grad());
    const std::vector<double> gkv = values_of(kv2.grad());
    for (size_t i = 0; i < g2.size(); ++i) g2[i] += gkv[i];
    check_close(x.grad(), g2, 1e-12, 1e-13, "query + (key is value) gradients");
  }
}

TEST_CASE("probe attention: size-0 batch, query length and key length (S = 0 gives out_proj.bias, exactly)") {
  const int64_t E = 4, H = 2;
  const TorchParams p = torch_params(E, H, 900);
  for (DType dt : {kFloat32, kFloat64})
    for (bool bf : {true, false}) {
      auto m = module_of(p, dt, bf);
      auto in = [&](int64_t B, int64_t T) {
        Tensor t = bf ? random_tensor({B, T, E}, dt, 901) : random_tensor({T, B, E}, dt, 901);
        t.requires_grad_();
        return t;
      };
      auto shape = [&](int64_t B, int64_t T) { return bf ? Shape{B, T, E} : Shape{T, B, E}; };
      const std::string tag = std::string(dtype_name(dt)) + (bf ? " batch_first" : " seq-first");
      // S = 0: softmax over no keys; the context is an empty sum, 0, so out = out_proj.bias
      // (torch: bmm over a 0-length dim is zeros).
      {
        const int64_t B = 2, L = 3;
        const Tensor q = in(B, L), kv = in(B, 0);
        for (bool need_weights : {false, true}) {
          m->zero_grad();
          const nn::AttentionOutput r =
              (*m)(q, kv, kv, {.key_padding_mask = zeros({B, 0}, kBool), .need_weights = need_weights});
          REQUIRE(r.output.sizes() == shape(B, L));
          std::vector<double> want;
          for (int64_t i = 0; i < B * L; ++i)
            for (int64_t e = 0; e < E; ++e)
              want.push_back(dt == kFloat32 ? double(float(p.out_b[size_t(e)])) : p.out_b[size_t(e)]);
          check_close(r.output.reshape({B * L, E}), want, 0, 0, tag + " S=0 output");
          if (need_weights) CHECK(r.weights.sizes() == Shape{B, L, 0});
          sum(r.output).backward();
          // torch: zeros for everything but out_proj.bias (an undefined gradient would also do).
          for (const Tensor& g : {q.grad(), m->out_proj->weight.grad(), m->in_proj_weight.grad()})
            if (g.defined())
              for (double x : values_of(g)) CHECK(x == 0.0);
          for (double g : values_of(m->out_proj->bias.grad())) CHECK(g == double(B * L));
        }
      }
      // L = 0 and B = 0: empty outputs of the right shape, and backward runs.
      for (const auto& sizes : std::vector<std::tuple<int64_t, int64_t, int64_t>>{{2, 0, 3}, {0, 3, 3}}) {
        const int64_t B = std::get<0>(sizes), L = std::get<1>(sizes), S = std::get<2>(sizes);
        const Tensor q = in(B, L), kv = in(B, S);
        for (bool need_weights : {false, true}) {
          const nn::AttentionOutput r = (*m)(q, kv, kv, {.need_weights = need_weights, .is_causal = true});
          CHECK_MESSAGE(r.output.sizes() == shape(B, L), tag, " B=", B, " L=", L, ": ", r.output.describe());
          if (need_weights) CHECK(r.weights.sizes() == Shape{B, L, S});
          sum(r.output).backward();
          REQUIRE(kv.grad().defined());
          CHECK(kv.grad().sizes() == kv.sizes());
          for (double g : values_of(kv.grad())) CHECK(g == 0.0);
        }
      }
      // Self-attention with L = 0.
      const Tensor x0 = in(2, 0);
      CHECK((*m)(x0, x0, x0).output.sizes() == shape(2, 0));
    }
}

TEST_CASE(
    "probe attention: CPU autocast (bfloat16) through the module with bool and -inf float masks stays close to "
    "float64") {
  const int64_t B = 2, L = 3, S = 4, E = 8, H = 2;
  const TorchParams p = torch_params(E, H, 1000);
  auto m = module_of(p, kFloat32, /*batch_first=*/true);
  const std::vector<double> qv = random_values(B * L * E, 1001, -1, 1), memv = random_values(B * S * E, 1002, -1, 1);
  const Tensor q = make_tensor(qv, {B, L, E}, kFloat32), mem = make_tensor(memv, {B, S, E}, kFloat32);
  Mask fpad{2, {B, S}, {0.0, -kInf, 0.5, 0.0, -kInf, -kInf, -kInf, -kInf}};  // batch 1 fully padded
  const Mask battn = bool_mask({L, S}, 1003, 0.2);
  for (bool causal : {false, true}) {
    const Ref ref = mha_ref(p, B, L, S, qv, memv, memv, fpad, battn, causal);
    for (bool need_weights : {false, true}) {
      nn::AttentionOutput r;
      {
        AutocastGuard amp(kCPU, kBFloat16);
        r = (*m)(q, mem, mem,
                 {.key_padding_mask = fpad.tensor(kFloat32),
                  .attn_mask = battn.tensor(kFloat32),
                  .need_weights = need_weights,
                  .average_attn_weights = false,
                  .is_causal = causal});
      }
      const std::vector<double> out = values_of(r.output);
      for (double x : out) CHECK(std::isfinite(x));
      check_close(out, ref.out, 5e-2, 5e-2, std::string("autocast output") + (causal ? " causal" : ""));
      if (need_weights) check_close(r.weights, ref.w, 2e-2, 2e-2, "autocast weights");
    }
  }
}

TEST_CASE(
    "probe attention: larger sizes (threaded softmax and GEMM blocking) with view masks, causal, seq-first, "
    "float32 and float64") {
  const int64_t B = 2, L = 70, S = 90, E = 32, H = 4;
  const TorchParams p = torch_params(E, H, 1100);
  const std::vector<double> qv = random_values(B * L * E, 1101, -1, 1), memv = random_values(B * S * E, 1102, -1, 1);
  // Padding: the last 7 keys of batch 1, as an expand of a (B, 1) length test would give;
  // attn_mask: a float (B*H, L, S) tensor stored transposed.
  Mask pad{1, {B, S}, std::vector<double>(size_t(B * S), 0.0)};
  for (int64_t s = S - 7; s < S; ++s) pad.v[size_t(S + s)] = 1.0;
  const Tensor attn_view = random_tensor({B * H, S, L}, kFloat64, 1103, Layout::Contiguous, -1, 1).transpose(1, 2);
  const Mask attn{2, {B * H, L, S}, values_of(attn_view)};
  for (DType dt : {kFloat64, kFloat32}) {
    auto m = module_of(p, dt, /*batch_first=*/false);
    const Tensor q = seq_first(qv, B, L, E, dt), mem = seq_first(memv, B, S, E, dt);
    const double tol = dt == kFloat64 ? 1e-11 : 1e-4;
    for (bool causal : {false, true})
      check_module(*m, q, mem, mem,
                   {.key_padding_mask = pad.tensor(dt), .attn_mask = attn_view.to(dt), .is_causal = causal},
                   mha_ref(p, B, L, S, qv, memv, memv, pad, attn, causal), B, L, S, tol,
                   std::string(dtype_name(dt)) + (causal ? " causal" : ""));
  }
}

TEST_CASE(
    "probe attention: float16 and bfloat16 modules (to(dtype)) with bool and float32 masks stay close to "
    "float64") {
  const int64_t B = 2, L = 3, S = 5, E = 8, H = 2;
  const TorchParams p = torch_params(E, H, 1200);
  const std::vector<double> qv = random_values(B * L * E, 1201, -1, 1), memv = random_values(B * S * E, 1202, -1, 1);
  Mask fpad{2, {B, S}, {0.0, -kInf, 0.3, 0.0, -1.0, -kInf, -kInf, -kInf, -kInf, -kInf}};  // batch 1 fully padded
  const Mask battn = bool_mask({L, S}, 1203, 0.2);
  for (DType dt : {kFloat16, kBFloat16}) {
    auto m = module_of(p, dt, /*batch_first=*/true);
    const double tol = dt == kFloat16 ? 1e-2 : 6e-2;
    const Tensor q = make_tensor(qv, {B, L, E}, dt), mem = make_tensor(memv, {B, S, E}, dt);
    for (bool causal : {false, true}) {
      const Ref ref = mha_ref(p, B, L, S, qv, memv, memv, fpad, battn, causal);
      for (bool need_weights : {false, true}) {
        const nn::AttentionOutput r = (*m)(q, mem, mem,
                                           {.key_padding_mask = fpad.tensor(kFloat32),
                                            .attn_mask = battn.tensor(kFloat32),
                                            .need_weights = need_weights,
                                            .average_attn_weights = false,
                                            .is_causal = causal});
        CHECK(r.output.dtype() == dt);
        const std::string tag =
            std::string(dtype_name(dt)) + (causal ? " causal" : "") + (need_weights ? " weights" : "");
        check_close(r.output, ref.out, tol, tol, tag + " output");
        if (need_weights) check_close(r.weights, ref.w, tol, tol, tag + " weights");
      }
    }
  }
}

TEST_CASE(
    "probe attention: writing the returned per-head weights in place makes backward throw (torch's "
    "version-counter error); the averaged weights are a fresh tensor") {
  // The per-head weights are what the value product saved; torch raises "one of the variables
  // needed for gradient computation has been modified by an inplace operation". A silent
  // backward would use the doubled weights.
  const int64_t B = 2, L = 3, S = 4, E = 6, H = 2;
  const TorchParams p = torch_params(E, H, 1300);
  for (double p_drop : {0.0, 0.3}) {
    auto m = module_of(p, kFloat64, true, p_drop);
    const Tensor q = random_tensor({B, L, E}, kFloat64, 1301), mem = random_tensor({B, S, E}, kFloat64, 1302);
    q.requires_grad_();
    const nn::AttentionOutput r = (*m)(q, mem, mem, {.need_weights = true, .average_attn_weights = false});
    mul_(r.weights, 2.0);
    check_error([&] { sum(r.output).backward(); }, {"modified by an in-place operation"});
    // Unbatched per-head weights are a view (squeeze): the write itself is refused.
    const nn::AttentionOutput u = (*m)(q[0], mem[0], mem[0], {.need_weights = true, .average_attn_weights = false});
    check_error([&] { mul_(u.weights, 2.0); }, {"mul_", "view"});
  }
  // Averaged weights: writing them changes nothing the backward uses.
  auto m = module_of(p, kFloat64, true);
  const Tensor q = random_tensor({B, L, E}, kFloat64, 1303), mem = random_tensor({B, S, E}, kFloat64, 1304);
  q.requires_grad_();
  sum(m->forward(q, mem, mem).output).backward();
  const std::vector<double> g0 = values_of(q.grad());
  q.set_grad(Tensor());
  const nn::AttentionOutput r = m->forward(q, mem, mem, {.need_weights = true});
  mul_(r.weights, 2.0);
  sum(r.output).backward();
  check_close(q.grad(), g0, 0, 0, "gradient after writing the averaged weights");
}

TEST_CASE("probe attention: a float32 float mask on a float64 module is converted and still gets its gradient") {
  // nn/attention.h: float masks are converted to the scores' dtype and are differentiable.
  const int64_t B = 2, L = 3, S = 4, E = 6, H = 2;
  const TorchParams p = torch_params(E, H, 1400);
  auto m = module_of(p, kFloat64, true);
  const std::vector<double> qv = random_values(B * L * E, 1401), memv = random_values(B * S * E, 1402),
                            pv = random_values(B * S, 1403, -1, 1), av = random_values(L * S, 1404, -1, 1);
  const Tensor q = make_tensor(qv, {B, L, E}, kFloat64), mem = make_tensor(memv, {B, S, E}, kFloat64);
  for (bool need_weights : {false, true}) {
    const Tensor pad32 = make_tensor(pv, {B, S}, kFloat32), attn32 = make_tensor(av, {L, S}, kFloat32);
    const Tensor pad64 = make_tensor(values_of(pad32), {B, S}, kFloat64),
                 attn64 = make_tensor(values_of(attn32), {L, S}, kFloat64);
    for (const Tensor& t : {pad32, attn32, pad64, attn64}) t.requires_grad_();
    const Tensor o32 =
        (*m)(q, mem, mem, {.key_padding_mask = pad32, .attn_mask = attn32, .need_weights = need_weights}).output;
    const Tensor o64 =
        (*m)(q, mem, mem, {.key_padding_mask = pad64, .attn_mask = attn64, .need_weights = need_weights}).output;
    CHECK(o32.dtype() == kFloat64);
    check_close(
        o32,
        mha_ref(p, B, L, S, qv, memv, memv, Mask{2, {B, S}, values_of(pad32)}, Mask{2, {L, S}, values_of(attn32)}).out,
        1e-12, 1e-12, "float32 masks on a float64 module");
    const Tensor G = random_tensor({B, L, E}, kFloat64, 1405);
    sum(mul(o32, G)).backward();
    sum(mul(o64, G)).backward();
    REQUIRE(pad32.grad().defined());
    REQUIRE(attn32.grad().defined());
    CHECK(pad32.grad().dtype() == kFloat32);
    CHECK(attn32.grad().dtype() == kFloat32);
    check_close(pad32.grad(), values_of(pad64.grad()), 1e-6, 1e-7, "d key_padding_mask (float32)");
    check_close(attn32.grad(), values_of(attn64.grad()), 1e-6, 1e-7, "d attn_mask (float32)");
  }
}
