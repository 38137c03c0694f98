// Recompute checkpointing (autograd/checkpoint.h, nn/checkpoint.h): every gradient is
// compared with the same computation run without checkpointing (exactly in float64,
// 1e-6 relative in float32), or with central differences (gradcheck); the memory saving
// is measured with the CPU arena's statistics.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>

#include "autograd/autocast.h"
#include "autograd/checkpoint.h"
#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/gradcheck.h"
#include "autograd/ops/all.h"
#include "autograd/ops/conv_bn.h"
#include "memory/allocator.h"
#include "nn/activation.h"
#include "nn/batch_norm.h"
#include "nn/block_memory.h"
#include "nn/checkpoint.h"
#include "nn/layers.h"
#include "nn/linear.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"
#include "tests/test_util.h"

using namespace frugal;
using namespace frugal::testing;
using autograd::TensorList;

namespace {

Tensor leaf(const Shape& s, DType dtype, uint64_t seed) {
  Tensor t = random_tensor(s, dtype, seed);
  t.requires_grad_();
  return t;
}

// depth x (Linear(width, width) -> ReLU [-> Dropout(p)]), weights drawn from `seed`.
std::shared_ptr<nn::Sequential> make_mlp(int64_t depth, int64_t width, DType dtype, uint64_t seed,
                                         double dropout_p = 0.0) {
  manual_seed(seed);
  auto seq = std::make_shared<nn::Sequential>();
  for (int64_t i = 0; i < depth; ++i) {
    seq->push_back(std::make_shared<nn::Linear>(width, width));
    seq->push_back(std::make_shared<nn::ReLU>());
    if (dropout_p > 0.0) seq->push_back(std::make_shared<nn::Dropout>(dropout_p));
  }
  seq->to(dtype);
  return seq;
}

// The output, the input's gradient and every parameter's gradient of loss = sum(y * c).
struct Run {
  std::vector<double> out, input_grad;
  std::vector<std::vector<double>> param_grads;
};

Run run_mlp(nn::Sequential& seq, const Tensor& x0, const Tensor& c, int64_t segments) {
  seq.zero_grad();
  Tensor x = x0.detach();
  x.requires_grad_();
  Tensor y = segments > 0 ? nn::checkpoint_sequential(seq, segments, x) : seq.forward(x);
  sum(y * c).backward();
  Run r{values_of(y), values_of(x.grad()), {}};
  for (const Tensor& p : seq.parameters()) r.param_grads.push_back(values_of(p.grad()));
  return r;
}

void check_runs_equal(const Run& a, const Run& plain, double rtol) {
  auto same = [rtol](const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
    if (rtol == 0.0) CHECK_MESSAGE(got == want, what, " differs from the plain run");
    else check_close(got, want, rtol, 0.0, what);
  };
  same(a.out, plain.out, "output");
  same(a.input_grad, plain.input_grad, "input grad");
  REQUIRE(a.param_grads.size() == plain.param_grads.size());
  for (size_t i = 0; i < a.param_grads.size(); ++i)
    same(a.param_grads[i], plain.param_grads[i], "param " + std::to_string(i));
}

}  // namespace

TEST_CASE("checkpoint_sequential: output and every gradient equal the plain run (f64 exactly, f32 to 1e-6)") {
  for (DType dtype : {kFloat64, kFloat32}) {
    CAPTURE(dtype_name(dtype));
    auto seq = make_mlp(/*depth=*/6, /*width=*/24, dtype, /*seed=*/11);
    const Tensor x = random_tensor({10, 24}, dtype, 12), c = random_tensor({10, 24}, dtype, 13);
    const Run plain = run_mlp(*seq, x, c, 0);
    for (int64_t segments : {1, 2, 3, 5, 12}) {
      CAPTURE(segments);
      check_runs_equal(run_mlp(*seq, x, c, segments), plain, dtype == kFloat64 ? 0.0 : 1e-6);
    }
  }
}

