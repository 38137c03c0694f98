// Per-block memory plans (nn/block_memory.h) and their planner (nn/block_planner.h) on the
// small ResNet, BERT and ViT: a mixed plan gives the plain run's gradients, the predicted
// peak of random plans is never below the CPU arena's measured one, a plan for a budget
// fits it, and an infeasible budget names the lowest reachable peak.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>

#include "autograd/ops/all.h"
#include "memory/allocator.h"
#include "models/bert.h"
#include "models/resnet.h"
#include "models/vit.h"
#include "nn/block_planner.h"
#include "optim/sgd.h"
#include "tensor/factory.h"
#include "tests/test_util.h"
#include "tests/tp_model_fixtures.h"

using namespace frugal;
using namespace frugal::testing;
using nn::BlockMemory;

namespace {

// A model with blocks, its fixed batch's loss and a way to set its plan.
struct Subject {
  std::string name;
  std::shared_ptr<nn::Module> module;
  int64_t num_blocks = 0;
  std::function<void(const nn::BlockMemoryPlan&)> set_plan;
  std::function<Tensor()> loss;
};

Subject small_resnet(uint64_t seed) {
  manual_seed(seed);
  // ResNet-50's block type at toy widths: 4 bottlenecks, one per layer.
  auto net = std::make_shared<models::ResNet>(models::BlockType::Bottleneck, std::array<int64_t, 4>{2, 1, 1, 1},
                                              models::ResNetOptions{.num_classes = 5, .small_input_stem = true});
  const Tensor x = randn({2, 3, 12, 12});
  const Tensor y = from_vector<int64_t>({1, 4}, {2});
  return {"resnet", net, net->num_blocks(), [net](const nn::BlockMemoryPlan& p) { net->memory_plan = p; },
          [net, x, y] { return cross_entropy(net->forward(x), y); }};
}

Subject small_vit(uint64_t seed) {
  manual_seed(seed);
  models::ViTConfig c;
  c.image_size = 16, c.patch_size = 4, c.num_layers = 4, c.num_heads = 2, c.hidden_dim = 32, c.mlp_dim = 64;
  c.num_classes = 5;
  auto net = std::make_shared<models::VisionTransformer>(c);
  for (const Tensor& p : net->parameters()) {  // torchvision's zero head would stop every gradient
    NoGradGuard no_grad;
    if (p.dim() == 2 && p.size(0) == 5) p.copy_(randn(p.sizes()) * 0.3);
  }
  const Tensor x = randn({3, 3, 16, 16});
  const Tensor y = from_vector<int64_t>({1, 4, 0}, {3});
  return {"vit", net, net->num_blocks(), [net](const nn::BlockMemoryPlan& p) { net->memory_plan = p; },
          [net, x, y] { return cross_entropy(net->forward(x), y); }};
}

Subject small_bert_mlm(uint64_t seed) {
  manual_seed(seed);
  models::BertConfig c = small_bert();
  c.num_hidden_layers = 3;
  auto net = std::make_shared<models::BertForMaskedLM>(c);
  // Enough tokens that the layers' activations, not the parameters and their gradients, set the peak.
  const Tensor ids = randint(0, c.vocab_size, {8, 16}, TensorOptions(kInt64));
  std::vector<int64_t> label_values(8 * 16, -100);
  for (size_t i = 0; i < label_values.size(); i += 3) label_values[i] = int64_t(i * 7 % 96);
  const Tensor labels = from_vector<int64_t>(label_values, {8, 16});
  return {"bert", net, net->bert->num_blocks(), [net](const nn::BlockMemoryPlan& p) { net->bert->memory_plan = p; },
          [net, ids, labels] { return net->forward(ids, Tensor(), Tensor(), labels).loss; }};
}

std::vector<std::function<Subject(uint64_t)>> subjects() { return {small_resnet, small_vit, small_bert_mlm}; }

// Forward, loss and backward; the step's peak allocated bytes (absolute).
int64_t backward_peak(Subject& s, const nn::BlockMemoryPlan& plan) {
  s.set_plan(plan);
  s.module->zero_grad(/*set_to_none=*/true);
  memory::reset_peak(kCPU);
  s.loss().backward();
  return memory::stats(kCPU).allocated_bytes.peak;
}

std::vector<double> flat_grads(const nn::Module& m) {
  std::vector<double> g;
  for (const Tensor& p : m.parameters()) {
    const std::vector<double> v = values_of(p.grad());
    g.insert(g.end(), v.begin(), v.end());
  }
  return g;
}

std::vector<BlockMemory> all_choices() {
  std::vector<BlockMemory> c;
  for (int i = 0; i < nn::kNumBlockMemory; ++i) c.push_back(static_cast<BlockMemory>(i));
  return c;
}

nn::BlockMemoryPlan random_plan(int64_t n, std::mt19937_64& rng, const std::vector<BlockMemory>& from) {
  nn::BlockMemoryPlan p;
  for (int64_t i = 0; i < n; ++i) p.blocks.push_back(from[rng() % from.size()]);
  return p;
}

// A planner over every choice, profiled after the training loop's warm-up step.
nn::BlockPlanner profiled_planner(Subject& s) {
  nn::BlockPlanner planner(
      kCPU, s.num_blocks, [&s](const nn::BlockMemoryPlan& p) { backward_peak(s, p); }, all_choices(), 1);
  backward_peak(s, nn::BlockMemoryPlan::uniform(BlockMemory::Keep));
  planner.profile();
  return planner;
}

}  // namespace

