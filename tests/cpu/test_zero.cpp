// ZeRO-2 (parallel/zero.h, ZeroOptions{.stage = 2}) on the threads backend, 2 and 4 ranks:
// gradients reduce-scattered per bucket during backward, each rank keeping its shard.
// Checked against one process running optim::AdamW on the whole batch (f32, 1e-5
// relative: check_equiv) and against ZeRO-1: the gradient shard against the single-process
// gradient's elements, the weights after each step, the loss before each step; gradient
// accumulation (two backward passes per step, with and without no_sync); per-rank bytes
// against Note [ZeRO-2]'s formulas; a checkpointed block; a rank that fails mid-backward.
// The model has 155 parameters, divisible by neither 2 nor 4 (nor are its small buckets).
#include <doctest/doctest.h>

#include <chrono>
#include <limits>
#include <map>
#include <string>

#include "autograd/checkpoint.h"
#include "autograd/meta.h"
#include "autograd/ops/all.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "parallel/thread_communicator.h"
#include "parallel/zero.h"
#include "tensor/factory.h"
#include "tensor/ops/fill.h"
#include "tests/cpu/parallel_test_util.h"
#include "tests/error_text.h"

using namespace frugal;
using namespace frugal::testing;
using CommPtr = std::shared_ptr<parallel::Communicator>;
using parallel::run_ranks;

namespace {

/// The elements rank r owns of `grads` (one per parameter), laid out as ZeroAdamW's shard:
/// bucket by bucket, each bucket's parameters end to end, zero-padded to a multiple of p,
/// chunk r. An independent re-derivation of the layout of Note [ZeRO-1 step].
std::vector<double> shard_of(const std::vector<Tensor>& grads, const std::vector<std::vector<size_t>>& buckets, int p,
                             int r) {
  std::vector<double> out;
  for (const auto& b : buckets) {
    std::vector<double> flat;
    for (size_t k : b) {
      const std::vector<double> v = values_of(grads[k]);
      flat.insert(flat.end(), v.begin(), v.end());
    }
    while (flat.size() % size_t(p) != 0) flat.push_back(0.0);
    const size_t n = flat.size() / size_t(p);
    out.insert(out.end(), flat.begin() + long(size_t(r) * n), flat.begin() + long(size_t(r + 1) * n));
  }
  return out;
}

constexpr optim::AdamWOptions kOpts{.lr = 0.02, .weight_decay = 0.1};

}  // namespace