TEST_CASE("checkpoint: gradcheck through single, multi-output and nested checkpoints") {
  Tensor a = leaf({3, 4}, kFloat64, 1), b = leaf({4, 3}, kFloat64, 2);
  // Two outputs, a non-contiguous view of an input inside fn.
  auto r = autograd::gradcheck(
      [](const TensorList& in) {
        TensorList outs = checkpoint(
            [](const TensorList& xs) {
              return TensorList{matmul(xs[0], xs[1]), sigmoid(xs[1].t()) * xs[0]};
            },
            in);
        return matmul(outs[0], tanh(outs[1]));
      },
      {a, b});
  CHECK_MESSAGE(r.ok, r.report);
  // A checkpoint nested inside another one.
  auto r2 = autograd::gradcheck(
      [](const TensorList& in) {
        return checkpoint(
            [](const TensorList& xs) {
              Tensor h = checkpoint([](const TensorList& ys) { return TensorList{tanh(matmul(ys[0], ys[1]))}; },
                                    {xs[0], xs[1]})[0];
              return TensorList{exp(h) * sum(xs[0])};
            },
            in)[0];
      },
      {a, b});
  CHECK_MESSAGE(r2.ok, r2.report);
  // The single-input form.
  auto r4 = autograd::gradcheck(
      [](const TensorList& in) { return checkpoint([](const Tensor& t) { return sin(t.t()) * t.t(); }, in[0]); }, {a});
  CHECK_MESSAGE(r4.ok, r4.report);
  auto r3 = autograd::gradcheck(
      [](const TensorList& in) {
        return checkpoint([](const TensorList& xs) { return TensorList{exp(matmul(xs[0], xs[1])) - sum(xs[1])}; },
                          in)[0];
      },
      {a, b});
  CHECK_MESSAGE(r3.ok, r3.report);
}

TEST_CASE("checkpoint: dropout draws the same mask on recompute, and the outer random stream is untouched") {
  auto seq = make_mlp(/*depth=*/4, /*width=*/16, kFloat64, /*seed=*/21, /*dropout_p=*/0.5);
  const Tensor x = random_tensor({8, 16}, kFloat64, 22), c = random_tensor({8, 16}, kFloat64, 23);

  manual_seed(99);
  const Run plain = run_mlp(*seq, x, c, 0);
  const std::vector<double> plain_next = values_of(randn({16}, kFloat64));

  manual_seed(99);
  const Run ckpt = run_mlp(*seq, x, c, 4);
  const std::vector<double> ckpt_next = values_of(randn({16}, kFloat64));
  check_runs_equal(ckpt, plain, 0.0);
  CHECK_MESSAGE(ckpt_next == plain_next, "the recompute moved the default generator");

  // The masks matter: a different seed changes the output and the gradients.
  manual_seed(100);
  const Run other = run_mlp(*seq, x, c, 4);
  CHECK(other.out != plain.out);
  CHECK(other.input_grad != plain.input_grad);
  // Dropout zeroes about half of the last layer's outputs (on top of ReLU's zeros).
  int64_t zeros_count = 0;
  for (double v : ckpt.out) zeros_count += v == 0.0;
  CHECK(zeros_count > int64_t(ckpt.out.size()) / 2);
}

TEST_CASE("checkpoint: nested checkpoints with dropout give the plain run's gradients") {
  const DType dt = kFloat64;
  Tensor w1 = leaf({6, 6}, dt, 31), w2 = leaf({6, 6}, dt, 32), w3 = leaf({6, 6}, dt, 33);
  const Tensor x0 = random_tensor({5, 6}, dt, 34);
  auto inner = [&](const Tensor& h) { return dropout(relu(linear(h, w2)), 0.3); };
  auto outer = [&](const Tensor& x, bool ckpt) {
    Tensor h = tanh(linear(x, w1));
    h = ckpt ? checkpoint(inner, h) : inner(h);
    return dropout(linear(h, w3), 0.2);
  };
  struct Result {
    std::vector<double> y, gx, g1, g2, g3;
  };
  auto run = [&](int mode) {  // 0: plain, 1: outer checkpointed, 2: outer and inner checkpointed
    for (Tensor* w : {&w1, &w2, &w3}) w->set_grad(Tensor());
    Tensor x = x0.detach();
    x.requires_grad_();
    manual_seed(5);
    Tensor y = mode == 0 ? outer(x, false) : checkpoint([&](const Tensor& t) { return outer(t, mode == 2); }, x);
    sum(y * y).backward();
    return Result{values_of(y), values_of(x.grad()), values_of(w1.grad()), values_of(w2.grad()), values_of(w3.grad())};
  };
  const Result plain = run(0);
  for (int mode : {1, 2}) {
    CAPTURE(mode);
    const Result r = run(mode);
    CHECK(r.y == plain.y);
    CHECK(r.gx == plain.gx);
    CHECK(r.g1 == plain.g1);
    CHECK(r.g2 == plain.g2);
    CHECK(r.g3 == plain.g3);
  }
}