TEST_CASE("block memory: names, parsing and the checkpoint switches' plan") {
  for (int i = 0; i < nn::kNumBlockMemory; ++i) {
    const auto c = static_cast<BlockMemory>(i);
    CHECK(nn::parse_block_memory(nn::to_string(c)) == c);
    CHECK(nn::is_lossy(c) == (c == BlockMemory::Compress));
  }
  CHECK_FALSE(nn::parse_block_memory("full").has_value());
  CHECK(nn::BlockMemoryPlan::from_checkpoint(false, autograd::CheckpointPolicy::Full).at(3) == BlockMemory::Keep);
  CHECK(nn::BlockMemoryPlan::from_checkpoint(true, autograd::CheckpointPolicy::Full).at(0) == BlockMemory::Checkpoint);
  CHECK(nn::BlockMemoryPlan::from_checkpoint(true, autograd::CheckpointPolicy::Selective).at(7) ==
        BlockMemory::Selective);
  const nn::BlockMemoryPlan mixed{{BlockMemory::Checkpoint, BlockMemory::Selective}, BlockMemory::Keep};
  CHECK(mixed.at(1) == BlockMemory::Selective);
  CHECK(mixed.at(2) == BlockMemory::Keep);  // past the end: the fallback
}

TEST_CASE("block memory: mixed plans give the plain run's gradients (small ResNet, ViT, BERT)") {
  for (const auto& make : subjects()) {
    Subject plain = make(7);
    backward_peak(plain, nn::BlockMemoryPlan::uniform(BlockMemory::Keep));
    const std::vector<double> want = flat_grads(*plain.module);
    std::mt19937_64 rng(3);
    for (int k = 0; k < 3; ++k) {
      Subject s = make(7);
      const nn::BlockMemoryPlan plan = random_plan(s.num_blocks, rng, nn::BlockPlanner::lossless());
      CAPTURE(s.name);
      CAPTURE(k);
      backward_peak(s, plan);
      check_close(flat_grads(*s.module), want, 1e-5, 1e-7);
    }
  }
}

TEST_CASE("block planner: the predicted peak of random plans is never below the measured one") {
  for (const auto& make : subjects()) {
    Subject s = make(11);
    CAPTURE(s.name);
    const nn::BlockPlanner planner = profiled_planner(s);
    // Uniform plans are what was measured: predicted within the allocator's rounding.
    for (const nn::ChoiceProfile& u : planner.profiles()) {
      const std::string choice = nn::to_string(u.choice);
      CAPTURE(choice);
      const int64_t measured = backward_peak(s, nn::BlockMemoryPlan::uniform(u.choice));
      const int64_t predicted = planner.predict_peak(nn::BlockMemoryPlan::uniform(u.choice));
      CHECK(predicted >= measured);
      CHECK(predicted <= measured + measured / 20);  // the head's term mixes in the other runs
    }
    std::mt19937_64 rng(5);
    for (int k = 0; k < 20; ++k) {
      const nn::BlockMemoryPlan plan = random_plan(s.num_blocks, rng, all_choices());
      const int64_t measured = backward_peak(s, plan), predicted = planner.predict_peak(plan);
      CAPTURE(k);
      CAPTURE(measured);
      CAPTURE(predicted);
      CHECK(predicted >= measured);
      CHECK(predicted <= measured + measured / 10);  // and not so far above that plans waste memory
    }
  }
}

