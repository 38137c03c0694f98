#pragma once
// The in-process backend: one thread per rank over CPU tensors, so every parallel
// algorithm runs in the cpu suite without GPUs (see parallel/communicator.h).
//
//   run_ranks(4, [&](Communicator& comm) {
//     Tensor g = ...;                      // this rank's gradient
//     all_reduce(comm, g, ReduceOp::Avg);  // every rank now holds the same mean
//   });
//
// Note [Threads backend semantics]
// Calls return at once with a Work, as NCCL's do: a collective completes when the
// last rank arrives, and that rank's thread computes it for everyone (reading each
// rank's input, writing each rank's output), so a caller that reads an output
// before wait() races exactly as it would on a GPU. The reduction runs in rank
// order in the type's compute precision (f32 for f16/bf16), once, so every rank
// gets bit-identical results. send() copies its tensor and completes at once;
// recv() completes when the matching send (the n-th send from that peer matches
// the n-th recv) has arrived.
//
// Note [Threads backend failures]
// A rank that throws (run_ranks catches it) marks its group failed: the other
// ranks' pending and later calls throw "rank R failed: <its error>" instead of
// hanging. A collective not completed within timeout() throws naming the op, the
// rank, the sequence number and the ranks that did not arrive, and marks the group
// failed too (as NCCL's watchdog aborts the communicator). A rank that returns
// while others wait on a collective it never joined fails them ("exited without
// joining"). Groups split from a group share its failure state.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.h"

namespace frugal::parallel {

class ThreadGroup;  // the state the ranks of one group share (thread_communicator.cpp)

/// Rank `rank` of an in-process group; use it from one thread only.
class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank, std::chrono::milliseconds timeout);

  int rank() const override { return rank_; }
  int size() const override;
  std::string backend() const override { return "threads"; }
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

  /// For runners other than run_ranks: this rank's thread failed with `what`, or
  /// returned (see Note [Threads backend failures]).
  void mark_failed(const std::string& what);
  void mark_exited();
  /// World rank of the group's first failure (the root cause), or -1.
  int first_failed_rank() const;

 private:
  std::shared_ptr<ThreadGroup> group_;
  int rank_;
  std::chrono::milliseconds timeout_;
  uint64_t next_seq_ = 1;  // collectives issued on this communicator, 1-based
};

/// n communicators of one new group; communicator r is rank r's.
std::vector<std::shared_ptr<ThreadCommunicator>> make_thread_communicators(
    int n, std::chrono::milliseconds timeout = kDefaultTimeout);

/// Runs fn on n threads, rank r on thread r, each with its communicator of one new
/// group, and joins them. When a rank throws, the others' communication fails fast
/// (Note [Threads backend failures]) and, once all have stopped, run_ranks throws
/// frugal::Error "run_ranks: rank R failed: <what>" for the first rank that failed.
void run_ranks(int n, const std::function<void(Communicator&)>& fn,
               std::chrono::milliseconds timeout = kDefaultTimeout);
/// As above, for code that needs the communicator as a shared_ptr (make_groups).
void run_ranks(int n, const std::function<void(const std::shared_ptr<Communicator>&)>& fn,
               std::chrono::milliseconds timeout = kDefaultTimeout);

}  // namespace frugal::parallel
