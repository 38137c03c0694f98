// Probes for silent wrong answers, crashes and hangs in parallel/ on the in-process threads
// backend, with the inputs users pass: world sizes 1-4, sizes the world size does not divide,
// size-0 and size-1 batches, transposed and strided inputs. Tensor parallel (column, row,
// MLP, vocab-parallel embedding and cross entropy), pipeline stages (GPipe, 1F1B, micro-batch
// counts of 1 up to the batch), DDP, ZeRO-1/2 (AdamW over shards of parameters of 1 and 0
// elements, gradient accumulation, resume) and ZeRO-3 (FSDP, sharded checkpoints): every
// output, gradient and parameter after optimizer steps is compared with the same model run
// on one rank (float64 wherever the API takes it), computed here. A failing case is a finding.
#include <doctest/doctest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops/all.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "parallel/ddp.h"
#include "parallel/fsdp.h"
#include "parallel/fsdp_checkpoint.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "parallel/thread_communicator.h"
#include "parallel/zero.h"
#include "tensor/factory.h"
#include "tests/cpu/parallel_test_util.h"

using namespace frugal;
using namespace frugal::testing;
using parallel::CommPtr;
using parallel::run_ranks;

namespace {

using Values = std::vector<double>;
/// A collective that never completes fails within this instead of hanging the suite.
constexpr std::chrono::milliseconds kShort = std::chrono::seconds(20);

/// A fresh leaf holding `v` in `shape`, laid out as `layout` (each rank its own).
Tensor input_of(const Values& v, const Shape& shape, Layout layout = Layout::Contiguous, DType dt = kFloat64) {
  Tensor t = make_tensor(v, shape, TensorOptions(dt), layout);
  t.requires_grad_();
  return t;
}
Tensor leaf(const Tensor& t) {
  Tensor c = t.detach().clone();
  c.requires_grad_();
  return c;
}

/// float64 results reached by another summation order: 1e-12 relative to the tensor's scale.
void check_f64(const Tensor& actual, const Tensor& expected, const std::string& what) {
  REQUIRE_MESSAGE(actual.defined(), what, ": undefined");
  REQUIRE_MESSAGE(expected.defined(), what, ": reference undefined");
  REQUIRE_MESSAGE(actual.sizes() == expected.sizes(), what, ": shape ", shape_str(actual.sizes()), " vs ",
                  shape_str(expected.sizes()));
  check_close(values_of(actual), values_of(expected), 1e-12, 1e-12 * std::max(max_abs(expected), 1.0), what);
}

/// Rows (dim 0) or columns (dim 1) of rank r's equal share of `full`.
Tensor shard_of(const Tensor& full, int64_t dim, int r, int p) {
  const int64_t n = full.size(dim) / p;
  return full.narrow(dim, int64_t(r) * n, n);
}

// ---- the data-parallel probe model -----------------------------------------------------------

/// x * s with s a parameter of one element.
struct Scale : nn::UnaryModule {
  Tensor s;
  explicit Scale(DType dt) { s = register_parameter("s", full({1}, 1.5, TensorOptions(dt))); }
  Tensor forward(const Tensor& x) override { return mul(x, s); }
  std::string type_name() const override { return "Scale"; }
};

/// x + x A^T B^T with A (0, n), B (n, 0): a rank-0 low-rank adapter, two 0-element parameters.
struct Adapter : nn::UnaryModule {
  Tensor a, b;
  Adapter(int64_t n, DType dt) {
    a = register_parameter("a", zeros({0, n}, TensorOptions(dt)));
    b = register_parameter("b", zeros({n, 0}, TensorOptions(dt)));
  }
  Tensor forward(const Tensor& x) override { return add(x, linear(linear(x, a), b)); }
  std::string type_name() const override { return "Adapter"; }
};

/// Linear(5, 7) Tanh Scale Adapter(7) Linear(7, 3): 67 parameters (42, 1, 0, 0, 24), sizes
/// the world sizes 2, 3 and 4 do not divide. Weights from `seed`, independent of the RNG.
std::shared_ptr<nn::Sequential> probe_model(DType dt, uint64_t seed) {
  auto m = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
      std::make_shared<nn::Linear>(5, 7), std::make_shared<nn::Tanh>(), std::make_shared<Scale>(dt),
      std::make_shared<Adapter>(7, dt), std::make_shared<nn::Linear>(7, 3)});
  m->to(dt);
  autograd::NoGradGuard no_grad;
  uint64_t k = seed * 100;
  for (const Tensor& p : m->parameters())
    p.detach().copy_(random_tensor(p.sizes(), dt, ++k, Layout::Contiguous, -0.8, 0.8));
  return m;
}

std::map<std::string, Tensor> params_of(const nn::Module& m) {
  std::map<std::string, Tensor> out;
  for (const auto& [k, v] : m.named_parameters()) out[k] = v.detach().clone();
  return out;
}

