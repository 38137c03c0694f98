// Selective checkpointing (Note [Selective checkpoint]): gradients against the plain run
// (exactly in float64, 1e-6 relative in float32); that the kept ops do not run again in the
// recompute, counted from the allocator's trace (which names the op of every allocation);
// the memory kept and the peak, from the CPU arena's statistics; nesting, in-place writes to
// kept outputs, retain_graph, flash attention's dropout, and the errors of a replay that does
// not match its forward.
#include <doctest/doctest.h>

#include <cstring>
#include <optional>
#include <tuple>

#include "autograd/autocast.h"
#include "autograd/checkpoint.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/ops/all.h"
#include "memory/allocator.h"
#include "memory/trace.h"
#include "nn/activation.h"
#include "nn/batch_norm.h"
#include "nn/checkpoint.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "tensor/factory.h"
#include "tensor/ops/fill.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autograd::TensorList;

namespace {

using Policy = std::optional<CheckpointPolicy>;  // nullopt: no checkpoint (the plain run)
constexpr CheckpointPolicy kFull = CheckpointPolicy::Full, kSelective = CheckpointPolicy::Selective;

Tensor leaf(const Shape& s, DType dtype, uint64_t seed, double scale = 1.0) {
  Tensor t = mul(random_tensor(s, dtype, seed), scale);
  t.requires_grad_();
  return t;
}

// A pre-norm transformer MLP block: h + dropout(linear(gelu(linear(layer_norm(h)))), p).
struct MlpBlock {
  Tensor ln_w, ln_b, w1, b1, w2, b2;
  double p = 0.0;
  MlpBlock(int64_t width, DType dt, uint64_t seed, double dropout_p)
      : ln_w(leaf({width}, dt, seed)),
        ln_b(leaf({width}, dt, seed + 1)),
        w1(leaf({4 * width, width}, dt, seed + 2, 0.3)),
        b1(leaf({4 * width}, dt, seed + 3)),
        w2(leaf({width, 4 * width}, dt, seed + 4, 0.3)),
        b2(leaf({width}, dt, seed + 5)),
        p(dropout_p) {}
  Tensor operator()(const Tensor& h) const {
    const Tensor n = layer_norm(h, {h.size(-1)}, ln_w, ln_b);
    return h + dropout(linear(gelu(linear(n, w1, b1)), w2, b2), p);
  }
  std::vector<Tensor> params() const { return {ln_w, ln_b, w1, b1, w2, b2}; }
};

// The output, the input's gradient and every parameter's gradient of loss = sum(y * c).
struct Run {
  std::vector<double> out, input_grad;
  std::vector<std::vector<double>> param_grads;
};

// `blocks` applied in turn, each under checkpoint(policy) unless policy is nullopt.
Run run_stack(const std::vector<std::function<Tensor(const Tensor&)>>& blocks, const std::vector<Tensor>& params,
              const Tensor& x0, const Tensor& c, Policy policy, uint64_t seed = 7) {
  for (Tensor p : params) p.set_grad(Tensor());
  Tensor x = x0.detach();
  x.requires_grad_();
  manual_seed(seed);
  Tensor h = x;
  for (const auto& block : blocks) h = policy ? checkpoint(block, h, *policy) : block(h);
  sum(h * c).backward();
  Run r{values_of(h), values_of(x.grad()), {}};
  for (const Tensor& p : params)
    r.param_grads.push_back(p.grad().defined() ? values_of(p.grad()) : std::vector<double>{});
  return r;
}

void check_runs_equal(const Run& got, const Run& plain, double rtol) {
  auto same = [rtol](const std::vector<double>& a, const std::vector<double>& b, const std::string& what) {
    if (rtol == 0.0) CHECK_MESSAGE(a == b, what, " differs from the plain run");
    else check_close(a, b, rtol, 1e-12, what);
  };
  same(got.out, plain.out, "output");
  same(got.input_grad, plain.input_grad, "input grad");
  REQUIRE(got.param_grads.size() == plain.param_grads.size());
  for (size_t i = 0; i < got.param_grads.size(); ++i)
    same(got.param_grads[i], plain.param_grads[i], "param " + std::to_string(i));
}

struct MlpStack {
  std::vector<MlpBlock> blocks;
  std::vector<std::function<Tensor(const Tensor&)>> fns;
  std::vector<Tensor> params;
  MlpStack(int depth, int64_t width, DType dt, double dropout_p) {
    for (int i = 0; i < depth; ++i) blocks.emplace_back(width, dt, 100 + 10 * uint64_t(i), dropout_p);
    for (const MlpBlock& b : blocks) {
      fns.push_back([&b](const Tensor& h) { return b(h); });
      for (const Tensor& p : b.params()) params.push_back(p);
    }
  }
};

// Allocations the allocator's trace attributes to op `op` (core::OpScope's name).
int64_t allocations_by(const std::vector<memory::TraceEvent>& events, const char* op) {
  int64_t n = 0;
  for (const memory::TraceEvent& e : events) n += e.action == memory::TraceAction::Alloc && std::strcmp(e.op, op) == 0;
  return n;
}

}  // namespace

