// The frugal half of the PyTorch parity check (tools/parity_mlp.py runs both halves):
// trains the example's MLP for a fixed number of steps on the first Fashion-MNIST
// images in order (no shuffling), from initial weights it writes to a safetensors
// file, and writes the loss of every step, so PyTorch can replay the same run.
//
//   build/tools/mlp_parity --data-dir DIR --out DIR [--steps 50] [--batch-size 64] [--device cuda]
//                          [--optimizer adam|sgd]   (adam: lr 1e-3; sgd: lr 0.05, momentum 0.9)
#include <cstdio>
#include <fstream>
#include <string>

#include "autograd/ops/loss.h"
#include "examples/flags.h"
#include "examples/mnist_train.h"
#include "nn/data/idx.h"
#include "nn/safetensors.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tensor/random.h"

using namespace frugal;

int main(int argc, char** argv) {
  std::string data_dir = "/usr/share/datasets/fashion-mnist", out = ".", device_name = "cpu", optimizer = "adam";
  int64_t steps = 50, batch = 64;
  const char* usage =
      "usage: mlp_parity --data-dir DIR --out DIR [--steps 50] [--batch-size 64] [--device cuda]\n"
      "                  [--optimizer adam|sgd]\n";
  cli::parse_or_exit("mlp_parity", usage, [&] {
    cli::Flags flags(argc, argv);
    while (flags.next()) {
      if (flags.is("--data-dir")) data_dir = flags.text();
      else if (flags.is("--out")) out = flags.text();
      else if (flags.is("--steps")) steps = flags.positive();
      else if (flags.is("--batch-size")) batch = flags.positive();
      else if (flags.is("--device")) device_name = flags.device();
      else if (flags.is("--optimizer")) optimizer = flags.choice({"adam", "sgd"});
      else flags.unknown();
    }
  });
  try {
    const Device device(device_name);
    manual_seed(0);
    data::FashionMnist ds = data::load_fashion_mnist(data_dir);
    auto model = examples::make_model("mlp");
    nn::save_safetensors(out + "/mlp_init.safetensors", model->state_dict());
    model->to(device);
    std::unique_ptr<optim::Optimizer> opt;
    if (optimizer == "adam") opt = std::make_unique<optim::Adam>(model->parameters(), optim::AdamOptions{.lr = 1e-3});
    else opt = std::make_unique<optim::SGD>(model->parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
    std::ofstream losses(out + "/frugal_losses.txt");
    for (int64_t step = 0; step < steps; ++step) {
      Tensor x = ds.train_images.narrow(0, step * batch, batch).to(device);
      Tensor y = ds.train_labels.narrow(0, step * batch, batch).to(device);
      Tensor loss = cross_entropy(model->forward(x), y);
      opt->zero_grad();
      loss.backward();
      opt->step();
      char line[64];
      std::snprintf(line, sizeof line, "%.9g\n", loss.item<double>());
      losses << line;
    }
    std::printf("mlp_parity: wrote %lld losses to %s/frugal_losses.txt\n", (long long)steps, out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mlp_parity: %s\n", e.what());
    return 1;
  }
}
