// Probes for silent wrong answers in the models (BERT, ViT, ResNet) on the inputs users pass:
// attention masks of every dtype with rows that are all padding, sequence lengths 1 and
// max_position_embeddings (and one over), ids out of range, padding that must not change the
// real tokens, dropout in train() and none in eval(), images of the wrong size, channels-last
// and sliced images, small and odd image sizes, batch norm in train and eval, batch 1 and
// empty batches, heads with one label. Every expectation is a float64 forward written here
// from Hugging Face's modeling_bert.py (BertEmbeddings, BertSelfAttention with
// get_extended_attention_mask's additive finfo.min mask, BertPooler), torchvision's
// vision_transformer.py (VisionTransformer._process_input, EncoderBlock) and resnet.py
// (BasicBlock, ResNet._forward_impl), on the model's own (randomised) weights, or a rule of
// PyTorch's documented behaviour, cited where used. A failing case here is a finding.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "core/json.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "models/vit.h"
#include "nn/module.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/random.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

using V = std::vector<double>;

// float32's lowest: torch.finfo(torch.float32).min, the value Hugging Face's
// get_extended_attention_mask puts where attention_mask is 0 for a float32 model.
constexpr double kLowestF32 = -3.4028234663852886e38;

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

/// Fills every floating parameter and buffer with deterministic values (weights and biases in
/// [-0.5, 0.5), 1-d norm weights in [0.5, 1.5), running variances in [0.5, 2)), so that no
/// zero-initialised head or near-uniform attention hides a wrong index.
void randomize(nn::Module& m, uint64_t seed) {
  autograd::NoGradGuard no_grad;
  for (auto& [name, t] : m.state_dict()) {
    if (!is_floating(t.dtype())) continue;
    double lo = -0.5, hi = 0.5;
    if (ends_with(name, "running_var")) lo = 0.5, hi = 2.0;
    else if (t.dim() == 1 && ends_with(name, ".weight")) lo = 0.5, hi = 1.5;
    t.copy_(random_tensor(t.sizes(), t.dtype(), seed++, Layout::Contiguous, lo, hi));
  }
}

/// Every floating state-dict entry as float64 values, by name.
std::map<std::string, V> params_of(const nn::Module& m) {
  std::map<std::string, V> p;
  for (auto& [name, t] : m.state_dict())
    if (is_floating(t.dtype())) p[name] = values_of(t);
  return p;
}

// ---- float64 building blocks ------------------------------------------------------------

/// x (rows, in) -> x W^T + b, W (out, in) as torch.nn.Linear.
V linear_ref(const V& x, int64_t rows, int64_t in, const V& w, const V& b, int64_t out) {
  V y(size_t(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[o];
      for (int64_t i = 0; i < in; ++i) s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = s;
    }
  return y;
}

/// torch.nn.LayerNorm over the last C values of each row (biased variance), in place.
void layer_norm_ref(V& x, int64_t rows, int64_t C, const V& w, const V& b, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += x[r * C + c];
    mean /= double(C);
    for (int64_t c = 0; c < C; ++c) var += (x[r * C + c] - mean) * (x[r * C + c] - mean);
    var /= double(C);
    for (int64_t c = 0; c < C; ++c) x[r * C + c] = (x[r * C + c] - mean) / std::sqrt(var + eps) * w[c] + b[c];
  }
}

double gelu_ref(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }

/// Multi-head attention of one sequence: q, k, v (T, H*D) rows; add (T) added to every
/// query's scores (empty: none) -> context (T, H*D). Softmax over the keys with the maximum
/// subtracted, as torch's softmax; a score plus kLowestF32 absorbs the score (as it does in
/// Hugging Face's float32 arithmetic), so a row whose every key is masked is uniform.
V attention_ref(const V& q, const V& k, const V& v, int64_t T, int64_t H, int64_t D, const V& add) {
  V ctx(size_t(T * H * D), 0.0);
  const int64_t C = H * D;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < T; ++i) {
      V s(static_cast<size_t>(T));
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < T; ++j) {
        double d = 0;
        for (int64_t e = 0; e < D; ++e) d += q[i * C + h * D + e] * k[j * C + h * D + e];
        s[j] = d / std::sqrt(double(D)) + (add.empty() ? 0.0 : add[j]);
        mx = std::max(mx, s[j]);
      }
      double z = 0;
      for (int64_t j = 0; j < T; ++j) z += (s[j] = std::exp(s[j] - mx));
      for (int64_t j = 0; j < T; ++j)
        for (int64_t e = 0; e < D; ++e) ctx[i * C + h * D + e] += s[j] / z * v[j * C + h * D + e];
    }
  return ctx;
}

// ---- BERT ---------------------------------------------------------------------------------

models::BertConfig tiny_bert() {
  models::BertConfig c;
  c.vocab_size = 50, c.hidden_size = 16, c.num_hidden_layers = 2, c.num_attention_heads = 2;
  c.intermediate_size = 24, c.max_position_embeddings = 12, c.type_vocab_size = 2;
  c.hidden_dropout_prob = 0.0, c.attention_probs_dropout_prob = 0.0, c.num_labels = 3;
  return c;
}

struct BertRef {
  V hidden;  // (B, T, C)
  V pooled;  // (B, C)
};

