// Probes for silent wrong answers in the memory-saving transforms, on the CPU: checkpoint
// (full and selective, dropout from the default generator and from others: a tensor-parallel
// layer's streams), checkpoint_sequential, recompute_cheap, offload, compress (its
// lossless paths), MemoryPlanner and BlockPlanner, fed what users pass: region inputs that
// are views (transposed, strided, expanded, a slice of a parameter), outputs that alias an
// input, each other or a captured parameter, several outputs of which some are unused, inputs
// without grad, size-0 and integer tensors, in-place ops inside and on the inputs, dropout,
// retain_graph, autograd::grad, no_grad, segment counts and budgets at their edges. Every
// gradient is compared with the same function run plainly in float64 (bit for bit where the
// transform claims to be exact). A failing case here is a finding.
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "autograd/checkpoint.h"
#include "autograd/compress.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/offload.h"
#include "autograd/ops/all.h"
#include "autograd/recompute_cheap.h"
#include "models/vit.h"
#include "nn/activation.h"
#include "nn/batch_norm.h"
#include "nn/block_memory.h"
#include "nn/block_planner.h"
#include "nn/checkpoint.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "nn/memory_planner.h"
#include "parallel/tensor_parallel.h"
#include "parallel/thread_communicator.h"
#include "tensor/factory.h"
#include "tensor/random.h"
#include "tests/cpu/gradcheck_util.h"
#include "tests/cpu/parallel_test_util.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autograd::CheckpointPolicy;
using autograd::TensorList;

namespace {

constexpr CheckpointPolicy kPolicies[] = {CheckpointPolicy::Full, CheckpointPolicy::Selective};

/// Checks that got and want have one shape and the same bytes (float64: bit for bit).
void check_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  REQUIRE_MESSAGE(got.defined() == want.defined(), what, ": defined ", got.defined(), " vs ", want.defined());
  if (!want.defined()) return;
  REQUIRE_MESSAGE(got.sizes() == want.sizes(), what, ": shape ", shape_str(got.sizes()), " vs ",
                  shape_str(want.sizes()));
  CHECK_MESSAGE(bytes_of(got) == bytes_of(want), what, " differs from the plain run");
}

/// The .grad of each tensor (detached copies), then clears them.
TensorList take_grads(const TensorList& leaves) {
  TensorList g;
  for (const Tensor& t : leaves) {
    g.push_back(t.grad().defined() ? t.grad().clone() : Tensor());
    t.set_grad(Tensor());
  }
  return g;
}

void check_all_bits(const TensorList& got, const TensorList& want, const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) check_bits(got[i], want[i], what + " grad " + std::to_string(i));
}

void check_all_close(const TensorList& got, const TensorList& want, double rtol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    REQUIRE_MESSAGE(got[i].defined() == want[i].defined(), what, " grad ", i);
    if (want[i].defined()) check_close(got[i], values_of(want[i]), rtol, 1e-300, what + " grad " + std::to_string(i));
  }
}

// The transforms of one tensor -> tensor block, by name: what run_block and the planners use.
using Block = std::function<Tensor(const Tensor&)>;
Tensor offload_all(const Block& fn, const Tensor& x) {
  return autograd::offload(fn, x, {.min_bytes = 0, .host_tensors = true});
}

}  // namespace

// ============================================================================================
// checkpoint: inputs, outputs, aliasing
// ============================================================================================

TEST_CASE(
    "probe recompute: checkpoint inputs that are views (transposed, strided, expanded, a slice) match bit for bit") {
  for (CheckpointPolicy policy : kPolicies) {
    const std::string policy_name = to_string(policy);
    CAPTURE(policy_name);
    Tensor p = leaf({4, 6}, 1), b = leaf({1, 3}, 2), w = leaf({4, 3}, 3);
    // in[0]: (6, 4) transposed, in[1]: (4, 3) every other column, in[2]: (4, 3) expanded row,
    // in[3]: (2, 6) rows 1..2: all views of the leaves p and b.
    auto fn = [&](const TensorList& in) {
      Tensor h = matmul(in[0], w);  // (6, 3), kept by the selective policy
      Tensor s = tanh(in[1]) * in[2];
      return TensorList{matmul(in[3], h), s, in[2] * in[2]};
    };
    auto inputs = [&] {
      return TensorList{p.transpose(0, 1), p.slice(1, 0, 6, 2), b.expand({4, 3}), p.slice(0, 1, 3)};
    };
    auto loss = [](const TensorList& o) { return sum(o[0] * o[0]) + sum(o[1] * 3.0) + sum(o[2]); };
    loss(fn(inputs())).backward();
    const TensorList plain = take_grads({p, b, w});
    loss(checkpoint(fn, inputs(), policy)).backward();
    check_all_bits(take_grads({p, b, w}), plain, "checkpointed");
  }
}

TEST_CASE("probe recompute: unused outputs, an input without grad, size-0 and integer tensors through a checkpoint") {
  for (CheckpointPolicy policy : kPolicies) {
    const std::string policy_name = to_string(policy);
    CAPTURE(policy_name);
    Tensor a = leaf({3, 4}, 11), e = leaf({0, 4}, 12);
    const Tensor k = random_tensor({3, 4}, kFloat64, 13);  // data: no grad
    const Tensor idx = from_vector<int64_t>({2, 0, 2}, {3});
    const Tensor c = random_tensor({3, 4}, kFloat64, 14);
    auto fn = [&](const TensorList& in) {
      return TensorList{in[0] * in[1],                          // used
                        in[2] * 2.0,                            // size 0, used
                        in[3],                                  // integer, passed through
                        index_select(in[0], 0, in[3]),          // integer input as an index, used
                        exp(in[0]),                             // unused
                        sum(in[2], {0}) + in[0].select(0, 1)};  // a size-0 reduction, used
    };
    auto loss = [&](const TensorList& o) { return sum(o[0] * o[0]) + sum(o[1]) + sum(o[3] * c) + sum(o[5] * 2.0); };
    loss(fn({a, k, e, idx})).backward();
    const TensorList plain = take_grads({a, e});
    const TensorList outs = checkpoint(fn, {a, k, e, idx}, policy);
    CHECK(outs[2].dtype() == kInt64);
    CHECK_FALSE(outs[2].requires_grad());
    CHECK(values_of(outs[2]) == values_of(idx));
    CHECK(outs[1].sizes() == Shape{0, 4});
    loss(outs).backward();
    const TensorList got = take_grads({a, e});
    check_all_bits(got, plain, "checkpointed");
    CHECK(got[1].sizes() == Shape{0, 4});
  }
}