TEST_CASE("selective checkpoint: MLP blocks with layer norm and dropout give the plain run's gradients") {
  for (DType dt : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dt));
    MlpStack stack(/*depth=*/3, /*width=*/8, dt, /*dropout_p=*/0.3);
    const Tensor x = random_tensor({2, 5, 8}, dt, 1), c = random_tensor({2, 5, 8}, dt, 2);
    const Run plain = run_stack(stack.fns, stack.params, x, c, std::nullopt);
    const Run full = run_stack(stack.fns, stack.params, x, c, kFull);
    const Run selective = run_stack(stack.fns, stack.params, x, c, kSelective);
    check_runs_equal(selective, plain, dt == kFloat64 ? 0.0 : 1e-6);
    check_runs_equal(selective, full, 0.0);  // the kept outputs are the forward's bits
    // The generator after the step is where the plain step leaves it.
    run_stack(stack.fns, stack.params, x, c, std::nullopt, 9);
    const std::vector<double> plain_next = values_of(randn({8}, dt));
    run_stack(stack.fns, stack.params, x, c, kSelective, 9);
    CHECK(values_of(randn({8}, dt)) == plain_next);
  }
}

TEST_CASE("selective checkpoint: conv-bn-relu blocks (train mode) give the plain run's gradients") {
  for (DType dt : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dt));
    manual_seed(3);
    std::vector<std::shared_ptr<nn::Conv2d>> convs;
    std::vector<std::shared_ptr<nn::BatchNorm2d>> bns;
    std::vector<std::function<Tensor(const Tensor&)>> fns;
    std::vector<Tensor> params;
    for (int i = 0; i < 3; ++i) {
      convs.push_back(std::make_shared<nn::Conv2d>(3, 3, Int2{3, 3}, nn::Conv2dModuleOptions{.padding = 1}));
      bns.push_back(std::make_shared<nn::BatchNorm2d>(3));
      convs.back()->to(dt);
      bns.back()->to(dt);
      for (const Tensor& p : convs.back()->parameters()) params.push_back(p);
      for (const Tensor& p : bns.back()->parameters()) params.push_back(p);
      fns.push_back([conv = convs.back(), bn = bns.back()](const Tensor& h) { return relu((*bn)((*conv)(h))); });
    }
    const Tensor x = random_tensor({2, 3, 6, 6}, dt, 4), c = random_tensor({2, 3, 6, 6}, dt, 5);
    const Run plain = run_stack(fns, params, x, c, std::nullopt);
    const Run selective = run_stack(fns, params, x, c, kSelective);
    check_runs_equal(selective, plain, dt == kFloat64 ? 0.0 : 1e-6);
  }
}

TEST_CASE("selective checkpoint: transposed-conv decoder blocks give the plain run's gradients") {
  // conv_transpose2d is one of the kept ops (is_expensive_op); its replay must take the kept output.
  for (DType dt : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dt));
    manual_seed(4);
    std::vector<std::function<Tensor(const Tensor&)>> fns;
    std::vector<Tensor> params;
    for (int i = 0; i < 3; ++i) {
      auto up = std::make_shared<nn::ConvTranspose2d>(3, 3, Int2{3, 3}, nn::ConvTranspose2dModuleOptions{.padding = 1});
      auto bn = std::make_shared<nn::BatchNorm2d>(3);
      up->to(dt);
      bn->to(dt);
      for (const Tensor& p : up->parameters()) params.push_back(p);
      for (const Tensor& p : bn->parameters()) params.push_back(p);
      fns.push_back([up, bn](const Tensor& h) { return relu((*bn)((*up)(h))); });
    }
    const Tensor x = random_tensor({2, 3, 5, 5}, dt, 6), c = random_tensor({2, 3, 5, 5}, dt, 7);
    const Run plain = run_stack(fns, params, x, c, std::nullopt);
    const Run selective = run_stack(fns, params, x, c, kSelective);
    check_runs_equal(selective, plain, dt == kFloat64 ? 0.0 : 1e-6);
  }
}