/// Hugging Face's BertModel.forward in float64 (eval: no dropout). ids, types (B, T); mask
/// (B, T) of 0/1 or empty (all ones), added as (1 - mask) * mask_value (finfo(dtype).min of the
/// model's dtype); types empty: zeros (BertModel's default token_type_ids); positions arange(T)
/// (BertEmbeddings' position_ids buffer).
BertRef bert_ref(const std::map<std::string, V>& p, const models::BertConfig& c, const std::vector<int64_t>& ids,
                 const std::vector<int64_t>& types, const V& mask, int64_t B, int64_t T, const std::string& pre = "",
                 double mask_value = kLowestF32) {
  const int64_t C = c.hidden_size, H = c.num_attention_heads, D = C / H, I = c.intermediate_size;
  auto P = [&](const std::string& k) -> const V& { return p.at(pre + k); };
  V h(size_t(B * T * C));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t n = b * T + t, tt = types.empty() ? 0 : types[n];
      for (int64_t e = 0; e < C; ++e)
        h[n * C + e] = P("embeddings.word_embeddings.weight")[ids[n] * C + e] +
                       P("embeddings.position_embeddings.weight")[t * C + e] +
                       P("embeddings.token_type_embeddings.weight")[tt * C + e];
    }
  const double eps = c.layer_norm_eps;
  layer_norm_ref(h, B * T, C, P("embeddings.LayerNorm.weight"), P("embeddings.LayerNorm.bias"), eps);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string L = "encoder.layer." + std::to_string(l) + ".";
    auto lin = [&](const V& x, const std::string& name, int64_t in, int64_t out) {
      return linear_ref(x, B * T, in, P(L + name + ".weight"), P(L + name + ".bias"), out);
    };
    const V q = lin(h, "attention.self.query", C, C), k = lin(h, "attention.self.key", C, C),
            v = lin(h, "attention.self.value", C, C);
    V ctx(size_t(B * T * C));
    for (int64_t b = 0; b < B; ++b) {
      auto rows = [&](const V& x) { return V(x.begin() + b * T * C, x.begin() + (b + 1) * T * C); };
      V add;
      if (!mask.empty())
        for (int64_t j = 0; j < T; ++j) add.push_back((1.0 - mask[b * T + j]) * mask_value);
      const V cb = attention_ref(rows(q), rows(k), rows(v), T, H, D, add);
      std::copy(cb.begin(), cb.end(), ctx.begin() + b * T * C);
    }
    V a = lin(ctx, "attention.output.dense", C, C);
    for (size_t i = 0; i < a.size(); ++i) a[i] += h[i];
    layer_norm_ref(a, B * T, C, P(L + "attention.output.LayerNorm.weight"), P(L + "attention.output.LayerNorm.bias"),
                   eps);
    V inter = lin(a, "intermediate.dense", C, I);
    for (double& x : inter) x = gelu_ref(x);
    h = lin(inter, "output.dense", I, C);
    for (size_t i = 0; i < h.size(); ++i) h[i] += a[i];
    layer_norm_ref(h, B * T, C, P(L + "output.LayerNorm.weight"), P(L + "output.LayerNorm.bias"), eps);
  }
  BertRef r{h, {}};
  if (p.count(pre + "pooler.dense.weight") && T > 0) {
    V first;
    for (int64_t b = 0; b < B; ++b) first.insert(first.end(), h.begin() + b * T * C, h.begin() + b * T * C + C);
    r.pooled = linear_ref(first, B, C, P("pooler.dense.weight"), P("pooler.dense.bias"), C);
    for (double& x : r.pooled) x = std::tanh(x);
  }
  return r;
}

std::vector<int64_t> random_ids(int64_t n, int64_t hi, uint64_t seed) {
  std::vector<int64_t> ids;
  for (double x : random_values(n, seed, 0.0, double(hi))) ids.push_back(std::min<int64_t>(int64_t(x), hi - 1));
  return ids;
}

Tensor ids_tensor(const std::vector<int64_t>& ids, int64_t B, int64_t T) { return from_vector<int64_t>(ids, {B, T}); }

bool all_finite(const Tensor& t) {
  for (double x : values_of(t))
    if (!std::isfinite(x)) return false;
  return true;
}

// ---- ViT ----------------------------------------------------------------------------------

models::ViTConfig tiny_vit() {
  models::ViTConfig c;
  c.image_size = 8, c.patch_size = 4, c.in_channels = 3, c.num_layers = 2, c.num_heads = 2, c.hidden_dim = 8;
  c.mlp_dim = 12, c.num_classes = 5;
  return c;
}

/// torchvision's VisionTransformer.forward in float64 (eval): x (N, C, S, S) row-major.
V vit_ref(const std::map<std::string, V>& p, const models::ViTConfig& c, const V& x, int64_t N) {
  const int64_t E = c.hidden_dim, Hh = c.num_heads, D = E / Hh, S = c.image_size, ps = c.patch_size,
                side = S / ps, T = side * side + 1, Cin = c.in_channels, M = c.mlp_dim;
  const V &w = p.at("conv_proj.weight"), &bias = p.at("conv_proj.bias");
  V h(size_t(N * T * E));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t e = 0; e < E; ++e) h[(n * T) * E + e] = p.at("class_token")[e];
    for (int64_t i = 0; i < side; ++i)
      for (int64_t j = 0; j < side; ++j)
        for (int64_t e = 0; e < E; ++e) {
          double s = bias[e];
          for (int64_t ch = 0; ch < Cin; ++ch)
            for (int64_t ky = 0; ky < ps; ++ky)
              for (int64_t kx = 0; kx < ps; ++kx)
                s += w[((e * Cin + ch) * ps + ky) * ps + kx] *
                     x[((n * Cin + ch) * S + i * ps + ky) * S + j * ps + kx];
          h[(n * T + 1 + i * side + j) * E + e] = s;
        }
    for (int64_t t = 0; t < T; ++t)
      for (int64_t e = 0; e < E; ++e) h[(n * T + t) * E + e] += p.at("encoder.pos_embedding")[t * E + e];
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string L = "encoder.layers.encoder_layer_" + std::to_string(l) + ".";
    V y = h;
    layer_norm_ref(y, N * T, E, p.at(L + "ln_1.weight"), p.at(L + "ln_1.bias"), 1e-6);
    const V qkv = linear_ref(y, N * T, E, p.at(L + "self_attention.in_proj_weight"),
                             p.at(L + "self_attention.in_proj_bias"), 3 * E);
    V ctx(size_t(N * T * E));
    for (int64_t n = 0; n < N; ++n) {
      V q, k, v;
      for (int64_t t = 0; t < T; ++t) {
        const auto row = qkv.begin() + (n * T + t) * 3 * E;
        q.insert(q.end(), row, row + E), k.insert(k.end(), row + E, row + 2 * E), v.insert(v.end(), row + 2 * E, row + 3 * E);
      }
      const V cn = attention_ref(q, k, v, T, Hh, D, {});
      std::copy(cn.begin(), cn.end(), ctx.begin() + n * T * E);
    }
    const V att = linear_ref(ctx, N * T, E, p.at(L + "self_attention.out_proj.weight"),
                             p.at(L + "self_attention.out_proj.bias"), E);
    for (size_t i = 0; i < h.size(); ++i) h[i] += att[i];
    y = h;
    layer_norm_ref(y, N * T, E, p.at(L + "ln_2.weight"), p.at(L + "ln_2.bias"), 1e-6);
    V m = linear_ref(y, N * T, E, p.at(L + "mlp.0.weight"), p.at(L + "mlp.0.bias"), M);
    for (double& z : m) z = gelu_ref(z);
    const V o = linear_ref(m, N * T, M, p.at(L + "mlp.3.weight"), p.at(L + "mlp.3.bias"), E);
    for (size_t i = 0; i < h.size(); ++i) h[i] += o[i];
  }
  layer_norm_ref(h, N * T, E, p.at("encoder.ln.weight"), p.at("encoder.ln.bias"), 1e-6);
  V cls;
  for (int64_t n = 0; n < N; ++n) cls.insert(cls.end(), h.begin() + n * T * E, h.begin() + n * T * E + E);
  return linear_ref(cls, N, E, p.at("heads.head.weight"), p.at("heads.head.bias"), c.num_classes);
}

// ---- ResNet -------------------------------------------------------------------------------

