// frugal's ops against PyTorch's own values and gradients on the CPU (Note [Golden cases] in
// tests/golden_replay/ops.cpp; tests/gpu/test_torch_golden_cuda.cpp replays them on CUDA).
#include <doctest/doctest.h>

#include "tests/golden_replay/replay.h"

using frugal::kCPU;
using frugal::testing::replay_golden_ops;

TEST_CASE("torch golden: unary ops and activations match PyTorch (values and gradients, every layout)") {
  replay_golden_ops({"unary"}, kCPU);
}

TEST_CASE("torch golden: binary ops, scalar operands, where and masked_fill match PyTorch (broadcasts, dtypes)") {
  replay_golden_ops({"binary"}, kCPU);
}

TEST_CASE("torch golden: reductions match PyTorch over non-contiguous dims, ties, 0-d and size-0 inputs") {
  replay_golden_ops({"reduce"}, kCPU);
}

TEST_CASE("torch golden: softmax, log_softmax and cumsum match PyTorch") { replay_golden_ops({"softmax"}, kCPU); }

TEST_CASE("torch golden: flip, repeat, tril/triu, pad, cat/stack/chunk/split match PyTorch") {
  replay_golden_ops({"shape"}, kCPU);
}

TEST_CASE("torch golden: gather, scatter_add, index_select, index_add, embedding and one_hot match PyTorch") {
  replay_golden_ops({"index"}, kCPU);
}

TEST_CASE("torch golden: losses match PyTorch in every reduction mode") { replay_golden_ops({"loss"}, kCPU); }

TEST_CASE("torch golden: layer, group, RMS and batch norm match PyTorch (running statistics included)") {
  replay_golden_ops({"norm"}, kCPU);
}

TEST_CASE("torch golden: conv2d and 2-D pooling match PyTorch") { replay_golden_ops({"conv", "pool"}, kCPU); }

TEST_CASE("torch golden: sort, argsort and topk match PyTorch (stable ties, NaN, -0)") {
  replay_golden_ops({"sort"}, kCPU);
}

TEST_CASE("torch golden: matmul and linear match PyTorch (broadcast batch dims, transposed operands)") {
  replay_golden_ops({"matmul"}, kCPU);
}

TEST_CASE("torch golden: the golden file is read whole and every case names a known op") {
  frugal::testing::check_golden_ops_file();
}
