// Compressed saved tensors (Note [Compressed saved tensors] in autograd/compress.h): gradients
// within the quantization bound of the plain run's (one linear, element by element against
// the bound of Note [Blockwise quantization]; an MLP, a conv-bn-relu block and a transformer
// block in relative norm), the bytes saved, select by op, parameters and autocast's cached
// casts left alone, dedupe, the in-place version check, retain_graph, and relu's 1-bit mask
// (gradients bit for bit those of the plain run).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/compress.h"
#include "autograd/ops/all.h"
#include "tensor/factory.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autograd::CompressFormat;
using autograd::CompressOptions;
using autograd::CompressSavedTensors;

namespace {

const CompressFormat kFormats[] = {CompressFormat::Fp8E4M3, CompressFormat::Int8};

Tensor param(const Shape& s, uint64_t seed, double scale = 0.3) {
  Tensor t = random_tensor(s, kFloat32, seed, Layout::Contiguous, -scale, scale);
  t.requires_grad_();
  return t;
}

/// The gradients of `params` (and of x when it requires grad) after backward of
/// sum(f(x) * r), r fixed, with the forward under `options` when given.
std::vector<std::vector<double>> grads_of(const std::function<Tensor(const Tensor&)>& f, const Tensor& x,
                                          const std::vector<Tensor>& params, const CompressOptions* options) {
  for (const Tensor& p : params) p.set_grad(Tensor());
  if (x.requires_grad()) x.set_grad(Tensor());
  Tensor y = options ? autograd::compress(f, x, *options) : f(x);
  const Tensor r = random_tensor(y.sizes(), kFloat32, 999);
  sum(y * r).backward();
  std::vector<std::vector<double>> out;
  for (const Tensor& p : params) out.push_back(values_of(p.grad()));
  if (x.requires_grad()) out.push_back(values_of(x.grad()));
  return out;
}

/// ||a - b|| / ||b|| over all gradients.
double relative_error(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j) {
      num += (a[i][j] - b[i][j]) * (a[i][j] - b[i][j]);
      den += b[i][j] * b[i][j];
    }
  return std::sqrt(num / den);
}

CompressOptions options_for(CompressFormat format) { return {.format = format, .block = 64, .min_bytes = 0}; }

}  // namespace

TEST_CASE("compress: one linear's weight gradient within the per-element bound, its input gradient exact") {
  const int64_t N = 24, K = 40, M = 12, block = 64;
  for (CompressFormat format : kFormats) {
    INFO(std::string(autograd::to_string(format)));
    const Tensor x = random_tensor({N, K}, kFloat32, 1, Layout::Contiguous, -2.0, 2.0).requires_grad_();
    const Tensor w = param({M, K}, 2);
    // h * 1.0 saves nothing and is no leaf: linear's saved input is compressed (x itself, a
    // leaf that requires grad, would be left alone as a parameter is).
    auto f = [&](const Tensor& h) { return linear(h * 1.0, w); };
    const CompressOptions o{.format = format, .block = block, .min_bytes = 0};
    autograd::reset_compress_stats();
    const auto plain = grads_of(f, x, {w}, nullptr);
    const auto packed = grads_of(f, x, {w}, &o);
    CHECK(autograd::compress_stats().tensors == 1);  // x; w is a parameter
    // dx = r W reads only the parameter: bit for bit.
    CHECK(packed[1] == plain[1]);
    // dW = r^T x: |dW' - dW|_mk <= sum_n |r_nm| bound(x_nk), the bound of Note [Blockwise
    // quantization] with the scale of x_nk's block (row-major blocks of x), plus the float32
    // rounding of the two matmuls.
    const std::vector<double> xv = values_of(x), rv = values_of(random_tensor({N, M}, kFloat32, 999));
    std::vector<double> scale((N * K + block - 1) / block, 0.0);
    for (int64_t i = 0; i < N * K; ++i)
      scale[size_t(i / block)] = std::max(scale[size_t(i / block)], std::fabs(xv[size_t(i)]));
    for (double& s : scale) s = double(float(s / (format == CompressFormat::Fp8E4M3 ? 448.0 : 127.0)));
    int64_t failures = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        double bound = 0, mag = 0;
        for (int64_t n = 0; n < N; ++n) {
          const double ax = std::fabs(xv[size_t(n * K + k)]), s = scale[size_t((n * K + k) / block)];
          const double b =
              format == CompressFormat::Fp8E4M3 ? std::max(std::ldexp(ax, -4), std::ldexp(s, -10)) : 0.5 * s;
          bound += std::fabs(rv[size_t(n * M + m)]) * (b + std::ldexp(ax + s, -20));
          mag += std::fabs(rv[size_t(n * M + m)]) * ax;
        }
        bound += 1e-5 * mag;
        const double err = std::fabs(packed[0][size_t(m * K + k)] - plain[0][size_t(m * K + k)]);
        if (!(err <= bound) && failures++ < 5) MESSAGE("dW[", m, ", ", k, "]: error ", err, " > bound ", bound);
      }
    CHECK(failures == 0);
    CHECK(packed[0] != plain[0]);  // it did compress
  }
}