/// (N, C, H, W) row-major, float64.
struct Map4 {
  int64_t N = 0, C = 0, H = 0, W = 0;
  V d;
  double& at(int64_t n, int64_t c, int64_t y, int64_t x) { return d[((n * C + c) * H + y) * W + x]; }
  double at(int64_t n, int64_t c, int64_t y, int64_t x) const { return d[((n * C + c) * H + y) * W + x]; }
};

/// torch.nn.functional.conv2d without bias, weight (Co, C, k, k).
Map4 conv_ref(const Map4& x, const V& w, int64_t Co, int64_t k, int64_t stride, int64_t pad) {
  Map4 y{x.N, Co, (x.H + 2 * pad - k) / stride + 1, (x.W + 2 * pad - k) / stride + 1, {}};
  y.d.assign(size_t(y.N * y.C * y.H * y.W), 0.0);
  for (int64_t n = 0; n < x.N; ++n)
    for (int64_t o = 0; o < Co; ++o)
      for (int64_t oy = 0; oy < y.H; ++oy)
        for (int64_t ox = 0; ox < y.W; ++ox) {
          double s = 0;
          for (int64_t c = 0; c < x.C; ++c)
            for (int64_t ky = 0; ky < k; ++ky) {
              const int64_t iy = oy * stride - pad + ky;
              if (iy < 0 || iy >= x.H) continue;
              for (int64_t kx = 0; kx < k; ++kx) {
                const int64_t ix = ox * stride - pad + kx;
                if (ix < 0 || ix >= x.W) continue;
                s += w[((o * x.C + c) * k + ky) * k + kx] * x.at(n, c, iy, ix);
              }
            }
          y.at(n, o, oy, ox) = s;
        }
  return y;
}

/// torch.nn.BatchNorm2d (eps 1e-5, momentum 0.1). Training: normalise with the batch's mean
/// and biased variance, and record the running statistics' update (unbiased variance) in
/// `updated`; eval: the running statistics.
void bn_ref(Map4& x, const std::map<std::string, V>& p, const std::string& name, bool train,
            std::map<std::string, V>* updated) {
  const V &w = p.at(name + ".weight"), &b = p.at(name + ".bias");
  V mean = p.at(name + ".running_mean"), var = p.at(name + ".running_var");
  if (train) {
    const double m = double(x.N * x.H * x.W);
    V new_mean = mean, new_var = var;
    for (int64_t c = 0; c < x.C; ++c) {
      double s = 0, sq = 0;
      for (int64_t n = 0; n < x.N; ++n)
        for (int64_t i = 0; i < x.H * x.W; ++i) s += x.at(n, c, i / x.W, i % x.W);
      const double mu = s / m;
      for (int64_t n = 0; n < x.N; ++n)
        for (int64_t i = 0; i < x.H * x.W; ++i) sq += std::pow(x.at(n, c, i / x.W, i % x.W) - mu, 2);
      new_mean[c] = 0.9 * mean[c] + 0.1 * mu;
      new_var[c] = 0.9 * var[c] + 0.1 * sq / (m - 1);
      mean[c] = mu, var[c] = sq / m;
    }
    if (updated) (*updated)[name + ".running_mean"] = new_mean, (*updated)[name + ".running_var"] = new_var;
  }
  for (int64_t n = 0; n < x.N; ++n)
    for (int64_t c = 0; c < x.C; ++c)
      for (int64_t i = 0; i < x.H * x.W; ++i) {
        double& v = x.at(n, c, i / x.W, i % x.W);
        v = (v - mean[c]) / std::sqrt(var[c] + 1e-5) * w[c] + b[c];
      }
}

void relu_ref(Map4& x) {
  for (double& v : x.d) v = std::max(v, 0.0);
}

/// torchvision's ResNet(BasicBlock, [1, 1, 1, 1]) forward in float64 (the 7x7 stem and max pool).
V resnet_ref(const std::map<std::string, V>& p, Map4 x, int64_t classes, bool train,
             std::map<std::string, V>* updated = nullptr) {
  x = conv_ref(x, p.at("conv1.weight"), 64, 7, 2, 3);
  bn_ref(x, p, "bn1", train, updated);
  relu_ref(x);
  Map4 m{x.N, x.C, (x.H + 2 - 3) / 2 + 1, (x.W + 2 - 3) / 2 + 1, {}};  // max_pool2d(3, 2, 1)
  m.d.assign(size_t(m.N * m.C * m.H * m.W), -std::numeric_limits<double>::infinity());
  for (int64_t n = 0; n < m.N; ++n)
    for (int64_t c = 0; c < m.C; ++c)
      for (int64_t oy = 0; oy < m.H; ++oy)
        for (int64_t ox = 0; ox < m.W; ++ox)
          for (int64_t ky = 0; ky < 3; ++ky)
            for (int64_t kx = 0; kx < 3; ++kx) {
              const int64_t iy = oy * 2 - 1 + ky, ix = ox * 2 - 1 + kx;
              if (iy >= 0 && iy < x.H && ix >= 0 && ix < x.W) m.at(n, c, oy, ox) = std::max(m.at(n, c, oy, ox), x.at(n, c, iy, ix));
            }
  x = m;
  int64_t planes = 64;
  for (int layer = 1; layer <= 4; ++layer) {
    const std::string L = "layer" + std::to_string(layer) + ".0.";
    const int64_t stride = layer == 1 ? 1 : 2;
    Map4 y = conv_ref(x, p.at(L + "conv1.weight"), planes, 3, stride, 1);
    bn_ref(y, p, L + "bn1", train, updated);
    relu_ref(y);
    y = conv_ref(y, p.at(L + "conv2.weight"), planes, 3, 1, 1);
    bn_ref(y, p, L + "bn2", train, updated);
    Map4 shortcut = x;
    if (layer > 1) {
      shortcut = conv_ref(x, p.at(L + "downsample.0.weight"), planes, 1, stride, 0);
      bn_ref(shortcut, p, L + "downsample.1", train, updated);
    }
    for (size_t i = 0; i < y.d.size(); ++i) y.d[i] = std::max(y.d[i] + shortcut.d[i], 0.0);
    x = y;
    planes *= 2;
  }
  V pooled(size_t(x.N * x.C), 0.0);  // adaptive_avg_pool2d(1)
  for (int64_t n = 0; n < x.N; ++n)
    for (int64_t c = 0; c < x.C; ++c) {
      for (int64_t i = 0; i < x.H * x.W; ++i) pooled[n * x.C + c] += x.at(n, c, i / x.W, i % x.W);
      pooled[n * x.C + c] /= double(x.H * x.W);
    }
  return linear_ref(pooled, x.N, x.C, p.at("fc.weight"), p.at("fc.bias"), classes);
}

