// A few training steps of a small MLP on random data, built against the installed frugal
// (examples/external/meson.build). The device is picked at run time, so the same program
// runs on a CPU-only build: `tiny_mlp` uses the GPU when there is one, `tiny_mlp cpu` never.
// It exits 1 when the loss does not fall, so tools/check_install.sh can run it as a test.
#include <cstdio>
#include <cstring>
#include <memory>

#include <frugal/frugal.h>

using namespace frugal;

int main(int argc, char** argv) {
  bool cpu_only = argc > 1 && std::strcmp(argv[1], "cpu") == 0;
  Device device = !cpu_only && cuda_device_count() > 0 ? cuda() : kCPU;
  manual_seed(0);

  // 64 random points in 16 dims with random labels among 4 classes: a net this size
  // memorizes them, so the loss must fall.
  Tensor x = randn({64, 16}, device);
  Tensor y = randint(0, 4, {64}, {kInt64, device});

  nn::Sequential net{std::make_shared<nn::Linear>(16, 32), std::make_shared<nn::ReLU>(),
                     std::make_shared<nn::Linear>(32, 4)};
  net.to(device);
  optim::Adam opt(net.parameters(), {.lr = 1e-2});

  float first = 0, last = 0;
  for (int step = 0; step < 50; ++step) {
    Tensor loss = cross_entropy(net.forward(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    last = loss.item<float>();
    if (step == 0) first = last;
  }
  memory::MemoryStats s = memory::stats(device);
  std::printf("tiny_mlp on %s: loss %.4f -> %.4f, peak %lld bytes allocated\n", device.str().c_str(), first, last,
              static_cast<long long>(s.allocated_bytes.peak));
  return last < first ? 0 : 1;
}