TEST_CASE("probe recompute: in-place ops on region-local tensors, kept GEMM outputs included, match bit for bit") {
  for (CheckpointPolicy policy : kPolicies) {
    const std::string policy_name = to_string(policy);
    CAPTURE(policy_name);
    Tensor x = leaf({3, 5}, 21), w = leaf({5, 4}, 22), b = leaf({4}, 23);
    auto fn = [&](const Tensor& t) {
      Tensor h = matmul(t, w);  // the selective policy keeps h, then sees it written
      h *= 2.0;
      h += b;
      Tensor r = tanh(h) + 1.0;  // tanh saves its output: write a sum instead
      r *= r;                    // other shares self's storage
      Tensor s = linear(r, w);   // r @ w^T
      s -= 1.0;
      return s;
    };
    Tensor y0 = fn(x);
    sum(y0 * y0).backward();
    const TensorList plain = take_grads({x, w, b});
    Tensor y = checkpoint(fn, x, policy);
    sum(y * y).backward();
    check_all_bits(take_grads({x, w, b}), plain, "checkpointed");
  }
}

TEST_CASE("probe recompute: a checkpointed function that writes its input in place is refused, not replayed from it") {
  // Replayed from the written input, the recompute would apply the write twice: weight
  // gradients from 4x where the forward used 2x.
  for (CheckpointPolicy policy : kPolicies) {
    const std::string policy_name = to_string(policy);
    CAPTURE(policy_name);
    Tensor w = leaf({3, 2}, 31);
    auto fn = [&](const Tensor& t) {
      t *= 2.0;
      return matmul(t, w);
    };
    const Tensor data = random_tensor({4, 3}, kFloat64, 32);  // no grad
    Tensor x = data.clone();
    check_error([&] { (void)checkpoint(fn, x, policy); }, {"checkpoint", "input 0", "in place"});
    Tensor x0 = leaf({4, 3}, 33);
    Tensor h = x0 * 1.0;  // a non-leaf: the plain run would rebase its history
    check_error([&] { (void)checkpoint(fn, h, policy); }, {"checkpoint", "input 0", "in place"});
    // Under no_grad nothing is replayed: the write is the function's, as in the plain run.
    {
      NoGradGuard no_grad;
      Tensor z = data.clone();
      const Tensor y = checkpoint(fn, z, policy);
      check_close(y, values_of(matmul(data * 2.0, w.detach())), 0, 0, "no_grad");
    }
  }
}

TEST_CASE("probe recompute: a checkpointed function that writes a captured buffer is refused by its recompute") {
  // A buffer the function updates (a call counter, a sum of what it saw) is written by the
  // forward and again by the replay: twice where the plain run writes it once.
  for (CheckpointPolicy policy : kPolicies) {
    const std::string policy_name = to_string(policy);
    CAPTURE(policy_name);
    Tensor w = leaf({3, 2}, 41);
    const Tensor x = random_tensor({4, 3}, kFloat64, 42);
    for (const bool nested : {false, true}) {
      CAPTURE(nested);
      Tensor calls = zeros({1}, kFloat64), seen = zeros({3}, kFloat64);
      auto update = [&](const Tensor& t) {
        add_(calls, 1.0);
        seen.copy_(sum(t.detach(), {0}));
        return matmul(t, w);
      };
      // Nested, the buffer is written inside an inner checkpoint, whose forward the outer
      // recompute runs again.
      auto fn = [&](const Tensor& t) { return nested ? checkpoint(update, t * 1.0, policy) : update(t); };
      Tensor y = checkpoint(fn, x, policy);
      CHECK(values_of(calls)[0] == 1.0);  // the forward writes it once, as the plain run
      check_error([&] { sum(y * y).backward(); },
                  {"add_", "recompute", "in place a second time", "in_checkpoint_recompute"});
      CHECK(values_of(calls)[0] == 1.0);  // and the refused replay wrote nothing
    }
    // Guarded by in_checkpoint_recompute(), the write happens once and the gradients are the
    // plain run's, bit for bit; writes to the function's own tensors are its business.
    Tensor calls = zeros({1}, kFloat64);
    auto guarded = [&](const Tensor& t) {
      if (!autograd::in_checkpoint_recompute()) add_(calls, 1.0);
      Tensor h = matmul(t, w);
      add_(h, 1.0);  // made here: written in the forward and in the replay alike
      return h;
    };
    sum(guarded(x) * guarded(x)).backward();
    const TensorList plain = take_grads({w});
    sum(checkpoint(guarded, x, policy) * checkpoint(guarded, x, policy)).backward();
    check_all_bits(take_grads({w}), plain, "guarded");
    CHECK(values_of(calls)[0] == 4.0);  // two plain calls, two checkpointed forwards
  }
}

TEST_CASE("probe recompute: checkpoint outputs that alias each other, an input or a captured parameter") {
  for (CheckpointPolicy policy : kPolicies) {
    const std::string policy_name = to_string(policy);
    CAPTURE(policy_name);
    Tensor x = leaf({3, 4}, 41), w = leaf({3, 4}, 42);
    auto twice = [&](const TensorList& in) {
      Tensor h = in[0] * w;
      return TensorList{h, h, h.t()};
    };
    auto loss = [](const TensorList& o) { return sum(o[0]) + sum(o[1] * 3.0) + sum(o[2] * o[2]); };
    loss(twice({x})).backward();
    const TensorList plain = take_grads({x, w});
    TensorList o = checkpoint(twice, {x}, policy);
    loss(o).backward();
    check_all_bits(take_grads({x, w}), plain, "aliasing outputs");

    // Written in place, one of them would change the others' values behind their history (in
    // the plain run they are one tensor and its view): refused, as frugal refuses any write
    // through an alias it cannot track.
    o = checkpoint(twice, {x}, policy);
    check_error([&] { o[0] *= 2.0; }, {"in-place"});
    check_error([&] { o[2] *= 2.0; }, {"in-place"});
    // Once the other aliases are gone, the write is safe and recorded.
    o = checkpoint(twice, {x}, policy);
    Tensor only = o[1];
    o.clear();
    only *= 2.0;
    sum(only).backward();
    check_close(x.grad(), values_of(w.detach() * 2.0), 0, 0, "written alone");
    take_grads({x, w});

    // The function returns a captured parameter: writing the output would write the parameter.
    const std::vector<double> w_before = values_of(w);
    Tensor ow = checkpoint([&](const Tensor&) { return w; }, x, policy);
    check_error([&] { ow *= 2.0; }, {"in-place"});
    CHECK(values_of(w) == w_before);

    // The function returns its input, or a view of it: gradients pass through; a write is refused.
    Tensor hx = x * 1.0;
    Tensor id = checkpoint([](const Tensor& t) { return t; }, hx, policy);
    Tensor tv = checkpoint([](const Tensor& t) { return t.t(); }, hx, policy);
    sum(id * 2.0).backward({}, true);
    check_close(x.grad(), std::vector<double>(12, 2.0), 0, 0, "identity");
    take_grads({x});
    check_error([&] { id *= 2.0; }, {"in-place"});
    check_error([&] { tv *= 2.0; }, {"in-place"});
  }
}

