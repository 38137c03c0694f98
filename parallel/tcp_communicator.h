#pragma once
// The CPU backend for separate processes, as torch.distributed's gloo: every pair of
// ranks holds one TCP connection, set up through the TcpStore that init_process_group
// already serves, so `frugal-run --nproc 2 prog` (or two hosts with --nnodes 2) runs
// DDP and ZeRO on CPU tensors without mpirun and without GPUs.
//
//   auto world = parallel::init_process_group({.backend = parallel::Backend::Tcp});
//   all_reduce(*world, grads, ReduceOp::Avg);
//
// Note [TCP backend]
// Why TCP and not only MPI: a PyTorch user expects `torchrun --nproc-per-node 2` with
// gloo to work on a laptop, and Open MPI's ranks only find each other when mpirun starts
// them (a process that calls MPI_Init alone is a world of one), so an MPI backend cannot
// serve frugal-run's processes. MPI stays available under mpirun (parallel/mpi_communicator.h).
//
// Every rank runs one receiver thread per peer that reads whatever arrives into a
// mailbox, so a send never waits for the peer to post its recv: sends cannot deadlock
// (as the threads backend's, they complete at once), and a peer that dies shows up at
// once as its connection's end of file ("rank 1 closed its connection"), not as a hang.
//
// Collectives run on the calling thread and return a completed Work (errors throw from
// the call itself): on CPU tensors there is no stream to overlap with. all_reduce is a
// reduce-scatter of balanced chunks (any length, size 0 included) followed by an
// all-gather, each rank reducing its chunk in rank order in the type's compute precision
// (f32 for f16/bf16): bit-identical on every rank and to the threads backend (Note
// [Threads backend semantics]), with 2 (p - 1) / p of the tensor sent per rank.
//
// Timeouts: a wait for a peer's message past timeout() throws naming the op, the rank,
// its sequence number and the peer waited for; the failure (or a closed peer) poisons
// the connections, so every later call on this communicator and those split from it
// throws the first error (as NCCL's watchdog aborts its communicator). The process
// should then exit: frugal-run stops the other local ranks, and the remote ones see its
// connections close.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/tcp_store.h"

namespace frugal::parallel {

class TcpMesh;  // the connections a world and its splits share (tcp_communicator.cpp)

/// Rank `rank` of a group of processes over TCP; use it from one thread at a time.
class TcpCommunicator final : public Communicator {
 public:
  /// Collective over `size` processes: each publishes a listening address in `store`
  /// under `prefix`, then connects to the lower ranks and accepts the higher ones,
  /// within `timeout`. `master_addr` is the store's host; this rank advertises its own
  /// address on the route to it.
  TcpCommunicator(TcpStore& store, int rank, int size, const std::string& master_addr,
                  std::chrono::milliseconds timeout = kDefaultTimeout, const std::string& prefix = "tcp");
  ~TcpCommunicator() override;
  TcpCommunicator(const TcpCommunicator&) = delete;
  TcpCommunicator& operator=(const TcpCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return int(members_.size()); }
  std::string backend() const override { return "tcp"; }
  Device device() const override { return kCPU; }

  std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> all_gather(const Tensor& input, const Tensor& output) override;
  std::shared_ptr<Work> reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root) override;
  std::shared_ptr<Work> send(const Tensor& tensor, int peer) override;
  std::shared_ptr<Work> recv(const Tensor& tensor, int peer) override;
  void barrier() override;
  /// A negative color leaves this rank out: it gets nullptr (MPI_UNDEFINED).
  std::shared_ptr<Communicator> split(int color, int key) override;

  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

 private:
  TcpCommunicator(std::shared_ptr<TcpMesh> mesh, uint64_t id, std::vector<int> members, int rank,
                  std::chrono::milliseconds timeout);
  struct Exchange;  // one collective's messages (tcp_communicator.cpp)
  Exchange begin(int op_code, uint16_t detail = 0);
  std::string label() const;

  std::shared_ptr<TcpMesh> mesh_;
  uint64_t id_;               // tags this group's messages on the shared connections
  std::vector<int> members_;  // world rank of each group rank
  int rank_;
  std::chrono::milliseconds timeout_;
  uint64_t next_seq_ = 1;                // collectives issued, 1-based
  std::vector<uint64_t> sent_, posted_;  // point-to-point messages per peer, for matching
};

}  // namespace frugal::parallel
