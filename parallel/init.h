#pragma once
// Process-group setup for the NCCL backend, one process per GPU, as
// torch.distributed.init_process_group: the launcher (tools/frugal_run.cpp, or
// mpirun) sets the environment, rank 0 serves a TcpStore, and the ranks share the
// NCCL unique id through it.
//
//   auto world = parallel::init_process_group();  // under `frugal-run --nproc 2 prog`
//   all_reduce(*world, grads);
#include <chrono>
#include <memory>
#include <string>

#include "parallel/communicator.h"
#include "parallel/tcp_store.h"

namespace frugal::parallel {

/// Where this process sits, read from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
/// MASTER_PORT (under mpirun OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK stand in for the
/// first three; MASTER_ADDR defaults to 127.0.0.1 there and for a world of one).
struct ProcessEnv {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string master_addr;
  int master_port = 0;
};
/// Throws frugal::Error naming the missing or malformed variables.
ProcessEnv read_process_env();

/// Selects cudaSetDevice(LOCAL_RANK), rendezvouses through the store and returns the
/// world's NCCL communicator. Throws in a build without CUDA, or when the
/// environment is incomplete (see read_process_env).
std::shared_ptr<Communicator> init_process_group(std::chrono::milliseconds timeout = kDefaultTimeout);

/// The store init_process_group connected to (it lives as long as the process), for
/// the application's own rendezvous keys. Throws before init_process_group.
TcpStore& process_store();

}  // namespace frugal::parallel