// ============================================================================================
// checkpoint: parameters, repeats, dropout, retain_graph, autograd::grad
// ============================================================================================

TEST_CASE("probe recompute: a region called twice with dropout, its parameter also used outside: backward and grad") {
  Tensor x = leaf({3, 5}, 51), w = leaf({5, 5}, 52);
  auto block = [&](const Tensor& t) { return dropout(tanh(matmul(t, w)), 0.3); };
  // mode 0: plain; 1: full checkpoints; 2: selective.
  auto loss_of = [&](int mode) {
    manual_seed(99);
    auto run = [&](const Tensor& t) {
      return mode == 0 ? block(t)
                       : checkpoint(block, t, mode == 1 ? CheckpointPolicy::Full : CheckpointPolicy::Selective);
    };
    Tensor h1 = run(x);
    Tensor h2 = run(h1);
    return sum(matmul(h2, w) * h1);  // w outside the regions too, h1 used twice
  };
  loss_of(0).backward();
  const TensorList plain = take_grads({x, w});
  const TensorList plain_w = autograd::grad({loss_of(0)}, {w});
  for (int mode : {1, 2}) {
    CAPTURE(mode);
    // The recompute accumulates into w.grad apart from the outer run's buffer: the sum is
    // grouped differently, so rounding may differ in the last bits (a lost or doubled
    // contribution would be off by tens of percent).
    Tensor loss = loss_of(mode);
    loss.backward({}, /*retain_graph=*/true);
    check_all_close(take_grads({x, w}), plain, 1e-13, "backward");
    loss.backward();  // the retained graph replays with the same masks
    check_all_close(take_grads({x, w}), plain, 1e-13, "second backward");
    // grad: the parameter's share from inside the regions is handed over; no .grad is touched.
    const TensorList g = autograd::grad({loss_of(mode)}, {w});
    CHECK_FALSE(w.grad().defined());
    CHECK_FALSE(x.grad().defined());
    check_all_close(g, plain_w, 1e-13, "grad(w)");
    const TensorList gx = autograd::grad({loss_of(mode)}, {x, w});
    check_all_close(gx, plain, 1e-13, "grad(x, w)");
    CHECK_FALSE(w.grad().defined());
  }
}

TEST_CASE(
    "probe recompute: checkpoint_sequential with one segment per module, one segment, uneven chunks, one module") {
  manual_seed(61);
  auto seq = std::make_shared<nn::Sequential>();
  seq->push_back(std::make_shared<nn::Linear>(4, 6));
  seq->push_back(std::make_shared<nn::Tanh>());
  seq->push_back(std::make_shared<nn::Dropout>(0.25));
  seq->push_back(std::make_shared<nn::Linear>(6, 6));
  seq->push_back(std::make_shared<nn::GELU>());
  seq->to(kFloat64);
  nn::Sequential one{std::make_shared<nn::Linear>(4, 3)};
  one.to(kFloat64);
  const Tensor data = random_tensor({5, 4}, kFloat64, 62);
  for (nn::Sequential* s : {seq.get(), &one}) {
    const TensorList params = s->parameters();
    for (bool input_grad : {false, true}) {
      Tensor x = data.clone();
      if (input_grad) x.requires_grad_();
      TensorList leaves = params;
      if (input_grad) leaves.push_back(x);
      auto run = [&](int64_t segments) {
        manual_seed(63);
        Tensor y = segments == 0 ? s->forward(x) : nn::checkpoint_sequential(*s, segments, x);
        sum(y * y).backward();
        return std::pair{y.detach(), take_grads(leaves)};
      };
      const auto plain = run(0);
      for (int64_t segments = 1; segments <= int64_t(s->size()); ++segments) {
        CAPTURE(segments);
        const auto got = run(segments);
        check_bits(got.first, plain.first, "output");
        check_all_bits(got.second, plain.second, "checkpoint_sequential");
      }
    }
  }
}

TEST_CASE("probe recompute: every transform under no_grad gives the plain values and records nothing") {
  Tensor x = leaf({4, 6}, 71), w = leaf({6, 6}, 72);
  const Block fn = [&](const Tensor& t) { return gelu(layer_norm(matmul(t, w), {6})); };
  Tensor plain;
  {
    NoGradGuard no_grad;
    plain = fn(x);
  }
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> transforms = {
      {"checkpoint", [&](const Tensor& t) { return checkpoint(fn, t); }},
      {"selective", [&](const Tensor& t) { return checkpoint(fn, t, CheckpointPolicy::Selective); }},
      {"recompute_cheap", [&](const Tensor& t) { return autograd::recompute_cheap(fn, t); }},
      {"offload", [&](const Tensor& t) { return offload_all(fn, t); }},
      {"compress", [&](const Tensor& t) { return autograd::compress(fn, t, {.min_bytes = 0}); }},
  };
  for (const auto& [name, f] : transforms) {
    CAPTURE(name);
    NoGradGuard no_grad;
    const Tensor y = f(x);
    CHECK_FALSE(y.requires_grad());
    check_bits(y, plain, name);
  }
}

// ============================================================================================
// recompute_cheap, offload, compress: exact where they claim to be
// ============================================================================================

TEST_CASE("probe recompute: recompute_cheap, offload and lossless compress on view inputs match bit for bit") {
  Tensor p = leaf({8, 6}, 81), w = leaf({6, 6}, 82), g = leaf({6}, 83), bias = leaf({6}, 84), r = leaf({1, 6}, 85);
  // A block that saves views: layer norm of a transposed input, GELU, a linear, an expanded
  // residual row, a relu whose output the next matmul saves.
  const Block block = [&](const Tensor& t) {
    Tensor h = layer_norm(t, {6}, g, bias);
    h = linear(gelu(h), w);
    h = h * r.expand(h.sizes());
    return matmul(relu(h), w.t());
  };
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> transforms = {
      {"recompute_cheap", [&](const Tensor& t) { return autograd::recompute_cheap(block, t); }},
      {"offload", [&](const Tensor& t) { return offload_all(block, t); }},
      {"compress float64", [&](const Tensor& t) { return autograd::compress(block, t, {.min_bytes = 0}); }},
      {"compress declining every op",
       [&](const Tensor& t) {
         return autograd::compress(block, t, {.min_bytes = 0, .select = [](std::string_view) { return false; }});
       }},
      {"checkpoint of recompute_cheap",
       [&](const Tensor& t) {
         return checkpoint([&](const Tensor& u) { return autograd::recompute_cheap(block, u); }, t);
       }},
  };
  const TensorList leaves = {p, w, g, bias, r};
  // The region input in three layouts: transposed, every other row, a slice of the parameter.
  const std::vector<std::function<Tensor()>> inputs = {[&] {
                                                         return p.t().reshape({6, 8}).t();
                                                       },
                                                       [&] { return p.slice(0, 0, 8, 2); },
                                                       [&] { return p.slice(0, 2, 7); }};
  for (size_t i = 0; i < inputs.size(); ++i) {
    CAPTURE(i);
    Tensor y0 = block(inputs[i]());
    sum(y0 * y0).backward();
    const TensorList plain = take_grads(leaves);
    for (const auto& [name, f] : transforms) {
      CAPTURE(name);
      Tensor y = f(inputs[i]());
      check_bits(y, y0, name + " output");
      sum(y * y).backward();
      check_all_bits(take_grads(leaves), plain, name);
    }
  }
}

