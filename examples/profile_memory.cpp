// Profiles the first training steps of a small CNN: what filled the memory at the
// peak (by op, module and category), where the time went (per op, forward and
// backward), a Chrome trace (open it in https://ui.perfetto.dev or chrome://tracing)
// and a timeline picture.
//
//   profile_memory [--device cpu|cuda] [--steps 2] [--batch 64] [--out .]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "autograd/ops/all.h"
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
  Device device = kCPU;
  int steps = 2;
  int64_t batch = 64;
  std::string out = ".";
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto value = [&](const char* flag) -> const char* {
      if (std::strcmp(argv[i], flag) != 0) return nullptr;
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    if (const char* v = value("--device")) a.device = Device(std::string(v));
    else if (const char* v = value("--steps")) a.steps = std::atoi(v);
    else if (const char* v = value("--batch")) a.batch = std::atoll(v);
    else if (const char* v = value("--out")) a.out = v;
    else {
      std::fprintf(stderr, "usage: %s [--device cpu|cuda] [--steps 2] [--batch 64] [--out DIR]\n", argv[0]);
      std::exit(2);
    }
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  manual_seed(0);
  SmallCnn net;
  net.to(args.device);
  optim::Adam opt(net.parameters(), {.lr = 1e-3});
  // Synthetic data: the profile is about memory and time, not accuracy.
  const Tensor images = randn({args.batch, 1, 28, 28}).to(args.device);
  const Tensor labels = randint(0, 10, {args.batch}).to(args.device);

  profiler::Session session({.device = args.device});
  session.attach(net);  // after net.to(): names modules and marks the parameters' bytes
  session.start();
  for (int step = 0; step < args.steps; ++step) {
    opt.zero_grad();
    Tensor loss = cross_entropy(net(images), labels);
    loss.backward();
    opt.step();  // the first step also creates Adam's moments
  }
  session.stop();

  std::printf("%s\n%s\n", session.top_allocations_table(12).c_str(), session.op_time_table(25).c_str());
  session.write_files(args.out);
  const std::string trace = args.out + "/trace.json", svg = args.out + "/timeline.svg";
  std::printf("%d steps of SmallCnn (batch %lld) on %s: peak %s allocated\n", args.steps, (long long)args.batch,
              args.device.str().c_str(), memory::format_bytes(session.peak_allocated()).c_str());
  std::printf("wrote %s (open in https://ui.perfetto.dev or chrome://tracing)\nwrote %s\n", trace.c_str(), svg.c_str());
}
