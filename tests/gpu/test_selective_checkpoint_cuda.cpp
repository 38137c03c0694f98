// Selective checkpointing on CUDA (Note [Selective checkpoint]): the small ViT under float16
// autocast (its attention on the fused flash kernels, with dropout) and the small ResNet
// channels-last with cuDNN's fused BN+ReLU give the plain run's gradients with either
// policy, and the allocator's trace shows that the selective recompute runs no linear,
// flash_attention or conv2d while the full one does.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "autograd/autocast.h"
#include "autograd/checkpoint.h"
#include "autograd/ops/all.h"
#include "memory/trace.h"
#include "models/resnet.h"
#include "models/vit.h"
#include "nn/channels_last.h"
#include "nn/init.h"
#include "tensor/factory.h"
#include "tensor/memory_format.h"
#include "tests/gpu/compare_devices.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;

namespace {

using Policy = std::optional<autograd::CheckpointPolicy>;  // nullopt: no checkpoint

int64_t allocations_by(const std::vector<memory::TraceEvent>& events, const char* op,
                       const std::set<size_t>& except_sizes = {}) {
  int64_t n = 0;
  for (const memory::TraceEvent& e : events)
    n += e.action == memory::TraceAction::Alloc && std::strcmp(e.op, op) == 0 && !except_sizes.count(e.requested);
  return n;
}

// The byte sizes of the parameters' 16-bit casts. A checkpoint's forward runs without grad,
// so its casts carry no graph to the weights and the recompute casts them again, inside the
// op's scope (Note [Autocast], the cast cache): those allocations are not a rerun kernel.
std::set<size_t> cast_sizes(const nn::Module& m) {
  std::set<size_t> sizes;
  for (const auto& [name, p] : m.named_parameters()) sizes.insert(static_cast<size_t>(p.numel()) * 2);
  return sizes;
}

// max |a - b| / max |b| over every parameter's gradient.
double worst_grad_error(const nn::Module& got, const nn::Module& want) {
  std::map<std::string, Tensor> w;
  for (auto& [name, p] : want.named_parameters()) w[name] = p.grad();
  double worst = 0;
  for (auto& [name, p] : got.named_parameters()) {
    REQUIRE_MESSAGE(p.grad().defined() == w.at(name).defined(), name);
    if (!p.grad().defined()) continue;
    const std::vector<double> a = values_of(p.grad()), b = values_of(w.at(name));
    double diff = 0, scale = 1e-30;
    for (size_t i = 0; i < a.size(); ++i)
      diff = std::max(diff, std::abs(a[i] - b[i])), scale = std::max(scale, std::abs(b[i]));
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

struct Traced {
  std::vector<memory::TraceEvent> forward, backward;
};

// One step of `loss()` with the CUDA allocator's trace on, split at the backward.
template <typename F>
Traced traced_step(F&& loss) {
  memory::enable_trace(kGpu);
  Tensor l = loss();
  Traced t{memory::trace_events(kGpu), {}};
  memory::enable_trace(kGpu);
  l.backward();
  t.backward = memory::trace_events(kGpu);
  memory::disable_trace(kGpu);
  return t;
}

}  // namespace

TEST_CASE("cuda selective checkpoint: ViT under float16 autocast with fused attention and dropout") {
  models::ViTConfig c;
  c.image_size = 16, c.patch_size = 4, c.num_layers = 2, c.num_heads = 2, c.hidden_dim = 128, c.mlp_dim = 256;
  c.num_classes = 5, c.dropout = 0.1, c.attention_dropout = 0.1;
  manual_seed(1);
  models::VisionTransformer plain(c);
  nn::init::normal_(plain.head->weight, 0.0, 0.5);  // torchvision's zero head would stop every gradient
  plain.to(kGpu);
  const Tensor x = randn({4, 3, 16, 16}).to(kGpu);
  const Tensor y = from_vector<int64_t>({4, 1, 0, 2}, {4}).to(kGpu);
  auto step = [&](models::VisionTransformer& net) {
    AutocastGuard amp(kGpu, kFloat16);
    return traced_step([&] {
      manual_seed(9);
      return cross_entropy(net.forward(x), y);
    });
  };
  const Traced plain_trace = step(plain);
  CHECK(allocations_by(plain_trace.forward, "flash_attention") > 0);  // the fused kernels ran
  for (autograd::CheckpointPolicy policy : {autograd::CheckpointPolicy::Full, autograd::CheckpointPolicy::Selective}) {
    CAPTURE(autograd::to_string(policy));
    c.checkpoint_blocks = true;
    c.checkpoint_policy = policy;
    models::VisionTransformer ckpt(c);
    ckpt.to(kGpu);
    const auto sd = plain.state_dict();
    ckpt.load_state_dict(std::map<std::string, Tensor>(sd.begin(), sd.end()));
    const Traced t = step(ckpt);
    const double worst = worst_grad_error(ckpt, plain);
    MESSAGE("worst gradient error against the plain run: ", worst);
    CHECK(worst <= 2e-3);  // float16 GEMMs; the same kernels on the same values except for reduction order
    if (policy == autograd::CheckpointPolicy::Selective) {
      // No GEMM runs again; what linear allocates in the recompute are the float16 casts of its
      // float32 inputs (the layer norms' outputs, for in_proj and mlp.0), which the weight
      // gradient needs: one per such linear and layer, none for the others.
      CHECK(allocations_by(t.backward, "linear", cast_sizes(ckpt)) == 2 * c.num_layers);
      CHECK(allocations_by(t.backward, "flash_attention") == 0);
      CHECK(allocations_by(t.backward, "layer_norm") > 0);  // the cheap ops are recomputed
    } else {
      CHECK(allocations_by(t.backward, "linear") > 0);
      CHECK(allocations_by(t.backward, "flash_attention") > 0);
    }
  }
}

TEST_CASE("cuda selective checkpoint: ResNet-18 channels-last float16 with fused BN+ReLU") {
  models::ResNetOptions o{.num_classes = 4, .in_channels = 3, .small_input_stem = true, .fused_bn_relu = true};
  manual_seed(2);
  auto plain = models::resnet18(o);
  plain->to(kGpu);
  nn::to_channels_last(*plain);
  const Tensor x = to_channels_last(randn({4, 3, 16, 16}).to(kGpu));
  const Tensor y = from_vector<int64_t>({1, 3, 0, 2}, {4}).to(kGpu);
  auto step = [&](models::ResNet& net) {
    AutocastGuard amp(kGpu, kFloat16);
    return traced_step([&] { return cross_entropy(net.forward(x), y); });
  };
  step(*plain);
  for (autograd::CheckpointPolicy policy : {autograd::CheckpointPolicy::Full, autograd::CheckpointPolicy::Selective}) {
    CAPTURE(autograd::to_string(policy));
    o.checkpoint_blocks = true;
    o.checkpoint_policy = policy;
    manual_seed(2);
    auto ckpt = models::resnet18(o);
    ckpt->to(kGpu);
    nn::to_channels_last(*ckpt);
    const Traced t = step(*ckpt);
    const double worst = worst_grad_error(*ckpt, *plain);
    MESSAGE("worst gradient error against the plain run: ", worst);
    CHECK(worst <= 1e-2);  // cuDNN may pick other algorithms (and reduction orders) per run
    if (policy == autograd::CheckpointPolicy::Selective)
      CHECK(allocations_by(t.backward, "conv2d", cast_sizes(*ckpt)) == 0);
    else CHECK(allocations_by(t.backward, "conv2d") > 0);
  }
}