TEST_CASE("probe recompute: compress's lossless paths in float32 (declined ops, min_bytes, relu masks) are exact") {
  manual_seed(91);
  const Tensor x = randn({64, 64});
  Tensor w1 = randn({64, 64}), w2 = randn({64, 64});
  w1.requires_grad_(), w2.requires_grad_();
  const Block block = [&](const Tensor& t) { return matmul(relu(matmul(t, w1)), w2); };
  sum(block(x) * x).backward();
  const TensorList plain = take_grads({w1, w2});
  const std::vector<std::pair<std::string, autograd::CompressOptions>> exact = {
      {"min_bytes above every tensor", {.min_bytes = int64_t(1) << 40}},
      {"select declines all", {.min_bytes = 0, .select = [](std::string_view) { return false; }}},
      // relu saves a mask; matmul's saves are declined: nothing is quantized.
      {"relu masks only", {.min_bytes = 0, .select = [](std::string_view op) { return op == "relu"; }}},
  };
  for (const auto& [name, options] : exact) {
    CAPTURE(name);
    sum(autograd::compress(block, x, options) * x).backward();
    check_all_bits(take_grads({w1, w2}), plain, name);
  }
}

TEST_CASE("probe recompute: offload of a function that returns its input or a view of it") {
  Tensor x = leaf({4, 4}, 101);
  Tensor h = x * 1.0;
  // Gradients pass through; a leaf input comes back as itself for autograd.
  Tensor id = offload_all([](const Tensor& t) { return t; }, h);
  Tensor tv = offload_all([](const Tensor& t) { return t.t(); }, h);
  sum(id * 2.0 + tv * 3.0).backward();
  check_close(x.grad(), std::vector<double>(16, 5.0), 0, 0, "identity and transpose");
  take_grads({x});
  // A write through the output would change the input behind its history (the plain run writes
  // the input itself, and rebases it): refused. With a leaf input it would write the leaf.
  id = offload_all([](const Tensor& t) { return t; }, h);
  check_error([&] { id *= 2.0; }, {"in-place"});
  Tensor lid = offload_all([](const Tensor& t) { return t; }, x);
  const std::vector<double> before = values_of(x);
  check_error([&] { lid *= 2.0; }, {"in-place"});
  CHECK(values_of(x) == before);
}

// ============================================================================================
// run_block, MemoryPlanner, BlockPlanner
// ============================================================================================

TEST_CASE("probe recompute: run_block under every choice, probed or not, gives the plain gradients") {
  Tensor x = leaf({6, 8}, 111), w = leaf({8, 8}, 112), g = leaf({8}, 113);
  const Block block = [&](const Tensor& t) { return linear(gelu(layer_norm(t, {8}, g)), w) + t; };
  const Block identity = [](const Tensor& t) { return t; };
  for (const Block* fn : {&block, &identity}) {
    auto loss_of = [&](const nn::BlockMemoryPlan& plan) {
      Tensor h = x.t().reshape({8, 6}).t();  // a transposed view of x's values
      h = nn::run_block(plan, 0, *fn, h);
      h = nn::run_block(plan, 1, *fn, h);
      return sum(h * h);
    };
    loss_of(nn::BlockMemoryPlan::uniform(nn::BlockMemory::Keep)).backward();
    const TensorList plain = take_grads({x, w, g});
    for (int c = 0; c < nn::kNumBlockMemory; ++c) {
      const auto choice = static_cast<nn::BlockMemory>(c);
      if (nn::is_lossy(choice)) continue;
      const std::string choice_name = to_string(choice);
      CAPTURE(choice_name);
      for (bool probed : {false, true}) {
        CAPTURE(probed);
        std::unique_ptr<nn::BlockProbe> probe;
        if (probed) probe = std::make_unique<nn::BlockProbe>(kCPU);
        loss_of({{choice, nn::BlockMemory::Keep}, choice}).backward();
        check_all_bits(take_grads({x, w, g}), plain, "mixed plan");
      }
    }
  }
}

TEST_CASE("probe recompute: a block that writes its input in place is not silently wrong when probed") {
  // Keep runs fn on the caller's tensor: the write rebases its history, as in the plain run.
  // A probed block sees an alias of it (a mark for the planner): a write there is refused.
  Tensor x = leaf({3, 4}, 121);
  const Block writes = [](const Tensor& t) {
    t *= 3.0;
    return t * 1.0;
  };
  auto loss_of = [&] {
    Tensor h = x * 1.0;
    Tensor y = nn::run_block(nn::BlockMemoryPlan::uniform(nn::BlockMemory::Keep), 0, writes, h);
    return sum(y) + sum(h * 2.0);  // h after the write: 3x
  };
  loss_of().backward();
  check_close(x.grad(), std::vector<double>(12, 9.0), 0, 0, "plain");
  take_grads({x});
  nn::BlockProbe probe(kCPU);
  check_error([&] { (void)loss_of(); }, {"in-place"});
}

