// matmul, mm, bmm and linear on CUDA (cuBLAS, cuBLASLt) against the CPU (Eigen) on the same inputs,
// and linear's weight and bias gradients (the bias-gradient epilogue) against float64.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "autograd/autocast.h"
#include "autograd/ops/matmul.h"
#include "core/stream.h"
#include "tensor/factory.h"
#include "tensor/ops/matmul.h"
#include "tensor/ops/reduce.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

constexpr DType kFloatTypes[] = {kFloat32, kFloat16, kBFloat16, kFloat64};

// Both backends accumulate in float32 (float64 for float64) in different orders and
// round once: they may differ by the output rounding plus a sqrt(K)-sized sum error.
double atol_for(DType t, int64_t K) { return default_rtol(t) * std::sqrt(double(std::max<int64_t>(K, 1))); }

void check_vs_cpu(const Tensor& a, const Tensor& b, const std::string& what) {
  const Tensor out = ops::matmul(a, b);
  CHECK(out.device() == a.device());
  const Tensor expected = ops::matmul(a.cpu(), b.cpu());
  REQUIRE_MESSAGE(out.sizes() == expected.sizes(), what);
  CHECK(out.dtype() == a.dtype());
  check_close(out, values_of(expected), default_rtol(a.dtype()), atol_for(a.dtype(), a.size(-1)), what);
}

void check_shapes(const Shape& sa, const Shape& sb, uint64_t seed) {
  for (DType t : kFloatTypes)
    for (Layout la : kAllLayouts)
      for (Layout lb : kAllLayouts) {
        const Tensor a = random_tensor(sa, {t, cuda()}, seed, la), b = random_tensor(sb, {t, cuda()}, seed + 1, lb);
        check_vs_cpu(a, b,
                     detail::str_cat(dtype_name(t), " ", shape_str(sa), " ", layout_name(la), " @ ", shape_str(sb), " ",
                                     layout_name(lb)));
      }
}

// Largest |x - ref| / sum_k |a_mk b_kn| of a float32 product against float64 on the CPU.
double relative_error_f32(const Tensor& out, const Tensor& a, const Tensor& b) {
  const Tensor ref = ops::matmul(a.cpu().to(kFloat64), b.cpu().to(kFloat64));
  const auto va = values_of(a), vb = values_of(b), vr = values_of(ref), vo = values_of(out);
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  double worst = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += std::fabs(va[size_t(m * K + k)] * vb[size_t(k * N + n)]);
      worst = std::max(worst, std::fabs(vo[size_t(m * N + n)] - vr[size_t(m * N + n)]) / s);
    }
  return worst;
}

}  // namespace

TEST_CASE("cuda matmul: 1-D, 2-D and mixed operands match the CPU") {
  check_shapes({7}, {7}, 1);
  check_shapes({5}, {5, 3}, 2);
  check_shapes({4, 5}, {5}, 3);
  check_shapes({13, 17}, {17, 11}, 4);
  check_shapes({1, 9}, {9, 1}, 5);
  check_shapes({6, 1}, {1, 5}, 6);
  for (DType t : kFloatTypes) {  // large enough for tensor-core tiles and split-K
    const Tensor a = random_tensor({200, 1000}, {t, cuda()}, 7, Layout::Transposed);
    const Tensor b = random_tensor({1000, 96}, {t, cuda()}, 8);
    check_vs_cpu(a, b, detail::str_cat(dtype_name(t), " 200x1000x96"));
  }
}

