// The parallel algorithms over NCCL on CUDA tensors against single-process CPU runs, as
//   frugal-run --nproc 2 build/tests/parallel_check
// Every rank builds the single-process reference itself (same seeds, on the CPU), so the
// checks need no communication beyond the algorithm under test: tensor-parallel MLP and
// encoder layer, vocab-parallel embedding + cross entropy, a 2-stage pipeline (GPipe and
// 1F1B with recompute), DDP with small buckets and no_sync, ZeRO-1 AdamW and ZeRO-2 (with two micro-batches
// accumulated; under a GradScaler whose overflow only rank 0 sees, and with clipping), ZeRO-3
// (FullyShardedDataParallel, losses and weights per step, and a sharded save resumed into a fresh model that repeats
// the uninterrupted run's steps bit for bit). The tensor-parallel BertForMaskedLM and VisionTransformer (the small
// models of tests/tp_model_fixtures.h) are checked against the single-process models run on the rank's own GPU instead.
// f32 without TF32, 1e-4 relative (cuBLAS and the CPU sum in different orders). Exits 0 (all passed), 1 (a check
// failed) or 77 (fewer GPUs than ranks on this node: skipped, unless FRUGAL_REQUIRE_MULTI_GPU=1; tests/multi_gpu.h).
//   frugal-run --nproc 2 build/tests/parallel_check --cpu
// runs the data-parallel checks (DDP, ZeRO-1, -2, -3) over the TCP backend on CPU tensors
// instead, with no GPU (the cpu suite's "parallel-cpu" test).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/meta.h"
#include "autograd/ops/all.h"
#include "core/device.h"
#include "models/bert_tp.h"
#include "models/vit_tp.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/linear.h"
#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/grad_scaler.h"
#include "parallel/ddp.h"
#include "parallel/fsdp.h"
#include "parallel/fsdp_checkpoint.h"
#include "parallel/init.h"
#include "parallel/pipeline.h"
#include "parallel/tensor_parallel.h"
#include "parallel/zero.h"
#include "tensor/factory.h"
#include "tensor/ops/fill.h"
#include "tensor/ops/matmul.h"
#include "tests/multi_gpu.h"
#include "tests/tp_model_fixtures.h"

using namespace frugal;
using namespace frugal::parallel;
using frugal::detail::str_cat;

namespace {

int g_checks = 0, g_failures = 0, g_rank = 0;

std::vector<double> values(const Tensor& t) { return t.to(kCPU, kFloat64).contiguous().tolist<double>(); }

void check_close(const Tensor& got, const Tensor& want, const std::string& what, double rtol = 1e-4) {
  ++g_checks;
  if (!got.defined() || got.sizes() != want.sizes()) {
    ++g_failures;
    std::printf("FAIL (rank %d): %s: shape\n", g_rank, what.c_str());
    return;
  }
  const std::vector<double> a = values(got), b = values(want);
  double scale = 0;
  for (double v : b) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::fabs(a[i] - b[i]) <= rtol * std::fabs(b[i]) + 1e-5 * scale)) {
      ++g_failures;
      std::printf("FAIL (rank %d): %s: element %zu is %g, expected %g\n", g_rank, what.c_str(), i, a[i], b[i]);
      return;
    }
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : values(t)) m = std::max(m, std::fabs(v));
  return m;
}

Tensor randn_cpu(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return randn(s, {}, &g);
}

Tensor leaf_on(const Tensor& x, Device d) {
  Tensor t = x.to(d).detach().clone();
  t.requires_grad_();
  return t;
}

Tensor shard_of(const Tensor& full, int64_t dim, int r, int p) {
  const int64_t n = full.size(dim) / p;
  return full.narrow(dim, r * n, n);
}