TEST_CASE("zero-2: gradient shards, losses and AdamW steps equal one process on the whole batch, and ZeRO-1") {
  // cap: one bucket of everything; {l3.b l3.w l2.b} {l2.w} {l1.b l1.w}; one bucket per parameter
  for (int p : {2, 4})
    for (int64_t cap : {int64_t(25) << 20, int64_t(256), int64_t(16)}) {
      CAPTURE(p);
      CAPTURE(cap);
      const int64_t per_rank = 2, B = per_rank * p, steps = 3;
      auto ref = data_parallel_mlp(10);
      auto zero1_models = rank_models(*ref, p, /*equal=*/true), zero2_models = rank_models(*ref, p, /*equal=*/true);
      optim::AdamW ref_opt(ref->parameters(), kOpts);
      const Tensor x = random_tensor({steps, B, 6}, kFloat32, 101), y = random_tensor({steps, B, 3}, kFloat32, 102);
      std::vector<double> ref_loss;
      std::vector<std::vector<Tensor>> ref_grads, ref_params;
      for (int64_t s = 0; s < steps; ++s) {
        Tensor loss = mse_loss(ref->forward(x[s]), y[s]);
        ref_loss.push_back(loss.item<double>());
        loss.backward();
        std::vector<Tensor> g, w;
        for (const Tensor& t : ref->parameters()) g.push_back(t.grad().clone());
        ref_grads.push_back(g);
        ref_opt.step();
        ref_opt.zero_grad();
        for (const Tensor& t : ref->parameters()) w.push_back(t.detach().clone());
        ref_params.push_back(w);
      }
      using Steps = std::vector<std::vector<Tensor>>;                        // per step, per parameter
      PerRank<std::vector<Steps>> params(size_t(p), std::vector<Steps>(2));  // per rank, per stage
      PerRank<std::vector<Tensor>> shards(static_cast<size_t>(p));
      PerRank<std::vector<double>> losses(static_cast<size_t>(p));
      PerRank<int64_t> grads_left(static_cast<size_t>(p));
      PerRank<std::vector<std::vector<size_t>>> buckets(static_cast<size_t>(p));
      run_ranks(p, [&](const CommPtr& comm) {
        const int r = comm->rank();
        for (int stage : {1, 2}) {
          auto& model = *(stage == 1 ? zero1_models : zero2_models)[size_t(r)];
          parallel::ZeroAdamW opt(model.parameters(), comm, kOpts, {.stage = stage, .bucket_cap_bytes = cap});
          if (stage == 2) buckets[size_t(r)] = opt.bucket_assignment();
          for (int64_t s = 0; s < steps; ++s) {
            Tensor loss = mse_loss(model.forward(rows(x[s], r, per_rank)), rows(y[s], r, per_rank));
            loss.backward();
            if (stage == 2) {
              losses[size_t(r)].push_back(loss.item<double>());
              shards[size_t(r)].push_back(opt.gradient_shard().clone());
              for (const Tensor& t : model.parameters()) grads_left[size_t(r)] += t.grad().defined() ? 1 : 0;
            }
            opt.step();
            opt.zero_grad();
            std::vector<Tensor> w;
            for (const Tensor& t : model.parameters()) w.push_back(t.detach().clone());
            params[size_t(r)][size_t(stage - 1)].push_back(w);
          }
        }
      });
      const size_t n_params = ref_params[0].size();
      for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        CHECK(grads_left[size_t(r)] == 0);  // stage 2 leaves no full .grad after backward
        CHECK(buckets[size_t(r)] == buckets[0]);
        CHECK(buckets[size_t(r)].size() == (cap > 1000 ? 1u : cap == 256 ? 3u : 6u));
        for (size_t s = 0; s < size_t(steps); ++s) {
          check_equiv(values_of(shards[size_t(r)][s]), shard_of(ref_grads[s], buckets[0], p, r), "gradient shard");
          for (size_t i = 0; i < n_params; ++i) {
            check_equiv(params[size_t(r)][1][s][i], ref_params[s][i], "zero-2 param " + std::to_string(i));
            check_equiv(params[size_t(r)][1][s][i], params[size_t(r)][0][s][i],
                        "zero-2 vs zero-1 " + std::to_string(i));
          }
        }
      }
      for (size_t s = 0; s < size_t(steps); ++s) {  // the global loss: the mean of the ranks' (equal) shards'
        double mean = 0;
        for (int r = 0; r < p; ++r) mean += losses[size_t(r)][s] / p;
        check_equiv(std::vector<double>{mean}, std::vector<double>{ref_loss[s]}, "loss");
      }
    }
}

