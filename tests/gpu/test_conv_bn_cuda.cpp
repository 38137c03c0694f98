// The fused convolution + batch-norm graphs on CUDA (Note [Convolution batch-norm fusion]):
// conv2d_stats and scale_bias_relu_conv2d against the CPU in float64 (outputs and sums), the
// differentiable bn_relu_conv2d against conv2d, batch_norm_relu and conv2d composed (values,
// running statistics, every gradient) in float16 and bfloat16 channels-last, at ResNet-50's
// layer shapes and odd ones, training and eval; and a ResNet with fused_conv_bn against the
// same network with fused_bn_relu through a mixed-precision training step.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/ops/batch_norm.h"
#include "autograd/ops/conv.h"
#include "autograd/ops/conv_bn.h"
#include "autograd/ops/loss.h"
#include "models/resnet.h"
#include "nn/channels_last.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/binary.h"
#include "tensor/ops/conv.h"
#include "tensor/ops/conv_bn.h"
#include "tensor/ops/unary.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

/// One convolution: x (N, C, H, W), weight (K, C, R, R).
struct Layer {
  int64_t N, C, H, W, K, R, stride;
  Conv2dOptions options() const { return {.stride = stride, .padding = R / 2}; }
};

const Layer kLayers[] = {
    {4, 64, 14, 14, 64, 3, 1},   // layer1's 3x3, smaller image
    {2, 256, 14, 14, 64, 1, 1},  // a bottleneck's reduce
    {3, 64, 15, 13, 128, 3, 2},  // strided, odd sizes
    {2, 512, 7, 7, 2048, 1, 1},  // layer4's expand
    {5, 8, 9, 11, 16, 3, 1},     // few channels
};

Tensor on_gpu(const Tensor& t, DType dt) { return to_channels_last(t.to(kGpu, dt)); }

/// ||a - e|| / ||e|| in float64.
double rel_l2(const Tensor& a, const Tensor& e) {
  const std::vector<double> av = values_of(a), ev = values_of(e);
  REQUIRE(av.size() == ev.size());
  double d = 0, n = 0;
  for (size_t i = 0; i < av.size(); ++i) d += (av[i] - ev[i]) * (av[i] - ev[i]), n += ev[i] * ev[i];
  return std::sqrt(d / std::max(n, 1e-300));
}

}  // namespace

TEST_CASE("cuda conv_bn: the fused graphs match the CPU in float64") {
  for (DType dt : {kFloat16, kBFloat16})
    for (const Layer& l : kLayers) {
      CAPTURE(dtype_name(dt));
      CAPTURE(shape_str({l.N, l.C, l.H, l.W, l.K, l.R, l.stride}));
      const Tensor x = random_tensor({l.N, l.C, l.H, l.W}, kFloat64, 1, {}, -1.0, 2.0);
      const Tensor w = random_tensor({l.K, l.C, l.R, l.R}, kFloat64, 2, {}, -0.1, 0.1);
      // Values float16 holds exactly: the fused prologue takes them in the data type.
      const Tensor scale = random_tensor({l.C}, kFloat16, 3, {}, 0.5, 1.5).to(kFloat32),
                   shift = random_tensor({l.C}, kFloat16, 4).to(kFloat32);
      const Tensor xg = on_gpu(x, dt), wg = on_gpu(w, dt);
      // The CPU reference from the same rounded values, in float64.
      const Tensor x64 = xg.to(kCPU, kFloat64), w64 = wg.to(kCPU, kFloat64);

      const int64_t runs = ops::cuda::conv_bn_graph_runs();
      const ops::ConvStats r = ops::conv2d_stats(xg, wg, l.options());
      CHECK(ops::cuda::conv_bn_graph_runs() == runs + 1);  // the fused graph ran
      const Tensor y64 = ops::conv2d(x64, w64, Tensor(), l.options());
      CHECK(suggests_channels_last(r.out));
      check_norm_close(r.out, y64, rtol_for(dt) * 2, "conv2d_stats out");
      // The sums of what was stored, against float64 sums of the same values: float32 accumulation.
      const ops::ConvStats ref = ops::channel_sums(r.out.to(kCPU, kFloat64));
      check_norm_close(r.sum, ref.sum, 3e-4, "conv2d_stats sum");
      check_norm_close(r.sq_sum, ref.sq_sum, 3e-4, "conv2d_stats sq_sum");

      const ops::ConvStats z = ops::scale_bias_relu_conv2d(xg, scale.to(kGpu), shift.to(kGpu), wg, l.options());
      CHECK(ops::cuda::conv_bn_graph_runs() == runs + 2);
      const Tensor a64 = ops::relu(
          ops::add(ops::mul(x64, scale.to(kFloat64).view({1, l.C, 1, 1})), shift.to(kFloat64).view({1, l.C, 1, 1})));
      // cuDNN rounds the prologue's output to the data type before the tensor cores.
      const Tensor z64 = ops::conv2d(a64.to(dt).to(kFloat64), w64, Tensor(), l.options());
      check_norm_close(z.out, z64, rtol_for(dt) * 2, "scale_bias_relu_conv2d out");
      const ops::ConvStats zref = ops::channel_sums(z.out.to(kCPU, kFloat64));
      check_norm_close(z.sum, zref.sum, 3e-4, "scale_bias_relu_conv2d sum");
      check_norm_close(z.sq_sum, zref.sq_sum, 3e-4, "scale_bias_relu_conv2d sq_sum");
    }
}

