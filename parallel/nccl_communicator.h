#pragma once
// The NCCL backend (CUDA builds only): one process per GPU, CUDA tensors.
//
// Note [Communication stream]
// Each communicator issues its NCCL calls on its own stream, so communication
// overlaps the caller's compute. An op first makes the comm stream wait for an
// event recorded on the caller's current stream (the inputs are ready), then
// records an event after the NCCL call; Work::wait() makes the then-current
// stream wait for that event (no host sync). The tensors are record_stream'ed on
// the comm stream, so freeing them early never lets the allocator hand their
// memory to compute work before the collective is done with it.
//
// Note [NCCL watchdog]
// Communicators are created non-blocking (NCCL_CONFIG blocking = 0), so no NCCL
// call parks the host thread, and a watchdog thread polls the outstanding ops'
// events and ncclCommGetAsyncError. An op still running past timeout() (a peer
// that never joined, a dead peer) or an asynchronous NCCL error makes the watchdog
// call ncclCommAbort, which also stops the stuck kernels, so the streams drain;
// the op's wait() and every later call then throw an error naming the op, the
// rank and the sequence number. The communicator cannot be used after that (as in
// PyTorch: the process should exit, and frugal-run stops the other ranks).
#include <array>
#include <memory>

#include "core/stream.h"
#include "parallel/communicator.h"

namespace frugal::parallel {

/// ncclUniqueId's bytes: made by rank 0, shared with the others (the TCP store).
using NcclUniqueId = std::array<char, 128>;
NcclUniqueId nccl_unique_id();

/// cudaSetDevice for the calling thread (init_process_group selects LOCAL_RANK's GPU).
void set_cuda_device(Device device);

class NcclCommunicator final : public Communicator {
 public:
  /// Rank `rank` of `size`, on `device` (the current CUDA device when it is CPU).
  /// Collective over the ranks sharing `id`: waits for all, at most `timeout`.
  NcclCommunicator(const NcclUniqueId& id, int rank, int size, Device device,
                   std::chrono::milliseconds timeout = kDefaultTimeout);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  std::string backend() const override { return "nccl"; }
  Device device() const override;

  std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> all_gather(const Tensor& input, const Tensor& output) override;
  std::shared_ptr<Work> reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root) override;
  std::shared_ptr<Work> send(const Tensor& tensor, int peer) override;
  std::shared_ptr<Work> recv(const Tensor& tensor, int peer) override;
  std::pair<std::shared_ptr<Work>, std::shared_ptr<Work>> send_recv(const Tensor& to_send, int send_peer,
                                                                    const Tensor& to_recv, int recv_peer) override;
  /// An all_reduce of one element, then the host polls until it completes (or the
  /// communicator is aborted: then it throws).
  void barrier() override;
  /// ncclCommSplit; a negative color leaves this rank out (nullptr).
  std::shared_ptr<Communicator> split(int color, int key) override;

  void set_timeout(std::chrono::milliseconds timeout) override;
  std::chrono::milliseconds timeout() const override;

  /// The stream this communicator's NCCL calls run on.
  Stream comm_stream() const;
  /// True once the watchdog (or a failed call) aborted the communicator.
  bool aborted() const;

  struct State;  // nccl_communicator.cpp

 private:
  struct FromSplit {};
  NcclCommunicator(FromSplit, std::shared_ptr<State> state);
  std::shared_ptr<State> state_;
};

/// Fuses the NCCL calls made in its scope into one launch (ncclGroupStart/End),
/// e.g. a send and a recv between two ranks that would otherwise deadlock, or many
/// small all_reduces. The Works of those calls complete with the group.
///   { CommGroup group; comm.send(a, peer); comm.recv(b, peer); }
class CommGroup {
 public:
  CommGroup();
  /// Ends the group. Throws (naming the calls' communicators) when it fails, unless
  /// an exception is already unwinding the stack.
  ~CommGroup() noexcept(false);
  /// Ends the group now (the destructor then does nothing).
  void end();
  CommGroup(const CommGroup&) = delete;
  CommGroup& operator=(const CommGroup&) = delete;

 private:
  bool ended_ = false;
  int uncaught_ = 0;
};

}  // namespace frugal::parallel