/// Two optimizer steps of `micro` backward calls each on this rank's rows (rows(t, step, k)),
/// the calls before a step's last under no_sync() when use_no_sync; the parameters after each.
template <typename Forward, typename NoSync, typename Optimizer, typename Rows>
std::vector<std::map<std::string, Tensor>> accumulated_steps(Forward&& forward, NoSync&& no_sync, Optimizer& opt,
                                                             const nn::Module& model, Rows&& rows, const Tensor& x,
                                                             const Tensor& y, int micro, bool use_no_sync) {
  std::vector<std::map<std::string, Tensor>> params;
  for (int64_t s = 0; s < 2; ++s) {
    for (int k = 0; k < micro; ++k) {
      auto run = [&] { mse_loss(forward(rows(x, s, k)), rows(y, s, k)).backward(); };
      if (use_no_sync && k + 1 < micro) {
        auto guard = no_sync();
        run();
      } else {
        run();
      }
    }
    opt.step();
    opt.zero_grad();
    params.push_back(params_of(model));
  }
  return params;
}
std::map<std::string, Tensor> grads_of(const nn::Module& m) {
  std::map<std::string, Tensor> out;
  for (const auto& [k, v] : m.named_parameters()) out[k] = v.grad().defined() ? v.grad().clone() : Tensor();
  return out;
}
void check_maps(const std::map<std::string, Tensor>& got, const std::map<std::string, Tensor>& want,
                const std::string& what, bool f64 = true) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    REQUIRE_MESSAGE(got.count(name), what, ": no ", name);
    if (f64) check_f64(got.at(name), t, what + " " + name);
    else check_equiv(got.at(name), t, what + " " + name);
  }
}

const optim::AdamWOptions kAdam{.lr = 0.05, .weight_decay = 0.1};

/// The one-rank reference: AdamW on the whole batch, `steps` steps of `micro` backward calls
/// each (micro-batch k of step s: rows [k B / micro, (k + 1) B / micro) of x[s]); the
/// parameters after every step and the gradients of the first.
struct Reference {
  std::vector<std::map<std::string, Tensor>> params;
  std::map<std::string, Tensor> first_grads;
};
Reference reference_run(DType dt, const Tensor& x, const Tensor& y, int micro = 1) {
  auto m = probe_model(dt, 1);
  optim::AdamW opt(m->parameters(), kAdam);
  Reference ref;
  const int64_t mb = x.size(1) / micro;
  for (int64_t s = 0; s < x.size(0); ++s) {
    for (int k = 0; k < micro; ++k) mse_loss(m->forward(rows(x[s], k, mb)), rows(y[s], k, mb)).backward();
    if (s == 0) ref.first_grads = grads_of(*m);
    opt.step();
    opt.zero_grad();
    ref.params.push_back(params_of(*m));
  }
  return ref;
}

/// Rank r's rows of micro-batch k when each of p ranks takes b rows of every micro-batch.
Tensor rank_rows(const Tensor& t, int k, int r, int p, int64_t b) { return t.narrow(0, (int64_t(k) * p + r) * b, b); }

}  // namespace

// ============================================================================================
// Tensor parallel
// ============================================================================================

TEST_CASE("probe parallel: column- and row-parallel linear over 1-4 ranks, batches 0/1/3, strided inputs") {
  const int64_t in = 12, out = 12;  // divisible by 1, 2, 3 and 4
  const Tensor w = random_tensor({out, in}, kFloat64, 1), b = random_tensor({out}, kFloat64, 2);
  for (int p : {1, 2, 3, 4})
    for (int64_t batch : {0, 1, 3})
      for (Layout layout : kAllLayouts) {
        CAPTURE(p);
        CAPTURE(batch);
        CAPTURE(layout_name(layout));
        const Shape xs{batch, 2, in};
        const Values xv = random_values(batch * 2 * in, 3);
        const Tensor c = random_tensor({batch, 2, out}, kFloat64, 4);
        Tensor xr = input_of(xv, xs), wr = leaf(w), br = leaf(b);
        const Tensor yr = linear(xr, wr, br);
        sum(mul(yr, c)).backward();
        PerRank<Results> got(static_cast<size_t>(p));
        run_ranks(
            p,
            [&](const CommPtr& comm) {
              parallel::ColumnParallelLinear col(in, out, comm);
              parallel::RowParallelLinear row(in, out, comm);
              col.to(kFloat64), row.to(kFloat64);
              col.load_full(w, b), row.load_full(w, b);
              Tensor x1 = input_of(xv, xs, layout), x2 = input_of(xv, xs, layout);
              const Tensor y1 = col.forward(x1), y2 = row.forward(x2);
              sum(mul(y1, c)).backward();
              sum(mul(y2, c)).backward();
              got[size_t(comm->rank())] = {{"col.y", y1.detach()},        {"col.xg", x1.grad()},
                                           {"col.wg", col.weight.grad()}, {"col.bg", col.bias.grad()},
                                           {"row.y", y2.detach()},        {"row.xg", x2.grad()},
                                           {"row.wg", row.weight.grad()}, {"row.bg", row.bias.grad()}};
            },
            kShort);
        for (int r = 0; r < p; ++r) {
          const Results& g = got[size_t(r)];
          for (const char* l : {"col", "row"}) {
            check_f64(g.at(std::string(l) + ".y"), yr, std::string(l) + " output");
            check_f64(g.at(std::string(l) + ".xg"), xr.grad(), std::string(l) + " input grad");
          }
          check_f64(g.at("col.wg"), shard_of(wr.grad(), 0, r, p), "column weight grad shard");
          check_f64(g.at("col.bg"), shard_of(br.grad(), 0, r, p), "column bias grad shard");
          check_f64(g.at("row.wg"), shard_of(wr.grad(), 1, r, p), "row weight grad shard");
          check_f64(g.at("row.bg"), br.grad(), "row bias grad");
        }
      }
}