void check_tensor_parallel(const CommPtr& world) {
  const int r = world->rank(), p = world->size();
  const Device dev = world->device();
  {  // MLP: column (no gather) -> gelu -> row (input parallel)
    Generator g1(1), g2(1);
    ColumnParallelLinear ref_a(64, 256, nullptr, {.generator = &g1});
    RowParallelLinear ref_b(256, 64, nullptr, {.generator = &g1});
    ColumnParallelLinear a(64, 256, world, {.gather_output = false, .generator = &g2});
    RowParallelLinear b(256, 64, world, {.input_is_parallel = true, .generator = &g2});
    const Tensor x = randn_cpu({4, 16, 64}, 2), c = randn_cpu({4, 16, 64}, 3);
    Tensor xr = leaf_on(x, kCPU), xg = leaf_on(x, dev);
    const Tensor yr = ref_b.forward(gelu(ref_a.forward(xr)));
    sum(mul(yr, c)).backward();
    const Tensor yg = b.forward(gelu(a.forward(xg)));
    sum(mul(yg, c.to(dev))).backward();
    check_close(yg, yr, "TP MLP output");
    check_close(xg.grad(), xr.grad(), "TP MLP input grad");
    check_close(a.weight.grad(), shard_of(ref_a.weight.grad(), 0, r, p), "TP MLP column weight grad");
    check_close(b.weight.grad(), shard_of(ref_b.weight.grad(), 1, r, p), "TP MLP row weight grad");
    check_close(b.bias.grad(), ref_b.bias.grad(), "TP MLP row bias grad");
  }
  for (bool pre_norm : {false, true}) {  // encoder layer: the same full weights from the same generator
    Generator g1(4), g2(4);
    TensorParallelEncoderLayer ref(64, 4, 128, nullptr, {.pre_norm = pre_norm, .generator = &g1});
    TensorParallelEncoderLayer tp(64, 4, 128, world, {.pre_norm = pre_norm, .generator = &g2});
    const Tensor x = randn_cpu({2, 8, 64}, 5), c = randn_cpu({2, 8, 64}, 6);
    Tensor xr = leaf_on(x, kCPU), xg = leaf_on(x, dev);
    const Tensor yr = ref.forward(xr);
    sum(mul(yr, c)).backward();
    const Tensor yg = tp.forward(xg);
    sum(mul(yg, c.to(dev))).backward();
    const std::string tag = pre_norm ? " (pre-norm)" : " (post-norm)";
    check_close(yg, yr, "TP encoder output" + tag);
    check_close(xg.grad(), xr.grad(), "TP encoder input grad" + tag);
    check_close(tp.query->weight.grad(), shard_of(ref.query->weight.grad(), 0, r, p), "TP encoder query grad" + tag);
    check_close(tp.output->weight.grad(), shard_of(ref.output->weight.grad(), 1, r, p), "TP encoder output grad" + tag);
    check_close(tp.output_norm->weight.grad(), ref.output_norm->weight.grad(), "TP encoder norm grad" + tag);
  }
  {  // vocab-parallel embedding and cross entropy
    Generator g1(7), g2(7), g3(8), g4(8);
    VocabParallelEmbedding ref_emb(512, 32, nullptr, &g1), emb(512, 32, world, &g2);
    ColumnParallelLinear ref_head(32, 512, nullptr, {.bias = false, .generator = &g3});
    ColumnParallelLinear head(32, 512, world, {.bias = false, .gather_output = false, .generator = &g4});
    Generator gt(9);
    const Tensor tokens = randint(0, 512, {64}, {kInt64}, &gt), target = randint(0, 512, {64}, {kInt64}, &gt);
    const Tensor ref_loss = cross_entropy(ref_head.forward(ref_emb.forward(tokens)), target);
    ref_loss.backward();
    const Tensor loss = vocab_parallel_cross_entropy(head.forward(emb.forward(tokens.to(dev))), target.to(dev), world);
    loss.backward();
    check_close(loss, ref_loss, "vocab-parallel cross entropy");
    check_close(emb.weight.grad(), shard_of(ref_emb.weight.grad(), 0, r, p), "vocab-parallel embedding grad");
    check_close(head.weight.grad(), shard_of(ref_head.weight.grad(), 0, r, p), "vocab-parallel head grad");
  }
}