std::shared_ptr<models::ResNet> tiny_resnet(int64_t classes = 4, models::ResNetOptions o = {}) {
  o.num_classes = classes;
  return std::make_shared<models::ResNet>(models::BlockType::Basic, std::array<int64_t, 4>{1, 1, 1, 1}, o);
}

}  // namespace

// =========================================================================================
// BERT
// =========================================================================================

TEST_CASE("probe models: BERT matches a float64 forward, with a row of only padding finite and uniform as HF's") {
  // Hugging Face: the additive mask is (1 - mask) * finfo(float32).min (get_extended_attention_mask),
  // so a sequence whose every token is padding attends uniformly to all of them: finite, not NaN.
  manual_seed(10);
  const models::BertConfig c = tiny_bert();
  models::BertModel bert(c);
  randomize(bert, 100);
  bert.eval();
  const int64_t B = 3, T = 5;
  const std::vector<int64_t> ids = random_ids(B * T, c.vocab_size, 1), types = {0, 0, 1, 1, 1, 0, 1, 0, 1, 0, 1, 1, 0, 0, 1};
  const V mask = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0};
  const auto out =
      bert.forward(ids_tensor(ids, B, T), from_vector<int64_t>({1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0}, {B, T}),
                   ids_tensor(types, B, T));
  const BertRef ref = bert_ref(params_of(bert), c, ids, types, mask, B, T);
  CHECK(all_finite(out.last_hidden_state));
  CHECK(out.last_hidden_state.sizes() == Shape{B, T, c.hidden_size});
  check_close(out.last_hidden_state, ref.hidden, 1e-4, 1e-5, "last_hidden_state");
  check_close(out.pooler_output, ref.pooled, 1e-4, 1e-5, "pooler_output");
  // Without a mask: as an all-ones mask (get_extended_attention_mask of torch.ones).
  const auto none = bert.forward(ids_tensor(ids, B, T), Tensor(), ids_tensor(types, B, T));
  check_close(none.last_hidden_state, bert_ref(params_of(bert), c, ids, types, {}, B, T).hidden, 1e-4, 1e-5,
              "no mask");
}

TEST_CASE("probe models: BERT attention_mask of int64, int32, bool, float16/32/64, transposed; default token types 0") {
  manual_seed(11);
  const models::BertConfig c = tiny_bert();
  models::BertModel bert(c);
  randomize(bert, 200);
  bert.eval();
  const int64_t B = 2, T = 6;
  const std::vector<int64_t> ids = random_ids(B * T, c.vocab_size, 2);
  const V mask = {1, 1, 1, 1, 0, 0, 1, 0, 1, 1, 1, 0};  // a hole in the middle of the second row
  const Tensor base = make_tensor(mask, {B, T}, kInt64);
  const Tensor want = bert.forward(ids_tensor(ids, B, T), base).last_hidden_state;
  check_close(want, bert_ref(params_of(bert), c, ids, {}, mask, B, T).hidden, 1e-4, 1e-5, "int64 mask");
  for (DType dt : {kInt32, kBool, kFloat32, kFloat64, kFloat16}) {
    CAPTURE(dtype_name(dt));
    const Tensor m = make_tensor(mask, {B, T}, dt);
    CHECK(bytes_of(bert.forward(ids_tensor(ids, B, T), m).last_hidden_state) == bytes_of(want));
  }
  // A transposed (non-contiguous) mask and ids: the same values, the same output.
  const Tensor ids_t = ids_tensor(ids, B, T).t().contiguous().t();
  const Tensor mask_t = base.t().contiguous().t();
  REQUIRE_FALSE(ids_t.is_contiguous());
  CHECK(bytes_of(bert.forward(ids_t, mask_t).last_hidden_state) == bytes_of(want));
  // token_type_ids default to zeros (BertModel.forward: torch.zeros(input_shape)); int32 types as int64.
  const Tensor zeros64 = zeros({B, T}, kInt64);
  CHECK(bytes_of(bert.forward(ids_tensor(ids, B, T), base, zeros64).last_hidden_state) == bytes_of(want));
  CHECK(bytes_of(bert.forward(ids_tensor(ids, B, T).to(kInt32), base, zeros({B, T}, kInt32)).last_hidden_state) ==
        bytes_of(want));
}

TEST_CASE("probe models: BERT padding appended to a sequence leaves the real tokens' outputs unchanged") {
  // The point of the mask: outputs at real tokens are the same with and without padding
  // tokens (any ids, any token types) appended after them.
  manual_seed(12);
  const models::BertConfig c = tiny_bert();
  models::BertForSequenceClassification cls(c);
  randomize(cls, 300);
  cls.eval();
  models::BertModel& bert = *cls.bert;
  const int64_t B = 2, T = 4, P = 5;
  const std::vector<int64_t> ids = random_ids(B * T, c.vocab_size, 3);
  const std::vector<int64_t> types = {0, 0, 1, 1, 0, 1, 1, 1};
  const auto plain = bert.forward(ids_tensor(ids, B, T), Tensor(), ids_tensor(types, B, T));
  std::vector<int64_t> pids, ptypes, pmask;
  const std::vector<int64_t> junk = random_ids(B * P, c.vocab_size, 4);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) pids.push_back(ids[b * T + t]), ptypes.push_back(types[b * T + t]), pmask.push_back(1);
    for (int64_t t = 0; t < P; ++t) pids.push_back(junk[b * P + t]), ptypes.push_back(t % 2), pmask.push_back(0);
  }
  const auto padded = bert.forward(ids_tensor(pids, B, T + P), from_vector<int64_t>(pmask, {B, T + P}),
                                   ids_tensor(ptypes, B, T + P));
  check_close(padded.last_hidden_state.narrow(1, 0, T), values_of(plain.last_hidden_state), 1e-5, 1e-6,
              "real tokens, padded vs not");
  check_close(padded.pooler_output, values_of(plain.pooler_output), 1e-5, 1e-6, "pooler, padded vs not");
  const Tensor l1 = cls.forward(ids_tensor(ids, B, T), Tensor(), ids_tensor(types, B, T)).logits;
  const Tensor l2 = cls.forward(ids_tensor(pids, B, T + P), from_vector<int64_t>(pmask, {B, T + P}),
                                ids_tensor(ptypes, B, T + P))
                        .logits;
  check_close(l2, values_of(l1), 1e-5, 1e-6, "classifier logits, padded vs not");
}