TEST_CASE("probe parallel: column -> gelu -> row MLP over 3 ranks equals one rank after 3 SGD steps") {
  const int p = 3;
  const int64_t in = 5, hidden = 9, out = 4;  // in and out not divisible by 3: only hidden is split
  const Tensor w1 = random_tensor({hidden, in}, kFloat64, 11), b1 = random_tensor({hidden}, kFloat64, 12);
  const Tensor w2 = random_tensor({out, hidden}, kFloat64, 13), b2 = random_tensor({out}, kFloat64, 14);
  const Tensor x = random_tensor({3, 2, 4, in}, kFloat64, 15, Layout::Transposed);  // 3 steps of (2, 4, in)
  const Tensor y = random_tensor({3, 2, 4, out}, kFloat64, 16);
  const optim::SGDOptions sgd{.lr = 0.1, .momentum = 0.9};
  std::vector<std::map<std::string, Tensor>> ref;
  {
    Tensor rw1 = leaf(w1), rb1 = leaf(b1), rw2 = leaf(w2), rb2 = leaf(b2);
    optim::SGD opt({rw1, rb1, rw2, rb2}, sgd);
    for (int64_t s = 0; s < 3; ++s) {
      mse_loss(linear(gelu(linear(x[s], rw1, rb1)), rw2, rb2), y[s]).backward();
      opt.step();
      opt.zero_grad();
      ref.push_back({{"w1", rw1.detach().clone()},
                     {"b1", rb1.detach().clone()},
                     {"w2", rw2.detach().clone()},
                     {"b2", rb2.detach().clone()}});
    }
  }
  PerRank<std::vector<Results>> got(static_cast<size_t>(p));
  run_ranks(
      p,
      [&](const CommPtr& comm) {
        parallel::ColumnParallelLinear fc1(in, hidden, comm, {.gather_output = false});
        parallel::RowParallelLinear fc2(hidden, out, comm, {.input_is_parallel = true});
        fc1.to(kFloat64), fc2.to(kFloat64);
        fc1.load_full(w1, b1), fc2.load_full(w2, b2);
        optim::SGD opt({fc1.weight, fc1.bias, fc2.weight, fc2.bias}, sgd);
        for (int64_t s = 0; s < 3; ++s) {
          mse_loss(fc2.forward(gelu(fc1.forward(x[s]))), y[s]).backward();
          opt.step();
          opt.zero_grad();
          got[size_t(comm->rank())].push_back({{"w1", fc1.weight.detach().clone()},
                                               {"b1", fc1.bias.detach().clone()},
                                               {"w2", fc2.weight.detach().clone()},
                                               {"b2", fc2.bias.detach().clone()}});
        }
      },
      kShort);
  for (int r = 0; r < p; ++r)
    for (size_t s = 0; s < 3; ++s) {
      CAPTURE(r);
      CAPTURE(s);
      const Results& g = got[size_t(r)][s];
      check_f64(g.at("w1"), shard_of(ref[s].at("w1"), 0, r, p), "fc1.weight shard");
      check_f64(g.at("b1"), shard_of(ref[s].at("b1"), 0, r, p), "fc1.bias shard");
      check_f64(g.at("w2"), shard_of(ref[s].at("w2"), 1, r, p), "fc2.weight shard");
      check_f64(g.at("b2"), ref[s].at("b2"), "fc2.bias");
    }
}

TEST_CASE("probe parallel: uneven splits and wrong input shapes are refused naming the layer, sizes and world") {
  for (int p : {2, 3}) {
    CAPTURE(p);
    run_ranks(
        p,
        [&](const CommPtr& comm) {
          const std::string ws = std::to_string(p);
          check_error([&] { parallel::ColumnParallelLinear(5, 7, comm); },
                      {"ColumnParallelLinear", "out_features", "7", "tensor-parallel size " + ws});
          check_error([&] { parallel::RowParallelLinear(7, 5, comm); },
                      {"RowParallelLinear", "in_features", "7", "tensor-parallel size " + ws});
          check_error([&] { parallel::VocabParallelEmbedding(7, 4, comm); },
                      {"VocabParallelEmbedding", "num_embeddings", "7", "tensor-parallel size " + ws});
          check_error([&] { parallel::TensorParallelEncoderLayer(12, 1, 12, comm); },
                      {"TensorParallelEncoderLayer", "heads", "tensor-parallel size " + ws});
          parallel::ColumnParallelLinear col(5, 6, comm);
          parallel::RowParallelLinear row(6, 5, comm);
          check_error([&] { col.forward(zeros({2, 4})); }, {"ColumnParallelLinear", "[2, 4]", "5"});
          // a replicated input of the wrong width: the row layer, not its scatter, is named
          check_error([&] { row.forward(zeros({2, 5})); }, {"RowParallelLinear", "[2, 5]", "6"});
          check_error([&] { row.forward(zeros({2, 12})); }, {"RowParallelLinear", "[2, 12]", "6"});
          check_error([&] { col.load_full(zeros({6, 4}), zeros({6})); }, {"ColumnParallelLinear", "[6, 5]"});
        },
        kShort);
  }
  // A communicator grid that does not multiply to the world size.
  run_ranks(
      4,
      [&](const CommPtr& comm) {
        check_error([&] { parallel::make_groups(comm, 3, 1, 1); }, {"make_groups", "4"});
      },
      kShort);
}

