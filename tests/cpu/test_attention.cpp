// nn::MultiheadAttention against a naive float64 implementation written here from the
// module's own parameters (self and cross attention, separate kdim/vdim projections,
// key padding, causal and float masks, returned weights, batch_first=false and unbatched
// inputs, dropout), gradcheck of the whole module in float64 w.r.t. inputs, parameters
// and a float mask, torch's state_dict keys and init, and the error paths.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/ops/attention.h"
#include "autograd/ops/join.h"
#include "nn/attention.h"
#include "tensor/factory.h"
#include "tensor/random.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

const double kInf = std::numeric_limits<double>::infinity();

// ---- the reference ----------------------------------------------------------------

/// The module's parameters as float64 vectors: wq (E, E), wk (E, kdim), wv (E, vdim),
/// biases (E) (zeros without bias), wo (E, E), bo (E).
struct Params {
  std::vector<double> wq, wk, wv, bq, bk, bv, wo, bo;
};

Params params_of(const nn::MultiheadAttention& m) {
  const int64_t E = m.embed_dim;
  auto part = [](const std::vector<double>& all, int64_t i, int64_t n) {
    return std::vector<double>(all.begin() + i * n, all.begin() + (i + 1) * n);
  };
  Params p;
  if (m.in_proj_weight.defined()) {
    const std::vector<double> w = values_of(m.in_proj_weight);
    p.wq = part(w, 0, E * E), p.wk = part(w, 1, E * E), p.wv = part(w, 2, E * E);
  } else {
    p.wq = values_of(m.q_proj_weight), p.wk = values_of(m.k_proj_weight), p.wv = values_of(m.v_proj_weight);
  }
  const std::vector<double> b = m.in_proj_bias.defined() ? values_of(m.in_proj_bias) : std::vector<double>(3 * E);
  p.bq = part(b, 0, E), p.bk = part(b, 1, E), p.bv = part(b, 2, E);
  p.wo = values_of(m.out_proj->weight);
  p.bo = m.out_proj->bias.defined() ? values_of(m.out_proj->bias) : std::vector<double>(E);
  return p;
}

/// A mask as the test describes it: row-major values; bool masks hold 1 where masked
/// (torch's nn.MultiheadAttention convention), float masks the values to add.
struct MaskSpec {
  std::vector<double> values;
  Shape shape;
  bool is_bool = true;
  bool defined() const { return !shape.empty(); }
  Tensor tensor(DType float_dtype) const {
    return make_tensor(values, shape, TensorOptions(is_bool ? kBool : float_dtype));
  }
};

struct Problem {
  int64_t B, L, S, E, H, kdim, vdim;
};

struct RefResult {
  std::vector<double> out;      // (B, L, E)
  std::vector<double> weights;  // (B, H, L, S)
};

/// out = out_proj(concat_h softmax(q_h k_h^T / sqrt(D) + mask) v_h) in float64, from
/// q (B, L, E), k (B, S, kdim), v (B, S, vdim) row-major. A row with no finite score gets
/// zero weights. `forced` (B, H, L, S), when given, replaces the softmax (for dropout).
RefResult reference(const Params& p, const Problem& pr, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const MaskSpec& padding, const MaskSpec& attn, bool causal,
                    const std::vector<double>* forced = nullptr) {
  const int64_t B = pr.B, L = pr.L, S = pr.S, E = pr.E, H = pr.H, KD = pr.kdim, VD = pr.vdim;
  const int64_t D = E / H;
  auto project = [&](const std::vector<double>& x, int64_t T, int64_t in, const std::vector<double>& w,
                     const std::vector<double>& b) {
    std::vector<double> y(size_t(B * T * E));
    for (int64_t r = 0; r < B * T; ++r)
      for (int64_t e = 0; e < E; ++e) {
        double s = b[e];
        for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[e * in + i];
        y[r * E + e] = s;
      }
    return y;
  };
  const std::vector<double> Q = project(q, L, E, p.wq, p.bq), K = project(k, S, KD, p.wk, p.bk),
                            V = project(v, S, VD, p.wv, p.bv);
  RefResult r;
  r.weights.assign(size_t(B * H * L * S), 0.0);
  std::vector<double> ctx(size_t(B * L * E), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < L; ++l) {
        double* w = &r.weights[((b * H + h) * L + l) * S];
        if (forced) {
          for (int64_t s = 0; s < S; ++s) w[s] = (*forced)[((b * H + h) * L + l) * S + s];
        } else {
          std::vector<double> sc(static_cast<size_t>(S));
          double mx = -kInf;
          for (int64_t s = 0; s < S; ++s) {
            double d = 0;
            for (int64_t j = 0; j < D; ++j) d += Q[(b * L + l) * E + h * D + j] * K[(b * S + s) * E + h * D + j];
            d /= std::sqrt(double(D));
            if (padding.defined()) {
              const double m = padding.values[b * S + s];
              d += padding.is_bool ? (m != 0 ? -kInf : 0.0) : m;
            }
            if (attn.defined()) {
              const int64_t i = attn.shape.size() == 2 ? l * S + s : ((b * H + h) * L + l) * S + s;
              const double m = attn.values[i];
              d += attn.is_bool ? (m != 0 ? -kInf : 0.0) : m;
            }
            if (causal && s > l) d = -kInf;
            sc[s] = d;
            mx = std::max(mx, d);
          }
          if (mx == -kInf) continue;  // every key masked: zero weights
          double z = 0;
          for (int64_t s = 0; s < S; ++s) z += (w[s] = std::exp(sc[s] - mx));
          for (int64_t s = 0; s < S; ++s) w[s] /= z;
        }
        for (int64_t j = 0; j < D; ++j) {
          double acc = 0;
          for (int64_t s = 0; s < S; ++s) acc += w[s] * V[(b * S + s) * E + h * D + j];
          ctx[(b * L + l) * E + h * D + j] = acc;
        }
      }
  r.out.assign(size_t(B * L * E), 0.0);
  for (int64_t row = 0; row < B * L; ++row)
    for (int64_t o = 0; o < E; ++o) {
      double s = p.bo[o];
      for (int64_t e = 0; e < E; ++e) s += ctx[row * E + e] * p.wo[o * E + e];
      r.out[row * E + o] = s;
    }
  return r;
}