TEST_CASE("probe recompute: MemoryPlanner::forward runs the whole chain with its hooks, and refuses a partial plan") {
  manual_seed(131);
  nn::Sequential seq{std::make_shared<nn::Linear>(4, 4), std::make_shared<nn::Tanh>(),
                     std::make_shared<nn::Linear>(4, 4), std::make_shared<nn::Tanh>()};
  seq.to(kFloat64);
  // A forward hook that changes an output (as a LoRA-style adapter or an activation scale does).
  seq[2]->add_forward_hooks({.before = {}, .after = [](nn::UnaryModule&, Tensor out) { return out * 0.5; }});
  const Tensor sample = random_tensor({3, 4}, kFloat64, 132);
  nn::MemoryPlanner planner(seq, sample);
  Tensor plain_y = seq.forward(sample);
  sum(plain_y * plain_y).backward();
  const TensorList params = seq.parameters();
  const TensorList plain = take_grads(params);
  for (const nn::MemoryPlan& plan : {planner.plan_none(), planner.plan_uniform(2), planner.plan_uniform(4),
                                     planner.plan(std::numeric_limits<int64_t>::max())}) {
    CAPTURE(plan.method);
    Tensor y = planner.forward(plan, sample);
    check_bits(y, plain_y, "output");
    sum(y * y).backward();
    check_all_bits(take_grads(params), plain, "planned");
  }
  // A plan that misses modules (made for a shorter chain, or edited) is refused, not run in part.
  nn::MemoryPlan partial = planner.plan_uniform(2);
  partial.segments.pop_back();
  check_error([&] { (void)planner.forward(partial, sample); }, {"MemoryPlanner::forward", "cover"});
  nn::MemoryPlan gap = planner.plan_none();
  gap.segments = {{0, 1, true}, {2, 4, false}};
  check_error([&] { (void)planner.forward(gap, sample); }, {"MemoryPlanner::forward"});
  // Budgets: 0 and negative are refused; a one-module chain plans too.
  check_error([&] { (void)planner.plan(0); }, {"budget", "positive"});
  nn::Sequential one{std::make_shared<nn::Linear>(4, 2)};
  one.to(kFloat64);
  nn::MemoryPlanner single(one, sample);
  const nn::MemoryPlan p1 = single.plan(std::numeric_limits<int64_t>::max());
  REQUIRE(p1.segments.size() == 1);
  CHECK_FALSE(p1.segments[0].checkpointed);
  check_error([&] { (void)single.plan(1); }, {"MemoryPlanner::plan", "no checkpointing plan fits"});
}

TEST_CASE("probe recompute: MemoryPlanner's profiling leaves running statistics and the random stream as found") {
  manual_seed(141);
  nn::Sequential seq{std::make_shared<nn::Conv2d>(2, 3, 3, nn::Conv2dModuleOptions{.padding = 1}),
                     std::make_shared<nn::BatchNorm2d>(3),
                     std::make_shared<nn::ReLU>(),
                     std::make_shared<nn::Dropout>(0.5),
                     std::make_shared<nn::Flatten>(),
                     std::make_shared<nn::Linear>(3 * 4 * 4, 2)};
  seq.to(kFloat64);
  const Tensor sample = random_tensor({2, 2, 4, 4}, kFloat64, 142);
  auto buffers = [&] {
    std::vector<std::vector<double>> b;
    for (const auto& [name, t] : seq.named_buffers()) b.push_back(values_of(t));
    return b;
  };
  const auto before = buffers();
  const uint64_t seed = default_generator().seed(), offset = default_generator().offset();
  nn::MemoryPlanner planner(seq, sample);
  CHECK(buffers() == before);
  CHECK(default_generator().seed() == seed);
  CHECK(default_generator().offset() == offset);
  (void)planner.measure_step(planner.plan_uniform(2));
  CHECK(buffers() == before);
  CHECK(default_generator().offset() == offset);
}

TEST_CASE("probe recompute: BlockPlanner with one block, a budget of 0 and an unbounded one") {
  Tensor x = leaf({16, 32}, 151), w = leaf({32, 32}, 152), g = leaf({32}, 153);
  const Block block = [&](const Tensor& t) { return linear(gelu(layer_norm(t, {32}, g)), w); };
  TensorList grads_seen;
  auto step = [&](const nn::BlockMemoryPlan& plan) {
    Tensor y = nn::run_block(plan, 0, block, x * 1.0);
    sum(y * y).backward();
    grads_seen = take_grads({x, w, g});
  };
  step(nn::BlockMemoryPlan::uniform(nn::BlockMemory::Keep));
  const TensorList plain = grads_seen;
  nn::BlockPlanner planner(kCPU, 1, step, nn::BlockPlanner::lossless(), 1);
  planner.profile();
  check_all_bits(grads_seen, plain, "profiled steps");  // the last profiled choice's
  const nn::BlockMemoryPlan all = planner.plan(std::numeric_limits<int64_t>::max());
  CHECK(all.at(0) == nn::BlockMemory::Keep);
  check_error([&] { (void)planner.plan(0); }, {"BlockPlanner", "no plan fits"});
  const nn::BlockMemoryPlan lowest = planner.plan(planner.lowest_peak());
  CHECK(planner.predict_peak(lowest) <= planner.lowest_peak());
  step(lowest);
  check_all_bits(grads_seen, plain, to_string(lowest.at(0)));
}

// ============================================================================================
// Random streams of generators other than the default one; outputs made outside offload;
// BlockPlanner's side effects
// ============================================================================================

TEST_CASE("probe recompute: dropout from explicit Generators under checkpoint replays the forward's masks") {
  Tensor x = leaf({4, 6}, 161), w = leaf({6, 6}, 162);
  Generator a(7), b(8);
  // Two generators of its own, one drawn twice, with the default one in between.
  const Block block = [&](const Tensor& t) {
    Tensor h = dropout(tanh(matmul(t, w)), 0.3, true, &a);
    h = dropout(h, 0.4);
    return dropout(matmul(h, w), 0.5, true, &b) + dropout(h, 0.2, true, &a);
  };
  // A kept op that draws (flash attention's dropout), then a cheap one from the same generator:
  // the selective replay skips the kept kernel but must still advance the generator past it.
  const Block attention = [&](const Tensor& t) {
    const Tensor q = matmul(t, w).reshape({1, 2, 2, 6});
    const Tensor o = flash_attention(q, q, q, Tensor(), false, 0.3, {}, &a).reshape({4, 6});
    return dropout(o, 0.4, true, &a);
  };
  // mode 0: plain; 1: full checkpoints; 2: selective; 3: checkpoint_sequential-like nesting
  // (a checkpoint of two checkpointed blocks).
  struct Run {
    TensorList grads;
    GeneratorState a, b, dflt;  // after backward
  };
  for (const Block* fn : {&block, &attention}) {
    auto run = [&](int mode) {
      manual_seed(163);
      a.manual_seed(7);
      b.manual_seed(8);
      auto one = [&](const Tensor& t) {
        if (mode == 0) return (*fn)(t);
        if (mode == 3) return checkpoint([&](const Tensor& u) { return checkpoint(*fn, u); }, t);
        return checkpoint(*fn, t, mode == 1 ? CheckpointPolicy::Full : CheckpointPolicy::Selective);
      };
      Tensor h = one(one(x));
      sum(h * h).backward();
      return Run{take_grads({x, w}), a.state(), b.state(), default_generator().state()};
    };
    const Run plain = run(0);
    for (int mode : {1, 2, 3}) {
      CAPTURE(mode);
      const Run got = run(mode);
      // w's share from inside the regions is summed apart from the outer run's (rounding in
      // the last bits); a mask drawn afresh would be off by tens of percent.
      check_all_close(got.grads, plain.grads, 1e-13, "explicit generators");
      // The replays put every stream back: the next draws are those of the plain run.
      CHECK(got.a.offset == plain.a.offset);
      CHECK(got.b.offset == plain.b.offset);
      CHECK(got.dflt.offset == plain.dflt.offset);
    }
  }

  // A generator destroyed before backward cannot be replayed: refused, naming the node.
  Tensor y;
  {
    auto gone = std::make_unique<Generator>(9);
    Generator* g = gone.get();
    y = checkpoint([g](const Tensor& t) { return dropout(t, 0.5, true, g); }, x * 1.0);
  }
  check_error([&] { sum(y).backward(); }, {"CheckpointBackward", "destroyed before backward"});
}