TEST_CASE("zero-2: gradient accumulation over 2 micro-batches per step (and under no_sync) equals the whole batch") {
  for (int p : {2, 4})
    for (bool no_sync : {false, true}) {
      CAPTURE(p);
      CAPTURE(no_sync);
      const int64_t micro = 2, per_mb = 2, B = p * micro * per_mb, steps = 2;
      auto ref = data_parallel_mlp(12);
      auto models = rank_models(*ref, p, /*equal=*/true);
      optim::AdamW ref_opt(ref->parameters(), kOpts);
      const Tensor x = random_tensor({steps, B, 6}, kFloat32, 121), y = random_tensor({steps, B, 3}, kFloat32, 122);
      std::vector<std::vector<Tensor>> ref_params;
      for (int64_t s = 0; s < steps; ++s) {
        // Each rank sums `micro` micro-batch means; their mean over ranks is micro * the batch mean.
        mul(mse_loss(ref->forward(x[s]), y[s]), double(micro)).backward();
        ref_opt.step();
        ref_opt.zero_grad();
        std::vector<Tensor> w;
        for (const Tensor& t : ref->parameters()) w.push_back(t.detach().clone());
        ref_params.push_back(w);
      }
      PerRank<std::vector<std::vector<Tensor>>> params(static_cast<size_t>(p));
      PerRank<int64_t> local_grad_bytes(static_cast<size_t>(p));
      run_ranks(p, [&](const CommPtr& comm) {
        const int r = comm->rank();
        auto& model = *models[size_t(r)];
        parallel::ZeroAdamW opt(model.parameters(), comm, kOpts, {.stage = 2, .bucket_cap_bytes = 200});
        for (int64_t s = 0; s < steps; ++s) {
          const Tensor xr = rows(x[s], r, micro * per_mb), yr = rows(y[s], r, micro * per_mb);
          for (int64_t m = 0; m < micro; ++m) {
            auto run = [&] { mse_loss(model.forward(rows(xr, m, per_mb)), rows(yr, m, per_mb)).backward(); };
            if (no_sync && m + 1 < micro) {
              auto guard = opt.no_sync();
              run();
              local_grad_bytes[size_t(r)] = opt.memory_report().param_grad_bytes;  // the full .grad, kept locally
            } else {
              run();
            }
          }
          opt.step();
          opt.zero_grad();
          std::vector<Tensor> w;
          for (const Tensor& t : model.parameters()) w.push_back(t.detach().clone());
          params[size_t(r)].push_back(w);
        }
      });
      for (int r = 0; r < p; ++r) {
        CHECK(local_grad_bytes[size_t(r)] == (no_sync ? 155 * 4 : 0));
        for (size_t s = 0; s < size_t(steps); ++s)
          for (size_t i = 0; i < ref_params[s].size(); ++i)
            check_equiv(params[size_t(r)][s][i], ref_params[s][i], "param " + std::to_string(i));
      }
    }
}

TEST_CASE("zero-2: per-rank bytes of parameters, gradients and optimizer state match the formulas") {
  const int64_t N = 155, e = 4;  // f32
  for (int p : {2, 4})
    for (int64_t cap : {int64_t(25) << 20, int64_t(16)}) {  // one bucket; one per parameter
      CAPTURE(p);
      CAPTURE(cap);
      auto ref = data_parallel_mlp(13);
      auto zero1_models = rank_models(*ref, p, /*equal=*/true), zero2_models = rank_models(*ref, p, /*equal=*/true);
      const Tensor x = random_tensor({2 * p, 6}, kFloat32, 131), y = random_tensor({2 * p, 3}, kFloat32, 132);
      PerRank<std::vector<parallel::ZeroMemoryReport>> reports(static_cast<size_t>(p));
      PerRank<std::vector<int64_t>> bucket_numel(static_cast<size_t>(p));
      PerRank<int64_t> shard(static_cast<size_t>(p));
      run_ranks(p, [&](const CommPtr& comm) {
        const int r = comm->rank();
        for (int stage : {1, 2}) {
          auto& model = *(stage == 1 ? zero1_models : zero2_models)[size_t(r)];
          parallel::ZeroAdamW opt(model.parameters(), comm, kOpts, {.stage = stage, .bucket_cap_bytes = cap});
          auto& rep = reports[size_t(r)];
          rep.push_back(opt.memory_report());  // built: no gradient, no state
          mse_loss(model.forward(rows(x, r, 2)), rows(y, r, 2)).backward();
          rep.push_back(opt.memory_report());  // after backward
          opt.step();
          rep.push_back(opt.memory_report());  // after step
          opt.zero_grad();
          rep.push_back(opt.memory_report());  // at rest
          if (stage == 2) {
            shard[size_t(r)] = opt.shard_numel();
            const std::vector<Tensor> ps = model.parameters();
            for (const auto& b : opt.bucket_assignment()) {
              int64_t n = 0;
              for (size_t k : b) n += ps[k].numel();
              bucket_numel[size_t(r)].push_back(n);
            }
          }
        }
      });
      for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        // S = sum over buckets of ceil(n_b / p): N / p plus less than one per bucket
        int64_t S = 0, largest = 0;
        for (int64_t n : bucket_numel[size_t(r)]) {
          const int64_t m = (n + p - 1) / p * p;
          S += m / p;
          largest = std::max(largest, (m + m / p) * e);  // a bucket's flat buffer and its chunk
        }
        CHECK(shard[size_t(r)] == S);
        CHECK(S * p >= N);
        CHECK(S * p < N + p * int64_t(bucket_numel[size_t(r)].size()));
        const int64_t S1 = (N + p - 1) / p;  // stage 1: one bucket
        const auto& rep = reports[size_t(r)];
        for (int stage : {1, 2}) {
          CAPTURE(stage);
          const int64_t s = stage == 1 ? S1 : S;
          const parallel::ZeroMemoryReport* at = &rep[size_t(stage - 1) * 4];
          for (int i = 0; i < 4; ++i) CHECK(at[i].parameter_bytes == (N + s) * e);
          CHECK(at[0].param_grad_bytes + at[0].gradient_shard_bytes + at[0].optimizer_state_bytes == 0);
          // after backward: stage 1 holds every full .grad; stage 2 only its shard
          CHECK(at[1].param_grad_bytes == (stage == 1 ? N * e : 0));
          CHECK(at[1].gradient_shard_bytes == (stage == 1 ? 0 : s * e));
          CHECK(at[1].bucket_bytes == 0);
          CHECK(at[1].optimizer_state_bytes == 0);
          CHECK(at[2].optimizer_state_bytes == 2 * s * e);  // exp_avg, exp_avg_sq of the shard only
          CHECK(at[2].gradient_shard_bytes == s * e);
          CHECK(at[3].param_grad_bytes + at[3].gradient_shard_bytes + at[3].bucket_bytes == 0);
          CHECK(at[3].optimizer_state_bytes == 2 * s * e);
          if (stage == 1) CHECK(at[1].bucket_bytes_peak == 0);
        }
        // stage 2's transient buckets: one bucket of everything is exactly its buffer and
        // chunk; with six small ones, between the largest and 3 (2 in flight + 1) of them
        const int64_t peak = rep[5].bucket_bytes_peak;
        if (bucket_numel[size_t(r)].size() == 1) CHECK(peak == largest);
        else {
          CHECK(peak >= largest);
          CHECK(peak <= 3 * largest);
          CHECK(peak < (S1 * p + S1) * e);  // below one bucket of everything
        }
      }
    }
}