/// (B, H, L, S) -> (B, L, S): the mean over heads.
std::vector<double> head_mean(const std::vector<double>& w, const Problem& pr) {
  const int64_t per = pr.L * pr.S;
  std::vector<double> m(size_t(pr.B * per), 0.0);
  for (int64_t b = 0; b < pr.B; ++b)
    for (int64_t h = 0; h < pr.H; ++h)
      for (int64_t i = 0; i < per; ++i) m[b * per + i] += w[(b * pr.H + h) * per + i] / double(pr.H);
  return m;
}

// ---- helpers ----------------------------------------------------------------------

/// Random values for every parameter (the biases start at zero, which would hide bias bugs).
void randomize(nn::Module& m, uint64_t seed) {
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : m.state_dict())
    state[name] = random_tensor(t.sizes(), TensorOptions(t.dtype()), seed++, Layout::Contiguous, -0.6, 0.6);
  m.load_state_dict(state);
}

std::shared_ptr<nn::MultiheadAttention> make_mha(int64_t E, int64_t H, DType dt, nn::MultiheadAttentionOptions o = {},
                                                 uint64_t seed = 1) {
  manual_seed(seed);
  auto m = std::make_shared<nn::MultiheadAttention>(E, H, o);
  randomize(*m, seed * 100);
  m->to(dt);
  return m;
}

double rtol_for(DType dt) { return dt == kFloat64 ? 1e-10 : 1e-4; }
double atol_for(DType dt) { return dt == kFloat64 ? 1e-12 : 2e-5; }

MaskSpec bool_mask(const Shape& shape, uint64_t seed, double p_masked = 0.3) {
  MaskSpec m{random_values(numel_of(shape), seed, 0.0, 1.0), shape, true};
  for (double& x : m.values) x = x < p_masked ? 1.0 : 0.0;
  return m;
}
MaskSpec float_mask(const Shape& shape, uint64_t seed) {
  return MaskSpec{random_values(numel_of(shape), seed, -1.5, 1.5), shape, false};
}

/// Runs the module on (q, k, v) with the given masks and checks output and weights (both
/// need_weights settings, averaged and per head) against the reference.
void check_against_reference(nn::MultiheadAttention& m, const Problem& pr, const Tensor& q, const Tensor& k,
                             const Tensor& v, const MaskSpec& padding, const MaskSpec& attn, bool causal,
                             const std::string& what) {
  const DType dt = q.dtype();
  const RefResult ref = reference(params_of(m), pr, values_of(q), values_of(k), values_of(v), padding, attn, causal);
  nn::AttentionForwardOptions o;
  if (padding.defined()) o.key_padding_mask = padding.tensor(dt);
  if (attn.defined()) o.attn_mask = attn.tensor(dt);
  o.is_causal = causal;
  const double rt = rtol_for(dt), at = atol_for(dt);
  {
    const nn::AttentionOutput r = m(q, k, v, o);
    CHECK(r.output.sizes() == Shape{pr.B, pr.L, pr.E});
    CHECK(r.output.dtype() == dt);
    CHECK_FALSE(r.weights.defined());
    check_close(r.output, ref.out, rt, at, what + " output (no weights)");
  }
  o.need_weights = true;
  for (bool average : {true, false}) {
    o.average_attn_weights = average;
    const nn::AttentionOutput r = m(q, k, v, o);
    check_close(r.output, ref.out, rt, at, what + " output (weights)");
    REQUIRE(r.weights.defined());
    if (average) {
      CHECK(r.weights.sizes() == Shape{pr.B, pr.L, pr.S});
      check_close(r.weights, head_mean(ref.weights, pr), rt, at, what + " averaged weights");
    } else {
      CHECK(r.weights.sizes() == Shape{pr.B, pr.H, pr.L, pr.S});
      check_close(r.weights, ref.weights, rt, at, what + " weights per head");
    }
  }
}

}  // namespace