TEST_CASE("probe models: BERT at sequence length 1, batch 1 and max_position_embeddings; one over is refused") {
  manual_seed(13);
  const models::BertConfig c = tiny_bert();
  models::BertModel bert(c);
  randomize(bert, 400);
  bert.eval();
  const auto p = params_of(bert);
  for (auto [B, T] : {std::pair<int64_t, int64_t>{1, 1}, {3, 1}, {1, 7}, {1, 12}, {2, 12}}) {
    CAPTURE(B);
    CAPTURE(T);
    const std::vector<int64_t> ids = random_ids(B * T, c.vocab_size, uint64_t(B * 100 + T));
    V mask(size_t(B * T), 1.0);
    mask.back() = T > 1 ? 0.0 : 1.0;
    const auto out = bert.forward(ids_tensor(ids, B, T), make_tensor(mask, {B, T}, kInt64));
    const BertRef ref = bert_ref(p, c, ids, {}, mask, B, T);
    check_close(out.last_hidden_state, ref.hidden, 1e-4, 1e-5, "hidden");
    check_close(out.pooler_output, ref.pooled, 1e-4, 1e-5, "pooled");
  }
  // Hugging Face fails there too (the position_ids buffer has 12 entries); frugal names both sizes.
  check_error([&] { bert.forward(zeros({1, 13}, kInt64)); }, {"13", "max_position_embeddings", "12"});
}

TEST_CASE("probe models: BERT ids and token types out of range, float or bool ids, wrong ranks are refused") {
  manual_seed(14);
  const models::BertConfig c = tiny_bert();
  models::BertModel bert(c);
  bert.eval();
  const Tensor ok = from_vector<int64_t>({1, 2, 3, 4}, {2, 2});
  // nn.Embedding (torch.embedding) raises "index out of range" for ids >= num_embeddings and
  // for negative ids; it never wraps or reads past the table.
  check_error([&] { bert.forward(from_vector<int64_t>({1, 50, 3, 4}, {2, 2})); }, {"embedding", "50"});
  check_error([&] { bert.forward(from_vector<int64_t>({1, 2, -1, 4}, {2, 2})); }, {"embedding", "-1"});
  check_error([&] { bert.forward(from_vector<int32_t>({1, 2, 3, 1000}, {2, 2})); }, {"embedding", "1000"});
  check_error([&] { bert.forward(ok, Tensor(), from_vector<int64_t>({0, 1, 2, 0}, {2, 2})); }, {"embedding", "2"});
  check_error([&] { bert.forward(ok, Tensor(), from_vector<int64_t>({0, -1, 0, 0}, {2, 2})); }, {"embedding", "-1"});
  // Float ids: torch.embedding wants Long or Int indices.
  check_error([&] { bert.forward(ok.to(kFloat32)); }, {"input_ids", "float32"});
  check_error([&] { bert.forward(ok.to(kBool)); }, {"bool"});
  check_error([&] { bert.forward(ok, Tensor(), ok.to(kFloat32)); }, {"float32"});
  // Ranks and shapes: input_ids must be (B, T); mask and token types must match it.
  check_error([&] { bert.forward(from_vector<int64_t>({1, 2, 3}, {3})); }, {"input_ids", "(B, T)"});
  check_error([&] { bert.forward(zeros({1, 2, 3}, kInt64)); }, {"input_ids", "(B, T)"});
  check_error([&] { bert.forward(ok, ones({2, 3}, kInt64)); }, {"attention_mask", "[2, 2]", "[2, 3]"});
  check_error([&] { bert.forward(ok, ones({2, 1, 1, 2})); }, {"attention_mask", "[2, 2]"});
  check_error([&] { bert.forward(ok, Tensor(), zeros({2}, kInt64)); }, {"token_type_ids", "[2, 2]"});
}

TEST_CASE("probe models: BERT on an empty batch gives empty outputs; zero-length sequences are refused or empty") {
  manual_seed(15);
  const models::BertConfig c = tiny_bert();
  models::BertModel bert(c);
  bert.eval();
  // Hugging Face runs a (0, T) batch through and returns (0, T, C) and (0, C).
  const auto out = bert.forward(zeros({0, 5}, kInt64), zeros({0, 5}, kInt64));
  CHECK(out.last_hidden_state.sizes() == Shape{0, 5, 16});
  CHECK(out.pooler_output.sizes() == Shape{0, 16});
  models::BertForSequenceClassification cls(c);
  cls.eval();
  CHECK(cls.forward(zeros({0, 5}, kInt64)).logits.sizes() == Shape{0, 3});
  // T = 0: Hugging Face's pooler indexes hidden_states[:, 0] and raises IndexError; without a
  // pooler the output is (B, 0, C). frugal: the same, as an Error, never a crash.
  check_error([&] { bert.forward(zeros({2, 0}, kInt64)); }, {"BertModel", "pooler", "[2, 0]"});
  models::BertForMaskedLM mlm(c);
  mlm.eval();
  CHECK(mlm.forward(zeros({2, 0}, kInt64)).logits.sizes() == Shape{2, 0, 50});
}

TEST_CASE("probe models: BERT gradients from the real tokens reach no padded token's embedding row") {
  // Padded keys get weight exactly 0 (exp of a score plus -3.4e38 underflows), so a loss over
  // the real tokens' outputs gives the padded positions' word embeddings a gradient of exactly
  // zero, in Hugging Face and here; the real tokens' rows get one.
  manual_seed(19);
  const models::BertConfig c = tiny_bert();
  models::BertModel bert(c, /*add_pooling_layer=*/false);
  randomize(bert, 350);
  bert.train();  // dropout is 0: train() only so that nothing is skipped for eval
  const int64_t B = 2, T = 6;
  // Real ids 1..8, padding ids 40..43 (each used only at padded positions).
  const std::vector<int64_t> ids = {1, 2, 3, 4, 40, 41, 5, 6, 7, 8, 42, 43};
  const V mask = {1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0};
  const Tensor h = bert.forward(ids_tensor(ids, B, T), make_tensor(mask, {B, T}, kFloat32)).last_hidden_state;
  const Tensor w = random_tensor({B, 4, c.hidden_size}, kFloat32, 77);
  sum(h.narrow(1, 0, 4) * w).backward();
  const Tensor g = bert.embeddings->word_embeddings->weight.grad();
  REQUIRE(g.defined());
  for (int64_t pad : {40, 41, 42, 43}) {
    CAPTURE(pad);
    CHECK(max_abs(g.select(0, pad)) == 0.0);
  }
  for (int64_t real : {1, 4, 5, 8}) {
    CAPTURE(real);
    CHECK(max_abs(g.select(0, real)) > 0.0);
  }
}