/// Every parameter's full gradient, gathered from the TP model's shards, against the
/// reference's (both on the GPU). Every rank walks the reference's keys in the same order,
/// as gather_full's all-gathers need.
template <typename TPModel, typename Reference>
void check_full_grads(const TPModel& tp, const Reference& ref, const std::string& tag) {
  std::map<std::string, Tensor> local;
  for (const auto& [k, t] : tp.named_parameters()) local[k] = t.grad();
  const nn::NamedTensors want = ref.named_parameters();
  ++g_checks;
  if (local.size() != want.size()) {
    ++g_failures;
    std::printf("FAIL (rank %d): %s: %zu parameters, expected %zu\n", g_rank, tag.c_str(), local.size(), want.size());
    return;
  }
  std::map<std::string, Tensor> want_grads;
  for (const auto& [k, t] : want) want_grads[k] = t.grad();
  for (const auto& [k, t] : want) {
    const Tensor got = tp.gather_full(k, local.at(k));
    if (const std::string q = testing::bert_zero_grad_scale_key(k); !q.empty()) {
      // ~0 up to rounding in both: bounded by the query bias gradient's scale instead
      const double bound = 1e-5 * max_abs(want_grads.at(q));
      ++g_checks;
      if (!(max_abs(got) < bound && max_abs(t.grad()) < bound)) {
        ++g_failures;
        std::printf("FAIL (rank %d): %s %s.grad: |%g| and |%g| not below %g\n", g_rank, tag.c_str(), k.c_str(),
                    max_abs(got), max_abs(t.grad()), bound);
      }
      continue;
    }
    check_close(got, t.grad(), tag + " " + k + ".grad");
  }
}

void check_tensor_parallel_bert(const CommPtr& world) {
  const Device dev = world->device();
  auto ref = testing::bert_reference_model();
  ref->to(dev);
  std::map<std::string, Tensor> full_state;
  for (const auto& [k, t] : ref->state_dict()) full_state[k] = t.detach();
  testing::BertBatch b = testing::bert_batch();
  for (Tensor* t : {&b.ids, &b.mask, &b.types, &b.labels}) *t = t->to(dev);
  const models::BertMlmOutput want = ref->forward(b.ids, b.mask, b.types, b.labels, {.logits = true});
  want.loss.backward();
  // Plain, then each layer checkpointed: its replay repeats the layer's all-reduces in
  // backward (Note [Tensor-parallel block memory]).
  for (bool checkpointed : {false, true}) {
    const std::string tag = checkpointed ? "TP BERT checkpointed" : "TP BERT";
    models::BertConfig c = testing::small_bert();
    c.checkpoint_blocks = checkpointed;
    models::TensorParallelBertForMaskedLM tp(c, world, /*seed=*/3);
    models::load_full_state_dict(tp, full_state);
    const models::TensorParallelMlmOutput out = tp.forward(b.ids, b.mask, b.types, b.labels);
    out.loss.backward();
    check_close(tp.gather_logits(out.local_logits), want.logits, tag + " logits");
    check_close(out.loss, want.loss, tag + " loss");
    check_full_grads(tp, *ref, tag);
  }
}

void check_tensor_parallel_vit(const CommPtr& world) {
  const Device dev = world->device();
  auto ref = testing::vit_reference_model();
  ref->to(dev);
  std::map<std::string, Tensor> full_state;
  for (const auto& [k, t] : ref->state_dict()) full_state[k] = t.detach();
  const Tensor images = randn_cpu({3, 3, 16, 16}, 41).to(dev);
  const Tensor labels = from_vector<int64_t>({7, 0, 3}, {3}).to(dev);
  const Tensor want_logits = ref->forward(images);
  const Tensor want_loss = cross_entropy(want_logits, labels);
  want_loss.backward();
  for (bool checkpointed : {false, true}) {  // as check_tensor_parallel_bert
    const std::string tag = checkpointed ? "TP ViT checkpointed" : "TP ViT";
    models::ViTConfig c = testing::small_vit();
    c.checkpoint_blocks = checkpointed;
    models::TensorParallelVisionTransformer tp(c, world, /*seed=*/3);
    models::load_full_state_dict(tp, full_state);
    const Tensor logits = tp.forward(images);
    const Tensor loss = cross_entropy(logits, labels);
    loss.backward();
    check_close(logits, want_logits, tag + " logits");
    check_close(loss, want_loss, tag + " loss");
    // in_proj_bias's key block is ~0 in both (softmax ignores a shift): check_close's floor
    // of 1e-5 of the tensor's largest magnitude covers it
    check_full_grads(tp, *ref, tag);
  }
}

std::shared_ptr<nn::Sequential> make_mlp(uint64_t seed) {
  manual_seed(seed);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(32, 64));
  m->push_back(std::make_shared<nn::Tanh>());
  m->push_back(std::make_shared<nn::Linear>(64, 64));
  m->push_back(std::make_shared<nn::Tanh>());
  m->push_back(std::make_shared<nn::Linear>(64, 8));
  return m;
}

