#pragma once
// Helpers shared by the parallel-algorithm tests (test_tensor_parallel.cpp,
// test_pipeline.cpp, test_ddp.cpp, test_zero.cpp, test_zero3*.cpp): every rank of run_ranks
// stores what it computed in a slot of its own, and the main thread compares it with the
// single-process reference.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "nn/activation.h"
#include "nn/block_memory.h"
#include "nn/block_planner.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "parallel/communicator.h"
#include "parallel/thread_communicator.h"
#include "tensor/random.h"
#include "tests/test_util.h"

namespace frugal::testing {

/// f32 equivalence with a single-process run: 1e-5 relative, plus an absolute floor of
/// 1e-6 of the tensor's largest magnitude (entries that cancel to ~0 differ by rounding).
inline void check_equiv(const std::vector<double>& actual, const std::vector<double>& expected,
                        const std::string& what) {
  double scale = 0.0;
  for (double e : expected) scale = std::max(scale, std::fabs(e));
  check_close(actual, expected, 1e-5, 1e-6 * std::max(scale, 1e-30), what);
}
inline void check_equiv(const Tensor& actual, const Tensor& expected, const std::string& what) {
  REQUIRE_MESSAGE(actual.defined(), what, ": undefined");
  REQUIRE_MESSAGE(actual.sizes() == expected.sizes(), what, ": shape ", shape_str(actual.sizes()), " vs ",
                  shape_str(expected.sizes()));
  check_equiv(values_of(actual), values_of(expected), what);
}

/// The data-parallel tests' model, its weights drawn from `seed`: Linear(6, 8) Tanh
/// Linear(8, 8) Tanh Linear(8, 3), 155 float32 parameters; in reverse order (the order
/// gradient buckets fill) 3, 24, 8, 64, 8, 48 elements, i.e. 12, 96, 32, 256, 32, 192 bytes.
inline std::shared_ptr<nn::Sequential> data_parallel_mlp(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
      std::make_shared<nn::Linear>(6, 8), std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(8, 8),
      std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(8, 3)});
}

/// Per-rank models for p ranks: rank 0's (every rank's, with `equal`) a copy of `ref`'s
/// weights, the others drawn differently (what DDP's broadcast must fix; ZeroAdamW does not
/// broadcast, so its ranks must start equal).
inline std::vector<std::shared_ptr<nn::Sequential>> rank_models(const nn::Sequential& ref, int p, bool equal = false) {
  std::vector<std::shared_ptr<nn::Sequential>> out;
  for (int r = 0; r < p; ++r) {
    auto m = data_parallel_mlp(1000 + uint64_t(r));
    if (r == 0 || equal) {
      std::map<std::string, Tensor> state;
      for (const auto& [k, v] : ref.state_dict()) state[k] = v;
      m->load_state_dict(state);
    }
    out.push_back(m);
  }
  return out;
}

/// A copy of every tensor of a state dict, by name: a rank's weights after a step, kept
/// past later steps.
inline std::map<std::string, Tensor> as_map(const nn::NamedTensors& named) {
  std::map<std::string, Tensor> out;
  for (const auto& [k, v] : named) out[k] = v.detach().clone();
  return out;
}

/// The same names as `want`, each check_equiv to it.
inline void check_weights(const std::map<std::string, Tensor>& got, const std::map<std::string, Tensor>& want,
                          const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    REQUIRE_MESSAGE(got.count(name), what, ": no ", name);
    check_equiv(got.at(name), t, what + " " + name);
  }
}

/// Rows [i n, (i + 1) n) of t: rank i's share of a batch.
inline Tensor rows(const Tensor& t, int64_t i, int64_t n) { return t.narrow(0, i * n, n); }

/// One slot per rank, written by that rank's thread only.
template <typename T>
using PerRank = std::vector<T>;

/// A rank's named results, compared after the ranks have joined.
using Results = std::map<std::string, Tensor>;

/// Three training steps of a tensor-parallel model `tp` (two SGD, then AdamW), loss() giving
/// each step's loss: the losses and local gradients of each step, the local weights after the
/// last, and how far each of tp.rng's dropout streams has advanced.
template <typename Model, typename Loss>
Results train_tp_steps(Model& tp, const Loss& loss_of_step) {
  Results out;
  tp.train();
  optim::SGD sgd(tp.parameters(), {.lr = 0.1});
  optim::AdamW adamw(tp.parameters(), {.lr = 1e-2});
  for (int step = 0; step < 3; ++step) {
    const std::string s = std::to_string(step);
    const Tensor loss = loss_of_step();
    loss.backward();
    out["loss " + s] = loss.detach();
    for (const auto& [k, t] : tp.named_parameters()) out["grad " + s + " " + k] = t.grad().clone();
    if (step < 2) sgd.step();
    else adamw.step();
    tp.zero_grad();
  }
  for (const auto& [k, t] : tp.named_parameters()) out["weight " + k] = t.detach().clone();
  out["replicated offset"] = from_vector<int64_t>({int64_t(tp.rng->replicated.offset())}, {1});
  out["split offset"] = from_vector<int64_t>({int64_t(tp.rng->split.offset())}, {1});
  return out;
}

