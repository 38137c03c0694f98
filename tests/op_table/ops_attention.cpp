// Flash attention forward and backward and dropout (tensor/ops/flash_attention.h,
// dropout.h) against the materialized math; the dropout mask is re-derived from its
// definition in Note [Dropout mask from counters] (philox.h is the spec here, not a kernel).
#include <cmath>
#include <limits>
#include <optional>

#include "tensor/factory.h"
#include "tensor/ops/dropout.h"
#include "tensor/ops/flash_attention.h"
#include "tensor/philox.h"
#include "tests/op_table/entry_util.h"

namespace frugal::optest {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr uint64_t kGeneratorSeed = 0x5EEDull;

/// Whether element i of a dropout over `range` is kept (Note [Dropout mask from counters]).
bool kept(Generator::Range range, int64_t i, double p) {
  const PhiloxResult r = philox4x32(range.seed, range.counter + uint64_t(i / 4));
  return philox_uniform(r.x[i % 4]) < float(1.0 - p);
}

struct AttentionCase {
  int64_t B, H, L, S, E;
  bool causal;
  std::optional<double> scale;
  double dropout_p;
  int mask_kind;  // 0 none, 1 bool, 2 added
  uint64_t counter;
  std::string str() const {
    return cat_str("is_causal=", causal, " scale=", scale ? std::to_string(*scale) : "default",
                   " dropout_p=", dropout_p, " mask=",
                   mask_kind == 0   ? "none"
                   : mask_kind == 1 ? "bool"
                                    : "added");
  }
  double scale_value() const { return scale ? *scale : 1.0 / std::sqrt(double(E)); }
  ops::FlashAttentionOptions options(const Tensor& mask) const { return {mask, causal, scale, dropout_p}; }
};

AttentionCase draw_attention(Rng& rng, DType dt) {
  AttentionCase c;
  c.B = random_size(rng, 2, 0.05, 0.4), c.H = rng.range(1, 3);
  c.L = random_size(rng, 9, 0.05, 0.1), c.S = rng.chance(0.5) ? c.L : random_size(rng, 9, 0.05, 0.1);
  const bool half = dt == kFloat16 || dt == kBFloat16;  // the CUDA kernels take E % 8 == 0
  c.E = half ? rng.pick(std::vector<int64_t>{8, 16, 32}) : random_size(rng, 9, 0.03, 0.1);
  c.causal = rng.chance(0.3);
  if (c.E == 0 || rng.chance(0.3)) c.scale = rng.pick(std::vector<double>{0.5, 1.0, 0.05});
  c.dropout_p = rng.chance(0.2) ? 0.3 : 0.0;
  c.mask_kind = int(rng.range(0, 2));
  c.counter = uint64_t(rng.range(0, 1000));
  return c;
}

/// q, k, v (and the mask) for a case: independent random layouts, or now and then views
/// of one packed (B, T, 3 H E) projection split into heads, as nn/attention.cpp makes them.
std::vector<Tensor> attention_inputs(Rng& rng, const AttentionCase& c, DType dt) {
  std::vector<Tensor> in;
  if (c.L == c.S && rng.chance(0.2)) {
    const int64_t D = c.H * c.E;
    Tensor x = random_input(rng, {c.B, c.L, 3 * D}, dt, {}, {.expand = false, .strided = false});
    for (int64_t i = 0; i < 3; ++i) in.push_back(x.narrow(-1, i * D, D).view({c.B, c.L, c.H, c.E}).transpose(1, 2));
  } else {
    in = {random_input(rng, {c.B, c.H, c.L, c.E}, dt), random_input(rng, {c.B, c.H, c.S, c.E}, dt),
          random_input(rng, {c.B, c.H, c.S, c.E}, dt)};
  }
  const Shape full{c.B, c.H, c.L, c.S};
  in.push_back(c.mask_kind == 0 ? Tensor()
               : c.mask_kind == 1
                   ? random_input(rng, broadcast_operand(rng, full), kBool)
                   : random_input(rng, broadcast_operand(rng, full), dt, Values{.lo = -2, .hi = 2, .p_neg_inf = 0.2}));
  return in;
}

/// The weights P[b, h, l, s] (softmax of the masked scores, 0 in empty rows) and lse[b, h, l].
void attention_weights(const AttentionCase& c, const Host& q, const Host& k, const Host& mask, Host& P, Host& lse) {
  P = host_zeros({c.B, c.H, c.L, c.S});
  lse = host_zeros({c.B, c.H, c.L});
  const double scale = c.scale_value();
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.H; ++h)
      for (int64_t l = 0; l < c.L; ++l) {
        std::vector<double> z(size_t(c.S));
        double m = -kInf;
        for (int64_t s = 0; s < c.S; ++s) {
          double dot = 0;
          for (int64_t e = 0; e < c.E; ++e) dot += q.at({b, h, l, e}) * k.at({b, h, s, e});
          double v = scale * dot;
          if (c.mask_kind == 1 && mask.at_broadcast({b, h, l, s}) == 0) v = -kInf;
          if (c.mask_kind == 2) v += mask.at_broadcast({b, h, l, s});
          if (c.causal && s > l) v = -kInf;
          z[size_t(s)] = v, m = std::max(m, v);
        }
        double se = 0;
        for (double v : z) se += m == -kInf ? 0.0 : std::exp(v - m);
        lse.at({b, h, l}) = m == -kInf ? -kInf : m + std::log(se);
        for (int64_t s = 0; s < c.S; ++s) P.at({b, h, l, s}) = m == -kInf ? 0.0 : std::exp(z[size_t(s)] - m) / se;
      }
}