TEST_CASE("probe recompute: a tensor-parallel layer's own dropout streams under checkpoint, 1 and 2 thread ranks") {
  constexpr int64_t E = 8, H = 2, F = 16;
  const Tensor data = random_tensor({2, 3, E}, kFloat64, 171);
  for (bool pre_norm : {false, true}) {
    for (int p : {1, 2}) {
      CAPTURE(pre_norm);
      CAPTURE(p);
      // Per rank: the plain run's gradients, then each policy's.
      PerRank<std::vector<TensorList>> got(static_cast<size_t>(p));
      auto rank = [&](const parallel::CommPtr& comm) {
        Generator init(172);  // the weights: the same on every rank
        auto rng = std::make_shared<parallel::TensorParallelRng>(173, comm);
        parallel::TensorParallelEncoderLayer layer(
            E, H, F, comm,
            {.pre_norm = pre_norm, .generator = &init, .hidden_dropout = 0.3, .attention_dropout = 0.4, .rng = rng});
        layer.to(kFloat64);
        const GeneratorState replicated = rng->replicated.state(), split = rng->split.state();
        Tensor x = data.clone();
        x.requires_grad_();
        TensorList leaves = layer.parameters();
        leaves.push_back(x);
        std::vector<TensorList>& out = got[size_t(parallel::tp_rank(comm))];
        for (int mode : {0, 1, 2}) {
          rng->replicated.set_state(replicated.seed, replicated.offset);
          rng->split.set_state(split.seed, split.offset);
          const auto fn = [&](const Tensor& t) { return layer.forward(t); };
          Tensor y =
              mode == 0 ? fn(x) : checkpoint(fn, x, mode == 1 ? CheckpointPolicy::Full : CheckpointPolicy::Selective);
          sum(y * y).backward();
          out.push_back(take_grads(leaves));
        }
      };
      if (p == 1) rank(nullptr);
      else parallel::run_ranks(p, rank);
      for (int r = 0; r < p; ++r) {
        CAPTURE(r);
        const std::vector<TensorList>& runs = got[size_t(r)];
        REQUIRE(runs.size() == 3);
        check_all_bits(runs[1], runs[0], "full checkpoint");
        check_all_bits(runs[2], runs[0], "selective checkpoint");
      }
    }
  }
}

TEST_CASE("probe recompute: offload and probed run_block outputs made outside the function refuse in-place writes") {
  Tensor x = leaf({3, 4}, 181), w = leaf({3, 4}, 182);
  // The plain run writes h itself and rebases its history: sum(h * w) sees 6x.
  auto loss_after_write = [&](const std::function<Tensor(const Block&, const Tensor&)>& transform) {
    Tensor h = x * 2.0;  // made before the function runs, with a history of its own
    Tensor y = transform([&](const Tensor&) { return h; }, x * 1.0);
    y *= 3.0;
    return sum(y) + sum(h * w);
  };
  loss_after_write([](const Block& fn, const Tensor& t) { return fn(t); }).backward();
  const TensorList plain = take_grads({x, w});
  check_close(plain[0], values_of(w.detach() * 6.0 + 6.0), 1e-15, 0, "plain");
  // Through offload the write would land in h's values but not in its history (dx = 2w + 6).
  check_error([&] { (void)loss_after_write(offload_all); }, {"in-place"});
  {
    nn::BlockProbe probe(kCPU);
    check_error(
        [&] {
          (void)loss_after_write([](const Block& fn, const Tensor& t) {
            return nn::run_block(nn::BlockMemoryPlan::uniform(nn::BlockMemory::Keep), 0, fn, t);
          });
        },
        {"in-place"});
  }
  take_grads({x, w});

  // A tensor the function writes in place and returns has a new history made inside it, but
  // is still the caller's: refused too.
  Tensor buf = zeros({3, 4}, kFloat64);
  Tensor y = offload_all(
      [&](const Tensor& t) {
        buf.copy_(t);
        return buf;
      },
      x * 1.0);
  check_error([&] { y *= 2.0; }, {"in-place"});

  // A fresh output alone in its storage is written as in the plain run.
  const Block fresh = [&](const Tensor& t) { return t * w; };
  auto loss = [&](const std::function<Tensor(const Block&, const Tensor&)>& transform) {
    Tensor out = transform(fresh, x * 1.0);
    out *= 3.0;
    return sum(out * out);
  };
  loss([](const Block& fn, const Tensor& t) { return fn(t); }).backward();
  const TensorList fresh_plain = take_grads({x, w});
  loss(offload_all).backward();
  check_all_bits(take_grads({x, w}), fresh_plain, "offload, written");
}

TEST_CASE("probe recompute: BlockPlanner's profiling leaves running statistics and the random streams as found") {
  auto bn = std::make_shared<nn::BatchNorm2d>(3);
  nn::Sequential model{bn};
  model.to(kFloat64);
  Generator own(191);
  Tensor x = leaf({4, 3, 2, 2}, 192);
  const Block block = [&](const Tensor& t) { return dropout(tanh((*bn)(t)), 0.3, true, &own) + dropout(t, 0.2); };
  TensorList leaves = model.parameters();
  leaves.push_back(x);
  auto step = [&](const nn::BlockMemoryPlan& plan) {
    Tensor y = nn::run_block(plan, 0, block, x * 1.0);
    sum(y * y).backward();
    return take_grads(leaves);
  };
  auto buffers = [&] {
    std::vector<std::vector<double>> b;
    for (const auto& [name, t] : model.named_buffers()) b.push_back(values_of(t));
    return b;
  };
  std::vector<Tensor> initial;
  for (const auto& [name, t] : model.named_buffers()) initial.push_back(t.clone());
  auto start = [&] {
    autograd::NoGradGuard no_grad;
    size_t i = 0;
    for (const auto& [name, t] : model.named_buffers()) t.copy_(initial[i++]);
    manual_seed(193);
    own.manual_seed(191);
  };
  const nn::BlockMemoryPlan keep = nn::BlockMemoryPlan::uniform(nn::BlockMemory::Keep);
  // The reference: one step from the start, with no profile before it.
  start();
  const auto buffers_before = buffers();
  const TensorList plain = step(keep);
  const auto buffers_plain = buffers();
  const uint64_t own_plain = own.offset(), default_plain = default_generator().offset();
  REQUIRE(buffers_plain != buffers_before);  // the step does move the statistics

  nn::BlockPlanner planner(
      kCPU, 1, [&](const nn::BlockMemoryPlan& plan) { (void)step(plan); }, nn::BlockPlanner::lossless(), 1);
  start();
  planner.profile(model);
  CHECK(buffers() == buffers_before);
  CHECK(own.offset() == 0);
  CHECK(default_generator().offset() == 0);
  check_all_bits(step(keep), plain, "the step after the profile");
  CHECK(buffers() == buffers_plain);
  CHECK(own.offset() == own_plain);
  CHECK(default_generator().offset() == default_plain);

  // Without the model the streams still come back; the buffers are the step's to keep.
  start();
  planner.profile();
  CHECK(own.offset() == 0);
  CHECK(default_generator().offset() == 0);
  CHECK(buffers() != buffers_before);
}

