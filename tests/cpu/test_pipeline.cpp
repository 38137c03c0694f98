// Pipeline parallelism (parallel/pipeline.h) on the threads backend, 2 and 4 stages:
// GPipe and 1F1B, with and without recompute, give the single-process model's loss and
// gradients on the whole batch (f32, 1e-5 relative); each schedule holds the number of
// micro-batches in flight it promises; the cost-based split is the optimal contiguous one.
#include <doctest/doctest.h>

#include <utility>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <string>

#include "autograd/ops/all.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "parallel/pipeline.h"
#include "parallel/thread_communicator.h"
#include "tensor/factory.h"
#include "tests/cpu/parallel_test_util.h"

using namespace frugal;
using namespace frugal::testing;
using CommPtr = std::shared_ptr<parallel::Communicator>;
using parallel::run_ranks;

namespace {

// 8 modules: (Linear, Tanh) x 3, Linear(8, 3), GELU.
std::shared_ptr<nn::Sequential> make_model(uint64_t seed) {
  manual_seed(seed);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(6, 8));
  m->push_back(std::make_shared<nn::Tanh>());
  m->push_back(std::make_shared<nn::Linear>(8, 8));
  m->push_back(std::make_shared<nn::Tanh>());
  m->push_back(std::make_shared<nn::Linear>(8, 8));
  m->push_back(std::make_shared<nn::Tanh>());
  m->push_back(std::make_shared<nn::Linear>(8, 3));
  m->push_back(std::make_shared<nn::GELU>());
  return m;
}

std::shared_ptr<nn::Sequential> copy_of(const nn::Sequential& ref, uint64_t seed) {
  auto m = make_model(seed);
  std::map<std::string, Tensor> state;
  for (const auto& [k, v] : ref.state_dict()) state[k] = v.clone();
  m->load_state_dict(state);
  return m;
}

double max_stage_cost(const std::vector<double>& costs, const parallel::StageBounds& b) {
  double worst = 0;
  for (auto [lo, hi] : b) {
    double s = 0;
    for (size_t i = lo; i < hi; ++i) s += costs[i];
    worst = std::max(worst, s);
  }
  return worst;
}

// The best max stage cost over every way to cut n modules into `stages` contiguous parts.
double brute_force_best(const std::vector<double>& costs, int stages) {
  double best = 1e300;
  std::function<void(size_t, int, double)> go = [&](size_t begin, int left, double worst) {
    if (left == 1) {
      double s = 0;
      for (size_t i = begin; i < costs.size(); ++i) s += costs[i];
      best = std::min(best, std::max(worst, s));
      return;
    }
    double s = 0;
    for (size_t end = begin + 1; end + size_t(left - 1) <= costs.size(); ++end) {
      s += costs[end - 1];
      go(end, left - 1, std::max(worst, s));
    }
  };
  go(0, stages, 0.0);
  return best;
}

}  // namespace

TEST_CASE("pipeline: split by index and by cost") {
  CHECK(parallel::split_by_index(8, 3) == parallel::StageBounds{{0, 3}, {3, 6}, {6, 8}});
  CHECK(parallel::split_by_cost({1, 1, 1, 10, 1, 1}, 2) == parallel::StageBounds{{0, 3}, {3, 6}});
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const std::vector<double> costs = random_values(9, seed, 0.0, 10.0);
    for (int stages : {1, 2, 3, 4, 9}) {
      const parallel::StageBounds b = parallel::split_by_cost(costs, stages);
      REQUIRE(b.size() == size_t(stages));
      CHECK(b.front().first == 0);
      CHECK(b.back().second == costs.size());
      for (size_t s = 0; s < b.size(); ++s) {
        CHECK(b[s].first < b[s].second);
        if (s > 0) CHECK(b[s].first == b[s - 1].second);
      }
      CHECK(max_stage_cost(costs, b) == doctest::Approx(brute_force_best(costs, stages)));
    }
  }
  auto model = make_model(1);
  const std::vector<double> params = parallel::parameter_costs(*model);
  CHECK(params == std::vector<double>{57, 1, 73, 1, 73, 1, 28, 1});
  const std::vector<double> times = parallel::time_costs(*model, random_tensor({4, 6}, kFloat32, 2), 2);
  REQUIRE(times.size() == 8);
  for (double t : times) CHECK(t > 0);
  for (const Tensor& p : model->parameters()) CHECK(!p.grad().defined());
  check_error([] { parallel::split_by_cost({1, 2}, 3); }, {"split_by_cost", "2 modules", "3"});
}