void check_pipeline(const CommPtr& world) {
  const int r = world->rank(), p = world->size();
  const Device dev = world->device();
  auto ref = make_mlp(10);
  const Tensor x = randn_cpu({16, 32}, 11), y = randn_cpu({16, 8}, 12);
  const Tensor ref_loss = mse_loss(ref->forward(x), y);
  ref_loss.backward();
  for (auto schedule : {Schedule::GPipe, Schedule::OneFOneB}) {
    auto model = make_mlp(10);
    model->to(dev);
    const StageBounds bounds = split_by_cost(parameter_costs(*model), p);
    PipelineStage stage(make_stage(*model, bounds[size_t(r)]), world,
                        {.schedule = schedule, .micro_batches = 4, .recompute = schedule == Schedule::OneFOneB});
    const PipelineStats s =
        stage.train_step(stage.is_first() ? x.to(dev) : Tensor(), stage.is_last() ? y.to(dev) : Tensor(),
                         [](const Tensor& o, const Tensor& t) { return mse_loss(o, t); });
    const std::string tag = schedule == Schedule::GPipe ? " (GPipe)" : " (1F1B, recompute)";
    check_close(full({}, s.loss), ref_loss, "pipeline loss" + tag);
    const auto want = ref->named_parameters(), got = model->named_parameters();
    for (size_t i = 0; i < want.size(); ++i) {
      const bool mine = std::stoul(want[i].first.substr(0, want[i].first.find('.'))) >= bounds[size_t(r)].first &&
                        std::stoul(want[i].first.substr(0, want[i].first.find('.'))) < bounds[size_t(r)].second;
      if (mine) check_close(got[i].second.grad(), want[i].second.grad(), "pipeline grad " + want[i].first + tag);
    }
  }
}