TEST_CASE("probe recompute: a checkpoint sees a parameter whose autocast cast is already cached") {
  // Inside one AutocastGuard the bf16 cast of w is cached; a checkpoint's no-grad forward that
  // reused it handed nothing requiring grad to any op, so the region recorded nothing and w
  // lost its gradient. By hand (and PyTorch 1.13 under torch.autocast): d/dw of
  // sum(x w) + sum(2x w) is 3 colsum(x) per column: 36, 45, 54, 63; then colsum(x): 12 ... 21.
  const Tensor x = arange(0.0, 12.0, 1.0).view({3, 4});
  const Tensor w = arange(0.0, 16.0, 1.0).view({4, 4}).clone().requires_grad_();
  const auto fn = [&](const Tensor& t) { return matmul(t, w); };
  const auto column0 = [&] { return w.grad().select(1, 0).contiguous().tolist<float>(); };
  {  // two regions over w in one guard: the second found the cast cached by the first
    AutocastGuard amp(kCPU, kBFloat16);
    const Tensor y1 = autograd::checkpoint(fn, x), y2 = autograd::checkpoint(fn, mul(x, 2.0));
    CHECK(y1.requires_grad());
    CHECK(y2.requires_grad());
    sum(add(y1, y2).to(kFloat32)).backward();
  }
  CHECK(column0() == std::vector<float>{36, 45, 54, 63});
  w.set_grad({});
  {  // a no-grad evaluation first caches the cast; the checkpointed step must still record
    AutocastGuard amp(kCPU, kBFloat16);
    {
      autograd::NoGradGuard no_grad;
      (void)fn(x);
    }
    const Tensor y = autograd::checkpoint(fn, x);
    REQUIRE(y.requires_grad());
    sum(y.to(kFloat32)).backward();
  }
  CHECK(column0() == std::vector<float>{12, 15, 18, 21});
}

TEST_CASE("probe recompute: a parameter used only under fn's own NoGradGuard makes the region record nothing") {
  // PyTorch's checkpoint records nothing for such a region (its output does not require
  // grad); frugal's probe counted the use, so the region held its input and replayed for
  // nothing (Note [Probed grad mode]).
  const Tensor x = arange(0.0, 6.0, 1.0).view({2, 3});
  const Tensor w = arange(1.0, 4.0, 1.0).requires_grad_();
  const auto statistic = [&](const Tensor& t) {  // fn's own no-grad use of w, as an EMA's
    Tensor s;
    {
      autograd::NoGradGuard no_grad;
      s = mul(w, 2.0);
    }
    return add(t, s);
  };
  const Tensor y = autograd::checkpoint(statistic, x);
  CHECK_FALSE(y.requires_grad());
  CHECK(y.tolist<float>() == std::vector<float>{2, 5, 8, 5, 8, 11});
  {  // nested: an inner checkpoint under the outer fn's NoGradGuard sees no use either
    const Tensor z = autograd::checkpoint(
        [&](const Tensor& t) {
          autograd::NoGradGuard no_grad;
          return autograd::checkpoint([&](const Tensor& u) { return mul(u, w); }, t);
        },
        x);
    CHECK_FALSE(z.requires_grad());
  }
  // A use after fn's guard closed counts again (the guard restores the probed mode), so the
  // region records and w gets its gradient: colsum(x) = 3, 5, 7.
  const Tensor v = autograd::checkpoint(
      [&](const Tensor& t) {
        {
          autograd::NoGradGuard no_grad;
          (void)mul(t, w);
        }
        return mul(t, w);
      },
      x);
  REQUIRE(v.requires_grad());
  sum(v).backward();
  CHECK(w.grad().tolist<float>() == std::vector<float>{3, 5, 7});
  // a region whose every op runs under fn's own guard records nothing, as before
  const Tensor u = autograd::checkpoint(
      [&](const Tensor& t) {
        autograd::NoGradGuard no_grad;
        return mul(t, 1.0);
      },
      x);
  CHECK_FALSE(u.requires_grad());
}

TEST_CASE("probe recompute: a mode switched between forward and backward is refused, not replayed in the new mode") {
  // The replay ran batch norm on its running statistics and dropout not at all where the
  // forward had used batch statistics and dropped: gradients up to 100% off, no error
  // (PyTorch's reentrant checkpoint too). Note [What a replay must find unchanged].
  const Tensor x = randn({4, 3, 2, 2});
  for (const nn::BlockMemory choice : {nn::BlockMemory::Checkpoint, nn::BlockMemory::Selective,
                                       nn::BlockMemory::CheckpointRecompute, nn::BlockMemory::CheckpointOffload}) {
    CAPTURE(nn::to_string(choice));
    auto net = std::make_shared<nn::Sequential>();
    net->push_back(std::make_shared<nn::Conv2d>(3, 3, 1));
    net->push_back(std::make_shared<nn::BatchNorm2d>(3));
    net->push_back(std::make_shared<nn::Dropout>(0.5));
    const nn::BlockMemoryPlan plan = nn::BlockMemoryPlan::uniform(choice);
    const Tensor xg = x.clone().requires_grad_();
    for (const bool back_to_train : {false, true}) {
      net->train();
      const Tensor y = nn::run_block(
          plan, 0, [net](const Tensor& h) { return net->forward(h); }, xg);
      net->eval();  // an evaluation pass before the step
      if (back_to_train) {
        net->train();  // switched back before backward: nothing changed for the replay
        sum(y).backward();
        CHECK(xg.grad().defined());
      } else {
        check_error([&] { sum(y).backward(); },
                    {"CheckpointBackward",
                     "batch_norm ran in training mode in the forward and in eval mode in the "
                     "recompute",
                     "train()/eval()"});
      }
    }
  }
  // Dropout alone, and the other way round (an eval forward, train() before backward).
  bool training = true;
  const Tensor w = randn({8}).requires_grad_();
  const auto fn = [&](const Tensor& h) { return dropout(mul(h, w), 0.5, training); };
  const Tensor y = autograd::checkpoint(fn, randn({8}));
  training = false;
  check_error([&] { sum(y).backward(); }, {"dropout ran in training mode in the forward and in eval mode"});
  const Tensor z = autograd::checkpoint(fn, randn({8}));
  training = true;
  check_error([&] { sum(z).backward(); }, {"dropout ran in eval mode in the forward and in training mode"});
}