TEST_CASE("probe parallel: vocab-parallel embedding (padding_idx, int32, transposed indices) equals embedding") {
  const int64_t V = 12, D = 3;
  const Tensor w = random_tensor({V, D}, kFloat64, 21);
  const std::vector<int64_t> idx = {0, 11, 5, 5, 3, 6, 7, 1, 11, 4, 8, 2};
  for (int p : {1, 2, 3, 4})
    for (DType it : {kInt64, kInt32}) {
      CAPTURE(p);
      const Tensor indices = from_vector(idx, {3, 4}).to(it).t();  // (4, 3), column-major
      const Tensor c = random_tensor({4, 3, D}, kFloat64, 22);
      Tensor wr = leaf(w);
      const Tensor yr = embedding(wr, indices, /*padding_idx=*/5);
      sum(mul(yr, c)).backward();
      PerRank<Results> got(static_cast<size_t>(p));
      run_ranks(
          p,
          [&](const CommPtr& comm) {
            parallel::VocabParallelEmbedding emb(V, D, comm);
            emb.to(kFloat64);
            emb.load_full(w);
            emb.padding_idx = 5;
            const Tensor y = emb.forward(indices);
            sum(mul(y, c)).backward();
            got[size_t(comm->rank())] = {{"y", y.detach()}, {"wg", emb.weight.grad()}};
            check_error(
                [&] {
                  emb.forward(from_vector(std::vector<int64_t>{3, 12}, {2}));
                },
                {"VocabParallelEmbedding", "out of range", "12"});
          },
          kShort);
      for (int r = 0; r < p; ++r) {
        check_f64(got[size_t(r)].at("y"), yr, "embedding output");
        check_f64(got[size_t(r)].at("wg"), shard_of(wr.grad(), 0, r, p), "embedding weight grad shard");
      }
    }
}

TEST_CASE(
    "probe parallel: vocab-parallel cross entropy (ignore_index, sliced logits, all ignored) equals cross_entropy") {
  const int64_t N = 6, V = 12;
  const Tensor logits = random_tensor({N, V}, kFloat64, 31, Layout::Contiguous, -4, 4);
  for (const std::vector<int64_t>& t :
       {std::vector<int64_t>{0, 11, -100, 5, 6, 3}, std::vector<int64_t>{-100, -100, -100, -100, -100, -100}})
    for (int p : {1, 2, 3, 4}) {
      CAPTURE(p);
      const Tensor target = from_vector(t, {N});
      Tensor lr = leaf(logits);
      const Tensor ref = cross_entropy(lr, target);
      ref.backward();
      PerRank<Results> got(static_cast<size_t>(p));
      run_ranks(
          p,
          [&](const CommPtr& comm) {
            Tensor full = leaf(logits);
            // this rank's columns, a strided view of the full logits
            const Tensor loss =
                parallel::vocab_parallel_cross_entropy(shard_of(full, 1, comm->rank(), p), target, comm);
            loss.backward();
            got[size_t(comm->rank())] = {{"loss", loss.detach()}, {"grad", full.grad()}};
          },
          kShort);
      for (int r = 0; r < p; ++r) {
        check_f64(got[size_t(r)].at("loss"), ref.detach(), "loss");
        check_f64(shard_of(got[size_t(r)].at("grad"), 1, r, p), shard_of(lr.grad(), 1, r, p), "logits grad slice");
      }
    }
}

TEST_CASE("probe parallel: vocab-parallel cross entropy refuses a target outside the vocabulary, as cross_entropy") {
  const int64_t N = 3, V = 8;
  const Tensor logits = random_tensor({N, V}, kFloat64, 41);
  for (int64_t bad : {int64_t(8), int64_t(-1)}) {
    const Tensor target = from_vector(std::vector<int64_t>{1, bad, 2}, {N});
    check_error([&] { cross_entropy(logits, target); }, {"out of range"});  // the one-rank behaviour
    for (int p : {1, 2, 4}) {
      CAPTURE(p);
      CAPTURE(bad);
      check_error(
          [&] {
            run_ranks(
                p,
                [&](const CommPtr& comm) {
                  parallel::vocab_parallel_cross_entropy(shard_of(logits, 1, comm->rank(), p), target, comm);
                },
                kShort);
          },
          {"vocab_parallel_cross_entropy", "out of range", std::to_string(bad), std::to_string(V)});
    }
  }
}

// ============================================================================================
// Pipeline
// ============================================================================================

namespace {
/// Linear(4, 6) Tanh Linear(6, 6) Tanh Linear(6, 5) Tanh Linear(5, 2), float64, from `seed`.
std::shared_ptr<nn::Sequential> pipe_model(uint64_t seed) {
  auto m = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
      std::make_shared<nn::Linear>(4, 6), std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(6, 6),
      std::make_shared<nn::Tanh>(), std::make_shared<nn::Linear>(6, 5), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(5, 2)});
  m->to(kFloat64);
  autograd::NoGradGuard no_grad;
  uint64_t k = seed * 100;
  for (const Tensor& p : m->parameters()) p.detach().copy_(random_tensor(p.sizes(), kFloat64, ++k));
  return m;
}
const auto kMse = [](const Tensor& out, const Tensor& target) { return mse_loss(out, target); };
}  // namespace

