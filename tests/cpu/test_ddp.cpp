// Data parallelism (parallel/ddp.h, parallel/zero.h) on the threads backend, 2 and 4
// ranks: each rank trains on its shard of the batch, and the synchronized gradients and
// the parameters after AdamW steps equal the single-process model's on the whole batch
// (f32, 1e-5 relative). The sync finishes by itself at the end of backward (an engine
// callback); an explicit finish_gradient_sync() after it changes nothing. Also: the
// post-accumulate-grad hook, rank 0's parameters broadcast at construction, no_sync()
// gradient accumulation, small (uneven) buckets, a checkpointed block.
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <string>

#include "autograd/checkpoint.h"
#include "autograd/meta.h"
#include "autograd/ops/all.h"
#include "nn/activation.h"
#include "nn/checkpoint.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "optim/adam.h"
#include "parallel/ddp.h"
#include "parallel/thread_communicator.h"
#include "parallel/zero.h"
#include "tensor/factory.h"
#include "tests/cpu/parallel_test_util.h"

using namespace frugal;
using namespace frugal::testing;
using CommPtr = std::shared_ptr<parallel::Communicator>;
using parallel::run_ranks;

namespace {

/// Forwards to `inner`, counting all-reduces: DDP must issue one per bucket per synced step.
class CountingCommunicator : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  int all_reduces = 0;

  std::shared_ptr<parallel::Work> all_reduce(const Tensor& t, parallel::ReduceOp op) override {
    ++all_reduces;
    return ForwardingCommunicator::all_reduce(t, op);
  }
};

}  // namespace

TEST_CASE("autograd: post-accumulate-grad hooks run after .grad is complete, once per backward, and can be removed") {
  Tensor w = random_tensor({3}, kFloat32, 1);
  w.requires_grad_();
  std::vector<std::vector<double>> seen;
  const uint64_t id =
      autograd::register_post_accumulate_grad_hook(w, [&](const Tensor& p) { seen.push_back(values_of(p.grad())); });
  // w used twice: the engine sums both uses before AccumulateGrad, so the hook sees 2 + 3 = 5 once
  sum(add(mul(w, 2.0), mul(w, 3.0))).backward();
  REQUIRE(seen.size() == 1);
  CHECK(seen[0] == std::vector<double>{5, 5, 5});
  sum(w).backward();  // accumulates: the hook sees the running total
  REQUIRE(seen.size() == 2);
  CHECK(seen[1] == std::vector<double>{6, 6, 6});
  autograd::remove_post_accumulate_grad_hook(w, id);
  sum(w).backward();
  CHECK(seen.size() == 2);
  check_error([&] { autograd::register_post_accumulate_grad_hook(ones({2}), [](const Tensor&) {}); },
              {"register_post_accumulate_grad_hook", "leaf"});
}

