// frugal's optimizers, schedulers, clipping and GradScaler against PyTorch's trajectories on the
// CPU (Note [Golden trajectories] in tests/golden_replay/optim.cpp;
// tests/gpu/test_torch_golden_cuda.cpp replays them on CUDA).
#include <doctest/doctest.h>

#include "tests/golden_replay/replay.h"

using frugal::kCPU;
using frugal::testing::replay_golden_optim;

TEST_CASE(
    "torch golden optim: SGD trajectories match PyTorch (momentum, dampening, nesterov, weight decay, maximize)") {
  replay_golden_optim({"sgd"}, kCPU);
}

TEST_CASE("torch golden optim: Adam trajectories match PyTorch (betas, eps, L2 decay, amsgrad, maximize, groups)") {
  replay_golden_optim({"adam"}, kCPU);
}

TEST_CASE("torch golden optim: AdamW trajectories match PyTorch (decoupled decay, amsgrad, groups, resume)") {
  replay_golden_optim({"adamw"}, kCPU);
}

TEST_CASE("torch golden optim: OffloadAdamW on the CPU matches PyTorch's AdamW") {
  replay_golden_optim({"offload"}, kCPU);
}

TEST_CASE("torch golden optim: LR schedulers give PyTorch's lr sequences (StepLR, cosine, linear, sequential)") {
  replay_golden_optim({"sched"}, kCPU);
}

TEST_CASE("torch golden optim: clip_grad_norm_ matches PyTorch (norm types, inf and NaN gradients)") {
  replay_golden_optim({"clip"}, kCPU);
}

TEST_CASE("torch golden optim: GradScaler follows PyTorch's dynamic loss scaling step for step") {
  replay_golden_optim({"scaler"}, kCPU);
}

TEST_CASE("torch golden optim: training loops of optimizer, scheduler and clipping match PyTorch") {
  replay_golden_optim({"loop"}, kCPU);
}

TEST_CASE("torch golden optim: the golden file is read whole and every case is of a known kind and family") {
  frugal::testing::check_golden_optim_file();
}