TEST_CASE("probe parallel: GPipe and 1F1B over 1-4 stages, 1 to B micro-batches, B = 0, equal one rank (2 steps)") {
  const optim::SGDOptions sgd{.lr = 0.1};
  struct Case {
    int64_t batch;
    int m;
  };
  for (int p : {1, 2, 3, 4})
    for (parallel::Schedule schedule : {parallel::Schedule::GPipe, parallel::Schedule::OneFOneB})
      for (Case c : {Case{15, 5}, Case{15, 3}, Case{15, 1}, Case{4, 4}, Case{6, 2}, Case{0, 2}}) {
        CAPTURE(p);
        CAPTURE(schedule == parallel::Schedule::GPipe ? "gpipe" : "1f1b");
        CAPTURE(c.batch);
        CAPTURE(c.m);
        // step 0 contiguous, step 1 a transposed input
        const Tensor x0 = random_tensor({c.batch, 4}, kFloat64, 51);
        const Tensor x1 = random_tensor({c.batch, 4}, kFloat64, 52, Layout::Transposed);
        const Tensor y = random_tensor({c.batch, 2}, kFloat64, 53);
        auto ref = pipe_model(5);
        optim::SGD ref_opt(ref->parameters(), sgd);
        std::vector<double> ref_loss;
        std::vector<Tensor> ref_xg;
        std::vector<std::map<std::string, Tensor>> ref_params;
        for (const Tensor& x : {x0, x1}) {
          Tensor xl = leaf(x);
          const Tensor loss = mse_loss(ref->forward(xl), y);
          loss.backward();
          ref_loss.push_back(loss.item<double>());
          ref_xg.push_back(xl.grad());
          ref_opt.step();
          ref_opt.zero_grad();
          ref_params.push_back(params_of(*ref));
        }
        auto model = pipe_model(5);  // the ranks' stages share it: their module ranges are disjoint
        const parallel::StageBounds bounds = parallel::split_by_index(model->size(), p);
        PerRank<std::vector<double>> losses(static_cast<size_t>(p));
        std::vector<Tensor> xg(2);
        run_ranks(
            p,
            [&](const CommPtr& comm) {
              const int r = comm->rank();
              parallel::PipelineStage stage(parallel::make_stage(*model, bounds[size_t(r)]), comm,
                                            {.schedule = schedule, .micro_batches = c.m});
              optim::SGD opt(stage.module()->parameters(), sgd);
              int s = 0;
              for (const Tensor& x : {x0, x1}) {
                Tensor xl = stage.is_first()
                                ? input_of(values_of(x), x.sizes(), s ? Layout::Transposed : Layout::Contiguous)
                                : Tensor();
                const parallel::PipelineStats st = stage.train_step(xl, stage.is_last() ? y : Tensor(), kMse);
                losses[size_t(r)].push_back(st.loss);
                if (stage.is_first()) xg[size_t(s)] = xl.grad();
                opt.step();
                opt.zero_grad();
                ++s;
              }
            },
            kShort);
        for (int s = 0; s < 2; ++s) {
          for (int r = 0; r < p; ++r)  // reported in float32
            check_close(Values{losses[size_t(r)][size_t(s)]}, Values{ref_loss[size_t(s)]}, 1e-6, 0, "step loss");
          if (c.batch > 0) check_f64(xg[size_t(s)], ref_xg[size_t(s)], "input grad");
        }
        check_maps(params_of(*model), ref_params[1], "parameters after 2 steps");
      }
}

TEST_CASE("probe parallel: pipeline batches the micro-batches do not divide fail clearly on every stage, no hang") {
  struct Case {
    int64_t batch;
    int m;
  };
  for (int p : {2, 3})
    for (Case c : {Case{5, 2}, Case{2, 4}, Case{7, 3}}) {
      CAPTURE(p);
      CAPTURE(c.batch);
      auto model = pipe_model(6);
      const auto bounds = parallel::split_by_index(model->size(), p);
      const Tensor x = random_tensor({c.batch, 4}, kFloat64, 61), y = random_tensor({c.batch, 2}, kFloat64, 62);
      check_error(
          [&] {
            run_ranks(
                p,
                [&](const CommPtr& comm) {
                  parallel::PipelineStage stage(parallel::make_stage(*model, bounds[size_t(comm->rank())]), comm,
                                                {.micro_batches = c.m});
                  stage.train_step(stage.is_first() ? x : Tensor(), stage.is_last() ? y : Tensor(), kMse);
                },
                kShort);
          },
          {"PipelineStage.train_step", std::to_string(c.m) + " micro-batches", "[" + std::to_string(c.batch) + ", "});
    }
  // A target whose batch differs from the input's would broadcast in mse_loss: refused.
  auto model = pipe_model(7);
  const auto bounds = parallel::split_by_index(model->size(), 2);
  const Tensor x = random_tensor({8, 4}, kFloat64, 63), y = random_tensor({4, 2}, kFloat64, 64);
  check_error(
      [&] {
        run_ranks(
            2,
            [&](const CommPtr& comm) {
              parallel::PipelineStage stage(parallel::make_stage(*model, bounds[size_t(comm->rank())]), comm,
                                            {.micro_batches = 4});
              stage.train_step(stage.is_first() ? x : Tensor(), stage.is_last() ? y : Tensor(), kMse);
            },
            kShort);
      },
      {"PipelineStage.train_step", "target", "4 rows", "input has 8"});
  check_error([&] { parallel::PipelineStage(model, nullptr); }, {"PipelineStage", "communicator"});
}