TEST_CASE("selective checkpoint: the kept ops do not run in the recompute; the cheap ones do") {
  // The trace names the op of every allocation: a linear that runs allocates its output,
  // one that takes its kept output allocates nothing.
  const int depth = 3;
  MlpStack stack(depth, /*width=*/8, kFloat32, /*dropout_p=*/0.1);
  const Tensor x0 = random_tensor({4, 8}, kFloat32, 1), c = random_tensor({4, 8}, kFloat32, 2);
  struct Counts {
    int64_t forward_linear, backward_linear, backward_gelu, backward_layer_norm;
  };
  auto count = [&](Policy policy) {
    Tensor x = x0.detach();
    x.requires_grad_();
    memory::enable_trace(kCPU);
    Tensor h = x;
    for (const auto& block : stack.fns) h = policy ? checkpoint(block, h, *policy) : block(h);
    const std::vector<memory::TraceEvent> forward = memory::trace_events(kCPU);
    memory::enable_trace(kCPU);  // a fresh ring
    sum(h * c).backward();
    const std::vector<memory::TraceEvent> backward = memory::trace_events(kCPU);
    memory::disable_trace(kCPU);
    return Counts{allocations_by(forward, "linear"), allocations_by(backward, "linear"),
                  allocations_by(backward, "gelu"), allocations_by(backward, "layer_norm")};
  };
  const Counts plain = count(std::nullopt), full = count(kFull), selective = count(kSelective);
  CHECK(plain.forward_linear >= 2 * depth);
  CHECK(full.forward_linear == plain.forward_linear);
  CHECK(selective.forward_linear == plain.forward_linear);
  CHECK(plain.backward_linear == 0);
  CHECK(full.backward_linear == plain.forward_linear);  // a full recompute runs every linear again
  CHECK(selective.backward_linear == 0);                // a selective one none
  CHECK(plain.backward_gelu == 0);
  CHECK(selective.backward_gelu >= depth);  // the cheap ops are recomputed
  CHECK(selective.backward_gelu == full.backward_gelu);
  CHECK(selective.backward_layer_norm >= depth);
}

TEST_CASE("selective checkpoint: keeps the GEMM outputs, peaks between full checkpointing and none") {
  // 6 MLP blocks, width 64, 256 rows, float32: per block linear1's output (256 x 256, 256 KiB)
  // and linear2's (256 x 64, 64 KiB) are what the selective forward keeps; the plain forward
  // also keeps the layer norm output and GELU's input and output.
  const int depth = 6;
  const int64_t width = 64, rows = 256;
  MlpStack stack(depth, width, kFloat32, /*dropout_p=*/0.0);
  const Tensor x0 = random_tensor({rows, width}, kFloat32, 1), c = random_tensor({rows, width}, kFloat32, 2);
  const int64_t gemm_bytes = depth * rows * (4 * width + width) * int64_t(sizeof(float));
  for (Tensor p : stack.params) p.set_grad(zeros_like(p));  // preallocated, as after a first step
  struct Measured {
    int64_t kept, peak, after_backward;
    Run run;
  };
  auto measure = [&](Policy policy) {
    for (Tensor p : stack.params) ops::zero_(p.grad());
    memory::empty_cache(kCPU);
    Tensor x = x0.detach();
    x.requires_grad_();
    const int64_t before = memory::stats(kCPU).allocated_bytes.current;
    memory::reset_peak(kCPU);
    Tensor h = x;
    for (const auto& block : stack.fns) h = policy ? checkpoint(block, h, *policy) : block(h);
    const int64_t kept = memory::stats(kCPU).allocated_bytes.current - before;
    sum(h * c).backward();
    const int64_t peak = memory::stats(kCPU).allocated_bytes.peak - before;
    const int64_t after_backward = memory::stats(kCPU).allocated_bytes.current - before;
    Run r{values_of(h), values_of(x.grad()), {}};
    for (const Tensor& p : stack.params) r.param_grads.push_back(values_of(p.grad()));
    return Measured{kept, peak, after_backward, r};
  };
  const Measured plain = measure(std::nullopt), full = measure(kFull), selective = measure(kSelective);
  MESSAGE("after forward: plain ", memory::format_bytes(plain.kept), ", full ", memory::format_bytes(full.kept),
          ", selective ", memory::format_bytes(selective.kept), " (GEMM outputs ", memory::format_bytes(gemm_bytes),
          "); peak: plain ", memory::format_bytes(plain.peak), ", full ", memory::format_bytes(full.peak),
          ", selective ", memory::format_bytes(selective.peak));
  // What selective keeps beyond a full checkpoint is the GEMM outputs, and little else.
  const int64_t extra = selective.kept - full.kept;
  CHECK(extra >= gemm_bytes);
  CHECK(extra <= gemm_bytes + gemm_bytes / 10);
  CHECK(selective.kept < plain.kept - gemm_bytes / 2);  // the norm and activation outputs are gone
  // The backward lets every kept output go: what is left (the output, the input's gradient)
  // is what a full checkpoint leaves.
  CHECK(selective.after_backward == full.after_backward);
  CHECK(full.peak < selective.peak);
  CHECK(selective.peak < plain.peak);
  check_runs_equal(selective.run, plain.run, 1e-6);
}