// ================================= forward values ==================================

TEST_CASE("attention: self-attention (fused projection) matches the float64 reference") {
  for (DType dt : {kFloat32, kFloat64}) {
    const Problem pr{2, 5, 5, 8, 2, 8, 8};
    auto m = make_mha(pr.E, pr.H, dt);
    for (Layout layout : {Layout::Contiguous, Layout::Transposed}) {
      const Tensor x = random_tensor({pr.B, pr.L, pr.E}, TensorOptions(dt), 11, layout);
      check_against_reference(*m, pr, x, x, x, {}, {}, false,
                              std::string("self ") + dtype_name(dt) + " " + layout_name(layout));
    }
    // Four heads of two, and one head of eight.
    for (int64_t H : {4, 1}) {
      const Problem p2{3, 4, 4, 8, H, 8, 8};
      auto m2 = make_mha(8, H, dt, {}, 2 + uint64_t(H));
      const Tensor x = random_tensor({3, 4, 8}, TensorOptions(dt), 12);
      check_against_reference(*m2, p2, x, x, x, {}, {}, false, "self H=" + std::to_string(H));
    }
  }
}

TEST_CASE("attention: cross-attention (key is value, separate tensors, kdim/vdim) matches the reference") {
  const Problem pr{2, 3, 4, 8, 2, 8, 8};
  for (DType dt : {kFloat32, kFloat64}) {
    auto m = make_mha(pr.E, pr.H, dt);
    const Tensor q = random_tensor({pr.B, pr.L, pr.E}, TensorOptions(dt), 21);
    const Tensor mem = random_tensor({pr.B, pr.S, pr.E}, TensorOptions(dt), 22, Layout::Transposed);
    check_against_reference(*m, pr, q, mem, mem, {}, {}, false, "key is value");
    const Tensor k = random_tensor({pr.B, pr.S, pr.E}, TensorOptions(dt), 23);
    const Tensor v = random_tensor({pr.B, pr.S, pr.E}, TensorOptions(dt), 24, Layout::Strided);
    check_against_reference(*m, pr, q, k, v, {}, {}, false, "separate key and value");
    // Same values as q but a different handle: the three-product path must agree.
    check_against_reference(*m, {2, 3, 3, 8, 2, 8, 8}, q, q.clone(), q.clone(), {}, {}, false, "copies of query");

    const Problem pk{2, 3, 4, 8, 2, 6, 5};
    auto mk = make_mha(8, 2, dt, {.kdim = 6, .vdim = 5}, 7);
    CHECK_FALSE(mk->in_proj_weight.defined());
    const Tensor k6 = random_tensor({pk.B, pk.S, 6}, TensorOptions(dt), 25);
    const Tensor v5 = random_tensor({pk.B, pk.S, 5}, TensorOptions(dt), 26);
    check_against_reference(*mk, pk, q, k6, v5, {}, {}, false, "kdim=6 vdim=5");
    auto mv = make_mha(8, 2, dt, {.vdim = 3}, 8);  // kdim == E but vdim differs: still separate
    CHECK(mv->k_proj_weight.sizes() == Shape{8, 8});
    check_against_reference(*mv, {2, 3, 4, 8, 2, 8, 3}, q, mem, random_tensor({2, 4, 3}, TensorOptions(dt), 27), {}, {},
                            false, "vdim=3");
  }
}

TEST_CASE("attention: key_padding_mask (bool and float) matches the reference; fully padded rows give zeros") {
  const Problem pr{3, 4, 5, 8, 2, 8, 8};
  for (DType dt : {kFloat32, kFloat64}) {
    auto m = make_mha(pr.E, pr.H, dt);
    const Tensor x = random_tensor({pr.B, pr.L, pr.E}, TensorOptions(dt), 31);
    const Tensor mem = random_tensor({pr.B, pr.S, pr.E}, TensorOptions(dt), 32);
    MaskSpec pad = bool_mask({pr.B, pr.S}, 33);
    for (int64_t s = 0; s < pr.S; ++s) pad.values[1 * pr.S + s] = 1.0;  // batch 1: every key ignored
    pad.values[0] = 0.0;                                                // batch 0: key 0 kept
    check_against_reference(*m, pr, x, mem, mem, pad, {}, false, "bool padding");
    check_against_reference(*m, {3, 4, 4, 8, 2, 8, 8}, x, x, x, bool_mask({3, 4}, 34), {}, false, "self, padding");
    check_against_reference(*m, pr, x, mem, mem, float_mask({pr.B, pr.S}, 35), {}, false, "float padding");

    // Batch 1 attends to nothing: its weights are zero and its output is out_proj.bias.
    nn::AttentionForwardOptions o{.key_padding_mask = pad.tensor(dt), .need_weights = true};
    const nn::AttentionOutput r = m->forward(x, mem, mem, o);
    const std::vector<double> w = values_of(r.weights.select(0, 1)), out = values_of(r.output.select(0, 1));
    const std::vector<double> bias = values_of(m->out_proj->bias);
    for (double wi : w) CHECK(wi == 0.0);
    for (int64_t l = 0; l < pr.L; ++l)
      for (int64_t e = 0; e < pr.E; ++e) CHECK(out[l * pr.E + e] == doctest::Approx(bias[e]).epsilon(1e-6));
  }
}