// ============================================================================================
// Data parallel and ZeRO
// ============================================================================================

TEST_CASE("probe parallel: DDP over 1-4 ranks with 1- and 0-element parameters equals one rank (3 AdamW steps)") {
  for (int p : {1, 2, 3, 4})
    for (int64_t b : {1, 2})
      for (int64_t cap : {int64_t(4), int64_t(64), int64_t(25) << 20}) {
        CAPTURE(p);
        CAPTURE(b);
        CAPTURE(cap);
        const Tensor x = random_tensor({3, p * b, 5}, kFloat64, 71), y = random_tensor({3, p * b, 3}, kFloat64, 72);
        const Reference ref = reference_run(kFloat64, x, y);
        PerRank<std::vector<std::map<std::string, Tensor>>> got(static_cast<size_t>(p));
        PerRank<std::map<std::string, Tensor>> grads(static_cast<size_t>(p));
        run_ranks(
            p,
            [&](const CommPtr& comm) {
              const int r = comm->rank();
              auto model = probe_model(kFloat64, r == 0 ? 1 : 90 + uint64_t(r));  // DDP broadcasts rank 0's
              parallel::DistributedDataParallel ddp(model, comm, {.bucket_cap_bytes = cap});
              optim::AdamW opt(model->parameters(), kAdam);
              for (int64_t s = 0; s < 3; ++s) {
                mse_loss(ddp.forward(rank_rows(x[s], 0, r, p, b)), rank_rows(y[s], 0, r, p, b)).backward();
                if (s == 0) grads[size_t(r)] = grads_of(*model);
                opt.step();
                opt.zero_grad();
                got[size_t(r)].push_back(params_of(*model));
              }
            },
            kShort);
        for (int r = 0; r < p; ++r) {
          check_maps(grads[size_t(r)], ref.first_grads, "gradients");
          for (size_t s = 0; s < 3; ++s) check_maps(got[size_t(r)][s], ref.params[s], "parameters");
        }
      }
}

TEST_CASE(
    "probe parallel: DDP gradient accumulation over 3 backward calls (synced and under no_sync) equals one rank") {
  const int p = 3, micro = 3;
  const int64_t b = 1;
  const Tensor x = random_tensor({2, micro * p * b, 5}, kFloat64, 81),
               y = random_tensor({2, micro * p * b, 3}, kFloat64, 82);
  const Reference ref = reference_run(kFloat64, x, y, micro);
  for (bool use_no_sync : {false, true}) {
    CAPTURE(use_no_sync);
    PerRank<std::vector<std::map<std::string, Tensor>>> got(static_cast<size_t>(p));
    run_ranks(
        p,
        [&](const CommPtr& comm) {
          const int r = comm->rank();
          auto model = probe_model(kFloat64, 1);
          parallel::DistributedDataParallel ddp(model, comm, {.bucket_cap_bytes = 64});
          optim::AdamW opt(model->parameters(), kAdam);
          got[size_t(r)] = accumulated_steps(
              [&](const Tensor& in) { return ddp.forward(in); }, [&] { return ddp.no_sync(); }, opt, *model,
              [&](const Tensor& t, int64_t s, int k) { return rank_rows(t[s], k, r, p, b); }, x, y, micro, use_no_sync);
        },
        kShort);
    for (int r = 0; r < p; ++r)
      for (size_t s = 0; s < 2; ++s) check_maps(got[size_t(r)][s], ref.params[s], "parameters");
  }
}

TEST_CASE("probe parallel: ZeRO-1 and ZeRO-2 over 1-4 ranks, parameters of 1 and 0 elements, equal AdamW on one rank") {
  for (int stage : {1, 2})
    for (int p : {1, 2, 3, 4})
      for (int64_t cap : {int64_t(4), int64_t(64), int64_t(25) << 20}) {
        if (stage == 1 && cap != 4) continue;  // stage 1 has one bucket whatever the cap
        CAPTURE(stage);
        CAPTURE(p);
        CAPTURE(cap);
        const int64_t b = 2;
        const Tensor x = random_tensor({3, p * b, 5}, kFloat64, 91), y = random_tensor({3, p * b, 3}, kFloat64, 92);
        const Reference ref = reference_run(kFloat64, x, y);
        PerRank<std::vector<std::map<std::string, Tensor>>> got(static_cast<size_t>(p));
        PerRank<int64_t> shard(static_cast<size_t>(p));
        run_ranks(
            p,
            [&](const CommPtr& comm) {
              const int r = comm->rank();
              auto model = probe_model(kFloat64, 1);
              parallel::ZeroAdamW opt(model->parameters(), comm, kAdam, {.stage = stage, .bucket_cap_bytes = cap});
              shard[size_t(r)] = opt.shard_numel();
              for (int64_t s = 0; s < 3; ++s) {
                mse_loss(model->forward(rank_rows(x[s], 0, r, p, b)), rank_rows(y[s], 0, r, p, b)).backward();
                opt.step();
                opt.zero_grad();
                got[size_t(r)].push_back(params_of(*model));
              }
            },
            kShort);
        for (int r = 0; r < p; ++r) {
          CHECK(shard[size_t(r)] * p >= 67);  // the shards cover the parameters
          for (size_t s = 0; s < 3; ++s) check_maps(got[size_t(r)][s], ref.params[s], "parameters");
        }
      }
}