TEST_CASE("ddp: averaged gradients and AdamW steps equal the single-process model on the whole batch") {
  // explicit_sync: also call finish_gradient_sync() after backward (already done: a no-op)
  for (int p : {2, 4})
    for (int64_t cap : {int64_t(25) << 20, int64_t(256)})
      for (bool explicit_sync : {false, true}) {
        CAPTURE(p);
        CAPTURE(cap);
        CAPTURE(explicit_sync);
        const int64_t per_rank = 3, B = per_rank * p;
        auto ref = data_parallel_mlp(7);
        auto models = rank_models(*ref, p);
        optim::AdamW ref_opt(ref->parameters(), {.lr = 0.01});
        const Tensor x = random_tensor({2, B, 6}, kFloat32, 71);  // two steps' batches
        const Tensor y = random_tensor({2, B, 3}, kFloat32, 72);
        std::vector<std::vector<Tensor>> ref_grads, ref_params;
        for (int64_t s = 0; s < 2; ++s) {
          mse_loss(ref->forward(x[s]), y[s]).backward();
          std::vector<Tensor> g;
          for (const Tensor& t : ref->parameters()) g.push_back(t.grad().clone());
          ref_grads.push_back(g);
          ref_opt.step();
          ref_opt.zero_grad();
          std::vector<Tensor> w;
          for (const Tensor& t : ref->parameters()) w.push_back(t.detach().clone());
          ref_params.push_back(w);
        }
        PerRank<std::vector<std::vector<Tensor>>> grads(static_cast<size_t>(p)), params(static_cast<size_t>(p));
        PerRank<std::vector<std::vector<size_t>>> buckets(static_cast<size_t>(p));
        run_ranks(p, [&](const CommPtr& comm) {
          const int r = comm->rank();
          parallel::DistributedDataParallel ddp(models[size_t(r)], comm, {.bucket_cap_bytes = cap});
          buckets[size_t(r)] = ddp.bucket_assignment();
          optim::AdamW opt(ddp.parameters(), {.lr = 0.01});
          for (int64_t s = 0; s < 2; ++s) {
            mse_loss(ddp.forward(rows(x[s], r, per_rank)), rows(y[s], r, per_rank)).backward();
            if (explicit_sync) ddp.finish_gradient_sync();
            std::vector<Tensor> g;
            for (const Tensor& t : ddp.parameters()) g.push_back(t.grad().clone());
            grads[size_t(r)].push_back(g);
            opt.step();
            opt.zero_grad();
            std::vector<Tensor> w;
            for (const Tensor& t : ddp.parameters()) w.push_back(t.detach().clone());
            params[size_t(r)].push_back(w);
          }
        });
        // buckets: reverse parameter order; with a 256-byte cap {l3.b, l3.w, l2.b}, {l2.w}, {l1.b, l1.w}
        const std::vector<std::vector<size_t>> expect_small{{5, 4, 3}, {2}, {1, 0}};
        const std::vector<std::vector<size_t>> expect_one{{5, 4, 3, 2, 1, 0}};
        for (int r = 0; r < p; ++r) {
          CAPTURE(r);
          CHECK(buckets[size_t(r)] == (cap == 256 ? expect_small : expect_one));
          for (size_t s = 0; s < 2; ++s)
            for (size_t i = 0; i < ref_grads[s].size(); ++i) {
              check_equiv(grads[size_t(r)][s][i], ref_grads[s][i], "grad " + std::to_string(i));
              check_equiv(params[size_t(r)][s][i], ref_params[s][i], "param " + std::to_string(i));
            }
        }
      }
}

