#pragma once
// The MPI backend (builds that found MPI define FRUGAL_WITH_MPI): CPU tensors, one
// process per rank, ranks started by mpirun (or srun with PMIx):
//
//   mpirun -np 2 build/bench/parallel_bench --backend mpi --model tiny
//   auto world = parallel::init_process_group({.backend = parallel::Backend::Mpi});
//
// Note [MPI backend]
// Processes that frugal-run starts are not an MPI job: each MPI_Init alone makes a world
// of one, so frugal-run's ranks use the tcp backend (Note [TCP backend] in
// parallel/tcp_communicator.h) and this one is for clusters where mpirun is the launcher.
//
// The data move as bytes (any dtype), and reductions are not MPI's: all_reduce is an
// MPI_Ialltoallv of balanced chunks, each rank reducing its chunk in rank order
// (reduce_in_rank_order: f32 compute for f16/bf16, which MPI has no type for), then an
// MPI_Iallgatherv, so results are bit-identical to the threads and tcp backends.
//
// MPI has no timeouts: every call is non-blocking and the host polls MPI_Test until the
// request completes or timeout() passes. A request cannot be withdrawn once posted, so on
// a timeout the op throws frugal::Error naming the op, the rank, the sequence number and
// the timeout, the communicator is marked failed (later calls throw the first error),
// and at exit the process calls MPI_Abort instead of MPI_Finalize (which would wait for
// the absent peer): mpirun then stops every rank. A rank that dies is mpirun's to see:
// it stops the job.
#include <chrono>
#include <memory>
#include <string>

#include "parallel/communicator.h"

namespace frugal::parallel {

/// MPI_Init_thread (once per process) and MPI_COMM_WORLD as a Communicator. Throws when
/// WORLD_SIZE (or RANK) is set and disagrees with MPI's world: the ranks were not started
/// by mpirun.
std::shared_ptr<Communicator> make_mpi_world(std::chrono::milliseconds timeout = kDefaultTimeout);

class MpiCommunicator final : public Communicator {
 public:
  struct State;  // the MPI_Comm and what its ranks share (mpi_communicator.cpp)
  explicit MpiCommunicator(std::shared_ptr<State> state);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  std::string backend() const override { return "mpi"; }
  Device device() const override { return kCPU; }

  std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> all_gather(const Tensor& input, const Tensor& output) override;
  std::shared_ptr<Work> reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root) override;
  /// MPI_Isend: the Work completes when MPI is done with the tensor (a copy when it was not
  /// contiguous); send_recv's default (send, then recv) cannot deadlock.
  std::shared_ptr<Work> send(const Tensor& tensor, int peer) override;
  std::shared_ptr<Work> recv(const Tensor& tensor, int peer) override;
  void barrier() override;
  /// MPI_Comm_split after a timed exchange of the colors; a negative color gets nullptr.
  std::shared_ptr<Communicator> split(int color, int key) override;

  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

 private:
  std::shared_ptr<State> state_;
  std::chrono::milliseconds timeout_ = kDefaultTimeout;
  uint64_t next_seq_ = 1;
};

}  // namespace frugal::parallel
