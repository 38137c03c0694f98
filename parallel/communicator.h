#pragma once
// The collective-communication interface every parallel algorithm in frugal is written
// against (tensor parallel, pipeline, data parallel). Implementations:
//   - NCCL (parallel/nccl_communicator.*): CUDA tensors, one process per GPU.
//   - TCP (parallel/tcp_communicator.*): CPU tensors, one process per rank, any launcher
//     (frugal-run, torchrun, srun, mpirun), as torch's gloo.
//   - MPI (parallel/mpi_communicator.*, builds that found MPI): CPU tensors under mpirun.
//   - in-process (parallel/thread_communicator.*): one thread per rank over CPU tensors,
//     so every parallel algorithm is tested in the cpu suite without GPUs.
//
// Semantics follow torch.distributed: every rank of a communicator calls the same
// collectives in the same order. Calls enqueue the operation and return a Work handle;
// Work::wait() orders the caller's current stream after it (NCCL) or returns once it
// completed (in-process; tcp and mpi run their collectives in the call and return them
// completed). Tensors are handles: "output" arguments are written in place.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace frugal::parallel {

/// How long a collective may take before it fails (Communicator::set_timeout).
inline constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(10);

enum class ReduceOp : uint8_t { Sum, Avg, Max };
const char* to_string(ReduceOp op);

/// A pending collective. wait() throws (naming op, rank and sequence number) if the
/// operation failed or timed out.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool completed() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// "nccl", "tcp", "mpi" or "threads".
  virtual std::string backend() const = 0;
  /// The device this rank's tensors live on (a CUDA device for NCCL, CPU for threads).
  virtual Device device() const = 0;

  /// In place: every rank's `tensor` becomes the reduction over ranks.
  virtual std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) = 0;
  /// output (contiguous, size() * input.numel() elements) = the ranks' inputs, rank order.
  virtual std::shared_ptr<Work> all_gather(const Tensor& input, const Tensor& output) = 0;
  /// output (contiguous, input.numel() / size() elements) = this rank's chunk of the
  /// reduction of the ranks' inputs (chunk r of the flattened input goes to rank r).
  virtual std::shared_ptr<Work> reduce_scatter(const Tensor& input, const Tensor& output,
                                               ReduceOp op = ReduceOp::Sum) = 0;
  /// In place: every rank's `tensor` becomes root's.
  virtual std::shared_ptr<Work> broadcast(const Tensor& tensor, int root) = 0;
  /// Point to point; matched in order per (sender, receiver) pair.
  virtual std::shared_ptr<Work> send(const Tensor& tensor, int peer) = 0;
  virtual std::shared_ptr<Work> recv(const Tensor& tensor, int peer) = 0;
  /// Sends `to_send` to send_peer and receives into `to_recv` from recv_peer, the two
  /// running concurrently: two ranks exchanging tensors this way cannot deadlock, and a
  /// pipeline's activation and gradient cross at once (NCCL fuses them in one group).
  /// Returns {send's Work, recv's Work}. The default issues send, then recv.
  virtual std::pair<std::shared_ptr<Work>, std::shared_ptr<Work>> send_recv(const Tensor& to_send, int send_peer,
                                                                            const Tensor& to_recv, int recv_peer);
  /// Blocks the calling host thread until every rank reached it.
  virtual void barrier() = 0;

  /// Collective over this communicator: ranks passing the same color form a new
  /// communicator, ordered by key (then by parent rank). As MPI_Comm_split / ncclCommSplit.
  virtual std::shared_ptr<Communicator> split(int color, int key) = 0;

  /// How long a collective may take before the communicator is aborted and the
  /// operation throws (default 10 minutes).
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
  virtual std::chrono::milliseconds timeout() const = 0;
};

/// The reduction every CPU backend computes (threads, tcp, mpi): `count` elements of each
/// rank's buffer in `src` (rank order) reduced element by element in rank order, in the
/// type's compute precision (f32 for f16/bf16), into dst; NaN propagates through Max. So
/// the CPU backends agree bit for bit. `op_name` names the caller in a dtype error.
void reduce_in_rank_order(DType dtype, const std::vector<const void*>& src, void* dst, int64_t count, ReduceOp op,
                          const char* op_name);

/// Convenience blocking forms.
inline void all_reduce(Communicator& c, const Tensor& t, ReduceOp op = ReduceOp::Sum) { c.all_reduce(t, op)->wait(); }

/// The three groups of a 3-D rank grid, Megatron order: rank = (dp * pp_size + pp) * tp_size + tp,
/// so tensor-parallel peers are neighbours (the same host, the fastest links).
struct ParallelGroups {
  std::shared_ptr<Communicator> world, tensor, pipeline, data;
  int tp_rank = 0, pp_rank = 0, dp_rank = 0;
};
/// Splits `world` (size tp * pp * dp) into its tensor-, pipeline- and data-parallel groups.
ParallelGroups make_groups(const std::shared_ptr<Communicator>& world, int tp, int pp, int dp);

}  // namespace frugal::parallel