TEST_CASE("ddp: no_sync accumulation over micro-batches equals the whole batch") {
  for (int p : {2, 4})
    for (bool explicit_sync : {false, true}) {
      CAPTURE(p);
      CAPTURE(explicit_sync);
      const int64_t micro = 3, per_mb = 2, B = p * micro * per_mb;
      auto ref = data_parallel_mlp(8);
      auto models = rank_models(*ref, p);
      const Tensor x = random_tensor({B, 6}, kFloat32, 81), y = random_tensor({B, 3}, kFloat32, 82);
      // Each rank sums `micro` micro-batch means; the mean over ranks is micro * the batch mean.
      mul(mse_loss(ref->forward(x), y), double(micro)).backward();
      PerRank<std::vector<Tensor>> local(static_cast<size_t>(p)), grads(static_cast<size_t>(p));
      run_ranks(p, [&](const CommPtr& comm) {
        const int r = comm->rank();
        parallel::DistributedDataParallel ddp(models[size_t(r)], comm, {.bucket_cap_bytes = 200});
        const Tensor xr = rows(x, r, micro * per_mb), yr = rows(y, r, micro * per_mb);
        {
          auto guard = ddp.no_sync();
          for (int64_t m = 0; m + 1 < micro; ++m) {
            mse_loss(ddp.forward(rows(xr, m, per_mb)), rows(yr, m, per_mb)).backward();
            if (explicit_sync) ddp.finish_gradient_sync();  // nothing to sync: a no-op, no collective
          }
        }
        for (const Tensor& t : ddp.parameters()) local[size_t(r)].push_back(t.grad().clone());
        mse_loss(ddp.forward(rows(xr, micro - 1, per_mb)), rows(yr, micro - 1, per_mb)).backward();
        if (explicit_sync) ddp.finish_gradient_sync();
        for (const Tensor& t : ddp.parameters()) grads[size_t(r)].push_back(t.grad().clone());
      });
      // under no_sync nothing was communicated: each rank holds its own micro-batches' sum
      auto single = data_parallel_mlp(8);
      for (int r = 0; r < p; ++r) {
        single->zero_grad();
        const Tensor xr = rows(x, r, micro * per_mb), yr = rows(y, r, micro * per_mb);
        for (int64_t m = 0; m + 1 < micro; ++m)
          mse_loss(single->forward(rows(xr, m, per_mb)), rows(yr, m, per_mb)).backward();
        const std::vector<Tensor> ps = single->parameters();
        for (size_t i = 0; i < ps.size(); ++i)
          check_equiv(local[size_t(r)][i], ps[i].grad(), "local grad " + std::to_string(i));
      }
      const std::vector<Tensor> ref_params = ref->parameters();
      for (int r = 0; r < p; ++r)
        for (size_t i = 0; i < ref_params.size(); ++i)
          check_equiv(grads[size_t(r)][i], ref_params[i].grad(), "grad " + std::to_string(i));
    }
}

TEST_CASE("ddp: the sync waits for the outer backward when the first hooks fire in a checkpoint's recompute") {
  // The last two Linears run inside autograd::checkpoint: their hooks fire in the nested
  // engine run, the first Linear's later, in the outer run; all must be averaged.
  for (int p : {2, 4}) {
    CAPTURE(p);
    const int64_t per_rank = 2, B = per_rank * p;
    auto ref = data_parallel_mlp(11);
    auto models = rank_models(*ref, p);
    const Tensor x = random_tensor({B, 6}, kFloat32, 111), y = random_tensor({B, 3}, kFloat32, 112);
    mse_loss(ref->forward(x), y).backward();
    PerRank<std::vector<Tensor>> grads(static_cast<size_t>(p));
    PerRank<int> all_reduces(static_cast<size_t>(p)), after_finish(static_cast<size_t>(p));
    PerRank<size_t> buckets(static_cast<size_t>(p));
    run_ranks(p, [&](const CommPtr& comm) {
      const int r = comm->rank();
      const auto& seq = *models[size_t(r)];
      auto counting = std::make_shared<CountingCommunicator>(comm);
      parallel::DistributedDataParallel ddp(models[size_t(r)], counting, {.bucket_cap_bytes = 64});
      buckets[size_t(r)] = ddp.bucket_assignment().size();
      const Tensor h = seq[1]->forward(seq[0]->forward(rows(x, r, per_rank)));
      const Tensor out = autograd::checkpoint(
          [&](const Tensor& t) { return seq[4]->forward(seq[3]->forward(seq[2]->forward(t))); }, h);
      mse_loss(out, rows(y, r, per_rank)).backward();
      all_reduces[size_t(r)] = counting->all_reduces;
      ddp.finish_gradient_sync();  // already done at the end of backward: no collective
      after_finish[size_t(r)] = counting->all_reduces;
      for (const Tensor& t : ddp.parameters()) grads[size_t(r)].push_back(t.grad().clone());
    });
    const std::vector<Tensor> ps = ref->parameters();
    for (int r = 0; r < p; ++r) {
      CAPTURE(r);
      // one sync, after the outer run (one at the end of the nested run too would launch every bucket twice)
      CHECK(buckets[size_t(r)] == 6);
      CHECK(all_reduces[size_t(r)] == 6);
      CHECK(after_finish[size_t(r)] == 6);
      for (size_t i = 0; i < ps.size(); ++i)
        check_equiv(grads[size_t(r)][i], ps[i].grad(), "grad " + std::to_string(i));
    }
  }
}

