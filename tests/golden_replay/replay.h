#pragma once
// Replays of the PyTorch golden files (tests/golden/*_torch.safetensors, written by
// tools/torch_golden_{ops,modules,optim}.py) on a device: the cpu suite replays them on the CPU
// (tests/cpu/test_torch_golden*.cpp), the gpu suite on CUDA (tests/gpu/test_torch_golden_cuda.cpp),
// so both backends answer to PyTorch's own numbers on the same awkward inputs. Each function CHECKs
// every case of the named families (Notes [Golden cases], [Module goldens], [Golden trajectories])
// and fails when the file holds none of them.
#include <string>
#include <vector>

#include "core/device.h"

namespace frugal::testing {

/// The ops' values and gradients (tests/golden_replay/ops.cpp): families unary, binary, reduce,
/// softmax, shape, index, loss, norm, conv, pool, matmul.
void replay_golden_ops(const std::vector<std::string>& families, Device device);
/// Every case of the ops' file names an op the replay knows.
void check_golden_ops_file();

/// nn modules against torch.nn's (tests/golden_replay/modules.cpp): families linear, conv, pool,
/// batchnorm, layernorm, groupnorm, rmsnorm, embedding, activation, attention, container, model.
void replay_golden_modules(const std::vector<std::string>& families, Device device);
/// The modules' file is whole and every case builds a frugal module.
void check_golden_modules_file();

/// Optimizer, scheduler, clipping and GradScaler trajectories (tests/golden_replay/optim.cpp):
/// families sgd, adam, adamw, offload, sched, clip, scaler, loop. On a device other than the CPU
/// the parameters and gradients live there (OffloadAdamW keeps its state on the host); the lr
/// sequences of the sched family have no device and run as on the CPU.
void replay_golden_optim(const std::vector<std::string>& families, Device device);
/// Every case of the optimizers' file is of a known kind and family.
void check_golden_optim_file();

}  // namespace frugal::testing