TEST_CASE("selective checkpoint: nested checkpoints of either policy give the plain run's gradients") {
  const DType dt = kFloat64;
  Tensor w1 = leaf({6, 6}, dt, 31), w2 = leaf({6, 6}, dt, 32), w3 = leaf({6, 6}, dt, 33);
  const std::vector<Tensor> params{w1, w2, w3};
  const Tensor x0 = random_tensor({5, 6}, dt, 34), c = random_tensor({5, 6}, dt, 35);
  auto inner = [&](const Tensor& h) { return dropout(relu(linear(h, w2)), 0.3); };
  auto outer = [&](const Tensor& x, Policy inner_policy) {
    Tensor h = tanh(matmul(x, w1));
    h = inner_policy ? checkpoint(inner, h, *inner_policy) : inner(h);
    return dropout(linear(h, w3), 0.2);
  };
  const Run plain = run_stack({[&](const Tensor& x) { return outer(x, std::nullopt); }}, params, x0, c, std::nullopt);
  for (Policy outer_policy : {Policy{kFull}, Policy{kSelective}})
    for (Policy inner_policy : {Policy{}, Policy{kFull}, Policy{kSelective}}) {
      CAPTURE(autograd::to_string(*outer_policy));
      CAPTURE((inner_policy ? autograd::to_string(*inner_policy) : "none"));
      const Run r = run_stack({[&](const Tensor& x) { return outer(x, inner_policy); }}, params, x0, c, outer_policy);
      check_runs_equal(r, plain, 0.0);
    }
  // gradcheck through selective checkpoints, one inside the other.
  Tensor a = leaf({3, 4}, dt, 1), b = leaf({4, 3}, dt, 2);
  auto result = autograd::gradcheck(
      [](const TensorList& in) {
        return checkpoint(
            [](const TensorList& xs) {
              Tensor h = checkpoint([](const TensorList& ys) { return TensorList{tanh(matmul(ys[0], ys[1]))}; },
                                    {xs[0], xs[1]}, kSelective)[0];
              return TensorList{exp(matmul(h, xs[0])) * sum(xs[0])};
            },
            in, kSelective)[0];
      },
      {a, b});
  CHECK_MESSAGE(result.ok, result.report);
}

TEST_CASE("selective checkpoint: a kept output written in place is recomputed instead") {
  const DType dt = kFloat64;
  Tensor w = leaf({5, 5}, dt, 41), b = leaf({5}, dt, 42);
  const Tensor x0 = random_tensor({3, 5}, dt, 43), c = random_tensor({3, 5}, dt, 44);
  // linear's output is kept, then scaled in place: the kept values are not the forward's
  // output of linear any more, and the replay must not hand them out.
  auto block = [&](const Tensor& h) {
    Tensor y = linear(h, w, b);
    y *= 2.0;
    return tanh(y);
  };
  const Run plain = run_stack({block}, {w, b}, x0, c, std::nullopt);
  check_runs_equal(run_stack({block}, {w, b}, x0, c, kSelective), plain, 0.0);
  // The block's output itself written in place after the forward.
  auto gemm_out = [&](const Tensor& h) { return linear(h, w, b); };
  auto with_write = [&](Policy policy) {
    for (Tensor p : {w, b}) p.set_grad(Tensor());
    Tensor x = x0.detach();
    x.requires_grad_();
    Tensor y = policy ? checkpoint(gemm_out, x, *policy) : gemm_out(x);
    y *= 3.0;  // bumps the version of the kept output's storage
    sum(y * c).backward();
    return std::vector<std::vector<double>>{values_of(x.grad()), values_of(w.grad()), values_of(b.grad())};
  };
  CHECK(with_write(kSelective) == with_write(std::nullopt));
}