TEST_CASE("compress: an MLP, a conv-bn-relu block and a transformer block train on gradients near the plain ones") {
  // Each gradient carries the error of the activations it was computed from: at most 2^-4
  // relative per element for e4m3 and half a scale for int8, far less on average and in norm.
  const std::vector<Tensor> mlp = {param({64, 32}, 10), param({64}, 11), param({48, 64}, 12), param({48}, 13),
                                   param({8, 48}, 14)};
  auto mlp_fn = [&](const Tensor& h) {
    return linear(tanh(linear(relu(linear(h, mlp[0], mlp[1])), mlp[2], mlp[3])), mlp[4]);
  };
  const Tensor mlp_x = random_tensor({48, 32}, kFloat32, 15).requires_grad_();

  const std::vector<Tensor> conv = {param({8, 3, 3, 3}, 20), param({8}, 21), param({8}, 22, 1.0), param({8}, 23),
                                    param({4, 8, 3, 3}, 24)};
  const Tensor running_mean = zeros({8}), running_var = ones({8});
  auto conv_fn = [&](const Tensor& h) {
    Tensor a = conv2d(h, conv[0], conv[1], {.padding = 1});
    a = relu(batch_norm(a, running_mean, running_var, conv[2], conv[3], /*training=*/true));
    return conv2d(a, conv[4], Tensor(), {.padding = 1});
  };
  const Tensor conv_x = random_tensor({4, 3, 10, 10}, kFloat32, 25).requires_grad_();

  const int64_t B = 2, T = 12, C = 32, H = 4;
  const std::vector<Tensor> tf = {param({3 * C, C}, 30), param({C, C}, 31),   param({4 * C, C}, 32),
                                  param({C, 4 * C}, 33), param({C}, 34, 1.0), param({C}, 35)};
  auto tf_fn = [&](const Tensor& x) {
    const Tensor qkv = linear(layer_norm(x, {C}, tf[4], tf[5]), tf[0]).reshape({B, T, 3, H, C / H});
    auto head = [&](int64_t i) { return qkv.select(2, i).transpose(1, 2); };  // (B, H, T, C / H)
    const Tensor a = scaled_dot_product_attention(head(0), head(1), head(2), Tensor(), /*is_causal=*/true);
    const Tensor x2 = x + linear(a.transpose(1, 2).reshape({B, T, C}), tf[1]);
    return x2 + linear(gelu(linear(layer_norm(x2, {C}), tf[2])), tf[3]);
  };
  const Tensor tf_x = random_tensor({B, T, C}, kFloat32, 36).requires_grad_();

  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
    Tensor x;
    std::vector<Tensor> params;
  };
  for (const Case& c : {Case{"mlp", mlp_fn, mlp_x, mlp}, Case{"conv-bn-relu", conv_fn, conv_x, conv},
                        Case{"transformer", tf_fn, tf_x, tf}}) {
    const auto plain = grads_of(c.f, c.x, c.params, nullptr);
    for (CompressFormat format : kFormats) {
      INFO(std::string(c.name), " ", std::string(autograd::to_string(format)));
      const CompressOptions o = options_for(format);
      autograd::reset_compress_stats();
      const auto packed = grads_of(c.f, c.x, c.params, &o);
      CHECK(autograd::compress_stats().tensors >= 3);
      const double err = relative_error(packed, plain);
      MESSAGE(std::string(c.name), " ", std::string(autograd::to_string(format)), ": relative gradient error ", err);
      CHECK(err > 0.0);
      CHECK(err < (format == CompressFormat::Fp8E4M3 ? 0.0625 : 0.03));
    }
  }
}