TEST_CASE("cuda conv_bn: bn_relu_conv2d matches the composed ops, training and eval, every gradient") {
  uint64_t seed = 100;
  for (DType dt : {kFloat16, kBFloat16})
    for (bool training : {true, false})
      for (const Layer& l : {kLayers[0], kLayers[2], kLayers[4]}) {
        CAPTURE(dtype_name(dt));
        CAPTURE(training);
        CAPTURE(shape_str({l.N, l.C, l.H, l.W, l.K, l.R, l.stride}));
        const int64_t C1 = l.C / 2;  // x (N, C1) -> conv1 1x1 -> (N, C) -> bn, relu -> conv2 -> (N, K)
        const Tensor x = random_tensor({l.N, C1, l.H, l.W}, kFloat64, ++seed);
        const Tensor w1 = random_tensor({l.C, C1, 1, 1}, kFloat64, ++seed, {}, -0.3, 0.3);
        const Tensor w2 = random_tensor({l.K, l.C, l.R, l.R}, kFloat64, ++seed, {}, -0.1, 0.1);
        const Tensor gamma = random_tensor({l.C}, kFloat32, ++seed, {}, 0.5, 1.5);
        const Tensor beta = random_tensor({l.C}, kFloat32, ++seed, {}, -0.5, 0.5);
        const Tensor rm = random_tensor({l.C}, kFloat32, ++seed),
                     rv = random_tensor({l.C}, kFloat32, ++seed, {}, 0.5, 2);
        const Conv2dOptions o2 = l.options();
        // Each run gets fresh leaves and running statistics on its device, in its dtype.
        auto run = [&](bool fused, DType t, Device d) {
          std::vector<Tensor> leaves;
          for (const Tensor& v : {x, w1, w2}) leaves.push_back(on_gpu(v, t).to(d).requires_grad_());
          const DType st = t == kFloat64 ? kFloat64 : kFloat32;  // float32 parameters for 16-bit x
          Tensor g = gamma.to(d, st).requires_grad_(), b = beta.to(d, st).requires_grad_();
          Tensor m = rm.to(d, st), v = rv.to(d, st);
          Tensor out;
          if (fused) {
            out = bn_relu_conv2d(conv2d_stats(leaves[0], leaves[1]), {m, v, g, b, training, 0.1, 1e-5}, leaves[2], o2)
                      .out;
          } else {
            out = conv2d(batch_norm_relu(conv2d(leaves[0], leaves[1]), m, v, g, b, training, 0.1, 1e-5), leaves[2],
                         Tensor(), o2);
          }
          const Tensor gy = random_tensor(out.sizes(), kFloat64, 999).to(d, t);
          out.backward(gy);
          return std::vector<Tensor>{out, leaves[0].grad(), leaves[1].grad(), leaves[2].grad(), g.grad(), b.grad(), m,
                                     v};
        };
        const std::vector<Tensor> fused = run(true, dt, kGpu), composed = run(false, dt, kGpu),
                                  exact = run(false, kFloat64, kCPU);
        const char* names[] = {"out",        "grad x",    "grad w1",      "grad w2",
                               "grad gamma", "grad beta", "running_mean", "running_var"};
        for (size_t i = 0; i < fused.size(); ++i) {
          // The fused op is about as close to float64 as the composed ops are, in the relative
          // 2-norm (a max-norm would count the few ReLU masks that rounding flips, on either
          // side). In float16 the fused op's scale and shift are rounded to float16 (Note
          // [Convolution batch-norm fusion]): ReLU's mask flips where |x scale + shift| is within
          // 2^-12 of its terms, and a gradient passed or stopped there is a whole entry, so the
          // 2-norm error grows as the square root of that fraction: up to 3 roundings here
          // (measured on the H200: 0.0063 and 0.0083 for grad x and grad w1 at C = 8, against
          // 0.0005 composed; the other layers and every other result within 2 ec + 1 rounding).
          const double ef = rel_l2(fused[i], exact[i]), ec = rel_l2(composed[i], exact[i]);
          CHECK_MESSAGE(ef <= 2 * ec + 3 * rtol_for(dt), std::string(names[i]), ": fused error ", ef,
                        ", composed error ", ec);
          CHECK_MESSAGE(ec <= 10 * rtol_for(dt), std::string(names[i]), ": composed error ", ec);
        }
        CHECK(suggests_channels_last(fused[1]));
      }
}