TEST_CASE("attention: attn_mask (L, S) and (B*H, L, S), bool (true = not allowed) and float, with padding") {
  const Problem pr{2, 3, 4, 8, 2, 8, 8};
  for (DType dt : {kFloat32, kFloat64}) {
    auto m = make_mha(pr.E, pr.H, dt);
    const Tensor q = random_tensor({pr.B, pr.L, pr.E}, TensorOptions(dt), 41);
    const Tensor mem = random_tensor({pr.B, pr.S, pr.E}, TensorOptions(dt), 42);
    const Shape s2{pr.L, pr.S}, s3{pr.B * pr.H, pr.L, pr.S};
    check_against_reference(*m, pr, q, mem, mem, {}, bool_mask(s2, 43), false, "bool (L, S)");
    check_against_reference(*m, pr, q, mem, mem, {}, bool_mask(s3, 44), false, "bool (B*H, L, S)");
    check_against_reference(*m, pr, q, mem, mem, {}, float_mask(s2, 45), false, "float (L, S)");
    check_against_reference(*m, pr, q, mem, mem, {}, float_mask(s3, 46), false, "float (B*H, L, S)");
    const MaskSpec pad = bool_mask({pr.B, pr.S}, 47, 0.25);
    check_against_reference(*m, pr, q, mem, mem, pad, bool_mask(s2, 48), false, "bool padding + bool (L, S)");
    check_against_reference(*m, pr, q, mem, mem, pad, bool_mask(s3, 49), false, "bool padding + bool (B*H, L, S)");
    check_against_reference(*m, pr, q, mem, mem, pad, float_mask(s3, 50), false, "bool padding + float mask");
    check_against_reference(*m, pr, q, mem, mem, float_mask({pr.B, pr.S}, 51), bool_mask(s2, 52), false,
                            "float padding + bool mask");
  }
  // A float mask in another floating dtype is converted to the query's.
  auto m = make_mha(8, 2, kFloat64);
  const Tensor q = random_tensor({2, 3, 8}, TensorOptions(kFloat64), 53);
  const MaskSpec fm = float_mask({3, 3}, 54);
  const RefResult ref =
      reference(params_of(*m), {2, 3, 3, 8, 2, 8, 8}, values_of(q), values_of(q), values_of(q), {}, fm, false);
  check_close(m->forward(q, q, q, {.attn_mask = fm.tensor(kFloat32)}).output, ref.out, 1e-6, 1e-7, "f32 mask, f64 q");
}

TEST_CASE("attention: is_causal alone, with padding, with attn_mask, and with L != S") {
  for (DType dt : {kFloat32, kFloat64}) {
    const Problem pr{2, 5, 5, 8, 2, 8, 8};
    auto m = make_mha(pr.E, pr.H, dt);
    const Tensor x = random_tensor({pr.B, pr.L, pr.E}, TensorOptions(dt), 61);
    check_against_reference(*m, pr, x, x, x, {}, {}, true, "causal");
    check_against_reference(*m, pr, x, x, x, bool_mask({pr.B, pr.S}, 62), {}, true, "causal + padding");
    check_against_reference(*m, pr, x, x, x, {}, float_mask({pr.L, pr.S}, 63), true, "causal + float mask");
    check_against_reference(*m, pr, x, x, x, bool_mask({pr.B, pr.S}, 64), bool_mask({pr.B * pr.H, pr.L, pr.S}, 65),
                            true, "causal + padding + bool mask");
    const Problem cross{2, 3, 6, 8, 2, 8, 8};
    const Tensor mem = random_tensor({2, 6, 8}, TensorOptions(dt), 66);
    check_against_reference(*m, cross, x.narrow(1, 0, 3), mem, mem, {}, {}, true, "causal L=3 S=6");
  }
}