TEST_CASE("checkpoint: captured parameters accumulate their gradient exactly once") {
  const DType dt = kFloat64;
  manual_seed(41);
  auto lin = std::make_shared<nn::Linear>(7, 7);
  lin->to(dt);
  const Tensor x0 = random_tensor({3, 7}, dt, 42);
  // The same Linear inside the checkpoint (twice) and outside it; x needs no grad, so only
  // the captured weights connect the loss to anything that requires grad.
  auto block = [&](const Tensor& h) { return lin->forward(relu(lin->forward(h))); };
  auto run = [&](bool ckpt, int steps) {
    lin->zero_grad();
    for (int s = 0; s < steps; ++s) {
      Tensor h = ckpt ? checkpoint(block, x0) : block(x0);
      CHECK(h.requires_grad());
      sum(square(lin->forward(h))).backward();
    }
    return std::pair{values_of(lin->weight.grad()), values_of(lin->bias.grad())};
  };
  // Three contributions reach each weight; the plain run sums them in one engine buffer,
  // the checkpointed run adds the recomputed pair as one, so rounding may differ in the
  // last bit: 1e-12 relative, far below a missing or doubled contribution.
  const auto plain = run(false, 1);
  const auto ckpt = run(true, 1);
  check_close(ckpt.first, plain.first, 1e-12, 0.0, "weight grad");
  check_close(ckpt.second, plain.second, 1e-12, 0.0, "bias grad");
  // Two steps accumulate twice.
  const auto twice = run(true, 2);
  std::vector<double> doubled_w, doubled_b;
  for (double v : plain.first) doubled_w.push_back(2 * v);
  for (double v : plain.second) doubled_b.push_back(2 * v);
  check_close(twice.first, doubled_w, 1e-12, 0.0, "weight grad after two steps");
  check_close(twice.second, doubled_b, 1e-12, 0.0, "bias grad after two steps");
}

TEST_CASE("checkpoint: outputs without grad, unused outputs, integer outputs and retain_graph") {
  const DType dt = kFloat64;
  Tensor a = leaf({4, 5}, dt, 51), b = leaf({4, 5}, dt, 52);
  const Tensor k = random_tensor({4, 5}, dt, 53);  // requires no grad
  auto fn = [&](const TensorList& in) {
    return TensorList{in[0] * in[1], exp(in[0]), k * 2.0, argmax(in[1], 1), Tensor()};
  };
  TensorList outs = checkpoint(fn, {a, b});
  REQUIRE(outs.size() == 5);
  CHECK(outs[0].grad_fn_name() == "CheckpointBackward");
  CHECK(!outs[3].requires_grad());  // integer: never part of the graph
  CHECK(!outs[4].defined());
  CHECK(values_of(outs[2]) == values_of(k * 2.0));

  // Only output 0 is used: outputs 1 and 2 receive zeros from the engine.
  sum(outs[0]).backward({}, /*retain_graph=*/true);
  CHECK(values_of(a.grad()) == values_of(b));
  CHECK(values_of(b.grad()) == values_of(a));
  // retain_graph: the checkpoint can replay again; gradients add.
  a.set_grad(Tensor());
  b.set_grad(Tensor());
  sum(outs[1] + outs[2]).backward();
  CHECK(values_of(a.grad()) == values_of(exp(a.detach())));
  CHECK(values_of(b.grad()) == values_of(zeros({4, 5}, dt)));  // the engine's zeros for unused output 0
  check_error([&] { sum(outs[0]).backward(); }, {"CheckpointBackward", "retain_graph"});

  // An output recorded (grad mode was on) that turns out to need no grad on replay takes no
  // part: the replay runs no backward, and a receives only the engine's zeros.
  a.set_grad(Tensor());
  Tensor constant = checkpoint([&](const Tensor&) { return k * 2.0; }, a);
  CHECK(constant.requires_grad());
  sum(constant).backward();
  CHECK((!a.grad().defined() || values_of(a.grad()) == values_of(zeros({4, 5}, dt))));

  // Under NoGradGuard a checkpoint records nothing.
  {
    NoGradGuard no_grad;
    CHECK(!checkpoint(fn, {a, b})[0].requires_grad());
  }
}