TEST_CASE("cuda matmul: broadcast batches, strided and permuted operands") {
  check_shapes({2, 1, 5, 6}, {1, 3, 6, 4}, 10);  // (B, 1, M, K) @ (1, H, K, N): not one stride, copied
  check_shapes({3, 5, 6}, {6, 4}, 11);           // folded into M
  check_shapes({5, 6}, {2, 3, 6, 4}, 12);        // stride-0 batch
  check_shapes({6}, {2, 6, 4}, 13);
  check_shapes({2, 5, 6}, {6}, 14);
  check_shapes({3, 4, 5}, {3, 5, 2}, 15);
  for (DType t : kFloatTypes) {
    const Tensor q = random_tensor({2, 33, 4, 16}, {t, cuda()}, 16).permute({0, 2, 1, 3});  // (B, H, T, D)
    const Tensor k = random_tensor({2, 33, 4, 16}, {t, cuda()}, 17).permute({0, 2, 3, 1});  // (B, H, D, T)
    check_vs_cpu(q, k, detail::str_cat(dtype_name(t), " attention scores"));
    const Tensor row = random_tensor({1, 6}, {t, cuda()}, 18).expand({4, 6});
    check_vs_cpu(row, random_tensor({6, 3}, {t, cuda()}, 19), detail::str_cat(dtype_name(t), " expanded row"));
    const Tensor stepped = random_tensor({6, 4, 5}, {t, cuda()}, 20).slice(0, 0, 6, 2);
    check_vs_cpu(stepped, random_tensor({3, 5, 2}, {t, cuda()}, 21, Layout::Transposed),
                 detail::str_cat(dtype_name(t), " batch step"));
  }
}

TEST_CASE("cuda matmul: mm, bmm, empty and K == 0") {
  for (DType t : kFloatTypes) {
    const Tensor a = random_tensor({6, 9}, {t, cuda()}, 30, Layout::Transposed);
    const Tensor b = random_tensor({9, 4}, {t, cuda()}, 31);
    check_close(ops::mm(a, b), values_of(ops::mm(a.cpu(), b.cpu())), default_rtol(t), atol_for(t, 9), "mm");
    const Tensor x = random_tensor({70000, 2, 3}, {t, cuda()}, 32), y = random_tensor({70000, 3, 2}, {t, cuda()}, 33);
    check_close(ops::bmm(x, y), values_of(ops::bmm(x.cpu(), y.cpu())), default_rtol(t), atol_for(t, 3),
                "bmm over more than 65535 batches");
    const Tensor z = ops::matmul(empty({3, 0}, {t, cuda()}), empty({0, 4}, {t, cuda()}));
    check_close(z, std::vector<double>(12, 0.0), 0, 0, "K == 0");
    CHECK(ops::matmul(empty({0, 5}, {t, cuda()}), random_tensor({5, 4}, {t, cuda()}, 34)).sizes() == Shape{0, 4});
  }
}

TEST_CASE("cuda matmul: 16-bit products accumulate in float32") {
  for (DType t : {kFloat16, kBFloat16}) {
    // 8192 ones: a float16 accumulator stalls at 2048, a bfloat16 one at 256.
    CHECK(ops::matmul(ones({1, 8192}, {t, cuda()}), ones({8192, 1}, {t, cuda()})).item<double>() == 8192.0);
    CHECK(ops::matmul(ones({3, 8192}, {t, cuda()}), ones({8192, 2}, {t, cuda()})).cpu().tolist<double>() ==
          std::vector<double>(6, 8192.0));
    // Long sums of random values agree with the CPU's float32 accumulation to the output rounding.
    const Tensor a = random_tensor({8, 16384}, {t, cuda()}, 35), b = random_tensor({16384, 8}, {t, cuda()}, 36);
    check_vs_cpu(a, b, detail::str_cat(dtype_name(t), " K=16384"));
  }
}