TEST_CASE("ddp and zero-2: two checkpointed forwards summed into one backward equal one process") {
  // Each forward's replay is a nested backward: a parameter's gradient arrives twice, the
  // second time after its bucket was launched ("arrived again after its bucket was launched"
  // was refused; PyTorch's reentrant checkpoint refuses it too). Note [Late gradients].
  for (int p : {2, 3})
    for (int64_t cap : {int64_t(64), int64_t(25) << 20}) {  // six buckets; one
      CAPTURE(p);
      CAPTURE(cap);
      const int64_t per_mb = 2, B = 2 * per_mb * p;
      auto ref = data_parallel_mlp(17);
      auto ddp_models = rank_models(*ref, p, /*equal=*/true), zero_models = rank_models(*ref, p, /*equal=*/true);
      const Tensor x = random_tensor({B, 6}, kFloat32, 171), y = random_tensor({B, 3}, kFloat32, 172);
      // each rank sums its two micro-batch means; their mean over ranks is twice the batch's
      const auto two_forwards = [&](nn::Sequential& m, const Tensor& xr, const Tensor& yr) {
        Tensor loss;
        for (int64_t mb = 0; mb < 2; ++mb) {
          const Tensor xm = rows(xr, mb, per_mb), ym = rows(yr, mb, per_mb);
          const Tensor out = nn::checkpoint_sequential(m, 2, xm);
          const Tensor l = mse_loss(out, ym);
          loss = loss.defined() ? add(loss, l) : l;
        }
        return loss;
      };
      mul(mse_loss(ref->forward(x), y), 2.0).backward();
      const std::vector<Tensor> ps = ref->parameters();
      PerRank<std::vector<Tensor>> ddp_grads(static_cast<size_t>(p)), zero_weights(static_cast<size_t>(p));
      run_ranks(p, [&](const CommPtr& comm) {
        const int r = comm->rank();
        const Tensor xr = rows(x, r, 2 * per_mb), yr = rows(y, r, 2 * per_mb);
        parallel::DistributedDataParallel ddp(ddp_models[size_t(r)], comm, {.bucket_cap_bytes = cap});
        two_forwards(*ddp_models[size_t(r)], xr, yr).backward();
        for (const Tensor& t : ddp.parameters()) ddp_grads[size_t(r)].push_back(t.grad().clone());
        parallel::ZeroAdamW opt(zero_models[size_t(r)]->parameters(), comm, {.lr = 0.02},
                                {.stage = 2, .bucket_cap_bytes = cap});
        two_forwards(*zero_models[size_t(r)], xr, yr).backward();
        opt.step();
        for (const Tensor& t : zero_models[size_t(r)]->parameters())
          zero_weights[size_t(r)].push_back(t.detach().clone());
      });
      optim::AdamW ref_opt(ref->parameters(), {.lr = 0.02});
      std::vector<Tensor> ref_grads;
      for (const Tensor& t : ps) ref_grads.push_back(t.grad().clone());
      ref_opt.step();
      for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        for (size_t i = 0; i < ps.size(); ++i) {
          check_equiv(ddp_grads[size_t(r)][i], ref_grads[i], "ddp grad " + std::to_string(i));
          check_equiv(zero_weights[size_t(r)][i], ps[i].detach(), "zero-2 param " + std::to_string(i));
        }
      }
    }
}

