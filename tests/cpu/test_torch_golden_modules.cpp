// frugal's nn modules against torch.nn's on the CPU (Note [Module goldens] in
// tests/golden_replay/modules.cpp; tests/gpu/test_torch_golden_cuda.cpp replays them on CUDA).
#include <doctest/doctest.h>

#include "tests/golden_replay/replay.h"

using frugal::kCPU;
using frugal::testing::replay_golden_modules;

TEST_CASE("torch golden modules: Linear matches torch.nn.Linear (bias off, unbatched, empty batch, views)") {
  replay_golden_modules({"linear"}, kCPU);
}

TEST_CASE("torch golden modules: Conv2d matches torch.nn.Conv2d (stride, padding, dilation, groups, bias)") {
  replay_golden_modules({"conv"}, kCPU);
}

TEST_CASE("torch golden modules: MaxPool2d, AvgPool2d and AdaptiveAvgPool2d match torch's") {
  replay_golden_modules({"pool"}, kCPU);
}

TEST_CASE("torch golden modules: BatchNorm2d matches torch (train and eval, running statistics, momentum=None)") {
  replay_golden_modules({"batchnorm"}, kCPU);
}

TEST_CASE("torch golden modules: LayerNorm, GroupNorm and RMSNorm match torch's") {
  replay_golden_modules({"layernorm", "groupnorm", "rmsnorm"}, kCPU);
}

TEST_CASE("torch golden modules: Embedding matches torch.nn.Embedding (padding_idx, repeated indices)") {
  replay_golden_modules({"embedding"}, kCPU);
}

TEST_CASE("torch golden modules: activation modules, Flatten and Dropout match torch's") {
  replay_golden_modules({"activation"}, kCPU);
}

TEST_CASE("torch golden modules: MultiheadAttention matches torch's (masks, weights, batch_first, kdim/vdim)") {
  replay_golden_modules({"attention"}, kCPU);
}

TEST_CASE("torch golden modules: Sequential and ModuleList keys and forward match torch's") {
  replay_golden_modules({"container"}, kCPU);
}

TEST_CASE("torch golden modules: BertLayer and the ViT EncoderBlock match torch.nn.TransformerEncoderLayer") {
  replay_golden_modules({"model"}, kCPU);
}

TEST_CASE("torch golden modules: the golden file is whole and every case builds a frugal module") {
  frugal::testing::check_golden_modules_file();
}