/// The dropout factor of weight (b, h, l, s): 0 or 1 / (1 - p).
double dropout_factor(const AttentionCase& c, int64_t b, int64_t h, int64_t l, int64_t s) {
  if (c.dropout_p == 0) return 1.0;
  const int64_t i = ((b * c.H + h) * c.L + l) * c.S + s;
  return kept({kGeneratorSeed, c.counter}, i, c.dropout_p) ? 1.0 / (1.0 - c.dropout_p) : 0.0;
}

Host attention_out(const AttentionCase& c, const Host& P, const Host& v) {
  Host out = host_zeros({c.B, c.H, c.L, c.E});
  for_each_index(out.sizes, [&](const std::vector<int64_t>& i) {
    double acc = 0;
    for (int64_t s = 0; s < c.S; ++s)
      acc += P.at({i[0], i[1], i[2], s}) * dropout_factor(c, i[0], i[1], i[2], s) * v.at({i[0], i[1], s, i[3]});
    out.at(i) = acc;
  });
  return out;
}

Expected rounded(Host h, DType dt, Tol tol) {
  for (double& v : h.v) v = round_to(dt, v);
  return {std::move(h), dt, tol};
}

DType lse_dtype(DType dt) { return dt == kFloat64 ? kFloat64 : kFloat32; }

/// The CUDA kernels round the weights (and dS) to the 16-bit input type for the tensor
/// cores, so a 16-bit result may be off by an ulp of that type times the magnitude it
/// sums (|v| <= 2, weights summing to at most 1 / (1 - p)); `terms` scales it for the
/// backward's longer sums.
Tol attention_tol(DType dt, const AttentionCase& c, double terms) {
  Tol t = tol_sum(dt, int64_t(terms) + 4, 8);
  if (dt == kFloat16 || dt == kBFloat16)
    t.atol += (dt == kFloat16 ? 9.8e-4 : 7.8e-3) * 2.0 * terms / (1.0 - c.dropout_p);
  return t;
}

}  // namespace