TEST_CASE("probe models: BERT in eval() is deterministic and dropout-free; train() drops, reproducibly per seed") {
  models::BertConfig c = tiny_bert();
  c.hidden_dropout_prob = 0.2, c.attention_probs_dropout_prob = 0.2;
  manual_seed(16);
  models::BertModel bert(c);
  randomize(bert, 500);
  const int64_t B = 2, T = 5;
  const std::vector<int64_t> ids = random_ids(B * T, c.vocab_size, 5);
  const V mask = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0};
  const Tensor x = ids_tensor(ids, B, T), m = make_tensor(mask, {B, T}, kInt64);
  bert.eval();
  const Tensor e1 = bert.forward(x, m).last_hidden_state, e2 = bert.forward(x, m).last_hidden_state;
  CHECK(bytes_of(e1) == bytes_of(e2));
  check_close(e1, bert_ref(params_of(bert), c, ids, {}, mask, B, T).hidden, 1e-4, 1e-5, "eval ignores dropout");
  bert.train();
  manual_seed(7);
  const Tensor t1 = bert.forward(x, m).last_hidden_state;
  const Tensor t2 = bert.forward(x, m).last_hidden_state;
  manual_seed(7);
  const Tensor t3 = bert.forward(x, m).last_hidden_state;
  CHECK(all_finite(t1));
  CHECK(bytes_of(t1) == bytes_of(t3));  // the same seed, the same masks
  CHECK(bytes_of(t1) != bytes_of(t2));
  CHECK(bytes_of(t1) != bytes_of(e1));
  bert.eval();
  CHECK(bytes_of(bert.forward(x, m).last_hidden_state) == bytes_of(e1));
}

TEST_CASE("probe models: BERT in float16 / bfloat16 and under autocast: the mask is finfo(dtype).min, not -inf") {
  // Hugging Face makes the additive mask in the model's dtype (get_extended_attention_mask:
  // (1 - mask) * torch.finfo(self.dtype).min): -65504 for float16, -3.39e38 for bfloat16, never
  // -inf; under autocast the model is float32 and so is its mask. A sequence that is all
  // padding therefore still attends to its keys: uniformly where the mask value swamps the
  // scores (float32, bfloat16), as softmax of the scores where it does not (float16's -65504
  // added in float32). The reference adds that value in float64. (-inf made it attend to
  // nothing: zeros, unlike the float32 model.) Partially padded rows ignore the padded keys.
  const models::BertConfig c = tiny_bert();
  manual_seed(17);
  models::BertModel ref_model(c);
  randomize(ref_model, 600);
  ref_model.eval();
  const auto p = params_of(ref_model);
  const int64_t B = 2, T = 4;
  const std::vector<int64_t> ids = random_ids(B * T, c.vocab_size, 6);
  const V mask = {1, 1, 1, 0, 0, 0, 0, 0};
  const Tensor x = ids_tensor(ids, B, T), m = make_tensor(mask, {B, T}, kInt64);
  for (DType dt : {kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(dt));
    const double lowest = dt == kFloat16 ? -65504.0 : -3.3895313892515355e38;
    const BertRef ref = bert_ref(p, c, ids, {}, mask, B, T, "", lowest);
    models::BertModel low(c);
    low.load_state_dict(ref_model.state_dict());
    low.to(dt);
    low.eval();
    const Tensor h = low.forward(x, m).last_hidden_state;
    REQUIRE(h.dtype() == dt);
    CHECK(all_finite(h));
    const double tol = dt == kFloat16 ? 3e-2 : 1.5e-1;
    check_close(h.narrow(0, 0, 1), V(ref.hidden.begin(), ref.hidden.begin() + T * 16), tol, tol, "partly padded");
    check_close(h.narrow(0, 1, 1), V(ref.hidden.begin() + T * 16, ref.hidden.end()), tol, tol, "all padding");
    // The mask itself: the lowest finite value of the dtype where attention_mask is 0, made
    // directly or converted from the float32 one the model passes its layers.
    CHECK(values_of(models::bert_additive_mask(m, dt))[3] == lowest);
    CHECK(values_of(models::bert_mask_in(models::bert_additive_mask(m, kFloat32), dt))[3] == lowest);
  }
  {
    AutocastGuard amp(kCPU, kBFloat16);
    const BertRef ref = bert_ref(p, c, ids, {}, mask, B, T);  // float32's finfo.min
    const Tensor h = ref_model.forward(x, m).last_hidden_state;
    CHECK(all_finite(h));
    check_close(h, ref.hidden, 1.5e-1, 1.5e-1, "bfloat16 autocast");
  }
}

TEST_CASE("probe models: sequence classification heads: num_labels 1 is MSE regression, labels (B) or (B, 1)") {
  // Hugging Face BertForSequenceClassification: num_labels == 1 -> problem_type "regression",
  // MSELoss()(logits.squeeze(), labels.squeeze()); integer labels with num_labels > 1 ->
  // CrossEntropyLoss()(logits.view(-1, num_labels), labels.view(-1)).
  models::BertConfig c = tiny_bert();
  c.num_labels = 1;
  manual_seed(18);
  models::BertForSequenceClassification reg(c);
  randomize(reg, 700);
  reg.eval();
  const Tensor x = ids_tensor(random_ids(6, c.vocab_size, 7), 3, 2);
  const V y = {0.5, -1.0, 2.0};
  const auto out = reg.forward(x, Tensor(), Tensor(), make_tensor(y, {3}, kFloat32));
  REQUIRE(out.logits.sizes() == Shape{3, 1});
  const V lg = values_of(out.logits);
  double mse = 0;
  for (int i = 0; i < 3; ++i) mse += (lg[i] - y[i]) * (lg[i] - y[i]) / 3.0;
  CHECK(out.loss.item<double>() == doctest::Approx(mse).epsilon(1e-6));
  // Labels (B, 1), as the logits: HF squeezes both, the same loss (never a (B, B) broadcast).
  const auto col = reg.forward(x, Tensor(), Tensor(), make_tensor(y, {3, 1}, kFloat32));
  CHECK(col.loss.item<double>() == doctest::Approx(mse).epsilon(1e-6));
  // Batch 1: logits (1, 1), loss (logit - y)^2.
  const auto one = reg.forward(x.narrow(0, 0, 1), Tensor(), Tensor(), make_tensor({0.5}, {1}, kFloat32));
  REQUIRE(one.logits.sizes() == Shape{1, 1});
  CHECK(one.loss.item<double>() == doctest::Approx(std::pow(values_of(one.logits)[0] - 0.5, 2)).epsilon(1e-6));

  // num_labels 3 with int64 labels (B) and (B, 1) (HF views both as (-1)): mean cross entropy.
  c.num_labels = 3;
  models::BertForSequenceClassification cls(c);
  randomize(cls, 800);
  cls.eval();
  const std::vector<int64_t> labels = {2, 0, 1};
  const auto ce = cls.forward(x, Tensor(), Tensor(), from_vector<int64_t>(labels, {3}));
  const V z = values_of(ce.logits);
  double want = 0;
  for (int i = 0; i < 3; ++i) {
    const double mx = std::max({z[i * 3], z[i * 3 + 1], z[i * 3 + 2]});
    const double lse = mx + std::log(std::exp(z[i * 3] - mx) + std::exp(z[i * 3 + 1] - mx) + std::exp(z[i * 3 + 2] - mx));
    want += (lse - z[i * 3 + labels[i]]) / 3.0;
  }
  CHECK(ce.loss.item<double>() == doctest::Approx(want).epsilon(1e-6));
  const auto ce_col = cls.forward(x, Tensor(), Tensor(), from_vector<int64_t>(labels, {3, 1}));
  CHECK(ce_col.loss.item<double>() == doctest::Approx(want).epsilon(1e-6));
}

