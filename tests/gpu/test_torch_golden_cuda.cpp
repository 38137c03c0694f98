// The PyTorch goldens replayed on CUDA (tests/golden_replay/replay.h): the same cases, inputs,
// views and bounds as the cpu suite's tests/cpu/test_torch_golden*.cpp, so every CUDA kernel
// answers to PyTorch's own numbers on transposed, expanded and size-0 inputs, values at the kinks,
// NaN and inf, and not only to the CPU's results on random data.
#include <doctest/doctest.h>

#include "tests/golden_replay/replay.h"

using frugal::testing::replay_golden_modules;
using frugal::testing::replay_golden_ops;
using frugal::testing::replay_golden_optim;

namespace {
constexpr frugal::Device kGpu = frugal::cuda(0);
}

TEST_CASE("torch golden cuda: unary, binary, reductions, softmax and cumsum match PyTorch on CUDA") {
  replay_golden_ops({"unary", "binary", "reduce", "softmax"}, kGpu);
}

TEST_CASE("torch golden cuda: shape, join and index ops match PyTorch on CUDA") {
  replay_golden_ops({"shape", "index"}, kGpu);
}

TEST_CASE("torch golden cuda: sort, argsort and topk match PyTorch on CUDA") { replay_golden_ops({"sort"}, kGpu); }

TEST_CASE("torch golden cuda: losses, norms, conv2d, pooling and matmul match PyTorch on CUDA") {
  replay_golden_ops({"loss", "norm", "conv", "pool", "matmul"}, kGpu);
}

TEST_CASE("torch golden cuda: nn modules match torch.nn on CUDA (attention, BertLayer, ViT block included)") {
  replay_golden_modules({"linear", "conv", "pool", "batchnorm", "layernorm", "groupnorm", "rmsnorm", "embedding",
                         "activation", "attention", "container", "model"},
                        kGpu);
}

TEST_CASE("torch golden cuda: SGD, Adam, AdamW, OffloadAdamW, clipping and GradScaler match PyTorch on CUDA") {
  replay_golden_optim({"sgd", "adam", "adamw", "offload", "clip", "scaler", "loop"}, kGpu);
}
