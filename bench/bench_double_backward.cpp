// bench_double_backward: a WGAN-GP critic step, the workload create_graph exists for (Note
// [Double backward] in autograd/graph_backward.h): a 3-layer MLP critic with LeakyReLU on real
// and generated batches, the gradient penalty at random interpolates (grad with create_graph,
// then the norm), and one backward of the critic loss plus 10 x penalty through both graphs.
// tools/bench_double_backward_torch.py times the same step in PyTorch (same sizes, same
// threads); tools/cpu_vs_torch.py-style medians of the step.
//
//   build/bench/bench_double_backward [--device cpu|cuda] [--batch N] [--width N] [--in N] [--steps N] [--threads N]
#include <cstdio>
#include <string>

#include "autograd/engine.h"
#include "autograd/ops/all.h"
#include "bench/bench_util.h"
#include "core/threads.h"
#include "examples/flags.h"
#include "core/stream.h"
#include "memory/allocator.h"
#include "tensor/factory.h"

using namespace frugal;

int main(int argc, char** argv) {
  int64_t batch = 64, width = 512, in = 784;
  int steps = 20, threads = 2;
  std::string device_name = "cpu";
  cli::parse_or_exit("bench_double_backward",
                     "usage: bench_double_backward [--device cpu|cuda] [--batch N] [--width N] [--in N] [--steps N] "
                     "[--threads N]\n",
                     [&] {
                       cli::Flags flags(argc, argv);
                       while (flags.next()) {
                         if (flags.is("--batch")) batch = flags.integer(1, 1 << 20);
                         else if (flags.is("--width")) width = flags.integer(1, 1 << 16);
                         else if (flags.is("--in")) in = flags.integer(1, 1 << 20);
                         else if (flags.is("--steps")) steps = int(flags.integer(1, 1 << 20));
                         else if (flags.is("--threads")) threads = int(flags.integer(1, 1024));
                         else if (flags.is("--device")) device_name = flags.choice({"cpu", "cuda"});
                         else flags.unknown();
                       }
                     });
  set_num_threads(threads);
  const Device dev = device_name == "cuda" ? cuda() : kCPU;
  manual_seed(0);
  auto param = [&](const Shape& s, double scale) { return frugal::mul(randn(s), scale).to(dev).requires_grad_(); };
  const Tensor w1 = param({width, in}, 0.03), b1 = param({width}, 0.0), w2 = param({width, width}, 0.04),
               b2 = param({width}, 0.0), w3 = param({1, width}, 0.04), b3 = param({1}, 0.0);
  const TensorList params = {w1, b1, w2, b2, w3, b3};
  auto critic = [&](const Tensor& x) {
    const Tensor h1 = frugal::leaky_relu(frugal::linear(x, w1, b1), 0.2);
    const Tensor h2 = frugal::leaky_relu(frugal::linear(h1, w2, b2), 0.2);
    return frugal::linear(h2, w3, b3);
  };
  const Tensor real = randn({batch, in}).to(dev), fake = randn({batch, in}).to(dev);
  auto step = [&] {
    const Tensor eps = rand({batch, 1}).to(dev);
    const Tensor mixed = frugal::add(frugal::mul(real, eps), frugal::mul(fake, frugal::rsub(eps, 1.0)))
                             .detach()
                             .requires_grad_();
    const Tensor score = critic(mixed);
    const Tensor gx = autograd::grad({score}, {mixed}, {ones_like(score)}, {.create_graph = true})[0];
    const Tensor penalty =
        frugal::mean(frugal::square(frugal::sub(frugal::sqrt(frugal::sum(frugal::square(gx), {1})), 1.0)));
    const Tensor loss = frugal::add(frugal::sub(frugal::mean(critic(fake)), frugal::mean(critic(real))),
                                    frugal::mul(penalty, 10.0));
    for (const Tensor& p : params) p.set_grad(Tensor());
    loss.backward();
    if (dev.is_cuda()) synchronize(dev);
  };
  if (dev.is_cuda()) memory::reset_peak(dev);
  const double ms = 1e3 * bench::time_median(step, 3, steps);
  std::printf("WGAN-GP critic step, MLP %lld-%lld-%lld-1, batch %lld, %s, %d threads: median %.2f ms over %d steps\n",
              (long long)in, (long long)width, (long long)width, (long long)batch, dev.str().c_str(), threads, ms,
              steps);
  if (dev.is_cuda())
    std::printf("peak allocated %.1f MiB\n", double(memory::stats(dev).allocated_bytes.peak) / (1 << 20));
  return 0;
}