/// The tensor-parallel models' checkpoint check: at 1, 2 and 4 thread ranks, trains each rank
/// plainly, with every block checkpointed and with every block selective, and requires the
/// checkpointed runs to equal the plain one bit for bit on every rank.
/// train_rank(checkpointed, policy, expected block choice, comm) builds the rank's model with
/// the reference weights, checks its plan's choice and returns its results, which hold
/// "replicated offset" and "split offset" (its dropout streams) and "loss 0", "loss 1".
template <typename TrainRank>
void check_checkpointed_like_plain(const TrainRank& train_rank) {
  struct Variant {
    const char* name;
    bool checkpointed;
    autograd::CheckpointPolicy policy;
    nn::BlockMemory choice;
  };
  const Variant variants[] = {{"plain", false, autograd::CheckpointPolicy::Full, nn::BlockMemory::Keep},
                              {"checkpoint", true, autograd::CheckpointPolicy::Full, nn::BlockMemory::Checkpoint},
                              {"selective", true, autograd::CheckpointPolicy::Selective, nn::BlockMemory::Selective}};
  for (int p : {1, 2, 4}) {
    CAPTURE(p);
    std::map<std::string, PerRank<Results>> got;
    for (const Variant& v : variants) {
      PerRank<Results> ranks(static_cast<size_t>(p));
      parallel::run_ranks(p, [&](const std::shared_ptr<parallel::Communicator>& comm) {
        ranks[size_t(comm->rank())] = train_rank(v.checkpointed, v.policy, v.choice, comm);
      });
      got[v.name] = std::move(ranks);
    }
    for (int r = 0; r < p; ++r) {
      CAPTURE(r);
      const Results& plain = got.at("plain")[size_t(r)];
      CHECK(plain.at("replicated offset").item<int64_t>() > 0);  // dropout acted, in both streams
      CHECK(plain.at("split offset").item<int64_t>() > 0);
      CHECK(values_of(plain.at("loss 1")) != values_of(plain.at("loss 0")));  // the steps changed the weights
      for (const char* name : {"checkpoint", "selective"}) {
        CAPTURE(name);
        const Results& ckpt = got.at(name)[size_t(r)];
        REQUIRE(ckpt.size() == plain.size());
        for (const auto& [k, t] : plain) CHECK_MESSAGE(values_of(ckpt.at(k)) == values_of(t), k);
      }
    }
  }
}

/// The tensor-parallel models' memory-plan check at 2 thread ranks: loss_rank(plan, comm) builds
/// a rank's model with the reference weights and `plan`, runs forward and backward, and returns
/// {"loss", each parameter's local gradient by name}. Every lossless choice over every block,
/// and a mixed plan, must give the Keep plan's loss exactly and its gradients to check_equiv;
/// a gradient zero_scale_key names (~0 in exact arithmetic) must stay below 1e-6 of that key's.
template <typename LossRank, typename ZeroKey>
void check_lossless_plans_like_keep(const LossRank& loss_rank, const ZeroKey& zero_scale_key) {
  const int p = 2;
  auto step = [&](const nn::BlockMemoryPlan& plan) {
    PerRank<Results> got(p);
    parallel::run_ranks(p, [&](const std::shared_ptr<parallel::Communicator>& comm) {
      got[size_t(comm->rank())] = loss_rank(plan, comm);
    });
    return got;
  };
  const PerRank<Results> want = step(nn::BlockMemoryPlan::uniform(nn::BlockMemory::Keep));
  std::vector<nn::BlockMemoryPlan> plans;
  for (nn::BlockMemory choice : nn::BlockPlanner::lossless()) plans.push_back(nn::BlockMemoryPlan::uniform(choice));
  plans.push_back({{nn::BlockMemory::CheckpointOffload, nn::BlockMemory::Selective}});  // a mixed plan
  for (const nn::BlockMemoryPlan& plan : plans) {
    const std::string choices = std::string(nn::to_string(plan.at(0))) + "," + nn::to_string(plan.at(1));
    CAPTURE(choices);
    const PerRank<Results> got = step(plan);
    for (int r = 0; r < p; ++r) {
      CAPTURE(r);
      const Results &out = got[size_t(r)], &plain = want[size_t(r)];
      CHECK(values_of(out.at("loss")) == values_of(plain.at("loss")));  // the forward is the plain one
      for (const auto& [k, t] : plain) {
        if (const std::string q = zero_scale_key(k); !q.empty()) {
          CHECK(max_abs(out.at(k)) < 1e-6 * max_abs(plain.at(q)));
          continue;
        }
        check_equiv(out.at(k), t, k);
      }
    }
  }
}

/// A communicator that hands every call to `inner`: tests derive from it to count or log the
/// calls they care about, overriding those alone.
class ForwardingCommunicator : public parallel::Communicator {
 public:
  using CommPtr = std::shared_ptr<parallel::Communicator>;
  explicit ForwardingCommunicator(CommPtr inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  Device device() const override { return inner_->device(); }
  std::shared_ptr<parallel::Work> all_reduce(const Tensor& t, parallel::ReduceOp op) override {
    return inner_->all_reduce(t, op);
  }
  std::shared_ptr<parallel::Work> all_gather(const Tensor& in, const Tensor& out) override {
    return inner_->all_gather(in, out);
  }
  std::shared_ptr<parallel::Work> reduce_scatter(const Tensor& in, const Tensor& out, parallel::ReduceOp op) override {
    return inner_->reduce_scatter(in, out, op);
  }
  std::shared_ptr<parallel::Work> broadcast(const Tensor& t, int root) override { return inner_->broadcast(t, root); }
  std::shared_ptr<parallel::Work> send(const Tensor& t, int peer) override { return inner_->send(t, peer); }
  std::shared_ptr<parallel::Work> recv(const Tensor& t, int peer) override { return inner_->recv(t, peer); }
  void barrier() override { inner_->barrier(); }
  CommPtr split(int color, int key) override { return inner_->split(color, key); }
  void set_timeout(std::chrono::milliseconds t) override { inner_->set_timeout(t); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }

 private:
  CommPtr inner_;
};

}  // namespace frugal::testing
