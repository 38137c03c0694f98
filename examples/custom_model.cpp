// The model from the README's "Writing a model": a custom module, one epoch of
// Fashion-MNIST, a checkpoint PyTorch can load. Kept here so the README's code compiles.
#include <cstdio>
#include <string>

#include "autograd/ops/all.h"
#include "nn/conv.h"
#include "nn/data/dataloader.h"
#include "nn/data/idx.h"
#include "nn/linear.h"
#include "nn/safetensors.h"
#include "optim/adam.h"
#include "train/checks.h"

using namespace frugal;

struct Net : nn::UnaryModule {
  std::shared_ptr<nn::Conv2d> conv =
      register_module("conv", std::make_shared<nn::Conv2d>(1, 16, 3, nn::Conv2dModuleOptions{.padding = 1}));
  std::shared_ptr<nn::Linear> fc = register_module("fc", std::make_shared<nn::Linear>(16 * 14 * 14, 10));
  Tensor forward(const Tensor& x) override { return fc->forward(max_pool2d(relu(conv->forward(x)), 2).flatten(1)); }
  std::string type_name() const override { return "Net"; }
};

int main(int argc, char** argv) try {
  const char* usage = "usage: custom_model [DATA_DIR]   (default /usr/share/datasets/fashion-mnist)\n";
  const std::string arg = argc > 1 ? argv[1] : "";
  if (arg == "-h" || arg == "--help") return std::fputs(usage, stdout), 0;
  const std::string mistake = argc > 2                 ? "expected at most one argument, the data directory"
                              : arg.rfind('-', 0) == 0 ? "unknown option " + arg  // not a directory named "--x"
                                                       : "";
  if (!mistake.empty()) return std::fprintf(stderr, "custom_model: %s\n%s", mistake.c_str(), usage), 2;
  const std::string dir = argc > 1 ? arg : "/usr/share/datasets/fashion-mnist";
  train::require_writable("net.safetensors", "custom_model");  // now, not after the epoch
  const Device device = cuda_device_count() > 0 ? cuda() : kCPU;
  data::FashionMnist ds = data::load_fashion_mnist(dir);
  Net net;
  net.to(device);
  optim::Adam opt(net.parameters(), {.lr = 1e-3});
  data::TensorDataset train(ds.train_images, ds.train_labels);
  data::DataLoader loader(train, {.batch_size = 64, .shuffle = true, .device = device});
  train::require_batches(loader, train.size());
  train::LossWatch watch(opt);  // stops on an inf or NaN loss, without a sync per step
  int64_t step = 0;
  for (data::Batch& b : loader) {
    Tensor loss = cross_entropy(net.forward(b.inputs), b.targets);
    opt.zero_grad();
    loss.backward();
    opt.step();
    watch.add(loss, 1, ++step);
  }
  watch.check();
  const nn::NamedTensors state = net.state_dict();
  train::require_finite(state, "net.safetensors");
  nn::save_safetensors("net.safetensors", state);  // loads in PyTorch with safetensors.torch
  std::printf("trained one epoch on %s; wrote net.safetensors (%lld parameters)\n", device.str().c_str(),
              (long long)net.num_parameters());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "custom_model: %s\n", e.what());
  return 1;
}