TEST_CASE("cuda linear: with and without bias, cuBLASLt epilogue and beta = 1 paths") {
  // (M, K, N): the first two take the bias epilogue, M == 1 and K == 1 the beta = 1 path.
  const Shape shapes[][2] = {{{4, 8, 16}, {24, 16}}, {{64, 128}, {96, 128}}, {{1, 16}, {8, 16}}, {{5, 1}, {3, 1}}};
  for (DType t : kFloatTypes)
    for (const auto& s : shapes)
      for (Layout lw : {Layout::Contiguous, Layout::Transposed})
        for (bool with_bias : {true, false}) {
          const Tensor x = random_tensor(s[0], {t, cuda()}, 40), w = random_tensor(s[1], {t, cuda()}, 41, lw);
          const Tensor bias = with_bias ? random_tensor({s[1][0]}, {t, cuda()}, 42) : Tensor();
          const Tensor y = ops::linear(x, w, bias);
          const Tensor expected = ops::linear(x.cpu(), w.cpu(), with_bias ? bias.cpu() : Tensor());
          REQUIRE(y.sizes() == expected.sizes());
          check_close(y, values_of(expected), default_rtol(t), atol_for(t, x.size(-1)),
                      detail::str_cat(dtype_name(t), " x ", shape_str(s[0]), " w ", shape_str(s[1]), " ",
                                      layout_name(lw), with_bias ? " with bias" : " without bias"));
        }
  // A bias at an odd address (a narrowed view) still works, by either path.
  const Tensor x = random_tensor({32, 64}, {kFloat16, cuda()}, 43), w = random_tensor({48, 64}, {kFloat16, cuda()}, 44);
  const Tensor bias = random_tensor({49}, {kFloat16, cuda()}, 45).narrow(0, 1, 48);
  check_close(ops::linear(x, w, bias), values_of(ops::linear(x.cpu(), w.cpu(), bias.cpu())), 2e-3,
              atol_for(kFloat16, 64), "misaligned bias");
}

// One unit in the last place of |v| in a 16-bit type (the subnormal spacing below its range).
double ulp_of(double v, DType t) {
  const int mantissa = t == kBFloat16 ? 7 : 10, min_exp = t == kBFloat16 ? -126 : -14;
  const int e = v == 0.0 ? min_exp : std::max(int(std::floor(std::log2(std::fabs(v)))), min_exp);
  return std::ldexp(1.0, e - mantissa);
}

TEST_CASE("cuda linear: the bias is added before the one rounding to 16 bits, at any bias address") {
  // bias ~ -(x @ w^T): outputs are small while the products are O(1), so a bias added
  // after x @ w^T was rounded (an error of half an ulp of the product) is far outside
  // one ulp of the output. The bias at element offsets 0..3 covers every alignment.
  const int64_t M = 36, K = 56, N = 55;
  for (DType t : {kFloat16, kBFloat16})
    for (int64_t offset : {0, 1, 2, 3})
      for (int64_t rows : {M, int64_t(1)}) {  // M == 1 takes the beta = 1 path
        const Tensor x = random_tensor({rows, K}, {t, cuda()}, 50), w = random_tensor({N, K}, {t, cuda()}, 51);
        const std::vector<double> xv = values_of(x), wv = values_of(w), noise = random_values(N, 52, -0.01, 0.01);
        std::vector<double> bias_values(size_t(N + offset), 0.0), bound(size_t(rows * N));
        for (int64_t j = 0; j < N; ++j) {
          double product = 0.0;
          for (int64_t k = 0; k < K; ++k) product += xv[size_t(k)] * wv[size_t(j * K + k)];
          bias_values[size_t(offset + j)] = noise[size_t(j)] - product;
        }
        const Tensor bias = make_tensor(bias_values, {N + offset}, {t, cuda()}).narrow(0, offset, N);
        const std::vector<double> bv = values_of(bias);
        std::vector<double> expected(size_t(rows * N));
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double sum = bv[size_t(j)], magnitude = std::fabs(bv[size_t(j)]);
            for (int64_t k = 0; k < K; ++k) {
              sum += xv[size_t(i * K + k)] * wv[size_t(j * K + k)];
              magnitude += std::fabs(xv[size_t(i * K + k)] * wv[size_t(j * K + k)]);
            }
            expected[size_t(i * N + j)] = sum;  // float32 sums, then one rounding
            bound[size_t(i * N + j)] = ulp_of(sum, t) + double(K + 1) * 0x1p-24 * magnitude;
          }
        const std::vector<double> got = values_of(ops::linear(x, w, bias));
        int64_t bad = 0;
        double worst = 0.0;
        for (size_t i = 0; i < got.size(); ++i) {
          const double err = std::fabs(got[i] - expected[i]);
          bad += err > bound[i];
          worst = std::max(worst, err / bound[i]);
        }
        CHECK_MESSAGE(bad == 0, std::string(dtype_name(t)), " rows ", rows, " bias offset ", offset, ": ", bad, " of ",
                      got.size(), " outputs off; worst error ", worst, " x the bound");
      }
}