TEST_CASE("pipeline: GPipe and 1F1B, with and without recompute, equal the single-process model") {
  const int m = 4;
  const int64_t B = 8;
  auto ref = make_model(3);
  const Tensor x = random_tensor({B, 6}, kFloat32, 31), y = random_tensor({B, 3}, kFloat32, 32);
  const Tensor ref_loss = mse_loss(ref->forward(x), y);
  ref_loss.backward();
  const auto loss_fn = [](const Tensor& out, const Tensor& target) { return mse_loss(out, target); };
  for (int p : {2, 4}) {
    for (auto schedule : {parallel::Schedule::GPipe, parallel::Schedule::OneFOneB}) {
      for (auto [recompute, measure] : {std::pair{false, true}, {true, true}, {false, false}}) {
        CAPTURE(p);
        CAPTURE(schedule == parallel::Schedule::GPipe ? "gpipe" : "1f1b");
        CAPTURE(recompute);
        CAPTURE(measure);
        auto model = copy_of(*ref, 99);  // stages share it: each rank runs a disjoint range
        const parallel::StageBounds bounds = parallel::split_by_index(model->size(), p);
        PerRank<parallel::PipelineStats> stats(static_cast<size_t>(p));
        run_ranks(p, [&](const CommPtr& comm) {
          const int r = comm->rank();
          parallel::PipelineStage stage(
              parallel::make_stage(*model, bounds[size_t(r)]), comm,
              {.schedule = schedule, .micro_batches = m, .recompute = recompute, .measure_busy = measure});
          stats[size_t(r)] = stage.train_step(stage.is_first() ? x : Tensor(), stage.is_last() ? y : Tensor(), loss_fn);
        });
        for (int r = 0; r < p; ++r) {
          CAPTURE(r);
          const parallel::PipelineStats& s = stats[size_t(r)];
          CHECK(s.loss == doctest::Approx(ref_loss.item<float>()).epsilon(1e-5));
          CHECK(s.bubble_theoretical == doctest::Approx(double(p - 1) / double(m + p - 1)));
          if (measure) {
            CHECK(s.stage_bubble >= 0.0);
            CHECK(s.stage_bubble < 1.0);
            CHECK(s.busy_seconds > 0.0);
            // The pipeline's bubble pools every stage's busy time over the longest step: one
            // value on all ranks.
            double longest = 0, busy_sum = 0;
            for (const parallel::PipelineStats& t : stats)
              longest = std::max(longest, t.step_seconds), busy_sum += t.busy_seconds;
            CHECK(s.bubble_measured == doctest::Approx(1.0 - busy_sum / (p * longest)));
          } else {  // no synchronizing timers: nothing measured
            CHECK(s.bubble_measured == -1.0);
            CHECK(s.stage_bubble == -1.0);
            CHECK(s.busy_seconds == -1.0);
          }
          // GPipe holds every micro-batch; 1F1B at most its warm-up + 1
          CHECK(s.peak_in_flight == (schedule == parallel::Schedule::GPipe ? m : std::min(p - r, m)));
        }
        const auto got = model->named_parameters(), want = ref->named_parameters();
        for (size_t i = 0; i < want.size(); ++i)
          check_equiv(got[i].second.grad(), want[i].second.grad(), want[i].first);
      }
    }
  }
}

TEST_CASE("pipeline: more stages than warm-up room (m < p) and bad inputs") {
  auto ref = make_model(4);
  const Tensor x = random_tensor({2, 6}, kFloat32, 41), y = random_tensor({2, 3}, kFloat32, 42);
  const Tensor ref_loss = mse_loss(ref->forward(x), y);
  ref_loss.backward();
  auto model = copy_of(*ref, 98);
  const parallel::StageBounds bounds = parallel::split_by_cost(parallel::parameter_costs(*model), 4);
  run_ranks(4, [&](const CommPtr& comm) {
    parallel::PipelineStage stage(parallel::make_stage(*model, bounds[size_t(comm->rank())]), comm,
                                  {.schedule = parallel::Schedule::OneFOneB, .micro_batches = 2});
    stage.train_step(stage.is_first() ? x : Tensor(), stage.is_last() ? y : Tensor(),
                     [](const Tensor& o, const Tensor& t) { return mse_loss(o, t); });
  });
  const auto got = model->named_parameters(), want = ref->named_parameters();
  for (size_t i = 0; i < want.size(); ++i) check_equiv(got[i].second.grad(), want[i].second.grad(), want[i].first);
  run_ranks(1, [&](const CommPtr& comm) {
    parallel::PipelineStage stage(model, comm, {.micro_batches = 3});
    check_error([&] { stage.train_step(x, y, [](const Tensor& o, const Tensor& t) { return mse_loss(o, t); }); },
                {"PipelineStage.train_step", "3 micro-batches"});
  });
}

namespace {
// Identity that counts its forward calls (recompute runs each stage forward twice).
struct Counter : nn::UnaryModule {
  std::atomic<int>& calls;
  explicit Counter(std::atomic<int>& c) : calls(c) {}
  Tensor forward(const Tensor& x) override {
    ++calls;
    return x;
  }
  std::string type_name() const override { return "Counter"; }
};
}  // namespace

TEST_CASE("pipeline: recompute re-runs each stage forward once per micro-batch in backward") {
  for (bool recompute : {false, true}) {
    std::atomic<int> calls{0};
    manual_seed(5);
    auto model = std::make_shared<nn::Sequential>();
    model->push_back(std::make_shared<nn::Linear>(4, 4));
    model->push_back(std::make_shared<Counter>(calls));
    model->push_back(std::make_shared<nn::Linear>(4, 2));
    model->push_back(std::make_shared<Counter>(calls));
    const Tensor x = random_tensor({6, 4}, kFloat32, 51), y = random_tensor({6, 2}, kFloat32, 52);
    const parallel::StageBounds bounds = parallel::split_by_index(4, 2);
    run_ranks(2, [&](const CommPtr& comm) {
      parallel::PipelineStage stage(
          parallel::make_stage(*model, bounds[size_t(comm->rank())]), comm,
          {.schedule = parallel::Schedule::GPipe, .micro_batches = 3, .recompute = recompute});
      stage.train_step(stage.is_first() ? x : Tensor(), stage.is_last() ? y : Tensor(),
                       [](const Tensor& o, const Tensor& t) { return mse_loss(o, t); });
    });
    CHECK(calls.load() == (recompute ? 12 : 6));  // 2 stages x 3 micro-batches, twice with recompute
  }
}
