// Selective recompute of cheap outputs on CUDA (Note [Recomputable outputs]): ResNet-18's
// blocks, channels-last float16 under autocast with cuDNN's fused BN+ReLU (and BN+add+ReLU),
// each under recompute_cheap: gradients and running statistics close to the plain run's
// (the recipe regenerates cuDNN's output with frugal's own kernel: rounding differs), and
// the allocator keeps exactly the recipes' outputs less after the forward; batch_norm_apply
// on channels-last float16 against the forward's output; a ViT's GELU and layer norm casts under autocast.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "autograd/autocast.h"
#include "autograd/ops/all.h"
#include "autograd/recompute_cheap.h"
#include "memory/allocator.h"
#include "memory/trace.h"
#include "models/resnet.h"
#include "models/vit.h"
#include "nn/channels_last.h"
#include "nn/init.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tensor/ops/batch_norm.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

int64_t allocations_by(const std::vector<memory::TraceEvent>& events, const char* op) {
  int64_t n = 0;
  for (const memory::TraceEvent& e : events) n += e.action == memory::TraceAction::Alloc && std::strcmp(e.op, op) == 0;
  return n;
}

// max |a - b| / max |b| of two tensors.
double rel_error(const Tensor& got, const Tensor& want) {
  const std::vector<double> a = values_of(got), b = values_of(want);
  REQUIRE(a.size() == b.size());
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i)
    diff = std::max(diff, std::abs(a[i] - b[i])), scale = std::max(scale, std::abs(b[i]));
  return diff / scale;
}

// The worst rel_error over every parameter's gradient, and over every buffer.
std::pair<double, double> worst_errors(const nn::Module& got, const nn::Module& want) {
  double grads = 0, buffers = 0;
  const auto g = got.named_parameters(), w = want.named_parameters();
  REQUIRE(g.size() == w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    REQUIRE_MESSAGE(g[i].second.grad().defined() == w[i].second.grad().defined(), g[i].first);
    if (g[i].second.grad().defined()) grads = std::max(grads, rel_error(g[i].second.grad(), w[i].second.grad()));
  }
  const auto gb = got.named_buffers(), wb = want.named_buffers();
  for (size_t i = 0; i < gb.size(); ++i)
    if (is_floating(gb[i].second.dtype())) buffers = std::max(buffers, rel_error(gb[i].second, wb[i].second));
    else CHECK(values_of(gb[i].second) == values_of(wb[i].second));  // num_batches_tracked: once per step
  return {grads, buffers};
}

// ResNet's forward with every residual block under recompute_cheap (a per-block planner's).
Tensor resnet_forward_cheap(models::ResNet& net, const Tensor& x) {
  Tensor h = net.bn1->forward_relu((*net.conv1)(x));
  if (!net.options.small_input_stem) h = max_pool2d(h, 3, {.stride = 2, .padding = 1});
  for (const auto& layer : {net.layer1, net.layer2, net.layer3, net.layer4})
    for (size_t i = 0; i < layer->size(); ++i) {
      std::shared_ptr<nn::UnaryModule> blk = (*layer)[i];
      h = autograd::recompute_cheap([blk](const Tensor& in) { return (*blk)(in); }, h);
    }
  return (*net.fc)(adaptive_avg_pool2d(h, 1).flatten(1));
}

}  // namespace

TEST_CASE("cuda recompute_cheap: batch_norm_apply regenerates a channels-last float16 BN+add+ReLU output") {
  // cuDNN's persistent NHWC kernels ran the forward; the recipe's kernel reads x in place.
  const Tensor x = to_channels_last(randn({4, 32, 6, 5}).to(kGpu, kFloat16));
  const Tensor r = to_channels_last(randn({4, 32, 6, 5}).to(kGpu, kFloat16));
  const Tensor w = randn({32}).to(kGpu), b = randn({32}).to(kGpu);
  for (bool residual : {false, true}) {
    CAPTURE(residual);
    const ops::BatchNormResult f =
        ops::batch_norm_add_relu(x, residual ? r : Tensor(), Tensor(), Tensor(), w, b, true, 0.1, 1e-5);
    const Tensor y = ops::batch_norm_apply(x, residual ? r : Tensor(), true, f.mean, f.invstd, w, b);
    CHECK(is_channels_last(y));
    // Both round bn(x) (+ r) once from float32: at most one float16 ulp apart.
    const std::vector<double> got = values_of(y), want = values_of(f.out);
    int64_t off = 0;
    for (size_t i = 0; i < got.size(); ++i) off += std::abs(got[i] - want[i]) > 1e-3 * (1 + std::abs(want[i]));
    CHECK(off == 0);
  }
}