TEST_CASE("compress: bytes out are a quarter of float32 bytes in, plus the scales; half of bfloat16's") {
  const Tensor w1 = param({256, 128}, 40), w2 = param({64, 256}, 41);
  auto f = [&](const Tensor& h) { return linear(tanh(linear(h, w1)), w2); };
  for (DType dt : {kFloat32, kBFloat16}) {
    const Tensor x = random_tensor({32, 128}, dt, 42);
    autograd::reset_compress_stats();
    {
      AutocastGuard autocast(kCPU, kBFloat16, dt == kBFloat16);
      Tensor y = autograd::compress(f, x, {.block = 256, .min_bytes = 0});
      sum(y).backward();
    }
    // Saved: x (by linear), tanh's output (by tanh and by the second linear: once), and under
    // autocast the bfloat16 casts of w1 and w2, which stay in the cast cache and are skipped.
    const autograd::CompressStats s = autograd::compress_stats();
    INFO(std::string(dtype_name(dt)));
    CHECK(s.tensors == 2);
    const int64_t elems = 32 * 128 + 32 * 256, esize = int64_t(element_size(dt));
    CHECK(s.bytes_in == elems * esize);
    CHECK(s.bytes_out == elems + 4 * elems / 256);
    CHECK(double(s.bytes_out) / double(s.bytes_in) == doctest::Approx(dt == kFloat32 ? 0.2539 : 0.5078).epsilon(1e-3));
  }
}

TEST_CASE("compress: select by the op that saves, min_bytes, parameters, dedupe, float64 and integers skipped") {
  const Tensor w1 = param({64, 32}, 50), w2 = param({16, 64}, 51);
  const Tensor x = random_tensor({20, 32}, kFloat32, 52);
  auto f = [&](const Tensor& h) { return linear(tanh(linear(h, w1)), w2); };
  std::vector<std::string> asked;
  autograd::reset_compress_stats();
  sum(autograd::compress(f, x,
                         {.min_bytes = 0,
                          .select =
                              [&](std::string_view op) {
                                asked.emplace_back(op);
                                return op == "tanh";
                              }}))
      .backward();
  // linear saves x and w1, tanh its output, linear its input (tanh's output again) and w2: the
  // parameters never reach select; tanh's output is compressed for tanh and again for the
  // second linear, which select declines (so it stays alive in full: select consistently).
  CHECK(asked == std::vector<std::string>{"linear", "tanh", "linear"});
  CHECK(autograd::compress_stats().tensors == 1);

  autograd::reset_compress_stats();
  sum(autograd::compress(f, x, {.min_bytes = 20 * 32 * 4 + 1})).backward();
  CHECK(autograd::compress_stats().tensors == 1);  // x is below min_bytes, tanh's output is not

  // u * u saves u twice: compressed once, both saves share the codes.
  autograd::reset_compress_stats();
  const Tensor a = random_tensor({300}, kFloat32, 53).requires_grad_();
  Tensor y = autograd::compress(
      [](const Tensor& t) {
        const Tensor u = t * 1.0;
        return u * u;
      },
      a, {.min_bytes = 0});
  CHECK(autograd::compress_stats().tensors == 1);
  CHECK(autograd::compress_stats().bytes_in == 300 * 4);
  y.backward(ones({300}));

  // A leaf that requires grad is a parameter: never compressed, whatever saves it.
  autograd::reset_compress_stats();
  sum(autograd::compress([](const Tensor& t) { return t * t; }, a, {.min_bytes = 0})).backward();
  CHECK(autograd::compress_stats().tensors == 0);

  // float64, and the int64 indices a gather saves, stay as they are.
  autograd::reset_compress_stats();
  const Tensor d = random_tensor({300}, kFloat64, 54).requires_grad_();
  const Tensor idx = from_vector<int64_t>(std::vector<int64_t>(100, 3), {100}, TensorOptions(kInt64));
  sum(autograd::compress([&](const Tensor& t) { return gather(t * t, 0, idx); }, d, {.min_bytes = 0})).backward();
  CHECK(autograd::compress_stats().tensors == 0);
}

