#pragma once
// Process-group setup, as torch.distributed.init_process_group: the launcher
// (tools/frugal_run.cpp, torchrun, mpirun or srun) sets the environment, rank 0 serves a
// TcpStore, and the ranks meet through it. Backends, as torch's backend argument:
//   nccl  one process per GPU, CUDA tensors (the ranks share the NCCL unique id);
//   tcp   CPU tensors over sockets, any launcher (Note [TCP backend]); "gloo" names it too;
//   mpi   CPU tensors over MPI, under mpirun only (builds that found MPI: FRUGAL_WITH_MPI);
//   auto  nccl when CUDA is built and a GPU is visible, else tcp.
//
//   auto world = parallel::init_process_group();  // under `frugal-run --nproc 2 prog`
//   all_reduce(*world, grads);
//   auto cpu_world = parallel::init_process_group({.backend = parallel::Backend::Tcp});
#include <chrono>
#include <memory>
#include <string>

#include "parallel/communicator.h"
#include "parallel/tcp_store.h"

namespace frugal::parallel {

/// MASTER_PORT under Slurm when the environment does not set it: this base plus
/// SLURM_JOB_ID % 1000, so two jobs that share a node rarely pick the same port.
inline constexpr int kSlurmBasePort = 29500;

/// Where this process sits. Each value comes from the first source that sets it:
///   rank        RANK, OMPI_COMM_WORLD_RANK (mpirun), SLURM_PROCID (srun)
///   world_size  WORLD_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_NTASKS
///   local_rank  LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, else rank
///   master_addr MASTER_ADDR, else under Slurm the first host of SLURM_STEP_NODELIST (or
///               SLURM_JOB_NODELIST), else 127.0.0.1
///   master_port MASTER_PORT, else under Slurm kSlurmBasePort + SLURM_JOB_ID % 1000
struct ProcessEnv {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string master_addr;
  int master_port = 0;
};
/// Throws frugal::Error naming the missing or malformed variables.
ProcessEnv read_process_env();

/// The first host of a Slurm host list such as "node[01-04,07],gpu5" ("node01"): the
/// first entry, each bracket replaced by the first number of its first range (zero
/// padding kept). Throws naming `list` when its brackets do not match.
std::string first_host_of_nodelist(const std::string& list);

enum class Backend : uint8_t { Auto, Nccl, Tcp, Mpi };
const char* to_string(Backend backend);
/// "auto", "nccl", "tcp" (or "gloo"), "mpi"; throws naming the accepted names.
Backend parse_backend(const std::string& name);
/// Auto resolved: nccl when CUDA is built and a GPU is visible, else tcp.
Backend resolve_backend(Backend backend);

struct ProcessGroupOptions {
  Backend backend = Backend::Auto;
  /// How long the rendezvous and each collective may take (Communicator::set_timeout).
  std::chrono::milliseconds timeout = kDefaultTimeout;
};

/// Rendezvouses the ranks of read_process_env() and returns the world's communicator.
/// nccl first selects cudaSetDevice(LOCAL_RANK). Throws when the backend is not built
/// (nccl without CUDA, mpi without MPI), or the environment is incomplete.
std::shared_ptr<Communicator> init_process_group(const ProcessGroupOptions& options);
/// The backend "auto" (as before backends could be chosen).
std::shared_ptr<Communicator> init_process_group(std::chrono::milliseconds timeout = kDefaultTimeout);

/// The store init_process_group connected to (it lives as long as the process), for
/// the application's own rendezvous keys. Throws before init_process_group.
TcpStore& process_store();

}  // namespace frugal::parallel
