// Per-op host overhead: microseconds per call of frugal ops on tiny CPU tensors, where
// the arithmetic is a few nanoseconds and everything else is the framework's own cost
// (validation, dispatch, Tensor/Storage creation, the caching allocator, autograd
// nodes, the backward engine, autocast, profiler scopes). That cost is device
// independent: on the GPU machine it is what a host-bound training step pays per op.
//
//   op_overhead [--calls N] [--runs R]
//
// Each row is the median over R runs of the mean time of N back-to-back calls, after
// N warm-up calls.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/ops/all.h"
#include "bench/bench_util.h"
#include "examples/flags.h"
#include "nn/linear.h"
#include "optim/sgd.h"
#include "tensor/factory.h"
#include "tensor/ops/binary.h"

using namespace frugal;

namespace {

struct Row {
  std::string name;  // the key figure's name
  std::string label;
  double us;
};

}  // namespace

int main(int argc, char** argv) {
  int calls = 20000, runs = 5;
  cli::parse_or_exit("op_overhead", "usage: op_overhead [--calls N] [--runs R]\n", [&] {
    cli::Flags flags(argc, argv);
    while (flags.next()) {
      if (flags.is("--calls")) calls = int(flags.integer(1, 1 << 30));
      else if (flags.is("--runs")) runs = int(flags.integer(1, 1 << 20));
      else flags.unknown();
    }
  });
  std::vector<Row> rows;
  auto measure = [&](const char* name, const char* label, auto&& fn) {
    const double ns = bench::ns_per_call(fn, runs, calls);
    rows.push_back({name, label, ns / 1000.0});
  };

  const Tensor x = randn({4}), y = randn({4});
  const Tensor m = randn({2, 3});
  const Tensor a22 = randn({2, 2}), b22 = randn({2, 2});

  measure("empty", "empty({4})", [] { (void)empty({4}); });
  measure("zeros", "zeros({2, 3})", [] { (void)zeros({2, 3}); });
  measure("raw_add", "ops::add (below autograd)", [&] { (void)ops::add(x, y); });
  measure("add", "add", [&] { (void)add(x, y); });
  measure("mul", "mul", [&] { (void)mul(x, y); });
  measure("relu", "relu", [&] { (void)relu(x); });
  measure("matmul", "matmul 2x2", [&] { (void)matmul(a22, b22); });
  measure("reshape", "reshape {2,3} -> {3,2}", [&] { (void)m.reshape({3, 2}); });
  measure("transpose", "transpose(0, 1)", [&] { (void)m.transpose(0, 1); });

  nn::Linear linear(3, 4);  // parameters require grad
  measure("linear_fwd", "Linear(3, 4) forward, {2, 3}", [&] { (void)linear(m); });

  const Tensor w = randn({4}).requires_grad_(), b = randn({4}).requires_grad_();
  auto chain = [&] {
    Tensor loss = sum(relu(x * w + b));
    loss.backward();
  };
  measure("chain_fwd_bwd", "(x*w + b).relu().sum() + backward", chain);

  std::vector<Tensor> params;
  for (int i = 0; i < 10; ++i) {
    params.push_back(randn({4}).requires_grad_());
    params.back().set_grad(randn({4}));
  }
  optim::SGD sgd(params, {.lr = 1e-3, .momentum = 0.9});
  measure("sgd_step", "SGD step, 10 params of {4}, momentum", [&] { sgd.step(); });

  {
    AutocastGuard amp(kCPU, kBFloat16);
    measure("chain_autocast", "the chain under AutocastGuard(cpu, bf16)", chain);
    measure("linear_fwd_bwd_autocast", "Linear(3, 4) fwd+bwd under autocast", [&] { sum(linear(m)).backward(); });
  }
  measure("linear_fwd_bwd", "Linear(3, 4) fwd+bwd", [&] { sum(linear(m)).backward(); });

  bench::Table table(bench::fmt("per-op host overhead, tiny CPU tensors (median of %d runs of %d calls)", runs, calls),
                     {"op", "us/call"});
  for (const Row& r : rows) table.add({r.label, bench::fmt("%.3f", r.us)});
  table.print();
  bench::KeyFigures figures;
  for (const Row& r : rows) figures.add(r.name + "_us", r.us);
  figures.print();
  return 0;
}