TEST_CASE("zero-2: buckets whose hooks fire in a checkpoint's recompute still shard the whole gradient") {
  // The last two Linears run inside autograd::checkpoint: their hooks fire in the nested
  // engine run, the first Linear's in the outer one (Note [Gradient buckets]).
  for (int p : {2, 4}) {
    CAPTURE(p);
    const int64_t per_rank = 2, B = per_rank * p;
    auto ref = data_parallel_mlp(15);
    auto models = rank_models(*ref, p, /*equal=*/true);
    optim::AdamW ref_opt(ref->parameters(), kOpts);
    const Tensor x = random_tensor({B, 6}, kFloat32, 151), y = random_tensor({B, 3}, kFloat32, 152);
    mse_loss(ref->forward(x), y).backward();
    const std::vector<Tensor> ps = ref->parameters();
    std::vector<Tensor> ref_grads;
    for (const Tensor& t : ps) ref_grads.push_back(t.grad().clone());
    ref_opt.step();
    PerRank<Tensor> shards(static_cast<size_t>(p));
    PerRank<std::vector<Tensor>> params(static_cast<size_t>(p));
    PerRank<std::vector<std::vector<size_t>>> buckets(static_cast<size_t>(p));
    run_ranks(p, [&](const CommPtr& comm) {
      const int r = comm->rank();
      const auto& seq = *models[size_t(r)];
      parallel::ZeroAdamW opt(models[size_t(r)]->parameters(), comm, kOpts, {.stage = 2, .bucket_cap_bytes = 64});
      buckets[size_t(r)] = opt.bucket_assignment();
      const Tensor h = seq[1]->forward(seq[0]->forward(rows(x, r, per_rank)));
      const Tensor out = autograd::checkpoint(
          [&](const Tensor& t) { return seq[4]->forward(seq[3]->forward(seq[2]->forward(t))); }, h);
      mse_loss(out, rows(y, r, per_rank)).backward();
      shards[size_t(r)] = opt.gradient_shard().clone();
      opt.step();
      for (const Tensor& t : models[size_t(r)]->parameters()) params[size_t(r)].push_back(t.detach().clone());
    });
    for (int r = 0; r < p; ++r) {
      CAPTURE(r);
      CHECK(buckets[size_t(r)].size() == 6);
      check_equiv(values_of(shards[size_t(r)]), shard_of(ref_grads, buckets[0], p, r), "gradient shard");
      for (size_t i = 0; i < ps.size(); ++i) check_equiv(params[size_t(r)][i], ps[i], "param " + std::to_string(i));
    }
  }
}