TEST_CASE("probe models: BertConfig.from_json: id2label decides num_labels over a disagreeing num_labels, as HF") {
  // transformers PretrainedConfig.__init__: with id2label given, a num_labels that disagrees
  // is overwritten by len(id2label) ("You passed along `num_labels=3` with an incompatible id to
  // label map ... The number of labels will be overwritten to 2").
  const json::Value both = json::parse(R"({"num_labels": 3, "id2label": {"0": "NEGATIVE", "1": "POSITIVE"}})");
  CHECK(models::BertConfig::from_json(both).num_labels == 2);
  CHECK(models::BertConfig::from_json(json::parse(R"({"num_labels": 4})")).num_labels == 4);
  CHECK(models::BertConfig::from_json(json::parse(R"({"id2label": {"0": "a"}})")).num_labels == 1);
  CHECK(models::BertConfig::from_json(json::parse(R"({})")).num_labels == 2);
}

// =========================================================================================
// ViT
// =========================================================================================

TEST_CASE("probe models: ViT matches a float64 forward at batch 1 and 2, on channels-last, sliced and transposed images") {
  manual_seed(20);
  const models::ViTConfig c = tiny_vit();
  models::VisionTransformer vit(c);
  randomize(vit, 900);
  vit.eval();
  const auto p = params_of(vit);
  for (int64_t N : {1, 2}) {
    CAPTURE(N);
    const V xv = random_values(N * 3 * 8 * 8, 30 + uint64_t(N));
    const V want = vit_ref(p, c, xv, N);
    const Tensor x = make_tensor(xv, {N, 3, 8, 8}, kFloat32);
    const Tensor y = vit.forward(x);
    REQUIRE(y.sizes() == Shape{N, 5});
    check_close(y, want, 1e-4, 1e-5, "contiguous");
    check_close(vit.forward(to_channels_last(x)), want, 1e-4, 1e-5, "channels-last");
    // Every other column of a (N, 3, 8, 16) image, and a (N, 8, 8, 3) image permuted to NCHW.
    check_close(vit.forward(make_tensor(xv, {N, 3, 8, 8}, kFloat32, Layout::Strided)), want, 1e-4, 1e-5, "strided");
    check_close(vit.forward(make_tensor(xv, {N, 3, 8, 8}, kFloat32, Layout::Transposed)), want, 1e-4, 1e-5,
                "transposed H/W");
    const Tensor big = zeros({N + 1, 5, 10, 11});
    big.narrow(0, 1, N).narrow(1, 1, 3).narrow(2, 2, 8).narrow(3, 3, 8).copy_(x);
    check_close(vit.forward(big.narrow(0, 1, N).narrow(1, 1, 3).narrow(2, 2, 8).narrow(3, 3, 8)), want, 1e-4, 1e-5,
                "a crop of a larger batch");
  }
}

TEST_CASE("probe models: ViT refuses wrong image sizes, channels and ranks; an empty batch gives (0, classes)") {
  // torchvision _process_input: torch._assert(h == self.image_size, "Wrong image height! ...");
  // Hugging Face ViTEmbeddings with interpolate_pos_encoding=False raises "Input image size
  // (16*16) doesn't match model (8*8)". Neither resizes or interpolates silently.
  manual_seed(21);
  models::ViTConfig c = tiny_vit();
  models::VisionTransformer vit(c);
  vit.eval();
  check_error([&] { vit.forward(randn({1, 3, 16, 16})); }, {"VisionTransformer", "8", "[1, 3, 16, 16]"});
  check_error([&] { vit.forward(randn({1, 3, 8, 12})); }, {"VisionTransformer", "[1, 3, 8, 12]"});
  check_error([&] { vit.forward(randn({1, 3, 12, 8})); }, {"VisionTransformer", "[1, 3, 12, 8]"});
  check_error([&] { vit.forward(randn({1, 1, 8, 8})); }, {"VisionTransformer", "3", "[1, 1, 8, 8]"});
  check_error([&] { vit.forward(randn({3, 8, 8})); }, {"VisionTransformer", "[3, 8, 8]"});
  check_error([&] { vit.forward(zeros({1, 3, 8, 8}, kInt64)); }, {"int64"});
  // An empty batch runs through (torch does: conv2d, cat and layer_norm of 0 rows).
  CHECK(vit.forward(zeros({0, 3, 8, 8})).sizes() == Shape{0, 5});
  // dropout in train() only (torchvision's encoder, attention and MLP dropouts).
  c.dropout = 0.3, c.attention_dropout = 0.3;
  models::VisionTransformer drop(c);
  randomize(drop, 950);
  const Tensor x = randn({2, 3, 8, 8});
  drop.eval();
  const Tensor e1 = drop.forward(x), e2 = drop.forward(x);
  CHECK(bytes_of(e1) == bytes_of(e2));
  check_close(e1, vit_ref(params_of(drop), c, values_of(x), 2), 1e-4, 1e-5, "eval ignores dropout");
  drop.train();
  const Tensor t1 = drop.forward(x), t2 = drop.forward(x);
  CHECK(all_finite(t1));
  CHECK(bytes_of(t1) != bytes_of(t2));
  CHECK(bytes_of(t1) != bytes_of(e1));
  // One class: (N, 1).
  c.num_classes = 1;
  models::VisionTransformer one(c);
  CHECK(one.forward(randn({2, 3, 8, 8})).sizes() == Shape{2, 1});
}

// =========================================================================================
// ResNet
// =========================================================================================

TEST_CASE("probe models: ResNet eval matches a float64 forward at 32x32 (last stage 1x1), 33x47 and 1x1 images") {
  manual_seed(30);
  auto net = tiny_resnet();
  randomize(*net, 1000);
  net->eval();
  const auto p = params_of(*net);
  for (auto [N, H, W] : {std::tuple<int64_t, int64_t, int64_t>{2, 32, 32}, {1, 33, 47}, {2, 1, 1}}) {
    CAPTURE(N);
    CAPTURE(H);
    CAPTURE(W);
    const V xv = random_values(N * 3 * H * W, uint64_t(40 + H + W));
    const V want = resnet_ref(p, Map4{N, 3, H, W, xv}, 4, /*train=*/false);
    const Tensor x = make_tensor(xv, {N, 3, H, W}, kFloat32);
    check_close(net->forward(x), want, 1e-4, 1e-4, "contiguous");
    check_close(net->forward(to_channels_last(x)), want, 1e-4, 1e-4, "channels-last");
    check_close(net->forward(make_tensor(xv, {N, 3, H, W}, kFloat32, Layout::Strided)), want, 1e-4, 1e-4, "strided");
    check_close(net->forward(make_tensor(xv, {N, 3, H, W}, kFloat32, Layout::Transposed)), want, 1e-4, 1e-4,
                "transposed");
  }
}