TEST_CASE("selective checkpoint: retain_graph replays twice (the second time in full)") {
  const DType dt = kFloat64;
  MlpStack stack(/*depth=*/2, /*width=*/4, dt, /*dropout_p=*/0.25);
  const Tensor x0 = random_tensor({3, 4}, dt, 51);
  Tensor x = x0.detach();
  x.requires_grad_();
  manual_seed(3);
  Tensor h = x;
  for (const auto& block : stack.fns) h = checkpoint(block, h, kSelective);
  sum(h * h).backward({}, /*retain_graph=*/true);
  const std::vector<double> first = values_of(x.grad());
  x.set_grad(Tensor());
  sum(h * h).backward();
  CHECK(values_of(x.grad()) == first);
  check_error([&] { sum(h).backward(); }, {"CheckpointBackward", "retain_graph"});
}

TEST_CASE("selective checkpoint: flash_attention with dropout keeps its output and the stream stays in step") {
  const DType dt = kFloat32;
  Tensor wq = leaf({8, 8}, dt, 61, 0.5), wo = leaf({8, 8}, dt, 62, 0.5);
  const Tensor x0 = random_tensor({2, 6, 8}, dt, 63), c = random_tensor({2, 6, 8}, dt, 64);
  // (B, T, 8) -> 2 heads of 4; attention dropout, then a dropout after it: the second mask
  // is drawn after the first, so a replay that skipped the attention without advancing the
  // generator would draw another one.
  auto block = [&](const Tensor& h) {
    const Tensor q = linear(h, wq).view({2, 6, 2, 4}).transpose(1, 2);
    const Tensor a = flash_attention(q, q, q, Tensor(), /*is_causal=*/true, /*dropout_p=*/0.3);
    return dropout(linear(a.transpose(1, 2).reshape({2, 6, 8}), wo), 0.4);
  };
  const Run plain = run_stack({block}, {wq, wo}, x0, c, std::nullopt);
  check_runs_equal(run_stack({block}, {wq, wo}, x0, c, kSelective), plain, 1e-6);
  check_runs_equal(run_stack({block}, {wq, wo}, x0, c, kFull), plain, 1e-6);
  // Only flash_attention kept (a predicate over op names): the linears run again.
  const Run only_attention = [&] {
    for (Tensor p : {wq, wo}) p.set_grad(Tensor());
    Tensor x = x0.detach();
    x.requires_grad_();
    manual_seed(7);
    Tensor y = checkpoint(block, x, [](std::string_view op) { return op == "flash_attention"; });
    sum(y * c).backward();
    return Run{values_of(y), values_of(x.grad()), {values_of(wq.grad()), values_of(wo.grad())}};
  }();
  check_runs_equal(only_attention, plain, 1e-6);
}

TEST_CASE("selective checkpoint: a recompute that does not match its forward is an error naming the ops") {
  const DType dt = kFloat64;
  Tensor w = leaf({4, 4}, dt, 71);
  const Tensor x = random_tensor({2, 4}, dt, 72);
  int calls = 0;
  // linear in the forward, matmul in the recompute.
  Tensor y = checkpoint([&](const Tensor& h) { return ++calls == 1 ? tanh(linear(h, w)) : tanh(matmul(h, w.t())); }, x,
                        kSelective);
  check_error([&] { sum(y).backward(); },
              {"CheckpointBackward: kept op 1 of 1 was linear(float64[2, 4] cpu, float64[4, 4] cpu, undefined)",
               "the recompute called matmul(float64[2, 4] cpu, float64[4, 4] cpu)", "deterministic"});
  // Another shape.
  calls = 0;
  y = checkpoint([&](const Tensor& h) { return linear(++calls == 1 ? h : h.narrow(0, 0, 1), w); }, x, kSelective);
  check_error([&] { sum(y).backward(); }, {"was linear(float64[2, 4] cpu", "called linear(float64[1, 4] cpu"});
  // Fewer and more kept ops than the forward ran.
  calls = 0;
  y = checkpoint([&](const Tensor& h) { return ++calls == 1 ? linear(linear(h, w), w) : linear(h, w) * 1.0; }, x,
                 kSelective);
  check_error([&] { sum(y).backward(); },
              {"CheckpointBackward: the recompute called 1 of the 2 kept ops", "deterministic"});
  calls = 0;
  y = checkpoint([&](const Tensor& h) { return ++calls == 1 ? linear(h, w) : linear(linear(h, w), w); }, x, kSelective);
  check_error([&] { sum(y).backward(); }, {"CheckpointBackward: the recompute called linear(", "after the 1 kept ops"});
  // Policy names.
  CHECK(autograd::parse_checkpoint_policy("selective") == kSelective);
  CHECK(autograd::parse_checkpoint_policy("full") == kFull);
  CHECK(!autograd::parse_checkpoint_policy("Selective"));
  CHECK(std::string(autograd::to_string(kSelective)) == "selective");
}