TEST_CASE("cuda recompute_cheap: ResNet-18 channels-last float16 under autocast with fused BN+ReLU") {
  models::ResNetOptions o{.num_classes = 4, .in_channels = 3, .small_input_stem = true, .fused_bn_relu = true};
  const int64_t N = 4;
  manual_seed(2);
  auto plain = models::resnet18(o);
  manual_seed(2);
  auto cheap = models::resnet18(o);
  for (auto* m : {plain.get(), cheap.get()}) {
    m->to(kGpu);
    nn::to_channels_last(*m);
  }
  const Tensor x = to_channels_last(randn({N, 3, 16, 16}).to(kGpu));
  const Tensor y = from_vector<int64_t>({1, 3, 0, 2}, {4}).to(kGpu);
  struct Step {
    int64_t kept;
    int64_t recomputed;
  };
  auto step = [&](models::ResNet& net, bool recompute) {
    AutocastGuard amp(kGpu, kFloat16);
    synchronize(kGpu);
    const int64_t before = memory::stats(kGpu).requested_bytes.current;
    const Tensor logits = recompute ? resnet_forward_cheap(net, x) : net.forward(x);
    synchronize(kGpu);
    const int64_t kept = memory::stats(kGpu).requested_bytes.current - before;
    memory::enable_trace(kGpu);
    cross_entropy(logits, y).backward();
    const int64_t recomputed = allocations_by(memory::trace_events(kGpu), "recompute_cheap");
    memory::disable_trace(kGpu);
    return Step{kept, recomputed};
  };
  // A first step of each warms cuDNN's plans and autocast's weight casts; the second is measured.
  for (auto* m : {plain.get(), cheap.get()}) {
    step(*m, m == cheap.get());
    m->zero_grad();
  }
  // Same running statistics before the measured step (the warm-up moved both the same way).
  const auto sd = plain->state_dict();
  cheap->load_state_dict(std::map<std::string, Tensor>(sd.begin(), sd.end()));
  const Step p = step(*plain, false), c = step(*cheap, true);
  // Every block's bn1 output and block output (2 blocks per layer; no residual chain is longer
  // than 3) become recipes: float16, (N, C, H, W) with 64x16x16, 128x8x8, 256x4x4, 512x2x2.
  const int64_t per_layer = N * (64 * 256 + 128 * 64 + 256 * 16 + 512 * 4);
  MESSAGE("kept after forward: plain ", p.kept, " B, recompute_cheap ", c.kept,
          " B; recipes run in backward: ", c.recomputed);
  CHECK(p.kept - c.kept == 2 * 2 * per_layer * 2);
  // Each of the 16 outputs is regenerated at least once, and its savers (its own ReLU mask, the
  // conv after it, a residual recipe) share that regeneration ("Sharing" in the Note): fewer
  // runs than one per saver (2 * 16 - 1 before sharing).
  CHECK(c.recomputed >= 16);
  CHECK(c.recomputed < 2 * 16 - 1);
  CHECK(p.recomputed == 0);
  const auto [grads, buffers] = worst_errors(*cheap, *plain);
  MESSAGE("worst gradient error against the plain run: ", grads, ", running statistics: ", buffers);
  CHECK(grads <= 1e-2);    // cuDNN's output against the recipe's: one float16 rounding apart
  CHECK(buffers <= 1e-6);  // the forward ran once in both: the same batch statistics
}

TEST_CASE("cuda recompute_cheap: ViT under float16 autocast regenerates GELU's output and the layer norm casts") {
  models::ViTConfig c;
  c.image_size = 16, c.patch_size = 4, c.num_layers = 2, c.num_heads = 2, c.hidden_dim = 128, c.mlp_dim = 256;
  c.num_classes = 5;
  manual_seed(1);
  models::VisionTransformer plain(c);
  nn::init::normal_(plain.head->weight, 0.0, 0.5);
  plain.to(kGpu);
  models::VisionTransformer cheap(c);
  cheap.to(kGpu);
  const auto sd = plain.state_dict();
  cheap.load_state_dict(std::map<std::string, Tensor>(sd.begin(), sd.end()));
  const Tensor x = randn({4, 3, 16, 16}).to(kGpu);
  const Tensor y = from_vector<int64_t>({4, 1, 0, 2}, {4}).to(kGpu);
  {
    AutocastGuard amp(kGpu, kFloat16);
    cross_entropy(plain.forward(x), y).backward();
  }
  AutocastGuard amp(kGpu, kFloat16);
  Tensor loss;
  {
    autograd::RecomputeCheapOutputs guard;
    loss = cross_entropy(cheap.forward(x), y);
  }
  memory::enable_trace(kGpu);
  loss.backward();
  const int64_t recomputed = allocations_by(memory::trace_events(kGpu), "recompute_cheap");
  memory::disable_trace(kGpu);
  // Per layer GELU's float16 output (saved by the second MLP linear) and the float16 casts of
  // both layer norms' float32 outputs (saved by the projections after them).
  CHECK(recomputed >= 3 * c.num_layers);
  const auto [grads, buffers] = worst_errors(cheap, plain);
  (void)buffers;
  MESSAGE("worst gradient error against the plain run: ", grads);
  CHECK(grads <=
        2e-3);  // the recipes are the forward's kernels; float16 GEMMs and attention may reduce in other orders
}