void add_attention_ops(std::vector<OpEntry>& t) {
  t.push_back({"flash_attention_forward",
               kFloats,
               [](Rng& rng, DType dt) {
                 Sample s;
                 const AttentionCase c = draw_attention(rng, dt);
                 s.inputs = attention_inputs(rng, c, dt);
                 s.params = c.str() + cat_str(" counter=", c.counter);
                 s.run = [c](const std::vector<Tensor>& in) {
                   // The reference draws frugal's mask; cuDNN's own differs (Note [cuDNN attention]).
                   std::optional<ops::AttentionBackendGuard> own_mask;
                   if (c.dropout_p > 0.0) own_mask.emplace(ops::AttentionBackend::Flash);
                   Generator gen(kGeneratorSeed);
                   gen.set_state(kGeneratorSeed, c.counter);
                   const ops::FlashAttentionForward r =
                       ops::flash_attention_forward(in[0], in[1], in[2], c.options(in[3]), &gen);
                   return std::vector<Tensor>{r.out, r.lse};
                 };
                 s.reference = [c, dt](const std::vector<Host>& in) {
                   Host P, lse;
                   attention_weights(c, in[0], in[1], in[3], P, lse);
                   const DType ld = lse_dtype(dt);
                   return std::vector<Expected>{rounded(attention_out(c, P, in[2]), dt, attention_tol(dt, c, 1)),
                                                rounded(lse, ld, tol_sum(ld, c.S + c.E + 4, 8))};
                 };
                 return s;
               },
               true,
               {kFloat16, kBFloat16}});

  t.push_back({"flash_attention_backward",
               kFloats,
               [](Rng& rng, DType dt) {
                 Sample s;
                 const AttentionCase c = draw_attention(rng, dt);
                 s.inputs = attention_inputs(rng, c, dt);  // q, k, v, mask
                 // The forward's out and lse, from the reference, as the backward's inputs.
                 std::vector<Host> h;
                 for (const Tensor& x : s.inputs) h.push_back(read_host(x));
                 Host P, lse;
                 attention_weights(c, h[0], h[1], h[3], P, lse);
                 const Host out = attention_out(c, P, h[2]);
                 s.inputs.push_back(random_input(rng, {c.B, c.H, c.L, c.E}, dt));  // dout
                 s.inputs.push_back(tensor_of(out.v, out.sizes, dt, &rng));
                 s.inputs.push_back(tensor_of(lse.v, lse.sizes, lse_dtype(dt), &rng));
                 s.params = c.str() + cat_str(" counter=", c.counter);
                 s.run = [c](const std::vector<Tensor>& in) {
                   const ops::FlashAttentionGrads g = ops::flash_attention_backward(
                       in[4], in[0], in[1], in[2], in[5], in[6], c.options(in[3]), {kGeneratorSeed, c.counter});
                   return std::vector<Tensor>{g.dq, g.dk, g.dv};
                 };
                 s.reference = [c, dt](const std::vector<Host>& in) {
                   const Host &q = in[0], &k = in[1], &v = in[2], &dout = in[4], &out = in[5], &lse = in[6];
                   Host dq = host_zeros(q.sizes), dk = host_zeros(k.sizes), dv = host_zeros(v.sizes);
                   const double scale = c.scale_value();
                   for (int64_t b = 0; b < c.B; ++b)
                     for (int64_t h = 0; h < c.H; ++h)
                       for (int64_t l = 0; l < c.L; ++l) {
                         double D = 0;
                         for (int64_t e = 0; e < c.E; ++e) D += dout.at({b, h, l, e}) * out.at({b, h, l, e});
                         for (int64_t s2 = 0; s2 < c.S; ++s2) {
                           double dot = 0, dP = 0;
                           for (int64_t e = 0; e < c.E; ++e) {
                             dot += q.at({b, h, l, e}) * k.at({b, h, s2, e});
                             dP += dout.at({b, h, l, e}) * v.at({b, h, s2, e});
                           }
                           double z = scale * dot;
                           if (c.mask_kind == 1 && in[3].at_broadcast({b, h, l, s2}) == 0) z = -kInf;
                           if (c.mask_kind == 2) z += in[3].at_broadcast({b, h, l, s2});
                           if (c.causal && s2 > l) z = -kInf;
                           const double L = lse.at({b, h, l});
                           const double p = z == -kInf || L == -kInf ? 0.0 : std::exp(z - L);
                           const double f = dropout_factor(c, b, h, l, s2);
                           const double dS = p * (dP * f - D);
                           for (int64_t e = 0; e < c.E; ++e) {
                             dv.at({b, h, s2, e}) += p * f * dout.at({b, h, l, e});
                             dq.at({b, h, l, e}) += scale * dS * k.at({b, h, s2, e});
                             dk.at({b, h, s2, e}) += scale * dS * q.at({b, h, l, e});
                           }
                         }
                       }
                   const Tol tol = attention_tol(dt, c, 2.0 * double(c.L + c.S + c.E));
                   return std::vector<Expected>{rounded(dq, dt, tol), rounded(dk, dt, tol), rounded(dv, dt, tol)};
                 };
                 return s;
               },
               true,
               {kFloat16, kBFloat16}});

  for (bool with_range : {false, true}) {
    t.push_back({with_range ? "dropout_with_range" : "dropout", kFloats, [with_range](Rng& rng, DType dt) {
                   Sample s;
                   s.inputs = {random_input(rng, random_shape(rng, {.max_dims = 6, .max_numel = 900}), dt)};
                   const double p = rng.pick(std::vector<double>{0.0, 0.1, 0.5, 0.9, 1.0});
                   const Generator::Range range{rng.next(), uint64_t(rng.range(0, 1 << 20))};
                   s.params = cat_str("p=", p, " seed=", range.seed, " counter=", range.counter);
                   s.run = [with_range, p, range](const std::vector<Tensor>& in) {
                     if (with_range) return std::vector<Tensor>{ops::dropout_with_range(in[0], p, range)};
                     Generator gen(range.seed);
                     gen.set_state(range.seed, range.counter);
                     const ops::DropoutResult r = ops::dropout(in[0], p, &gen);
                     const Tensor drawn = from_vector<int64_t>(
                         {int64_t(r.range.seed), int64_t(r.range.counter), int64_t(gen.offset())}, {3}, {kInt64});
                     return std::vector<Tensor>{r.out, drawn};
                   };
                   s.reference = [with_range, p, range, dt](const std::vector<Host>& in) {
                     const bool draws = p > 0 && p < 1 && in[0].numel() > 0;
                     Host out = in[0];
                     for (int64_t i = 0; i < out.numel(); ++i) {
                       double& v = out.v[size_t(i)];
                       v = p == 0 ? v : p == 1 ? 0.0 : kept(range, i, p) ? v / (1 - p) : 0.0;
                     }
                     std::vector<Expected> e{rounded(out, dt, tol_for(dt))};
                     if (!with_range) {
                       const uint64_t n = draws ? uint64_t(in[0].numel() + 3) / 4 : 0;
                       e.push_back(Expected{Host{true,
                                                 {3},
                                                 {draws ? double(int64_t(range.seed)) : 0.0,
                                                  draws ? double(range.counter) : 0.0, double(range.counter + n)}},
                                            kInt64,
                                            {}});
                     }
                     return e;
                   };
                   return s;
                 }});
  }
}

}  // namespace frugal::optest
