// Profiles the first training steps of a small CNN: what filled the memory at the
// peak (by op, module and category), where the time went (per op, forward and
// backward), a Chrome trace (open it in https://ui.perfetto.dev or chrome://tracing)
// and a timeline picture.
//
//   profile_memory [--device cpu|cuda] [--steps 2] [--batch 64] [--out .]
#include <cstdio>
#include <string>

#include "autograd/ops/all.h"
#include "examples/flags.h"
#include "memory/allocator.h"
#include "nn/activation.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/linear.h"
#include "nn/pooling.h"
#include "optim/adam.h"
#include "profiler/session.h"
#include "tensor/factory.h"
#include "tensor/random.h"
#include "train/checks.h"

using namespace frugal;

namespace {

// A LeNet-like CNN for 28x28 images; children named as a torchvision model would be.
struct SmallCnn : nn::UnaryModule {
  std::shared_ptr<nn::Sequential> features = register_module(
      "features", std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
                      std::make_shared<nn::Conv2d>(1, 32, 3, nn::Conv2dModuleOptions{.padding = 1}),
                      std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2),
                      std::make_shared<nn::Conv2d>(32, 64, 3, nn::Conv2dModuleOptions{.padding = 1}),
                      std::make_shared<nn::ReLU>(), std::make_shared<nn::MaxPool2d>(2)}));
  std::shared_ptr<nn::Sequential> classifier = register_module(
      "classifier", std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::UnaryModule>>{
                        std::make_shared<nn::Flatten>(), std::make_shared<nn::Linear>(64 * 7 * 7, 256),
                        std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(256, 10)}));
  // Call submodules through operator(): that is what names them in the profile.
  Tensor forward(const Tensor& x) override { return (*classifier)((*features)(x)); }
  std::string type_name() const override { return "SmallCnn"; }
};

struct Args {
  std::string device = "cpu";
  int64_t steps = 2, batch = 64;
  std::string out = ".";
};

const char* kUsage = "usage: profile_memory [--device cpu|cuda[:N]] [--steps 2] [--batch 64] [--out DIR]\n";

Args parse(int argc, char** argv) {
  Args a;
  cli::Flags flags(argc, argv);
  while (flags.next()) {
    if (flags.is("--device")) a.device = flags.device();
    else if (flags.is("--steps")) a.steps = flags.positive();
    else if (flags.is("--batch")) a.batch = flags.positive();
    else if (flags.is("--out")) a.out = flags.text();
    else flags.unknown();
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = cli::parse_or_exit("profile_memory", kUsage, [&] { return parse(argc, argv); });
  const Device device(args.device);
  train::require_writable_dir(args.out, "--out");  // now, not after profiling
  manual_seed(0);
  SmallCnn net;
  net.to(device);
  optim::Adam opt(net.parameters(), {.lr = 1e-3});
  // Synthetic data: the profile is about memory and time, not accuracy.
  const Tensor images = randn({args.batch, 1, 28, 28}).to(device);
  const Tensor labels = randint(0, 10, {args.batch}).to(device);

  profiler::Session session({.device = device});
  session.attach(net);  // after net.to(): names modules and marks the parameters' bytes
  session.start();
  for (int64_t step = 0; step < args.steps; ++step) {
    opt.zero_grad();
    Tensor loss = cross_entropy(net(images), labels);
    loss.backward();
    opt.step();  // the first step also creates Adam's moments
  }
  session.stop();

  std::printf("%s\n%s\n", session.top_allocations_table(12).c_str(), session.op_time_table(25).c_str());
  session.write_files(args.out);
  const std::string trace = args.out + "/trace.json", svg = args.out + "/timeline.svg";
  std::printf("%lld steps of SmallCnn (batch %lld) on %s: peak %s allocated\n", (long long)args.steps,
              (long long)args.batch, device.str().c_str(), memory::format_bytes(session.peak_allocated()).c_str());
  std::printf("wrote %s (open in https://ui.perfetto.dev or chrome://tracing)\nwrote %s\n", trace.c_str(), svg.c_str());
  return 0;
} catch (const std::exception& e) {  // frugal::Error, and std::filesystem's errors writing --out
  std::fprintf(stderr, "profile_memory: %s\n", e.what());
  return 1;
}