void check_data_parallel(const CommPtr& world) {
  const int r = world->rank(), p = world->size();
  const Device dev = world->device();
  const int64_t per_rank = 4, B = per_rank * p;
  const Tensor x = randn_cpu({2, B, 32}, 21), y = randn_cpu({2, B, 8}, 22);
  {  // DDP: two micro-batches (the first under no_sync), small buckets, one AdamW step
    auto ref = make_mlp(20);
    optim::AdamW ref_opt(ref->parameters(), {.lr = 0.01});
    for (int64_t k = 0; k < 2; ++k) mse_loss(ref->forward(x[k]), y[k]).backward();
    ref_opt.step();
    auto model = make_mlp(20 + uint64_t(r));  // rank 1 starts different: the broadcast fixes it
    model->to(dev);
    DistributedDataParallel ddp(model, world, {.bucket_cap_bytes = 8192});
    optim::AdamW opt(ddp.parameters(), {.lr = 0.01});
    {
      auto guard = ddp.no_sync();
      mse_loss(ddp.forward(x[0].narrow(0, r * per_rank, per_rank).to(dev)),
               y[0].narrow(0, r * per_rank, per_rank).to(dev))
          .backward();
    }
    mse_loss(ddp.forward(x[1].narrow(0, r * per_rank, per_rank).to(dev)),
             y[1].narrow(0, r * per_rank, per_rank).to(dev))
        .backward();
    ddp.finish_gradient_sync();
    const auto want = ref->parameters(), got = model->parameters();
    for (size_t i = 0; i < want.size(); ++i) check_close(got[i].grad(), want[i].grad(), str_cat("DDP grad ", i));
    opt.step();
    for (size_t i = 0; i < want.size(); ++i) check_close(got[i], want[i], str_cat("DDP param after step ", i));
  }
  {  // ZeRO-1: two steps
    auto ref = make_mlp(30);
    const optim::AdamWOptions o{.lr = 0.01, .weight_decay = 0.1};
    optim::AdamW ref_opt(ref->parameters(), o);
    auto model = make_mlp(30);
    model->to(dev);
    ZeroAdamW opt(model->parameters(), world, o);
    for (int64_t k = 0; k < 2; ++k) {
      mse_loss(ref->forward(x[k]), y[k]).backward();
      ref_opt.step();
      ref_opt.zero_grad();
      mse_loss(model->forward(x[k].narrow(0, r * per_rank, per_rank).to(dev)),
               y[k].narrow(0, r * per_rank, per_rank).to(dev))
          .backward();
      opt.step();
      opt.zero_grad();
    }
    const auto want = ref->parameters(), got = model->parameters();
    for (size_t i = 0; i < want.size(); ++i) check_close(got[i], want[i], str_cat("ZeRO-1 param after 2 steps ", i));
  }
  {  // ZeRO-2 (small buckets, so several reduce-scatters overlap backward): two steps, the
     // second accumulating two micro-batches (the reference scales its loss by 2)
    auto ref = make_mlp(31);
    const optim::AdamWOptions o{.lr = 0.01, .weight_decay = 0.1};
    optim::AdamW ref_opt(ref->parameters(), o);
    auto model = make_mlp(31);
    model->to(dev);
    ZeroAdamW opt(model->parameters(), world, o, {.stage = 2, .bucket_cap_bytes = 256});
    for (int64_t k = 0; k < 2; ++k) {
      mul(mse_loss(ref->forward(x[k]), y[k]), double(k + 1)).backward();
      ref_opt.step();
      ref_opt.zero_grad();
      for (int64_t m = 0; m <= k; ++m)
        mse_loss(model->forward(x[k].narrow(0, r * per_rank, per_rank).to(dev)),
                 y[k].narrow(0, r * per_rank, per_rank).to(dev))
            .backward();
      opt.step();
      opt.zero_grad();
    }
    const auto want = ref->parameters(), got = model->parameters();
    for (size_t i = 0; i < want.size(); ++i) check_close(got[i], want[i], str_cat("ZeRO-2 param after 2 steps ", i));
  }
  for (int stage : {1, 2}) {  // a GradScaler and clipping: step 0 overflows on rank 0 only (every
                              // rank must skip it), step 1 clips by the whole model's norm
    const double max_norm = 0.05;
    auto with_inf = [](int64_t step) {
      return [step](const Tensor& g) {
        if (step != 0) return Tensor();
        Tensor h = g.clone();
        ops::fill_(h.view({-1}).narrow(0, 3, 1), std::numeric_limits<double>::infinity());
        return h;
      };
    };
    int64_t step = 0;
    auto ref = make_mlp(32);
    autograd::register_hook(ref->parameters()[0], [&](const Tensor& g) { return with_inf(step)(g); });
    // eps 1e-6: clipped to 0.05, a few gradient elements are ~1e-9, where the first Adam step
    // lr * g / (|g| + eps) at eps 1e-8 turns the CPU's and GPU's float32 rounding of g (10%
    // at 5e-10: its terms cancel) into 4e-5 of a parameter; at 1e-6 that is below 1e-6.
    const optim::AdamWOptions o{.lr = 0.01, .eps = 1e-6, .weight_decay = 0.1};
    optim::AdamW ref_opt(ref->parameters(), o);
    optim::GradScaler ref_scaler({.init_scale = 1024.0});
    auto model = make_mlp(32);
    model->to(dev);
    if (r == 0) autograd::register_hook(model->parameters()[0], [&](const Tensor& g) { return with_inf(step)(g); });
    ZeroAdamW opt(model->parameters(), world, o, {.stage = stage, .bucket_cap_bytes = 256});
    optim::GradScaler scaler({.init_scale = 1024.0, .sync_found_inf = opt.found_inf_sync()});
    for (step = 0; step < 2; ++step) {
      ref_scaler.scale(mse_loss(ref->forward(x[step]), y[step])).backward();
      ref_scaler.unscale_(ref_opt);
      const double ref_norm = optim::clip_grad_norm_(ref->parameters(), max_norm);
      ref_scaler.step(ref_opt);
      ref_scaler.update();
      ref_opt.zero_grad();
      scaler
          .scale(mse_loss(model->forward(x[step].narrow(0, r * per_rank, per_rank).to(dev)),
                          y[step].narrow(0, r * per_rank, per_rank).to(dev)))
          .backward();
      opt.unscale_(scaler);
      const double norm = opt.clip_grad_norm_(max_norm);
      opt.step(scaler);
      scaler.update();
      opt.zero_grad();
      check_close(scalar_tensor(scaler.get_scale()), scalar_tensor(ref_scaler.get_scale()),
                  str_cat("ZeRO-", stage, " GradScaler scale after step ", step));
      if (step == 1)
        check_close(scalar_tensor(norm), scalar_tensor(ref_norm), str_cat("ZeRO-", stage, " clipped norm"));
    }
    const auto want = ref->parameters(), got = model->parameters();
    for (size_t i = 0; i < want.size(); ++i)
      check_close(got[i], want[i], str_cat("ZeRO-", stage, " param after a skipped and a clipped step ", i));
  }
}