TEST_CASE("attention: batch_first=false and unbatched inputs agree with the batch-first module") {
  const Problem pr{2, 3, 4, 8, 2, 8, 8};
  auto ref_m = make_mha(8, 2, kFloat64);
  auto seq_m = make_mha(8, 2, kFloat64, {.batch_first = false});
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : ref_m->state_dict()) state[name] = t;
  seq_m->load_state_dict(state);

  const Tensor q = random_tensor({pr.B, pr.L, pr.E}, TensorOptions(kFloat64), 71);
  const Tensor mem = random_tensor({pr.B, pr.S, pr.E}, TensorOptions(kFloat64), 72);
  const MaskSpec pad = bool_mask({pr.B, pr.S}, 73, 0.25), am = float_mask({pr.B * pr.H, pr.L, pr.S}, 74);
  const RefResult ref = reference(params_of(*ref_m), pr, values_of(q), values_of(mem), values_of(mem), pad, am, false);
  nn::AttentionForwardOptions o{.key_padding_mask = pad.tensor(kFloat64),
                                .attn_mask = am.tensor(kFloat64),
                                .need_weights = true,
                                .average_attn_weights = false};

  // (L, B, E) in, (L, B, E) out; weights stay (B, H, L, S) as torch.
  const nn::AttentionOutput r = seq_m->forward(q.transpose(0, 1), mem.transpose(0, 1), mem.transpose(0, 1), o);
  CHECK(r.output.sizes() == Shape{pr.L, pr.B, pr.E});
  check_close(r.output.transpose(0, 1), ref.out, 1e-10, 1e-12, "batch_first=false output");
  check_close(r.weights, ref.weights, 1e-10, 1e-12, "batch_first=false weights");
  // Self-attention in sequence-first layout, identity of the handle preserved.
  const Tensor xs = q.transpose(0, 1).contiguous();
  const RefResult rs =
      reference(params_of(*ref_m), {2, 3, 3, 8, 2, 8, 8}, values_of(q), values_of(q), values_of(q), {}, {}, true);
  check_close(seq_m->forward(xs, xs, xs, {.is_causal = true}).output.transpose(0, 1), rs.out, 1e-10, 1e-12,
              "batch_first=false self causal");

  // Unbatched: batch element 1 alone, (L, E) / (S, E), masks (S) and (H, L, S).
  const int64_t b = 1, L = pr.L, S = pr.S, H = pr.H;
  MaskSpec pad1{std::vector<double>(pad.values.begin() + b * S, pad.values.begin() + (b + 1) * S), {S}, true};
  MaskSpec am1{std::vector<double>(am.values.begin() + b * H * L * S, am.values.begin() + (b + 1) * H * L * S),
               {H, L, S},
               false};
  for (bool average : {true, false}) {
    const nn::AttentionOutput u = ref_m->forward(q.select(0, b), mem.select(0, b), mem.select(0, b),
                                                 {.key_padding_mask = pad1.tensor(kFloat64),
                                                  .attn_mask = am1.tensor(kFloat64),
                                                  .need_weights = true,
                                                  .average_attn_weights = average});
    CHECK(u.output.sizes() == Shape{L, pr.E});
    check_close(u.output, std::vector<double>(ref.out.begin() + b * L * pr.E, ref.out.begin() + (b + 1) * L * pr.E),
                1e-10, 1e-12, "unbatched output");
    const std::vector<double> w1(ref.weights.begin() + b * H * L * S, ref.weights.begin() + (b + 1) * H * L * S);
    if (average) {
      CHECK(u.weights.sizes() == Shape{L, S});
      check_close(u.weights, head_mean(w1, {1, L, S, pr.E, H, 8, 8}), 1e-10, 1e-12, "unbatched averaged weights");
    } else {
      CHECK(u.weights.sizes() == Shape{H, L, S});
      check_close(u.weights, w1, 1e-10, 1e-12, "unbatched weights");
    }
  }
}

TEST_CASE("attention: dropout on the weights in training only, returned after dropout as torch") {
  const Problem pr{2, 4, 4, 8, 2, 8, 8};
  const double p = 0.5;
  auto m = make_mha(pr.E, pr.H, kFloat64, {.dropout = p});
  const Tensor x = random_tensor({pr.B, pr.L, pr.E}, TensorOptions(kFloat64), 81);
  const Params prm = params_of(*m);
  const RefResult ref = reference(prm, pr, values_of(x), values_of(x), values_of(x), {}, {}, false);

  m->eval();  // no dropout: exactly the reference
  check_close(m->forward(x, x, x).output, ref.out, 1e-10, 1e-12, "eval output");
  check_close(m->forward(x, x, x, {.need_weights = true, .average_attn_weights = false}).weights, ref.weights, 1e-10,
              1e-12, "eval weights");

  m->train();
  manual_seed(5);
  const nn::AttentionOutput r = m->forward(x, x, x, {.need_weights = true, .average_attn_weights = false});
  const std::vector<double> w = values_of(r.weights);
  int64_t dropped = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (w[i] == 0.0) ++dropped;
    else CHECK(w[i] == doctest::Approx(ref.weights[i] / (1 - p)).epsilon(1e-10));
  }
  CHECK(dropped > int64_t(w.size()) / 5);
  CHECK(dropped < int64_t(w.size()) * 4 / 5);
  // The output is the product with exactly those (dropped, rescaled) weights.
  const RefResult forced = reference(prm, pr, values_of(x), values_of(x), values_of(x), {}, {}, false, &w);
  check_close(r.output, forced.out, 1e-10, 1e-12, "output from the dropped weights");
  // Without weights (the scaled_dot_product_attention path) dropout also applies.
  const std::vector<double> out = values_of(m->forward(x, x, x).output);
  double diff = 0;
  for (size_t i = 0; i < out.size(); ++i) diff = std::max(diff, std::fabs(out[i] - ref.out[i]));
  CHECK(diff > 1e-3);
  // p = 1 drops everything: the output is out_proj.bias.
  auto all = make_mha(pr.E, pr.H, kFloat64, {.dropout = 1.0});
  const std::vector<double> o1 = values_of(all->forward(x, x, x).output), bias = values_of(all->out_proj->bias);
  for (size_t i = 0; i < o1.size(); ++i) CHECK(o1[i] == doctest::Approx(bias[i % pr.E]).epsilon(1e-12));
}