TEST_CASE("checkpoint: an input modified in place before backward is caught, naming CheckpointBackward") {
  Tensor w = leaf({4, 4}, kFloat64, 61);
  Tensor x = random_tensor({2, 4}, kFloat64, 62);  // data: no grad, so in-place writes are allowed
  Tensor y = checkpoint([&](const Tensor& t) { return tanh(matmul(t, w)); }, x);
  x += 1.0;
  check_error([&] { sum(y).backward(); }, {"CheckpointBackward", "modified by an in-place operation"});
}

TEST_CASE("checkpoint: errors") {
  nn::Sequential seq{std::make_shared<nn::ReLU>(), std::make_shared<nn::ReLU>()};
  const Tensor x = random_tensor({3}, kFloat32, 71);
  check_error([&] { nn::checkpoint_sequential(seq, 0, x); }, {"checkpoint_sequential", "[1, 2]", "got 0"});
  check_error([&] { nn::checkpoint_sequential(seq, 3, x); }, {"checkpoint_sequential", "got 3"});
  check_error([&] { checkpoint(std::function<TensorList(const TensorList&)>(), {x}); }, {"checkpoint", "empty"});
  nn::Sequential empty_seq;
  CHECK(values_of(nn::checkpoint_sequential(empty_seq, 4, x)) == values_of(x));
  // A function that is not deterministic in its output count is caught on replay.
  Tensor a = leaf({3}, kFloat32, 72);
  int calls = 0;
  TensorList outs = checkpoint(
      [&](const TensorList& in) {
        return ++calls == 1 ? TensorList{in[0] * 2.0} : TensorList{in[0], in[0]};
      },
      {a});
  check_error([&] { sum(outs[0]).backward(); }, {"CheckpointBackward", "deterministic"});
}

TEST_CASE("checkpoint_sequential: a 32-layer MLP peaks at <= 60% of the plain run's memory, same gradients") {
  // 32 x (Linear(256, 256) + ReLU), batch 256, float32: 64 modules, sqrt(64) = 8 segments.
  // Note: at width == batch the weight gradients (8.4 MB) are as large as all the saved
  // activations (ReLU saves only its output: 32 x 256 KiB), and checkpointing cannot shrink
  // them. As in a training loop after its first step, they are allocated before the measured
  // step (zero_grad(set_to_none=false) keeps them; AccumulateGrad adds in place), so the peak
  // measures what checkpointing is about: activations and backward temporaries. The ratio
  // with gradients allocated inside the step is printed for information.
  const int64_t depth = 32, width = 256, batch = 256, segments = 8;
  auto seq = make_mlp(depth, width, kFloat32, /*seed=*/81);
  const Tensor x = random_tensor({batch, width}, kFloat32, 82), c = random_tensor({batch, width}, kFloat32, 83);

  auto measure = [&](int64_t segs, bool grads_preallocated, Run& out) {
    seq->zero_grad(/*set_to_none=*/!grads_preallocated);
    memory::empty_cache(kCPU);
    const int64_t before = memory::stats(kCPU).allocated_bytes.current;
    memory::reset_peak(kCPU);
    Tensor xin = x.detach();
    xin.requires_grad_();
    Tensor y = segs > 0 ? nn::checkpoint_sequential(*seq, segs, xin) : seq->forward(xin);
    sum(y * c).backward();
    const int64_t peak = memory::stats(kCPU).allocated_bytes.peak - before;
    out.input_grad = values_of(xin.grad());
    out.out = values_of(y.detach());
    out.param_grads.clear();
    for (const Tensor& p : seq->parameters()) out.param_grads.push_back(values_of(p.grad()));
    return peak;
  };
  Run plain, ckpt;
  const int64_t plain_with_grads = measure(0, false, plain);  // also allocates the .grad tensors
  const int64_t ckpt_with_grads = measure(segments, false, ckpt);
  check_runs_equal(ckpt, plain, 1e-6);

  const int64_t plain_peak = measure(0, true, plain);
  const int64_t ckpt_peak = measure(segments, true, ckpt);
  const double ratio = double(ckpt_peak) / double(plain_peak);
  MESSAGE("peak above the pre-step baseline, gradients preallocated: plain ", memory::format_bytes(plain_peak),
          ", checkpointed ", memory::format_bytes(ckpt_peak), " (ratio ", ratio,
          "); gradients allocated in the step: ", memory::format_bytes(plain_with_grads), " vs ",
          memory::format_bytes(ckpt_with_grads), " (ratio ", double(ckpt_with_grads) / double(plain_with_grads), ")");
  CHECK(ratio <= 0.60);
  check_runs_equal(ckpt, plain, 1e-6);
}