TEST_CASE("zero-2: a rank that throws mid-backward makes the others fail with its error, not hang") {
  const int p = 4;
  auto ref = data_parallel_mlp(14);
  auto models = rank_models(*ref, p, /*equal=*/true);
  const Tensor x = random_tensor({2 * p, 6}, kFloat32, 141), y = random_tensor({2 * p, 3}, kFloat32, 142);
  PerRank<std::string> errors(static_cast<size_t>(p));
  const auto start = std::chrono::steady_clock::now();
  const std::string err = error_of([&] {
    run_ranks(p, [&](const CommPtr& comm) {  // the default timeout (10 minutes): nobody may wait for it
      const int r = comm->rank();
      auto& model = *models[size_t(r)];
      parallel::ZeroAdamW opt(model.parameters(), comm, kOpts, {.stage = 2, .bucket_cap_bytes = 64});
      Tensor loss = mse_loss(model.forward(rows(x, r, 2)), rows(y, r, 2));
      if (r == 2) FRUGAL_FAIL("boom");  // after forward, before its buckets' reduce-scatters
      errors[size_t(r)] = error_of([&] {
        loss.backward();
        opt.step();
      });
    });
  });
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  check_contains(err, {"run_ranks: rank 2 failed: boom"});
  for (int r : {0, 1, 3}) {
    CAPTURE(r);
    check_contains(errors[size_t(r)], {"reduce_scatter", "rank 2 failed: boom"});
  }
}

TEST_CASE("zero-2: misuse is an error that says what to do") {
  run_ranks(2, [&](const CommPtr& comm) {
    Tensor a = ones({3});
    a.requires_grad_();
    check_error([&] { parallel::ZeroAdamW({a}, comm, {}, {.stage = 3}); }, {"ZeroAdamW", "stage must be 1 or 2"});
    parallel::ZeroAdamW one({a}, comm);
    check_error([&] { (void)one.no_sync(); }, {"ZeroAdamW.no_sync", "stage 2"});
  });
  run_ranks(2, [&](const CommPtr& comm) {
    Tensor a = ones({3});
    a.requires_grad_();
    parallel::ZeroAdamW two({a}, comm, {}, {.stage = 2});
    check_error([&] { two.step(); }, {"ZeroAdamW.step", "no gradient shard", "backward"});
  });
}

namespace {
/// The model's parameters after each step.
using WeightsPerStep = std::vector<std::vector<Tensor>>;

std::vector<Tensor> copies(const std::vector<Tensor>& params) {
  std::vector<Tensor> w;
  for (const Tensor& t : params) w.push_back(t.detach().clone());
  return w;
}

/// `g` with element 3 set to inf (an overflow on one rank only).
Tensor with_inf(const Tensor& g) {
  Tensor h = g.clone();
  ops::fill_(h.view({-1}).narrow(0, 3, 1), std::numeric_limits<double>::infinity());
  return h;
}
}  // namespace