TEST_CASE("selective checkpoint: checkpoint_sequential takes the policy") {
  manual_seed(81);
  nn::Sequential seq;
  for (int i = 0; i < 4; ++i) {
    seq.push_back(std::make_shared<nn::Linear>(6, 6));
    seq.push_back(std::make_shared<nn::GELU>());
  }
  seq.to(kFloat64);
  const Tensor x0 = random_tensor({3, 6}, kFloat64, 82), c = random_tensor({3, 6}, kFloat64, 83);
  auto run = [&](int64_t segments, CheckpointPolicy policy) {
    seq.zero_grad();
    Tensor x = x0.detach();
    x.requires_grad_();
    Tensor y = segments ? nn::checkpoint_sequential(seq, segments, x, policy) : seq.forward(x);
    sum(y * c).backward();
    std::vector<std::vector<double>> g{values_of(x.grad())};
    for (const Tensor& p : seq.parameters()) g.push_back(values_of(p.grad()));
    return g;
  };
  const auto plain = run(0, kFull);
  CHECK(run(4, kSelective) == plain);
  CHECK(run(2, kSelective) == plain);
}

TEST_CASE("selective checkpoint: an op that calls itself (1-D matmul, 3-D conv2d, autocast) is kept once") {
  // Each wrapper's own recursion (vector operands become matrices, a (C, H, W) input gets a
  // batch dim, autocast casts and calls again) reaches the hook once per call: a second
  // keep would be a replay mismatch, a missing one a recompute of the kernel.
  const DType dt = kFloat32;
  Tensor v = leaf({6}, dt, 91), m = leaf({6, 6}, dt, 92), w = leaf({2, 3, 3, 3}, dt, 93);
  const Tensor image = random_tensor({3, 5, 5}, dt, 94);
  auto block = [&](const Tensor& h) {
    const Tensor a = matmul(tanh(matmul(h, m)), v);        // (6) @ (6, 6) -> (6); then (6) @ (6) -> ()
    const Tensor b = conv2d(image * sum(h), w, Tensor());  // (3, 5, 5) -> (2, 3, 3)
    Tensor lowered;
    {
      AutocastGuard amp(kCPU, kBFloat16);
      lowered = linear(h.unsqueeze(0), m).to(dt);  // cast to bfloat16, then the kept linear
    }
    return a * sum(b) + sum(lowered);
  };
  const Tensor x0 = random_tensor({6}, dt, 95), c = ones({}, dt);
  auto run = [&](Policy policy) {
    for (Tensor p : {v, m, w}) p.set_grad(Tensor());
    Tensor x = x0.detach();
    x.requires_grad_();
    memory::enable_trace(kCPU);
    Tensor y = policy ? checkpoint(block, x, *policy) : block(x);
    memory::enable_trace(kCPU);
    sum(y * c).backward();
    const auto backward = memory::trace_events(kCPU);
    memory::disable_trace(kCPU);
    return std::tuple{
        Run{values_of(y), values_of(x.grad()), {values_of(v.grad()), values_of(m.grad()), values_of(w.grad())}},
        allocations_by(backward, "matmul") + allocations_by(backward, "conv2d"), allocations_by(backward, "linear")};
  };
  const auto [plain, plain_gemms, plain_linear] = run(std::nullopt);
  CHECK(plain_gemms == 0);
  const auto [selective, selective_gemms, selective_linear] = run(kSelective);
  const auto [full, full_gemms, full_linear] = run(kFull);
  check_runs_equal(selective, plain, 1e-6);
  CHECK(selective_gemms == 0);
  CHECK(full_gemms >= 3);  // two matmuls and a convolution
  // Under linear's OpScope the recompute casts its two inputs to bfloat16 again (casts are
  // cheap ops); the full recompute also runs the kernel (its output and workspace).
  CHECK(selective_linear == 2);
  CHECK(full_linear > selective_linear);
}