TEST_CASE("ddp: a parameter unused on some ranks gets the mean over ranks (zeros from the others)") {
  const int p = 2;
  auto ref = data_parallel_mlp(9);
  auto models = rank_models(*ref, p, /*equal=*/true);
  const Tensor x = random_tensor({4, 6}, kFloat32, 91);
  PerRank<std::vector<Tensor>> grads(static_cast<size_t>(p));
  run_ranks(p, [&](const CommPtr& comm) {
    const int r = comm->rank();
    parallel::DistributedDataParallel ddp(models[size_t(r)], comm, {.bucket_cap_bytes = 64});
    // rank 0 uses only the first Linear, rank 1 the whole model
    const auto& seq = *models[size_t(r)];
    const Tensor out = r == 0 ? seq[0]->forward(rows(x, r, 2)) : ddp.forward(rows(x, r, 2));
    sum(out).backward();  // rank 0's sync fills the unreached parameters with zeros
    for (const Tensor& t : ddp.parameters()) grads[size_t(r)].push_back(t.grad().clone());
  });
  // reference: the mean of the two ranks' gradients, computed separately
  const auto& seq = *ref;
  sum(seq[0]->forward(rows(x, 0, 2))).backward();
  std::vector<Tensor> g0;
  for (const Tensor& t : ref->parameters()) g0.push_back(t.grad().defined() ? t.grad().clone() : zeros_like(t));
  ref->zero_grad();
  sum(ref->forward(rows(x, 1, 2))).backward();
  const std::vector<Tensor> ps = ref->parameters();
  for (int r = 0; r < p; ++r)
    for (size_t i = 0; i < ps.size(); ++i)
      check_equiv(grads[size_t(r)][i], div(add(g0[i], ps[i].grad()), 2.0), "grad " + std::to_string(i));
}

TEST_CASE("zero-1: sharded AdamW steps equal AdamW on the whole batch") {
  for (int p : {2, 4}) {
    CAPTURE(p);
    const int64_t per_rank = 2, B = per_rank * p, steps = 3;
    auto ref = data_parallel_mlp(10);
    auto models = rank_models(*ref, p, /*equal=*/true);
    const optim::AdamWOptions opts{.lr = 0.02, .weight_decay = 0.1};
    optim::AdamW ref_opt(ref->parameters(), opts);
    const Tensor x = random_tensor({steps, B, 6}, kFloat32, 101), y = random_tensor({steps, B, 3}, kFloat32, 102);
    for (int64_t s = 0; s < steps; ++s) {
      mse_loss(ref->forward(x[s]), y[s]).backward();
      ref_opt.step();
      ref_opt.zero_grad();
    }
    PerRank<std::vector<Tensor>> params(static_cast<size_t>(p));
    PerRank<int64_t> shard(static_cast<size_t>(p));
    run_ranks(p, [&](const CommPtr& comm) {
      const int r = comm->rank();
      auto& model = *models[size_t(r)];
      parallel::ZeroAdamW opt(model.parameters(), comm, opts);
      shard[size_t(r)] = opt.shard_numel();
      for (int64_t s = 0; s < steps; ++s) {
        mse_loss(model.forward(rows(x[s], r, per_rank)), rows(y[s], r, per_rank)).backward();
        opt.step();
        opt.zero_grad();
      }
      for (const Tensor& t : model.parameters()) params[size_t(r)].push_back(t.detach().clone());
    });
    const std::vector<Tensor> ps = ref->parameters();
    const int64_t total = ref->num_parameters();
    for (int r = 0; r < p; ++r) {
      CHECK(shard[size_t(r)] == (total + p - 1) / p);
      for (size_t i = 0; i < ps.size(); ++i) check_equiv(params[size_t(r)][i], ps[i], "param " + std::to_string(i));
    }
  }
}

TEST_CASE("zero-1: a parameter without a gradient is an error naming it") {
  run_ranks(2, [&](const CommPtr& comm) {
    Tensor a = ones({3}), b = ones({2});
    a.requires_grad_(), b.requires_grad_();
    parallel::ZeroAdamW opt({a, b}, comm);
    sum(a).backward();
    check_error([&] { opt.step(); }, {"ZeroAdamW.step", "parameter 1", "no gradient"});
  });
}