TEST_CASE("zero-1/2: clip_grad_norm_ takes the whole model's norm across the shards (2-norm and inf-norm)") {
  // Each rank's shard holds the averaged gradient of its own elements: the norm is the
  // ranks' power sums combined, and every rank clips by it, as one process clips the model.
  for (const double norm_type : {2.0, std::numeric_limits<double>::infinity()})
    for (int p : {2, 3})
      for (int stage : {1, 2}) {
        CAPTURE(norm_type);
        CAPTURE(p);
        CAPTURE(stage);
        const int64_t per_rank = 2, B = per_rank * p, steps = 3;
        const double max_norm = 0.05;  // below every step's norm: each step clips
        const Tensor x = random_tensor({steps, B, 6}, kFloat32, 141), y = random_tensor({steps, B, 3}, kFloat32, 142);
        auto ref = data_parallel_mlp(14);
        auto models = rank_models(*ref, p, /*equal=*/true);
        optim::AdamW ref_opt(ref->parameters(), kOpts);
        std::vector<double> ref_norms;
        WeightsPerStep ref_weights;
        for (int64_t s = 0; s < steps; ++s) {
          mse_loss(ref->forward(x[s]), y[s]).backward();
          ref_norms.push_back(optim::clip_grad_norm_(ref->parameters(), max_norm, norm_type));
          ref_opt.step();
          ref_opt.zero_grad();
          ref_weights.push_back(copies(ref->parameters()));
        }
        PerRank<std::vector<double>> norms(static_cast<size_t>(p));
        PerRank<WeightsPerStep> weights(static_cast<size_t>(p));
        run_ranks(p, [&](const CommPtr& comm) {
          const int r = comm->rank();
          auto& model = *models[size_t(r)];
          parallel::ZeroAdamW opt(model.parameters(), comm, kOpts, {.stage = stage, .bucket_cap_bytes = 256});
          for (int64_t s = 0; s < steps; ++s) {
            mse_loss(model.forward(rows(x[s], r, per_rank)), rows(y[s], r, per_rank)).backward();
            norms[size_t(r)].push_back(opt.clip_grad_norm_(max_norm, norm_type));
            opt.step();
            opt.zero_grad();
            weights[size_t(r)].push_back(copies(model.parameters()));
          }
        });
        for (int r = 0; r < p; ++r) {
          CAPTURE(r);
          check_equiv(norms[size_t(r)], ref_norms, "total norm");
          for (size_t s = 0; s < size_t(steps); ++s)
            for (size_t i = 0; i < ref_weights[s].size(); ++i)
              check_equiv(weights[size_t(r)][s][i], ref_weights[s][i], "param " + std::to_string(i));
        }
      }
}

TEST_CASE("zero-1/2: a GradScaler with found_inf_sync skips on every rank when one rank's shard overflows") {
  // Step 1 puts an inf into one element of the first parameter's gradient on rank 0 only:
  // after the reduce-scatter only the rank owning that element sees it. One process skips
  // step 1 and halves the scale; every rank must, or the shards step apart. The steps also
  // clip (after unscale_), as a mixed-precision loop does.
  const int p = 2;
  const int64_t per_rank = 2, B = per_rank * p, steps = 3;
  const double max_norm = 0.05;
  const Tensor x = random_tensor({steps, B, 6}, kFloat32, 151), y = random_tensor({steps, B, 3}, kFloat32, 152);
  int64_t ref_step = 0;
  auto ref = data_parallel_mlp(15);
  const std::vector<decltype(rank_models(*ref, p))> models{rank_models(*ref, p, /*equal=*/true),
                                                           rank_models(*ref, p, /*equal=*/true)};  // per stage
  autograd::register_hook(ref->parameters()[0],
                          [&](const Tensor& g) { return ref_step == 1 ? with_inf(g) : Tensor(); });
  optim::AdamW ref_opt(ref->parameters(), kOpts);
  optim::GradScaler ref_scaler({.init_scale = 1024.0});
  std::vector<double> ref_scales;
  WeightsPerStep ref_weights;
  for (ref_step = 0; ref_step < steps; ++ref_step) {
    ref_scaler.scale(mse_loss(ref->forward(x[ref_step]), y[ref_step])).backward();
    ref_scaler.unscale_(ref_opt);
    optim::clip_grad_norm_(ref->parameters(), max_norm);
    ref_scaler.step(ref_opt);
    ref_scaler.update();
    ref_opt.zero_grad();
    ref_scales.push_back(ref_scaler.get_scale());
    ref_weights.push_back(copies(ref->parameters()));
  }
  CHECK(ref_scales == std::vector<double>{1024.0, 512.0, 512.0});
  for (int stage : {1, 2}) {
    CAPTURE(stage);
    const auto& ranks = models[size_t(stage - 1)];
    PerRank<std::vector<double>> scales(static_cast<size_t>(p));
    PerRank<WeightsPerStep> weights(static_cast<size_t>(p));
    run_ranks(p, [&](const CommPtr& comm) {
      const int r = comm->rank();
      auto& model = *ranks[size_t(r)];
      int64_t step = 0;
      if (r == 0)
        autograd::register_hook(model.parameters()[0],
                                [&](const Tensor& g) { return step == 1 ? with_inf(g) : Tensor(); });
      parallel::ZeroAdamW opt(model.parameters(), comm, kOpts, {.stage = stage, .bucket_cap_bytes = 256});
      optim::GradScaler unsynced({.init_scale = 1024.0});
      check_error([&] { opt.unscale_(unsynced); }, {"ZeroAdamW.unscale_", "2 ranks", "sync_found_inf"});
      check_error([&] { opt.step(unsynced); }, {"ZeroAdamW.step", "sync_found_inf"});
      optim::GradScaler scaler({.init_scale = 1024.0, .sync_found_inf = opt.found_inf_sync()});
      for (step = 0; step < steps; ++step) {
        scaler.scale(mse_loss(model.forward(rows(x[step], r, per_rank)), rows(y[step], r, per_rank))).backward();
        opt.unscale_(scaler);
        opt.clip_grad_norm_(max_norm);
        opt.step(scaler);
        scaler.update();
        opt.zero_grad();
        scales[size_t(r)].push_back(scaler.get_scale());
        weights[size_t(r)].push_back(copies(model.parameters()));
      }
    });
    for (int r = 0; r < p; ++r) {
      CAPTURE(r);
      CHECK(scales[size_t(r)] == ref_scales);
      for (size_t s = 0; s < size_t(steps); ++s)
        for (size_t i = 0; i < ref_weights[s].size(); ++i)
          check_equiv(weights[size_t(r)][s][i], ref_weights[s][i], "param " + std::to_string(i));
    }
  }
}