TEST_CASE("block planner: a plan for a budget fits it; an infeasible budget names the lowest peak") {
  for (const auto& make : subjects()) {
    Subject s = make(13);
    CAPTURE(s.name);
    const nn::BlockPlanner planner = profiled_planner(s);
    const int64_t top = planner.default_peak(), lowest = planner.lowest_peak();
    REQUIRE(lowest < top);  // checkpointing frees something in every model
    // A generous budget keeps every block.
    const nn::BlockMemoryPlan roomy = planner.plan(top + top / 100);
    for (int64_t b = 0; b < s.num_blocks; ++b) CHECK(roomy.at(size_t(b)) == BlockMemory::Keep);
    for (double f : {0.25, 0.5, 0.75, 1.0}) {
      const int64_t budget = lowest + static_cast<int64_t>(f * static_cast<double>(top - lowest));
      CAPTURE(f);
      const nn::BlockMemoryPlan plan = planner.plan(budget);
      CHECK(planner.predict_peak(plan) <= budget);
      CHECK(backward_peak(s, plan) <= budget);
      CHECK(planner.predict_ms(plan) >= planner.profiles()[0].step_ms);  // the Keep run is the fastest plan's floor
    }
    check_error([&] { planner.plan(lowest - 1); }, {"BlockPlanner", "no plan fits", "lowest predicted peak"});
    const nn::BlockMemoryPlan deepest = planner.plan(lowest);
    const std::string report = planner.report(deepest);
    CHECK(report.find("predicted: peak") != std::string::npos);
    CHECK(std::count(report.begin(), report.end(), '\n') == s.num_blocks + 2);  // header, a line per block, total
    for (int64_t b = 0; b < s.num_blocks; ++b) {
      CAPTURE(b);
      CHECK(report.find(std::to_string(b) + " ") != std::string::npos);
    }
    int64_t frugal_blocks = 0;
    for (int64_t b = 0; b < s.num_blocks; ++b) frugal_blocks += deepest.at(size_t(b)) != BlockMemory::Keep;
    CHECK(frugal_blocks > 0);
  }
}

TEST_CASE("block planner: a step that skips run_block is an error that says so") {
  Subject s = small_vit(1);
  nn::BlockPlanner planner(
      kCPU, s.num_blocks + 1, [&](const nn::BlockMemoryPlan& p) { backward_peak(s, p); }, {BlockMemory::Keep}, 1);
  check_error([&] { planner.profile(); }, {"BlockPlanner", "block 4", "run_block"});
  check_error([&] { nn::BlockPlanner(kCPU, 0, [](const nn::BlockMemoryPlan&) {}); }, {"BlockPlanner", "0 blocks"});
}

TEST_CASE("block planner: memory budgets parse as sizes or fractions of the default peak") {
  CHECK(nn::parse_memory_budget("3GiB", 0) == int64_t(3) << 30);
  CHECK(nn::parse_memory_budget("512MiB", 0) == int64_t(512) << 20);
  CHECK(nn::parse_memory_budget("2.5GB", 0) == int64_t(2500000000));
  CHECK(nn::parse_memory_budget("1e9", 0) == int64_t(1000000000));
  CHECK(nn::parse_memory_budget("0.5x", 1000) == 500);
  for (const char* bad : {"", "x", "-1GiB", "3 GiB", "3TiB", "0x", "nanGiB"})
    check_error([&] { nn::parse_memory_budget(bad, 1000); }, {"memory budget", bad});
}