TEST_CASE("checkpoint: the recomputed output is let go before the region's backward runs") {
  // y = 3 x saves nothing, so the replay's backward needs one new tensor (the grad of x);
  // held through that backward, the recomputed y would be a second one at the peak.
  const int64_t n = int64_t(1) << 20;
  const int64_t bytes = n * int64_t(sizeof(float));
  Tensor x = random_tensor({n}, kFloat32, 91);
  x.requires_grad_();
  const Tensor g = random_tensor({n}, kFloat32, 92);
  Tensor y = autograd::checkpoint([](const TensorList& in) { return TensorList{mul(in[0], 3.0)}; }, {x})[0];
  memory::empty_cache(kCPU);
  const int64_t before = memory::stats(kCPU).allocated_bytes.current;
  memory::reset_peak(kCPU);
  y.backward(g);
  const int64_t extra = memory::stats(kCPU).allocated_bytes.peak - before;
  CHECK(extra >= bytes);
  CHECK(extra < 2 * bytes);
  CHECK(max_abs(sub(x.grad(), mul(g, 3.0))) == 0.0);
}

TEST_CASE("checkpoint: batch norm's running statistics and batch count end the step as the plain run's") {
  // A conv -> bn+relu -> (bn+relu as the next conv's prologue) -> bn block in float64, run
  // plainly and under every replaying choice; momentum 0.1 and None (1 / batches). The
  // recompute must not fold the batch into the running statistics a second time, nor count
  // it again (Note [Checkpoint recompute], "State updated in the forward").
  for (std::optional<double> momentum : {std::optional<double>(0.1), std::optional<double>()}) {
    CAPTURE(momentum.has_value());
    const nn::BatchNormOptions bo{.momentum = momentum};
    auto bn1 = std::make_shared<nn::BatchNorm2d>(4, bo), bn2 = std::make_shared<nn::BatchNorm2d>(4, bo),
         bn3 = std::make_shared<nn::BatchNorm2d>(3, bo);
    for (const auto& bn : {bn1, bn2, bn3}) bn->to(kFloat64);
    const Tensor w1 = leaf({4, 3, 3, 3}, kFloat64, 1), w2 = leaf({4, 4, 3, 3}, kFloat64, 2),
                 w3 = leaf({3, 4, 1, 1}, kFloat64, 3);
    const Tensor x = leaf({2, 3, 6, 5}, kFloat64, 4);
    const Conv2dOptions same{.padding = {1, 1}};
    auto block = [&](const Tensor& in) {
      const Tensor h = bn1->forward_relu(conv2d(in, w1, Tensor(), same));
      const ConvWithStats c = conv2d_stats(h, w2, same);
      const ConvWithStats d = bn_relu_conv2d(c, bn2->args_for(c.out), w3);
      return bn3->forward(d.out);
    };
    auto buffers = [&] {
      std::vector<std::vector<double>> v;
      for (const auto& bn : {bn1, bn2, bn3})
        for (const Tensor& b : {bn->running_mean, bn->running_var, bn->num_batches_tracked}) v.push_back(values_of(b));
      return v;
    };
    auto run = [&](const std::function<Tensor(const Tensor&)>& how) {
      for (const auto& bn : {bn1, bn2, bn3}) bn->reset_running_stats();
      for (const Tensor& t : {w1, w2, w3, x}) t.set_grad(Tensor());
      for (int step = 0; step < 2; ++step) {  // two steps: momentum None weighs by the count
        Tensor y = how(x);
        sum(y * y).backward();
      }
      return std::pair{buffers(), std::vector{values_of(w1.grad()), values_of(w2.grad()), values_of(x.grad())}};
    };
    const auto plain = run(block);
    CHECK(plain.first[2] == std::vector<double>{2.0});  // bn1 counted two batches
    using nn::BlockMemory;
    for (BlockMemory choice : {BlockMemory::Checkpoint, BlockMemory::Selective, BlockMemory::CheckpointRecompute,
                               BlockMemory::CheckpointOffload}) {
      CAPTURE(int(choice));
      const auto got =
          run([&](const Tensor& in) { return nn::run_block(nn::BlockMemoryPlan::uniform(choice), 0, block, in); });
      CHECK(got.first == plain.first);    // running statistics and counts, bit for bit
      CHECK(got.second == plain.second);  // and the gradients
    }
  }
}