TEST_CASE("probe parallel: ZeRO-1/2 gradient accumulation over 3 backward calls (and no_sync) equals one rank") {
  const int p = 3, micro = 3;
  const int64_t b = 1;
  const Tensor x = random_tensor({2, micro * p * b, 5}, kFloat64, 101);
  const Tensor y = random_tensor({2, micro * p * b, 3}, kFloat64, 102);
  const Reference ref = reference_run(kFloat64, x, y, micro);
  for (int stage : {1, 2})
    for (bool use_no_sync : {false, true}) {
      if (stage == 1 && use_no_sync) continue;  // stage 1 syncs in step(): no no_sync
      CAPTURE(stage);
      CAPTURE(use_no_sync);
      PerRank<std::vector<std::map<std::string, Tensor>>> got(static_cast<size_t>(p));
      run_ranks(
          p,
          [&](const CommPtr& comm) {
            const int r = comm->rank();
            auto model = probe_model(kFloat64, 1);
            parallel::ZeroAdamW opt(model->parameters(), comm, kAdam, {.stage = stage, .bucket_cap_bytes = 64});
            got[size_t(r)] = accumulated_steps(
                [&](const Tensor& in) { return model->forward(in); }, [&] { return opt.no_sync(); }, opt, *model,
                [&](const Tensor& t, int64_t s, int k) { return rank_rows(t[s], k, r, p, b); }, x, y, micro,
                use_no_sync);
          },
          kShort);
      for (int r = 0; r < p; ++r)
        for (size_t s = 0; s < 2; ++s) check_maps(got[size_t(r)][s], ref.params[s], "parameters");
    }
}

TEST_CASE("probe parallel: ZeRO-2 resumed from each rank's shard optimizer state continues as one rank") {
  const int p = 3;
  const int64_t b = 1;
  const Tensor x = random_tensor({4, p * b, 5}, kFloat64, 111), y = random_tensor({4, p * b, 3}, kFloat64, 112);
  const Reference ref = reference_run(kFloat64, x, y);
  PerRank<std::vector<std::map<std::string, Tensor>>> got(static_cast<size_t>(p));
  PerRank<optim::StateDict> saved_opt(static_cast<size_t>(p));
  PerRank<std::map<std::string, Tensor>> saved_params(static_cast<size_t>(p));
  auto train = [&](nn::Module& m, parallel::ZeroAdamW& opt, int64_t s, int r) {
    mse_loss(static_cast<nn::Sequential&>(m).forward(rank_rows(x[s], 0, r, p, b)), rank_rows(y[s], 0, r, p, b))
        .backward();
    opt.step();
    opt.zero_grad();
  };
  run_ranks(
      p,
      [&](const CommPtr& comm) {
        const int r = comm->rank();
        auto model = probe_model(kFloat64, 1);
        parallel::ZeroAdamW opt(model->parameters(), comm, kAdam, {.stage = 2, .bucket_cap_bytes = 64});
        for (int64_t s = 0; s < 2; ++s) train(*model, opt, s, r);
        saved_params[size_t(r)] = params_of(*model);
        for (const auto& [k, v] : opt.shard_optimizer().state_dict()) saved_opt[size_t(r)].emplace_back(k, v.clone());
      },
      kShort);
  run_ranks(
      p,
      [&](const CommPtr& comm) {  // a fresh run from other weights, resumed after step 2
        const int r = comm->rank();
        auto model = probe_model(kFloat64, 7);
        model->load_state_dict(saved_params[size_t(r)]);
        parallel::ZeroAdamW opt(model->parameters(), comm, kAdam, {.stage = 2, .bucket_cap_bytes = 64});
        opt.shard_optimizer().load_state_dict(saved_opt[size_t(r)]);
        for (int64_t s = 2; s < 4; ++s) {
          train(*model, opt, s, r);
          got[size_t(r)].push_back(params_of(*model));
        }
      },
      kShort);
  for (int r = 0; r < p; ++r)
    for (size_t i = 0; i < 2; ++i) check_maps(got[size_t(r)][i], ref.params[2 + i], "resumed parameters");
}

TEST_CASE("probe parallel: ZeRO and DDP misuse: mismatched ranks and parameters are clear errors, not hangs") {
  // Ranks whose parameter lists differ disagree in their first collective: named, not a hang.
  check_error(
      [&] {
        run_ranks(
            2,
            [&](const CommPtr& comm) {
              auto model = probe_model(kFloat64, 1);
              std::vector<Tensor> params = model->parameters();
              if (comm->rank() == 1) params.pop_back();
              parallel::ZeroAdamW opt(params, comm, kAdam);
              mse_loss(model->forward(zeros({1, 5}, kFloat64)), zeros({1, 3}, kFloat64)).backward();
              opt.step();
            },
            kShort);
      },
      {"disagree", "reduce_scatter"});
  run_ranks(
      2,
      [&](const CommPtr& comm) {
        auto model = probe_model(kFloat32, 1);
        std::vector<Tensor> params = model->parameters();
        params.push_back(zeros({2}, kFloat64).requires_grad_());
        check_error([&] { parallel::ZeroAdamW(params, comm); }, {"ZeroAdamW", "one dtype", "float64"});
        check_error([&] { parallel::ZeroAdamW(model->parameters(), comm, kAdam, {.stage = 3}); },
                    {"ZeroAdamW", "stage", "3"});
      },
      kShort);
}