/// Bitwise: every element of got equals want's.
void check_equal(const Tensor& got, const Tensor& want, const std::string& what) {
  ++g_checks;
  if (!got.defined() || got.sizes() != want.sizes() || values(got) != values(want)) {
    ++g_failures;
    std::printf("FAIL (rank %d): %s: not bitwise equal\n", g_rank, what.c_str());
  }
}

// Dropout over NCCL on the GPU (Note [Tensor-parallel dropout]; the cpu suite checks the
// layer against one process with the same streams): the replicated output, input gradient
// and replicated parameters' gradients stay bitwise equal across ranks, dropout acts in
// training at about its rate, and eval mode gives the dropout-free layer's output exactly.
void check_tensor_parallel_dropout(const CommPtr& world) {
  const Device dev = world->device();
  auto rank0s = [&](const Tensor& t) {
    Tensor copy = t.detach().contiguous().clone();
    world->broadcast(copy, 0)->wait();
    return copy;
  };
  for (bool pre_norm : {false, true}) {
    const std::string tag = pre_norm ? " (pre-norm)" : " (post-norm)";
    Generator g1(4), g2(4);
    TensorParallelEncoderLayer with(
        64, 4, 128, world,
        {.pre_norm = pre_norm, .generator = &g1, .hidden_dropout = 0.2, .attention_dropout = 0.3, .dropout_seed = 91});
    TensorParallelEncoderLayer without(64, 4, 128, world, {.pre_norm = pre_norm, .generator = &g2});
    const Tensor x = randn_cpu({2, 8, 64}, 5).to(dev), c = randn_cpu({2, 8, 64}, 6).to(dev);
    Tensor xg = leaf_on(x, dev);
    const Tensor y = with.forward(xg);
    sum(mul(y, c)).backward();
    check_equal(y, rank0s(y), "TP dropout output equals rank 0's" + tag);
    check_equal(xg.grad(), rank0s(xg.grad()), "TP dropout input grad equals rank 0's" + tag);
    check_equal(with.output_norm->weight.grad(), rank0s(with.output_norm->weight.grad()),
                "TP dropout norm grad equals rank 0's" + tag);
    with.eval();
    const Tensor y_eval = with.forward(x);
    check_equal(y_eval, without.forward(x), "TP dropout eval output equals the p = 0 layer's" + tag);
    ++g_checks;
    if (values(y) == values(y_eval)) {
      ++g_failures;
      std::printf("FAIL (rank %d): TP dropout%s: training output equals eval output\n", g_rank, tag.c_str());
    }
  }
  {  // the replicated stream drops the same elements on every rank, at rate p
    TensorParallelRng rng(77, world);
    const double p = 0.3;
    const int64_t n = 1 << 20;
    const Tensor kept = dropout(ones({n}, {kFloat32, dev}), p, true, &rng.replicated);
    check_equal(kept, rank0s(kept), "replicated dropout mask equals rank 0's");
    double zeros = 0;
    for (double v : values(kept)) zeros += v == 0.0 ? 1.0 : 0.0;
    const double dropped = zeros / double(n);
    ++g_checks;
    if (std::fabs(dropped - p) > 5.0 * std::sqrt(p * (1.0 - p) / double(n))) {
      ++g_failures;
      std::printf("FAIL (rank %d): replicated dropout dropped %g, expected %g\n", g_rank, dropped, p);
    }
  }
}

}  // namespace