namespace {
/// The largest error a float32 sum of `terms` values whose magnitudes add up to `magnitude` may carry.
double float32_sum_error(int64_t terms, double magnitude) { return double(terms) * 0x1p-24 * magnitude; }
}  // namespace

TEST_CASE("cuda linear backward: weight and bias gradients from one GEMM, with and without autocast") {
  // Note [Bias gradient epilogue]: for (M, 24) inputs and a (40, 24) weight the bias gradient
  // comes out of the weight gradient's GEMM (CUBLASLT_EPILOGUE_BGRADB); with M = 1 it does not
  // apply, and LinearBackward runs mm and sum. Either way: float64 on the CPU, from the values
  // the GEMM saw (under autocast, x rounded to the low dtype).
  struct Case {
    Shape x;
    Layout layout;
    bool fused;
  };
  const int64_t in = 24, out = 40;
  const Case cases[] = {{{37, in}, Layout::Contiguous, true},
                        {{2, 5, in}, Layout::Contiguous, true},
                        {{37, in}, Layout::Transposed, true},  // x column-major: cuBLAS's A transposed
                        {{1, in}, Layout::Contiguous, false}};
  for (DType t : {kFloat32, kFloat16, kBFloat16})
    for (bool amp : {false, true}) {
      if (amp && t == kFloat32) continue;  // autocast lowers to 16 bits only
      const DType leaf = amp ? kFloat32 : t;
      // Note [Weight gradients in the master dtype]: under autocast the weight gradient is the
      // GEMM's float32 output; the bias gradient a sum in t, widened by the cast's backward.
      const DType w_dtype = amp ? kFloat32 : t;
      for (const Case& c : cases) {
        const std::string what =
            detail::str_cat(dtype_name(t), amp ? " autocast" : "", " x ", shape_str(c.x), " ", layout_name(c.layout));
        CAPTURE(what);
        const Tensor x = random_tensor(c.x, {leaf, cuda()}, 70, c.layout);
        const Tensor w = random_tensor({out, in}, {leaf, cuda()}, 71), b = random_tensor({out}, {leaf, cuda()}, 72);
        w.requires_grad_(), b.requires_grad_();
        Shape y_shape = c.x;
        y_shape.back() = out;
        const Tensor g = random_tensor(y_shape, {t, cuda()}, 73);
        Tensor y;
        {
          AutocastGuard guard(cuda(), t, amp);
          y = linear(x, w, b);
        }
        REQUIRE(y.dtype() == t);
        y.backward(g);
        REQUIRE(w.grad().dtype() == leaf);
        REQUIRE(b.grad().dtype() == leaf);

        const Tensor x2 = x.to(t).reshape({-1, in}), g2 = g.reshape({-1, out});  // what LinearBackward sees
        const int64_t M = x2.size(0);
        const std::vector<double> xv = values_of(x2), gv = values_of(g2);
        std::vector<double> w_ref(size_t(out * in), 0.0), b_ref(size_t(out), 0.0), b_bound(size_t(out), 0.0);
        for (int64_t n = 0; n < out; ++n) {
          double magnitude = 0.0;
          for (int64_t m = 0; m < M; ++m) {
            b_ref[size_t(n)] += gv[size_t(m * out + n)];
            magnitude += std::fabs(gv[size_t(m * out + n)]);
            for (int64_t k = 0; k < in; ++k)
              w_ref[size_t(n * in + k)] += gv[size_t(m * out + n)] * xv[size_t(m * in + k)];
          }
          // float32 sums rounded once to t: one ulp of t at most, beyond the float32 sum's error.
          b_bound[size_t(n)] = (t == kFloat32 ? 0.0 : ulp_of(b_ref[size_t(n)], t)) + float32_sum_error(M, magnitude);
        }
        check_close(w.grad(), w_ref, default_rtol(w_dtype), atol_for(w_dtype, M), what + ": weight gradient");
        const std::vector<double> bias_grad = values_of(b.grad()), summed = values_of(ops::sum(g2, {0}));
        for (int64_t n = 0; n < out; ++n) {
          CAPTURE(n);
          CHECK(std::fabs(bias_grad[size_t(n)] - b_ref[size_t(n)]) <= b_bound[size_t(n)]);
          CHECK(std::fabs(bias_grad[size_t(n)] - summed[size_t(n)]) <= 2 * b_bound[size_t(n)]);  // ops::sum's
        }

        // The fused op ran (its results are the gradients, bit for bit), or declined for M = 1.
        const ops::LinearWeightBiasGrads fused = ops::linear_backward_weight_bias(g2, x2, w_dtype);
        CHECK(fused.weight.defined() == c.fused);
        CHECK(fused.bias.defined() == c.fused);
        if (fused.weight.defined()) {
          CHECK(fused.weight.dtype() == w_dtype);
          CHECK(fused.bias.dtype() == t);
          CHECK(values_of(fused.weight) == values_of(w.grad()));
          CHECK(values_of(fused.bias) == bias_grad);
        }
      }
    }
  // The CPU keeps mm and sum: the fused op declines there.
  const Tensor g = random_tensor({37, out}, kFloat32, 74), x = random_tensor({37, in}, kFloat32, 75);
  CHECK_FALSE(ops::linear_backward_weight_bias(g, x, kFloat32).weight.defined());
}