TEST_CASE("checkpoint: a region that uses nothing requiring grad records nothing; a captured parameter is seen") {
  const DType dt = kFloat64;
  const Tensor x = random_tensor({3, 4}, dt, 61);  // data
  Tensor w = leaf({4, 4}, dt, 62);
  const Tensor frozen = random_tensor({4, 4}, dt, 63);
  int calls = 0;
  // A frozen backbone on data (torch's reentrant checkpoint: the output needs no grad, fn ran once).
  const Tensor feats = checkpoint(
      [&](const Tensor& t) {
        ++calls;
        return tanh(matmul(t, frozen));
      },
      x);
  CHECK_FALSE(feats.requires_grad());
  sum(matmul(feats, w)).backward();  // the head trains; the region is not replayed
  CHECK(calls == 1);
  CHECK(w.grad().defined());
  check_error([&] { sum(checkpoint([&](const Tensor& t) { return t * 2.0; }, x)).backward(); },
              {"does not require grad"});

  // A parameter reached only through a view, a conversion, or an inner checkpoint is seen.
  auto recorded = [&](const std::function<Tensor(const Tensor&)>& fn) {
    w.set_grad(Tensor());
    const Tensor y = checkpoint(fn, x);
    if (!y.requires_grad()) return false;
    sum(y).backward();
    return w.grad().defined();
  };
  CHECK(recorded([&](const Tensor& t) { return matmul(t, w.t()); }));
  CHECK(recorded([&](const Tensor& t) { return matmul(t.to(kFloat32), w.to(kFloat32)).to(dt); }));
  CHECK(
      recorded([&](const Tensor& t) { return checkpoint([&](const Tensor& u) { return u * w.narrow(0, 0, 1); }, t); }));
  CHECK(recorded([&](const Tensor& t) { return t + sum(w); }));
  {
    AutocastGuard amp(kCPU, kBFloat16);  // the weight cast through autocast's cache
    CHECK(recorded([&](const Tensor& t) { return matmul(t.to(kFloat32), w.to(kFloat32)).to(dt); }));
  }
  // A module's parameters, the checkpoint_sequential case.
  auto lin = std::make_shared<nn::Linear>(4, 2);
  const Tensor out = checkpoint([&](const Tensor& t) { return (*lin)(t); }, x.to(kFloat32));
  CHECK(out.requires_grad());
  sum(out).backward();
  CHECK(lin->weight.grad().defined());
  lin->requires_grad_(false);
  CHECK_FALSE(checkpoint([&](const Tensor& t) { return (*lin)(t); }, x.to(kFloat32)).requires_grad());
}