/// ZeRO-3: FullyShardedDataParallel (two units and the root's last layer) with AdamW on its
/// shards, four steps on each rank's quarter of the batch, against the reference on the whole
/// batch: each step's loss on the rank's rows and every weight after it. A sharded checkpoint
/// saved after step 2 and loaded into a fresh model and optimizer repeats steps 3 and 4 bit
/// for bit.
void check_fully_sharded(const CommPtr& world) {
  const int r = world->rank(), p = world->size();
  const Device dev = world->device();
  const int64_t per_rank = 4, B = per_rank * p, steps = 4;
  const Tensor x = randn_cpu({steps, B, 32}, 41), y = randn_cpu({steps, B, 8}, 42);
  const optim::AdamWOptions o{.lr = 0.01, .weight_decay = 0.1};
  const FullyShardOptions units{.units = {"0", "2"}};
  const char* port = std::getenv("MASTER_PORT");  // one directory per run, shared by its ranks
  const std::string dir =
      (std::filesystem::temp_directory_path() / str_cat("frugal_parallel_check_zero3_", port ? port : "0")).string();
  auto rows = [&](const Tensor& t, int64_t k) { return t[k].narrow(0, r * per_rank, per_rank).to(dev); };
  auto step = [&](FullyShardedDataParallel& fsdp, optim::AdamW& opt, int64_t k) {
    Tensor loss = mse_loss(fsdp.forward(rows(x, k)), rows(y, k));
    loss.backward();
    opt.step();
    opt.zero_grad();
    return loss;
  };
  auto as_map = [](const nn::NamedTensors& named) { return std::map<std::string, Tensor>(named.begin(), named.end()); };
  auto ref = make_mlp(40);
  optim::AdamW ref_opt(ref->parameters(), o);
  std::vector<std::map<std::string, Tensor>> uninterrupted;
  {
    auto model = make_mlp(40);
    model->to(dev);
    FullyShardedDataParallel fsdp(model, world, units);
    optim::AdamW opt(fsdp.parameters(), o);
    for (int64_t k = 0; k < steps; ++k) {
      Tensor ref_rows_loss;
      {
        autograd::NoGradGuard no_grad;
        ref_rows_loss =
            mse_loss(ref->forward(x[k].narrow(0, r * per_rank, per_rank)), y[k].narrow(0, r * per_rank, per_rank));
      }
      mse_loss(ref->forward(x[k]), y[k]).backward();
      ref_opt.step();
      ref_opt.zero_grad();
      check_close(step(fsdp, opt, k), ref_rows_loss, str_cat("ZeRO-3 loss at step ", k + 1));
      const std::map<std::string, Tensor> full = as_map(fsdp.full_state_dict());
      for (const auto& [name, want] : ref->named_parameters())
        check_close(full.at(name), want, str_cat("ZeRO-3 ", name, " after step ", k + 1));
      if (k == 1) save_sharded_checkpoint(fsdp, dir, &opt);
      if (k >= 2) uninterrupted.push_back(full);
    }
  }
  {  // resumed: another initialization, overwritten by the checkpoint
    auto model = make_mlp(77);
    model->to(dev);
    FullyShardedDataParallel fsdp(model, world, units);
    optim::AdamW opt(fsdp.parameters(), o);
    load_sharded_checkpoint(fsdp, dir, &opt);
    for (int64_t k = 2; k < steps; ++k) {
      step(fsdp, opt, k);
      for (const auto& [name, t] : fsdp.full_state_dict())
        check_equal(t, uninterrupted[size_t(k - 2)].at(name), str_cat("ZeRO-3 resumed ", name, " after step ", k + 1));
    }
  }
  world->barrier();
  if (r == 0) std::filesystem::remove_all(dir);
}

/// Runs `checks` on the world `options` makes and reports: 0 when all passed, 1 otherwise.
int run_checks(const char* what, const ProcessGroupOptions& options,
               const std::function<void(const CommPtr&)>& checks) {
  try {
    auto world = init_process_group(options);
    g_rank = world->rank();
    ops::set_allow_tf32(false);  // the default; stated because TF32 (~1e-3) would fail every check
    checks(world);
    world->barrier();
  } catch (const std::exception& e) {
    std::printf("FAIL (rank %d): %s\n", g_rank, e.what());
    return 1;
  }
  std::printf("%s rank %d: %d checks, %d failed\n", what, g_rank, g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  const bool cpu = argc > 1 && std::strcmp(argv[1], "--cpu") == 0;
  if (argc > 2 || (argc == 2 && !cpu)) {
    std::fprintf(stderr, "usage: parallel_check [--cpu]\n");
    return 2;
  }
  const std::chrono::seconds timeout(120);
  if (cpu)  // the data-parallel checks over TCP on CPU tensors
    return run_checks("parallel_check --cpu", {.backend = Backend::Tcp, .timeout = timeout}, [](const CommPtr& world) {
      check_data_parallel(world);
      check_fully_sharded(world);
    });
  if (const int skipped = testing::skip_without_gpus("parallel_check")) return skipped;
  return run_checks("parallel_check", {.timeout = timeout}, [](const CommPtr& world) {
    check_tensor_parallel(world);
    check_tensor_parallel_dropout(world);
    check_tensor_parallel_bert(world);
    check_tensor_parallel_vit(world);
    check_pipeline(world);
    check_data_parallel(world);
    check_fully_sharded(world);
  });
}