TEST_CASE("probe models: ResNet train() normalises with batch statistics and updates the running ones as torch") {
  // In float64 (Module::to), so that the comparison is tight: the last stage's two values per
  // channel make float32's variance a difference of nearly equal numbers.
  manual_seed(31);
  auto net = tiny_resnet();
  randomize(*net, 1100);
  net->to(kFloat64);
  net->train();
  const auto p = params_of(*net);
  // Batch 2 at 32x32: the last stage is 1x1, two values per channel (enough, as torch).
  const int64_t N = 2, H = 32, W = 32;
  const V xv = random_values(N * 3 * H * W, 50);
  std::map<std::string, V> updated;
  const V want = resnet_ref(p, Map4{N, 3, H, W, xv}, 4, /*train=*/true, &updated);
  const Tensor y = net->forward(to_channels_last(make_tensor(xv, {N, 3, H, W}, kFloat64)));
  check_close(y, want, 1e-9, 1e-9, "train logits");
  const auto after = params_of(*net);
  for (const char* name : {"bn1.running_mean", "bn1.running_var", "layer4.0.bn2.running_mean",
                           "layer4.0.bn2.running_var", "layer3.0.downsample.1.running_var"}) {
    CAPTURE(name);
    check_close(after.at(name), updated.at(name), 1e-9, 1e-9, name);
  }
  for (auto& [name, t] : net->state_dict())
    if (ends_with(name, "num_batches_tracked")) CHECK(t.item<int64_t>() == 1);
}

TEST_CASE("probe models: ResNet fused_bn_relu / fused_conv_bn in train() on odd sizes and views match the reference") {
  // The fused blocks compute the batch statistics inside the convolutions (conv2d_stats):
  // checked against the same float64 forward on 33x47 images, channels-last and sliced.
  const int64_t N = 2, H = 33, W = 47;
  const V xv = random_values(N * 3 * H * W, 52);
  for (auto [bn_relu, conv_bn] : {std::pair{true, false}, {false, true}}) {
    CAPTURE(bn_relu);
    CAPTURE(conv_bn);
    for (int layout = 0; layout < 3; ++layout) {
      CAPTURE(layout);
      manual_seed(34);
      auto net = tiny_resnet(4, {.fused_bn_relu = bn_relu, .fused_conv_bn = conv_bn});
      randomize(*net, 1300);
      net->to(kFloat64);
      net->train();
      std::map<std::string, V> updated;
      const V want = resnet_ref(params_of(*net), Map4{N, 3, H, W, xv}, 4, true, &updated);
      const Tensor x = layout == 0   ? make_tensor(xv, {N, 3, H, W}, kFloat64)
                       : layout == 1 ? to_channels_last(make_tensor(xv, {N, 3, H, W}, kFloat64))
                                     : make_tensor(xv, {N, 3, H, W}, kFloat64, Layout::Strided);
      check_close(net->forward(x), want, 1e-9, 1e-9, "train logits");
      const auto after = params_of(*net);
      for (const char* name : {"layer1.0.bn1.running_var", "layer2.0.bn2.running_mean", "layer4.0.bn1.running_var"})
        check_close(after.at(name), updated.at(name), 1e-9, 1e-9, name);
    }
  }
}

TEST_CASE("probe models: ResNet batch 1 in train(): refused where a channel has one value, as torch; fine otherwise") {
  // torch.nn.functional.batch_norm (_verify_batch_size): "Expected more than 1 value per
  // channel when training, got input size torch.Size([1, 512, 1, 1])". Without the check the
  // batch variance is 0/0 in the unbiased running variance: NaN running statistics.
  manual_seed(32);
  auto net = tiny_resnet();
  randomize(*net, 1200);
  net->train();
  check_error([&] { net->forward(randn({1, 3, 32, 32})); }, {"more than 1 value per channel", "[1, 512, 1, 1]"});
  // 64x64: the last stage is 2x2, four values per channel: runs and matches the reference.
  auto fresh = tiny_resnet();
  randomize(*fresh, 1200);
  fresh->to(kFloat64);
  fresh->train();
  const V xv = random_values(3 * 64 * 64, 51);
  std::map<std::string, V> updated;
  const V want = resnet_ref(params_of(*fresh), Map4{1, 3, 64, 64, xv}, 4, true, &updated);
  check_close(fresh->forward(make_tensor(xv, {1, 3, 64, 64}, kFloat64)), want, 1e-9, 1e-9, "batch 1, 64x64");
  for (auto& [name, t] : fresh->state_dict()) CHECK_MESSAGE(all_finite(t), name);
  // Batch 1 in eval: the running statistics, any size.
  net->eval();
  CHECK(all_finite(net->forward(randn({1, 3, 32, 32}))));
}

TEST_CASE("probe models: ResNet input validation; an empty batch in eval gives (0, classes); one class gives (N, 1)") {
  manual_seed(33);
  auto net = tiny_resnet();
  net->eval();
  check_error([&] { net->forward(randn({3, 32, 32})); }, {"ResNet", "(N, 3, H, W)", "[3, 32, 32]"});
  check_error([&] { net->forward(randn({1, 4, 32, 32})); }, {"ResNet", "(N, 3, H, W)", "[1, 4, 32, 32]"});
  check_error([&] { net->forward(randn({1, 1, 3, 32, 32})); }, {"ResNet", "[1, 1, 3, 32, 32]"});
  check_error([&] { net->forward(zeros({1, 3, 32, 32}, kInt64)); }, {"int64"});
  const Tensor empty = net->forward(zeros({0, 3, 32, 32}));
  CHECK(empty.sizes() == Shape{0, 4});
  // In train() too an empty batch gives (0, classes) and leaves the running statistics alone,
  // as torch (Note [Size-0 batch norm]).
  net->train();
  const auto before = net->named_buffers();
  std::vector<std::vector<double>> stats;
  for (const auto& [name, b] : before) stats.push_back(values_of(b.to(kFloat64)));
  CHECK(net->forward(zeros({0, 3, 32, 32})).sizes() == Shape{0, 4});
  for (size_t i = 0; i < before.size(); ++i)
    if (before[i].first.find("running") != std::string::npos)
      check_close(before[i].second.to(kFloat64), stats[i], 0, 0, before[i].first + " after an empty batch");
  net->eval();
  auto one = tiny_resnet(1);
  one->eval();
  CHECK(one->forward(randn({3, 3, 20, 24})).sizes() == Shape{3, 1});
}