// ===================================== gradients ======================================

TEST_CASE("attention: gradcheck of the whole module in float64 (inputs and parameters)") {
  const int64_t B = 2, L = 3, S = 4, E = 8, H = 2;
  auto params = [](nn::MultiheadAttention& m) {
    TensorList ps;
    for (const auto& [name, t] : m.named_parameters()) ps.push_back(t);
    return ps;
  };
  auto cat_with_weights = [](const nn::AttentionOutput& r) {
    return r.weights.defined() ? cat({r.output.flatten(), r.weights.flatten()}) : r.output;
  };
  // Self-attention (fused path) with padding and returned per-head weights.
  {
    auto m = make_mha(E, H, kFloat64, {}, 3);
    TensorList in = {leaf({B, L, E}, 91)};
    for (const Tensor& t : params(*m)) in.push_back(t);
    const Tensor pad = make_tensor({0, 0, 1, 0, 1, 0}, {B, L}, TensorOptions(kBool));
    check_gradcheck([&](const TensorList& t) { return m->forward(t[0], t[0], t[0], {.key_padding_mask = pad}).output; },
                    in);
    check_gradcheck(
        [&](const TensorList& t) {
          return cat_with_weights(m->forward(
              t[0], t[0], t[0], {.key_padding_mask = pad, .need_weights = true, .average_attn_weights = false}));
        },
        in);
    check_gradcheck([&](const TensorList& t) { return m->forward(t[0], t[0], t[0], {.is_causal = true}).output; }, in);
  }
  // Cross-attention, key is value, float attn_mask (differentiable too), averaged weights.
  {
    auto m = make_mha(E, H, kFloat64, {}, 4);
    TensorList in = {leaf({B, L, E}, 92), leaf({B, S, E}, 93), leaf({L, S}, 94)};
    for (const Tensor& t : params(*m)) in.push_back(t);
    check_gradcheck(
        [&](const TensorList& t) {
          return cat_with_weights(m->forward(t[0], t[1], t[1], {.attn_mask = t[2], .need_weights = true}));
        },
        in);
    check_gradcheck([&](const TensorList& t) { return m->forward(t[0], t[1], t[1], {.attn_mask = t[2]}).output; }, in);
  }
  // Separate key and value, non-contiguous query view, causal with padding (explicit path).
  {
    auto m = make_mha(E, H, kFloat64, {}, 5);
    TensorList in = {leaf({B, E, L}, 95), leaf({B, S, E}, 96), leaf({B, S, E}, 97)};
    for (const Tensor& t : params(*m)) in.push_back(t);
    const Tensor pad = make_tensor({0, 0, 0, 1, 0, 1, 0, 0}, {B, S}, TensorOptions(kBool));
    check_gradcheck(
        [&](const TensorList& t) {
          return m->forward(t[0].transpose(1, 2), t[1], t[2], {.key_padding_mask = pad, .is_causal = true}).output;
        },
        in);
  }
  // kdim/vdim projections, sequence-first layout, no bias.
  {
    auto m = make_mha(E, H, kFloat64, {.bias = false, .batch_first = false, .kdim = 5, .vdim = 3}, 6);
    TensorList in = {leaf({L, B, E}, 98), leaf({S, B, 5}, 99), leaf({S, B, 3}, 100)};
    for (const Tensor& t : params(*m)) in.push_back(t);
    CHECK(in.size() == 3 + 4);
    check_gradcheck([&](const TensorList& t) { return m->forward(t[0], t[1], t[2]).output; }, in);
  }
}

// ============================ parameters and checkpoints ============================

