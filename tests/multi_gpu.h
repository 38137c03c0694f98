#pragma once
// When nccl_check and parallel_check can run: one visible GPU for each rank on this node, so
// they run as `frugal-run --nproc 2` on a 2-GPU host and as two one-GPU nodes
// (`frugal-run --nnodes 2 ... --nproc-per-node 1` with CUDA_VISIBLE_DEVICES) alike.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/device.h"

namespace frugal::testing {

/// The ranks the launcher started on this node: LOCAL_WORLD_SIZE (frugal-run, torchrun) or
/// OMPI_COMM_WORLD_LOCAL_SIZE (mpirun); 2 when neither is set.
inline int ranks_on_this_node() {
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"})
    if (const char* v = std::getenv(name); v != nullptr && *v != '\0') return std::max(std::atoi(v), 1);
  return 2;
}

/// 0 when this node has a GPU for each of its ranks; otherwise, having said why, the exit
/// code of a skipped run: 77, or 1 under FRUGAL_REQUIRE_MULTI_GPU=1.
inline int skip_without_gpus(const char* program) {
  const int gpus = cuda_device_count(), needed = ranks_on_this_node();
  if (gpus >= needed) return 0;
  std::printf("%s: skipped (%d GPU(s) visible, %d rank(s) on this node need one each)\n", program, gpus, needed);
  const char* require = std::getenv("FRUGAL_REQUIRE_MULTI_GPU");
  return require != nullptr && std::strcmp(require, "1") == 0 ? 1 : 77;
}

}  // namespace frugal::testing