TEST_CASE("zero-1/2: reduce_gradients is idempotent until the step, and a backward after it is refused") {
  const Tensor x = random_tensor({4, 6}, kFloat32, 161), y = random_tensor({4, 3}, kFloat32, 162);
  auto ref = data_parallel_mlp(16);
  for (int stage : {1, 2}) {
    CAPTURE(stage);
    auto models = rank_models(*ref, 2, /*equal=*/true);
    run_ranks(2, [&](const CommPtr& comm) {
      const int r = comm->rank();
      auto& model = *models[size_t(r)];
      parallel::ZeroAdamW opt(model.parameters(), comm, kOpts, {.stage = stage, .bucket_cap_bytes = 256});
      auto backward = [&] { mse_loss(model.forward(rows(x, r, 2)), rows(y, r, 2)).backward(); };
      backward();
      opt.reduce_gradients();
      for (const Tensor& t : model.parameters()) CHECK(!t.grad().defined());  // stage 1 dropped them
      const Tensor shard = opt.gradient_shard().clone();
      opt.reduce_gradients();  // again: nothing more to reduce
      check_equiv(opt.gradient_shard(), shard, "shard after a second reduce");
      CHECK(opt.shard_optimizer().param_groups()[0].params[0].grad().defined());
      backward();
      check_error([&] { opt.step(); }, {"ZeroAdamW.step", "backward", "after the gradients were reduced"});
      opt.zero_grad();
      backward();
      opt.step();  // a fresh round steps
    });
  }
}

TEST_CASE(
    "zero-1/2: a parameter without a gradient is refused at the step, as stage 1 did; zeros after zero_grad(false)") {
  // Stage 2 filled its slot with zeros and stepped it: weight decay moved a parameter one
  // process's AdamW skips (E = 0.95^3 after 3 steps where one process leaves it at 1).
  run_ranks(2, [&](const CommPtr& comm) {
    for (int stage : {1, 2}) {
      CAPTURE(stage);
      const Tensor w = ones({4}).requires_grad_(), unused = ones({4}).requires_grad_();
      parallel::ZeroAdamW opt({w, unused}, comm, kOpts, {.stage = stage, .bucket_cap_bytes = 16});
      sum(mul(w, 2.0)).backward();
      check_error([&] { opt.step(); }, {"ZeroAdamW.step", "parameter 1", "float32[4]", "has no gradient"});
      opt.zero_grad();
      sum(mul(add(w, unused), 2.0)).backward();  // both used: a step
      opt.step();
      opt.zero_grad(/*set_to_none=*/false);  // every gradient now zeros, as .grad would be
      sum(mul(w, 2.0)).backward();
      opt.step();  // accepted: `unused` steps on zeros, as one process's AdamW on a zeroed .grad
    }
  });
}