TEST_CASE("attention: state_dict keys, shapes and init are torch's") {
  auto keys = [](const nn::Module& m) {
    std::vector<std::string> k;
    for (const auto& [name, t] : m.state_dict()) k.push_back(name);
    return k;
  };
  manual_seed(0);
  nn::MultiheadAttention m(64, 8);
  CHECK(keys(m) == std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"});
  CHECK(m.in_proj_weight.sizes() == Shape{192, 64});
  CHECK(m.in_proj_bias.sizes() == Shape{192});
  CHECK(m.out_proj->weight.sizes() == Shape{64, 64});
  CHECK(m.head_dim == 8);
  // xavier_uniform_: bound sqrt(6 / (fan_in + fan_out)) = sqrt(6 / (64 + 192)).
  const double bound = std::sqrt(6.0 / (64 + 192));
  double mx = 0;
  for (double w : values_of(m.in_proj_weight)) mx = std::max(mx, std::fabs(w));
  CHECK(mx <= bound);
  CHECK(mx > 0.99 * bound);
  for (double b : values_of(m.in_proj_bias)) CHECK(b == 0.0);
  for (double b : values_of(m.out_proj->bias)) CHECK(b == 0.0);
  mx = 0;
  for (double w : values_of(m.out_proj->weight)) mx = std::max(mx, std::fabs(w));
  CHECK(mx <= 1.0 / std::sqrt(64.0));  // nn.Linear's kaiming_uniform(a=sqrt(5)), not re-initialised
  for (const Tensor& p : m.parameters()) CHECK(p.requires_grad());

  nn::MultiheadAttention sep(16, 4, {.kdim = 6, .vdim = 10});
  CHECK(keys(sep) == std::vector<std::string>{"q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias",
                                              "out_proj.weight", "out_proj.bias"});
  CHECK(sep.k_proj_weight.sizes() == Shape{16, 6});
  CHECK(sep.v_proj_weight.sizes() == Shape{16, 10});
  const double qbound = std::sqrt(6.0 / 32), kbound = std::sqrt(6.0 / 22);
  for (double w : values_of(sep.q_proj_weight)) CHECK(std::fabs(w) <= qbound);
  for (double w : values_of(sep.k_proj_weight)) CHECK(std::fabs(w) <= kbound);

  nn::MultiheadAttention nobias(16, 4, {.bias = false});
  CHECK(keys(nobias) == std::vector<std::string>{"in_proj_weight", "out_proj.weight"});
  const std::string r = nobias.repr();
  CHECK(r.find("MultiheadAttention(") != std::string::npos);
  CHECK(r.find("embed_dim=16, num_heads=4") != std::string::npos);
  CHECK(r.find("(out_proj): Linear(in_features=16, out_features=16, bias=false)") != std::string::npos);

  // A torch-style checkpoint (keys by name) loads and is used.
  std::map<std::string, Tensor> ckpt;
  for (const auto& [name, t] : m.state_dict()) ckpt[name] = random_tensor(t.sizes(), TensorOptions(kFloat32), 7);
  nn::MultiheadAttention n(64, 8);
  n.load_state_dict(ckpt);
  check_close(n.in_proj_weight, values_of(ckpt.at("in_proj_weight")), 0, 0, "loaded in_proj_weight");
  check_close(n.out_proj->bias, values_of(ckpt.at("out_proj.bias")), 0, 0, "loaded out_proj.bias");
}

// ===================================== errors ========================================

TEST_CASE("attention: error paths name the numbers and shapes") {
  check_error([] { nn::MultiheadAttention(10, 3); }, {"MultiheadAttention", "embed_dim (10)", "num_heads (3)"});
  check_error([] { nn::MultiheadAttention(8, 0); }, {"MultiheadAttention", "num_heads=0"});
  check_error([] { nn::MultiheadAttention(8, 2, {.dropout = 1.5}); }, {"MultiheadAttention", "dropout", "1.5"});
  check_error([] { nn::MultiheadAttention(8, 2, {.kdim = 0}); }, {"MultiheadAttention", "kdim=0"});

  nn::MultiheadAttention m(8, 2);
  const Tensor q = zeros({2, 3, 8}), kv = zeros({2, 4, 8});
  check_error(
      [&] {
        m(q, kv, kv, {.attn_mask = zeros({3, 3}, kBool)});
      },
      {"MultiheadAttention", "attn_mask", "(L, S) = [3, 4]", "(B*H, L, S) = [4, 3, 4]", "bool[3, 3]"});
  check_error([&] { m(q, kv, kv, {.attn_mask = zeros({2, 3, 4})}); }, {"attn_mask", "[4, 3, 4]", "float32[2, 3, 4]"});
  check_error(
      [&] {
        m(q, kv, kv, {.key_padding_mask = zeros({2, 3}, kBool)});
      },
      {"MultiheadAttention", "key_padding_mask", "(B, S) = [2, 4]", "bool[2, 3]"});
  check_error(
      [&] {
        m(q[0], kv[0], kv[0], {.key_padding_mask = zeros({2, 4}, kBool)});
      },
      {"key_padding_mask", "(S) = [4]", "bool[2, 4]"});
  check_error(
      [&] {
        m(q, kv, kv, {.attn_mask = zeros({3, 4}, kInt64)});
      },
      {"MultiheadAttention", "attn_mask", "bool or floating", "int64[3, 4]"});
  check_error([&] { m(zeros({2, 3, 6}), kv, kv); }, {"MultiheadAttention", "(..., 8)", "float32[2, 3, 6]"});
  check_error([&] { m(q, kv, zeros({2, 5, 8})); }, {"MultiheadAttention", "float32[2, 4, 8]", "float32[2, 5, 8]"});
  check_error([&] { m(q, zeros({3, 4, 8}), zeros({3, 4, 8})); }, {"batch size", "float32[3, 4, 8]"});
  check_error([&] { m(q, kv[0], kv[0]); }, {"3-D (batched) or all 2-D", "float32[4, 8]"});
  check_error([&] { m(zeros({8}), zeros({8}), zeros({8})); }, {"MultiheadAttention", "float32[8]"});
  check_error([&] { m(q, kv, zeros({2, 4, 8}, kFloat64)); }, {"share a dtype", "float64[2, 4, 8]"});
  check_error([&] { m(q, kv, kv, {.key_padding_mask = zeros({2, 4}, kInt32)}); }, {"key_padding_mask", "int32"});
}

// ========================== scaled_dot_product_attention ==========================

TEST_CASE("nn_functional: scaled_dot_product_attention matches loops and passes gradcheck") {
  const int64_t B = 2, H = 2, L = 3, S = 4, E = 5, Ev = 3;
  const Tensor q = random_tensor({B, H, L, E}, kFloat64, 800), k = random_tensor({B, H, S, E}, kFloat64, 801),
               v = random_tensor({B, H, S, Ev}, kFloat64, 802);
  const std::vector<double> qv = values_of(q), kv = values_of(k), vv = values_of(v);
  const Tensor pad = from_vector<double>({1, 1, 1, 0, 1, 0, 1, 1}, {B, 1, 1, S}).to(kBool);
  const std::vector<double> padv = values_of(pad);
  for (int mode = 0; mode < 3; ++mode) {  // plain, bool padding mask, causal
    CAPTURE(mode);
    const double scale = mode == 1 ? 1.0 / std::sqrt(double(E)) : 0.25;
    std::vector<double> want(size_t(B * H * L * Ev), 0.0);
    for (int64_t bh = 0; bh < B * H; ++bh)
      for (int64_t l = 0; l < L; ++l) {
        std::vector<double> z(static_cast<size_t>(S));
        double m = -kInf, sum = 0;
        for (int64_t s = 0; s < S; ++s) {
          double d = 0;
          for (int64_t e = 0; e < E; ++e) d += qv[size_t((bh * L + l) * E + e)] * kv[size_t((bh * S + s) * E + e)];
          const bool keep = mode == 1 ? padv[size_t(bh / H * S + s)] != 0 : mode == 2 ? s <= l : true;
          z[size_t(s)] = keep ? d * scale : -kInf;
          m = std::max(m, z[size_t(s)]);
        }
        for (int64_t s = 0; s < S; ++s) sum += std::exp(z[size_t(s)] - m);
        for (int64_t s = 0; s < S; ++s)
          for (int64_t j = 0; j < Ev; ++j)
            want[size_t((bh * L + l) * Ev + j)] += std::exp(z[size_t(s)] - m) / sum * vv[size_t((bh * S + s) * Ev + j)];
      }
    const Tensor mask = mode == 1 ? pad : Tensor();
    const std::optional<double> sc = mode == 1 ? std::optional<double>() : std::optional<double>(scale);
    const Tensor out = scaled_dot_product_attention(q, k, v, mask, mode == 2, 0.0, sc);
    CHECK(out.sizes() == Shape{B, H, L, Ev});
    check_close(out, want, 1e-12, 1e-12, "sdpa");
    check_gradcheck(
        [&](const TensorList& in) {
          return scaled_dot_product_attention(in[0], in[1], in[2], mask, mode == 2, 0.0, sc);
        },
        {leaf({B, H, L, E}, 810), leaf({B, H, S, E}, 811), leaf({B, H, S, Ev}, 812)});
  }
  // A float mask that requires grad, broadcast batch dims (k, v shared across heads), and dropout
  // with a fixed generator state.
  Generator gen(5);
  check_gradcheck(
      [&](const TensorList& in) {
        gen.set_state(5, 0);
        return scaled_dot_product_attention(in[0], in[1], in[2], in[3], false, 0.3, {}, &gen);
      },
      {leaf({B, H, L, E}, 820), leaf({B, 1, S, E}, 821), leaf({B, 1, S, Ev}, 822), leaf({L, S}, 823)});
  // 2-D (unbatched) inputs.
  check_gradcheck([](const TensorList& in) { return scaled_dot_product_attention(in[0], in[1], in[2]); },
                  {leaf({L, E}, 830), leaf({S, E}, 831), leaf({S, Ev}, 832)});
}

TEST_CASE("nn_functional: scaled_dot_product_attention errors") {
  const Tensor q = zeros({2, 3, 4}), k = zeros({2, 5, 4}), v = zeros({2, 5, 6});
  check_error(
      [&] {
        scaled_dot_product_attention(q, zeros({2, 5, 3}), v);
      },
      {"scaled_dot_product_attention", "float32[2, 3, 4] cpu", "float32[2, 5, 3] cpu", "embedding"});
  check_error(
      [&] {
        scaled_dot_product_attention(q, k, zeros({2, 4, 6}));
      },
      {"scaled_dot_product_attention", "sequence length"});
  check_error(
      [&] {
        scaled_dot_product_attention(q, k, v, zeros({3, 5}, kBool), true);
      },
      {"scaled_dot_product_attention", "is_causal"});
  check_error(
      [&] {
        scaled_dot_product_attention(q, k, v, zeros({4, 5}, kBool));
      },
      {"masked_softmax", "bool[4, 5] cpu", "float32[2, 3, 5] cpu"});
  check_error([&] { scaled_dot_product_attention(q, k, v.to(kFloat64)); }, {"scaled_dot_product_attention", "dtype"});
  check_error([&] { scaled_dot_product_attention(zeros({4}), k, v); }, {"scaled_dot_product_attention", "2-D"});
}