TEST_CASE("compress: an in-place write after the save still throws, retain_graph unpacks twice") {
  const Tensor w = param({300}, 60);
  Tensor x = random_tensor({300}, kFloat32, 61);
  Tensor y = autograd::compress([&](const Tensor& t) { return t * w; }, x, {.min_bytes = 0});
  add_(x, 1.0);
  check_error([&] { sum(y).backward(); }, {"MulBackward", "modified by an in-place operation"});

  Tensor x2 = random_tensor({300}, kFloat32, 62);
  w.set_grad(Tensor());
  Tensor y2 = autograd::compress([&](const Tensor& t) { return t * w; }, x2, {.min_bytes = 0});
  sum(y2).backward(Tensor(), /*retain_graph=*/true);
  const std::vector<double> once = values_of(w.grad());
  sum(y2).backward();
  const std::vector<double> twice = values_of(w.grad());
  for (size_t i = 0; i < once.size(); ++i) CHECK(twice[i] == 2 * once[i]);
}

TEST_CASE("compress: relu saves a 1-bit mask, its gradients bit for bit the plain ones") {
  const Tensor w = param({64, 48}, 70);
  for (DType dt : {kFloat32, kBFloat16}) {
    const Tensor x = random_tensor({40, 48}, dt, 71).requires_grad_();
    // Only relu selected: everything else is saved as it is, so the gradients must agree bit
    // for bit; nothing else saves relu's output (a product with a number saves nothing).
    auto f = [&](const Tensor& h) { return relu(linear(h, w.to(dt))) * 2.0; };
    const CompressOptions o{.min_bytes = 0, .select = [](std::string_view op) { return op == "relu"; }};
    const auto plain = grads_of(f, x, {w}, nullptr);
    autograd::reset_compress_stats();
    const auto packed = grads_of(f, x, {w}, &o);
    CHECK(packed == plain);
    const autograd::CompressStats s = autograd::compress_stats();
    CHECK(s.tensors == 1);
    CHECK(s.bytes_in == 40 * 64 * int64_t(element_size(dt)));
    CHECK(s.bytes_out == 40 * 64 / 8);
  }
  // A NaN and zeros pass through the mask as through relu's backward.
  const Tensor z = from_vector<float>({0.0f, -0.0f, NAN, 1.0f, -1.0f, 2.0f, 0.0f, 3.0f, -2.0f}, {9}).requires_grad_();
  Tensor y = autograd::compress([](const Tensor& t) { return relu(t * 1.0); }, z, {.min_bytes = 0});
  y.backward(from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {9}));
  const std::vector<double> g = values_of(z.grad());
  CHECK(g[2] == 3.0);
  CHECK(g[3] == 4.0);
  CHECK(g[0] == 0.0);
  CHECK(g[4] == 0.0);
}