TEST_CASE("cuda conv_bn: ResNet with fused_conv_bn trains as accurately as with fused_bn_relu (AMP)") {
  // Both mixed-precision networks against the same one in float32: loss, every gradient and
  // running statistic after one step. Batch norm's backward amplifies roundings by
  // 1 / sqrt(var), so the bound is relative: the fused network's error at most twice the
  // unfused one's (plus a float16 rounding).
  for (models::BlockType type : {models::BlockType::Basic, models::BlockType::Bottleneck}) {
    CAPTURE(type == models::BlockType::Basic ? "Basic" : "Bottleneck");
    models::ResNetOptions o{.num_classes = 10, .in_channels = 3, .small_input_stem = true, .fused_bn_relu = true};
    manual_seed(5);
    auto reference = std::make_shared<models::ResNet>(type, std::array<int64_t, 4>{2, 1, 1, 1}, o);
    const auto sd = reference->state_dict();
    auto plain = std::make_shared<models::ResNet>(type, std::array<int64_t, 4>{2, 1, 1, 1}, o);
    o.fused_conv_bn = true;
    auto fused = std::make_shared<models::ResNet>(type, std::array<int64_t, 4>{2, 1, 1, 1}, o);
    for (auto* m : {reference.get(), plain.get(), fused.get()}) {
      m->load_state_dict(std::map<std::string, Tensor>(sd.begin(), sd.end()));
      m->to(kGpu);
      nn::to_channels_last(*m);
    }
    const Tensor x = to_channels_last(random_tensor({32, 3, 32, 32}, kFloat32, 7).to(kGpu));
    const Tensor y = randint(0, 10, {32}, TensorOptions(kInt64, kGpu));
    const int64_t runs = ops::cuda::conv_bn_graph_runs();
    Tensor losses[3];
    for (int i = 0; i < 3; ++i) {
      AutocastGuard amp(kGpu, kFloat16, i > 0);
      losses[i] = cross_entropy((i == 0 ? reference : i == 1 ? plain : fused)->forward(x), y);
      losses[i].backward();
    }
    CHECK(ops::cuda::conv_bn_graph_runs() > runs);  // the fused graphs ran
    auto error = [](const Tensor& a, const Tensor& e) {
      const std::vector<double> av = values_of(a), ev = values_of(e);
      double d = 0, m = 0;
      for (size_t i = 0; i < av.size(); ++i)
        d = std::max(d, std::fabs(av[i] - ev[i])), m = std::max(m, std::fabs(ev[i]));
      return d / std::max(m, 1e-30);
    };
    auto check_as_accurate = [&](const Tensor& f, const Tensor& p, const Tensor& r, const std::string& what) {
      const double ef = error(f, r), ep = error(p, r);
      CHECK_MESSAGE(ef <= 2 * ep + 1e-3, what, ": fused error ", ef, ", unfused error ", ep);
    };
    check_as_accurate(losses[2], losses[1], losses[0], "loss");
    const auto rp = reference->named_parameters(), pp = plain->named_parameters(), fp = fused->named_parameters();
    REQUIRE(rp.size() == fp.size());
    for (size_t i = 0; i < rp.size(); ++i)
      check_as_accurate(fp[i].second.grad(), pp[i].second.grad(), rp[i].second.grad(), "grad " + rp[i].first);
    const auto rb = reference->named_buffers(), pb = plain->named_buffers(), fb = fused->named_buffers();
    for (size_t i = 0; i < rb.size(); ++i)
      if (rb[i].second.is_floating_point())
        check_as_accurate(fb[i].second, pb[i].second, rb[i].second, "buffer " + rb[i].first);
  }
}