TEST_CASE("probe recompute: a tensor the region read, written in place before backward, is refused") {
  // A plain run refuses it where an op saved the tensor; the replay read the new values and
  // gave other gradients (x.grad 5 5 5 where the forward used m = 1), as PyTorch's checkpoint.
  for (const nn::BlockMemory choice : {nn::BlockMemory::Checkpoint, nn::BlockMemory::Selective,
                                       nn::BlockMemory::CheckpointRecompute, nn::BlockMemory::CheckpointOffload}) {
    CAPTURE(nn::to_string(choice));
    const nn::BlockMemoryPlan plan = nn::BlockMemoryPlan::uniform(choice);
    const Tensor x = from_vector<float>({1, 2, 3}, {3}).requires_grad_();
    const Tensor m = ones({3});
    const Tensor y = nn::run_block(
        plan, 0, [m](const Tensor& h) { return mul(h, m); }, x);
    {
      Tensor alias = m;
      alias *= 5.0;  // a refilled buffer
    }
    check_error([&] { sum(y).backward(); },
                {"CheckpointBackward", "float32[3]", "which the checkpointed function read", "read at version"});
    // a parameter stepped between forward and backward, under NoGradGuard
    auto lin = std::make_shared<nn::Linear>(3, 2);
    const Tensor z = nn::run_block(
        plan, 0, [lin](const Tensor& h) { return lin->forward(h); }, x.view({1, 3}));
    {
      autograd::NoGradGuard no_grad;
      lin->weight *= 0.5;
    }
    check_error([&] { sum(z).backward(); }, {"float32[2, 3]", "modified by an in-place operation after the forward"});
  }
  // What the region writes itself (batch norm's running statistics in training) is no change,
  // nor is a second forward's update of them before one backward (the statistics are not read
  // in training).
  auto bn = std::make_shared<nn::BatchNorm2d>(3);
  const Tensor x = randn({4, 3, 2, 2}).requires_grad_();
  const auto block = [bn](const Tensor& h) { return bn->forward(h); };
  const Tensor y1 = autograd::checkpoint(block, x), y2 = autograd::checkpoint(block, mul(x, 2.0));
  sum(add(y1, y2)).backward();
  CHECK(x.grad().defined());
}

TEST_CASE("probe recompute: a memory plan naming more blocks than the model has is refused, naming both counts") {
  // The extra choices were ignored, so a plan written per residual block (leaving out the
  // stem, ResNet's block 0) applied each choice one block off.
  models::ViTConfig c;
  c.image_size = 8, c.patch_size = 4, c.num_layers = 3, c.num_heads = 2, c.hidden_dim = 16, c.mlp_dim = 32;
  c.num_classes = 5;
  models::VisionTransformer vit(c);
  vit.memory_plan.blocks.assign(4, nn::BlockMemory::Checkpoint);
  check_error(
      [&] {
        (void)vit.forward(randn({2, 3, 8, 8}));
      },
      {"VisionTransformer: memory_plan names 4 blocks, but the model has 3"});
  vit.memory_plan.blocks.assign(2, nn::BlockMemory::Checkpoint);  // fewer: the rest take the fallback
  CHECK(vit.forward(randn({2, 3, 8, 8})).sizes() == Shape{2, 5});
}

TEST_CASE("probe recompute: a captured index, mask, target or autocast source written before backward is refused") {
  // These reach no make_node input, so the first version of the read check missed them and
  // the replay used the new values (index_select: [[0,6,0],[0,35,0]] where the forward's
  // indices give [[1,4,0],[12,20,0]]); PyTorch's checkpoint does the same. Tensor::data()
  // now reports every read (tensor/read_observer.h).
  const Tensor x = from_vector<float>({0.5f, 1, 1.5f, 2, 2.5f, 3}, {2, 3}).requires_grad_();
  const auto refused = [&](const char* what, const std::function<Tensor(const Tensor&)>& fn, const Tensor& captured,
                           const Tensor& new_values) {
    CAPTURE(what);
    const Tensor y = autograd::checkpoint(fn, x);
    {
      autograd::NoGradGuard no_grad;
      captured.copy_(new_values);
    }
    check_error([&] { sum(y).backward(); }, {"CheckpointBackward", "which the checkpointed function read"});
  };
  const Tensor idx = from_vector<int64_t>({0, 1}, {2});
  refused(
      "index_select", [&](const Tensor& h) { return index_select(mul(h, h), 1, idx); }, idx,
      from_vector<int64_t>({1, 1}, {2}));
  const Tensor mask = from_vector<bool>({true, false, true, false, true, false}, {2, 3});
  refused(
      "masked_fill", [&](const Tensor& h) { return masked_fill(mul(h, h), mask, 0.0); }, mask, logical_not(mask));
  const Tensor target = from_vector<int64_t>({0, 2}, {2});
  refused(
      "cross_entropy", [&](const Tensor& h) { return cross_entropy(mul(h, h), target); }, target,
      from_vector<int64_t>({1, 1}, {2}));
  const Tensor ids = from_vector<int64_t>({2, 0}, {2});
  refused(
      "ne",
      [&](const Tensor& h) {
        return ne(ids, 0.0).to(kFloat32).view({2, 1}) * h;
      },
      ids, from_vector<int64_t>({0, 0}, {2}));  // a non-differentiable op's input
  // A weight whose autocast cast was cached before the region: the region's matmul reads the
  // cast, the cast read the weight (right: x.grad from the forward's weight, as a plain run).
  const Tensor w = arange(1.0, 10.0, 1.0).view({3, 3}).requires_grad_();
  {
    AutocastGuard amp(kCPU, kBFloat16);
    (void)matmul(ones({1, 3}), w);  // an earlier use caches w's cast
    const Tensor y = autograd::checkpoint([&](const Tensor& h) { return matmul(h, w); }, x);
    {
      autograd::NoGradGuard no_grad;
      Tensor stepped = w;
      stepped *= 0.5;
    }
    check_error([&] { sum(y.to(kFloat32)).backward(); },
                {"CheckpointBackward", "float32[3, 3]", "which the checkpointed function read"});
  }
}