TEST_CASE("cuda linear backward: the epilogue's bias gradient is a float32 sum of the unrounded values") {
  const int64_t M = 4096, in = 24, out = 40;
  // 16 bits: 2048 ones and 2048 values of 2^-6 sum to 2080 exactly in float32 (a value both
  // 16-bit types hold), while a 16-bit accumulator drops the 2^-6 terms once it passes 64
  // (float16) or 8 (bfloat16), and a float16 one stalls at 2048.
  for (DType t : {kFloat16, kBFloat16}) {
    CAPTURE(dtype_name(t));
    std::vector<double> gv(size_t(M * out));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < out; ++n) gv[size_t(m * out + n)] = m % 2 == 0 ? 1.0 : 0x1p-6;
    const Tensor g = make_tensor(gv, {M, out}, {t, cuda()}), x = random_tensor({M, in}, {t, cuda()}, 80);
    const ops::LinearWeightBiasGrads fused = ops::linear_backward_weight_bias(g, x, t);
    REQUIRE(fused.bias.defined());
    CHECK(values_of(fused.bias) == std::vector<double>(size_t(out), 2080.0));
  }
  // float32 under TF32: g = 1 + 2^-12 rounds to 1 in TF32's 10-bit mantissa; the bias
  // gradient still sums the float32 values (64 + 2^-6), as ops::sum does, though the
  // product itself may use TF32.
  const Tensor g = full({64, out}, 1.0 + 0x1p-12, {kFloat32, cuda()}),
               x = random_tensor({64, in}, {kFloat32, cuda()}, 81);
  ops::set_allow_tf32(true);
  const ops::LinearWeightBiasGrads fused = ops::linear_backward_weight_bias(g, x, kFloat32);
  ops::set_allow_tf32(false);
  REQUIRE(fused.bias.defined());
  CHECK(values_of(fused.bias) == std::vector<double>(size_t(out), 64.0 + 0x1p-6));
}

