// bench/parallel_bench's modes (bench/parallel_bench_modes.h) at the tiny size on 2 and 4
// thread ranks, through the code path the GPU runs take: every default mode runs and
// reports finite positive throughput, the pipeline modes the theoretical bubble
// (p - 1) / (m + p - 1), and every mode - TP, pipeline, DDP, ZeRO-1, the 2 x 2 TP x pipeline
// grid - the same loss as an independent single-process model at the first step and after
// one AdamW step (f32, 1e-5 relative). Speed is never asserted.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "autograd/ops/all.h"
#include "bench/parallel_bench_modes.h"
#include "optim/adam.h"
#include "parallel/tensor_parallel.h"
#include "parallel/thread_communicator.h"
#include "tensor/factory.h"
#include "tests/cpu/parallel_test_util.h"

using namespace frugal;
using namespace frugal::testing;
using CommPtr = std::shared_ptr<parallel::Communicator>;

namespace {

/// The tiny encoder's mean-squared-error loss on the bench's batch, before and after one
/// AdamW step, with plain layers drawn from the bench's seeds: the reference every mode
/// must reproduce.
/// One encoder layer's parameters: q, k, v and output projections with biases, the MLP's two
/// linears with biases, two layer norms (BERT-base: 7,087,872).
int64_t layer_parameters(const bench::ModelConfig& m) {
  const int64_t h = m.hidden, f = m.ffn;
  return 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h;
}

std::pair<double, double> reference_losses(const bench::ModelConfig& m, int64_t batch) {
  std::vector<std::shared_ptr<parallel::TensorParallelEncoderLayer>> layers;
  std::vector<Tensor> params;
  for (int64_t i = 0; i < m.layers; ++i) {
    Generator gen(bench::kInitSeed + uint64_t(i));
    layers.push_back(std::make_shared<parallel::TensorParallelEncoderLayer>(
        m.hidden, m.heads, m.ffn, nullptr, parallel::TensorParallelEncoderOptions{.generator = &gen}));
    for (const Tensor& p : layers.back()->parameters()) params.push_back(p);
  }
  Generator data(bench::kDataSeed);
  const Tensor x = randn({batch, m.seq, m.hidden}, {}, &data), y = randn({batch, m.seq, m.hidden}, {}, &data);
  auto loss = [&] {
    Tensor h = x;
    for (auto& l : layers) h = l->forward(h);
    return mse_loss(h, y);
  };
  optim::AdamW opt(params, {.lr = bench::kLearningRate});
  Tensor first = loss();
  first.backward();
  opt.step();
  return {first.item<double>(), loss().item<double>()};
}

}  // namespace