// ============================================================================================
// ZeRO-3 (FSDP)
// ============================================================================================

namespace {
/// Units: each layer with parameters, the 0-element adapter and the 1-element scale included.
const std::vector<std::string> kUnits = {"0", "2", "3", "4"};
const std::vector<std::string> kSomeUnits = {"3", "4"};  // the rest in the root unit
}  // namespace

TEST_CASE("probe parallel: FSDP over 1-4 ranks, units of 1 and 0 elements, accumulation, equals one rank (f32)") {
  for (int p : {1, 2, 3, 4})
    for (const auto* units : {&kUnits, &kSomeUnits})
      for (int micro : {1, 3}) {
        CAPTURE(p);
        CAPTURE(units->size());
        CAPTURE(micro);
        const int64_t b = 1;
        const Tensor x = random_tensor({2, micro * p * b, 5}, kFloat32, 121);
        const Tensor y = random_tensor({2, micro * p * b, 3}, kFloat32, 122);
        const Reference ref = reference_run(kFloat32, x, y, micro);
        PerRank<std::vector<std::map<std::string, Tensor>>> got(static_cast<size_t>(p));
        run_ranks(
            p,
            [&](const CommPtr& comm) {
              const int r = comm->rank();
              auto fsdp = std::make_shared<parallel::FullyShardedDataParallel>(
                  probe_model(kFloat32, r == 0 ? 1 : 50 + uint64_t(r)), comm,
                  parallel::FullyShardOptions{.units = *units});
              optim::AdamW opt(fsdp->parameters(), kAdam);
              for (int64_t s = 0; s < 2; ++s) {
                for (int k = 0; k < micro; ++k)
                  mse_loss(fsdp->forward(rank_rows(x[s], k, r, p, b)), rank_rows(y[s], k, r, p, b)).backward();
                opt.step();
                opt.zero_grad();
                got[size_t(r)].push_back(as_map(fsdp->full_state_dict()));
              }
            },
            kShort);
        for (int r = 0; r < p; ++r)
          for (size_t s = 0; s < 2; ++s) check_maps(got[size_t(r)][s], ref.params[s], "parameters", /*f64=*/false);
      }
}

TEST_CASE("probe parallel: FSDP sharded checkpoint at 3 ranks resumes as one rank; other world sizes are refused") {
  const int p = 3;
  const int64_t b = 1;
  const Tensor x = random_tensor({4, p * b, 5}, kFloat32, 131), y = random_tensor({4, p * b, 3}, kFloat32, 132);
  const Reference ref = reference_run(kFloat32, x, y);
  ScratchDir dir("probe_parallel_fsdp");
  auto train = [&](parallel::FullyShardedDataParallel& fsdp, optim::AdamW& opt, int64_t s, int r) {
    mse_loss(fsdp.forward(rank_rows(x[s], 0, r, p, b)), rank_rows(y[s], 0, r, p, b)).backward();
    opt.step();
    opt.zero_grad();
  };
  run_ranks(
      p,
      [&](const CommPtr& comm) {
        auto fsdp = std::make_shared<parallel::FullyShardedDataParallel>(probe_model(kFloat32, 1), comm,
                                                                         parallel::FullyShardOptions{.units = kUnits});
        optim::AdamW opt(fsdp->parameters(), kAdam);
        for (int64_t s = 0; s < 2; ++s) train(*fsdp, opt, s, comm->rank());
        parallel::save_sharded_checkpoint(*fsdp, dir.path.string(), &opt);
      },
      kShort);
  PerRank<std::vector<std::map<std::string, Tensor>>> got(static_cast<size_t>(p));
  run_ranks(
      p,
      [&](const CommPtr& comm) {
        auto fsdp = std::make_shared<parallel::FullyShardedDataParallel>(probe_model(kFloat32, 9), comm,
                                                                         parallel::FullyShardOptions{.units = kUnits});
        optim::AdamW opt(fsdp->parameters(), kAdam);
        parallel::load_sharded_checkpoint(*fsdp, dir.path.string(), &opt);
        for (int64_t s = 2; s < 4; ++s) {
          train(*fsdp, opt, s, comm->rank());
          got[size_t(comm->rank())].push_back(as_map(fsdp->full_state_dict()));
        }
      },
      kShort);
  for (int r = 0; r < p; ++r)
    for (size_t i = 0; i < 2; ++i) check_maps(got[size_t(r)][i], ref.params[2 + i], "resumed", /*f64=*/false);
  for (int q : {2, 4})
    run_ranks(
        q,
        [&](const CommPtr& comm) {
          parallel::FullyShardedDataParallel fsdp(probe_model(kFloat32, 1), comm, {.units = kUnits});
          check_error([&] { parallel::load_sharded_checkpoint(fsdp, dir.path.string()); }, {"3", std::to_string(q)});
        },
        kShort);
}

TEST_CASE("probe parallel: FSDP refuses float64 parameters naming the parameter and dtype") {
  run_ranks(
      2,
      [&](const CommPtr& comm) {
        check_error([&] { parallel::FullyShardedDataParallel(probe_model(kFloat64, 1), comm); },
                    {"FullyShardedDataParallel", "0.weight", "float64", "float32"});
      },
      kShort);
}