TEST_CASE("cuda matmul: float32 is float32-accurate unless TF32 is allowed") {
  const Tensor a = random_tensor({256, 2048}, {kFloat32, cuda()}, 50),
               b = random_tensor({2048, 256}, {kFloat32, cuda()}, 51);
  REQUIRE_FALSE(ops::allow_tf32());
  const double fp32 = relative_error_f32(ops::matmul(a, b), a, b);
  CHECK(fp32 < 1e-5);  // float32 rounding (2^-24) times a small multiple; TF32 gives ~1e-3
  ops::set_allow_tf32(true);
  const double tf32 = relative_error_f32(ops::matmul(a, b), a, b);
  ops::set_allow_tf32(false);
  CHECK(tf32 < 4e-3);  // 10-bit mantissa inputs
  CHECK(tf32 > fp32);  // the switch reaches cuBLAS
  // linear's cuBLASLt path (a bias epilogue) is float32-accurate as well.
  const Tensor zero_bias = zeros({256}, {kFloat32, cuda()});
  const double lin = relative_error_f32(ops::linear(a, b.t().contiguous(), zero_bias), a, b);
  CHECK(lin < 1e-5);
}

TEST_CASE("cuda matmul: runs on the current stream, and is capturable in a CUDA graph") {
  // Captured on a non-blocking stream, the product lands in the graph only if cuBLAS
  // was bound to that stream (work sent to another stream would run at once instead).
  const Tensor a = random_tensor({64, 96}, {kFloat32, cuda()}, 60), b = random_tensor({96, 48}, {kFloat32, cuda()}, 61);
  const Tensor w = random_tensor({48, 96}, {kFloat32, cuda()}, 62), bias = random_tensor({48}, {kFloat32, cuda()}, 63);
  synchronize(cuda());
  cudaStream_t raw = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking) == cudaSuccess);
  const Stream before = current_stream(cuda());
  {
    StreamGuard guard(Stream{raw, cuda()});
    ops::matmul(a, b), ops::linear(a, w, bias);  // warm up: workspace and output blocks for this stream
    REQUIRE(cudaStreamSynchronize(raw) == cudaSuccess);
    cudaGraph_t graph = nullptr;
    REQUIRE(cudaStreamBeginCapture(raw, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    const Tensor out = ops::matmul(a, b), lin = ops::linear(a, w, bias);
    REQUIRE(cudaStreamEndCapture(raw, &graph) == cudaSuccess);
    size_t nodes = 0;
    REQUIRE(cudaGraphGetNodes(graph, nullptr, &nodes) == cudaSuccess);
    CHECK(nodes >= 2);
    cudaGraphExec_t exec = nullptr;
    REQUIRE(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    REQUIRE(cudaGraphLaunch(exec, raw) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(raw) == cudaSuccess);
    check_close(out, values_of(ops::matmul(a.cpu(), b.cpu())), 1e-5, atol_for(kFloat32, 96), "captured matmul");
    check_close(lin, values_of(ops::linear(a.cpu(), w.cpu(), bias.cpu())), 1e-5, atol_for(kFloat32, 96),
                "captured linear");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  CHECK(current_stream(cuda()) == before);
  synchronize(cuda());
  cudaStreamDestroy(raw);
}

TEST_CASE("cuda matmul: device mismatch and unsupported dtypes are errors") {
  const Tensor g = zeros({2, 3}, {kFloat32, cuda()}), c = zeros({3, 2});
  check_error([&] { ops::matmul(g, c); }, {"matmul", "cuda:0", "cpu", "one device"});
  check_error([&] { ops::mm(c, g.t()); }, {"mm", "cuda:0", "cpu"});
  check_error([&] { ops::linear(g, zeros({4, 3}), Tensor()); }, {"linear", "cuda:0", "cpu"});
  check_error([&] { ops::linear(g, zeros({4, 3}, {kFloat32, cuda()}), zeros({4})); }, {"linear", "cuda:0", "cpu"});
  check_error(
      [&] {
        ops::matmul(zeros({2, 2}, {kInt32, cuda()}), zeros({2, 2}, {kInt32, cuda()}));
      },
      {"matmul", "not implemented for int32 on cuda:0"});
}