TEST_CASE("parallel_bench: every mode at 2 and 4 thread ranks trains the single-process model") {
  const bench::ModelConfig tiny = bench::model_config("tiny");
  REQUIRE(layer_parameters(bench::model_config("base")) == 7087872);
  const int64_t batch = 8;
  const int micro = 4;
  const auto [ref_first, ref_second] = reference_losses(tiny, batch);
  // One step moves the loss by far more than the tolerance, so "after one step" tests the optimizer.
  REQUIRE(std::fabs(ref_second - ref_first) > 1e-3 * std::fabs(ref_first));
  for (int n : {2, 4}) {
    CAPTURE(n);
    const bench::BenchOptions opts{
        .model = tiny, .batch = batch, .iters = 1, .micro_batches = micro, .modes = bench::default_modes(tiny, n)};
    const std::vector<std::string> expected =
        n == 4 ? std::vector<std::string>{"single", "tp", "pp", "ddp", "ddp-weak", "zero1", "zero2", "zero3", "offload",
                                          "grid"}
               : std::vector<std::string>{"single", "tp", "pp", "ddp", "ddp-weak", "zero1", "zero2", "zero3", "offload"};
    REQUIRE(opts.modes == expected);
    PerRank<std::vector<bench::ModeResult>> got(static_cast<size_t>(n));
    parallel::run_ranks(n, [&](const CommPtr& world) { got[size_t(world->rank())] = bench::run_modes(world, opts); });
    const std::vector<bench::ModeResult>& results = got[0];
    REQUIRE(results.size() == expected.size());
    for (size_t i = 0; i < results.size(); ++i) {
      const bench::ModeResult& res = results[i];
      CAPTURE(res.mode);
      CHECK(res.mode == expected[i]);
      CHECK(res.ranks == (res.mode == "single" ? 1 : n));
      CHECK(res.samples == (res.mode == "ddp-weak" ? batch * n : batch));
      CHECK((std::isfinite(res.samples_per_s) && res.samples_per_s > 0));
      CHECK((std::isfinite(res.efficiency) && res.efficiency > 0));
      CHECK((std::isfinite(res.peak_gib) && res.peak_gib > 0));
      // Parameters per rank: tensor parallelism splits all but 6 h per layer (the row-parallel
      // layers' biases and both layer norms), stages split the layers.
      const int tp_ways = res.mode == "tp" ? n : res.mode == "grid" ? 2 : 1;
      const int stages = res.mode == "pp" ? n : res.mode == "grid" ? n / 2 : 1;
      const int64_t replicated = 6 * tiny.hidden, per_layer = layer_parameters(tiny);
      const int64_t per_rank = (tiny.layers / stages) * ((per_layer - replicated) / tp_ways + replicated);
      // ZeRO-3 keeps a shard of each layer (a unit), padded to a multiple of n.
      const int64_t shard = tiny.layers * ((per_layer + n - 1) / n);
      CHECK(res.param_mib == doctest::Approx(double((res.mode == "zero3" ? shard : per_rank) * 4) / double(1 << 20)));
      // Model states per rank: DDP 4 N params + 4 N grads + 8 N moments; ZeRO-3 16 S.
      if (res.mode == "ddp" || res.mode == "ddp-weak")
        CHECK(res.state_mib == doctest::Approx(double(16 * per_rank) / double(1 << 20)));
      // Offload: the device keeps weights and gradients (8 N); the moments are on the host (8 N:
      // float32 CPU weights are their own masters).
      if (res.mode == "offload") {
        CHECK(res.state_mib == doctest::Approx(double(8 * per_rank) / double(1 << 20)));
        CHECK(res.host_state_mib == doctest::Approx(double(8 * per_rank) / double(1 << 20)));
      }
      if (res.mode == "zero3") {
        CHECK(res.state_mib == doctest::Approx(double(16 * shard) / double(1 << 20)));
        CHECK(res.gathered_mib == doctest::Approx(double(2 * n * ((per_layer + n - 1) / n) * 4) / double(1 << 20)));
      }
      const bool pipeline = res.mode == "pp" || res.mode == "grid";
      if (pipeline) {
        const int p = res.mode == "pp" ? n : n / 2;
        CHECK(res.stages == p);
        CHECK(res.bubble_theory == doctest::Approx(double(p - 1) / (micro + p - 1)));
        CHECK((res.bubble_measured >= 0 && res.bubble_measured <= 1));
      } else {
        CHECK(res.bubble_theory == -1);
      }
      check_equiv({res.loss_first, res.loss_second}, {ref_first, ref_second}, res.mode + " losses");
      for (int r = 1; r < n; ++r) {  // every rank returns the same figures
        CHECK(got[size_t(r)][i].samples_per_s == res.samples_per_s);
        CHECK(got[size_t(r)][i].loss_second == res.loss_second);
      }
    }
  }
}

TEST_CASE("parallel_bench: options that do not fit are errors naming them") {
  check_error([] { bench::model_config("huge"); }, {"parallel_bench", "--model", "huge"});
  check_error([] { bench::parse_modes("tp,foo"); }, {"parallel_bench", "unknown mode 'foo'"});
  CHECK(bench::parse_modes("grid,zero1") == std::vector<std::string>{"grid", "zero1"});
  CHECK(bench::default_modes(bench::model_config("large"), 1) == std::vector<std::string>{"single"});
  // BERT-base's 12 heads do not split 8 ways: no tp by default at 8 ranks; grid is there.
  const std::vector<std::string> base8 = bench::default_modes(bench::model_config("base"), 8);
  CHECK(std::find(base8.begin(), base8.end(), "tp") == base8.end());
  CHECK(std::find(base8.begin(), base8.end(), "grid") != base8.end());
  const bench::BenchOptions grid{.model = bench::model_config("tiny"), .batch = 8, .iters = 1, .modes = {"grid"}};
  check_error([&] { parallel::run_ranks(2, [&](const CommPtr& w) { bench::run_modes(w, grid); }); },
              {"grid", "even world size >= 4", "got 2"});
  const bench::BenchOptions pp{
      .model = bench::model_config("tiny"), .batch = 6, .iters = 1, .micro_batches = 4, .modes = {"pp"}};
  check_error([&] { parallel::run_ranks(2, [&](const CommPtr& w) { bench::run_modes(w, pp); }); },
              {"pp", "batch (6)", "micro-batches (4)"});
}
