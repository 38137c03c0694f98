#include "parallel/mpi_communicator.h"

// The C bindings only: MPI's deprecated C++ bindings are not used (and warn).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace frugal::parallel {

using Clock = std::chrono::steady_clock;
using detail::str_cat;

namespace {

std::atomic<bool> g_failed{false};  // a request timed out: exit must abort (Note [MPI backend])

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, size_t(len));
}

#define FRUGAL_MPI_CHECK(call, what)                                                                      \
  do {                                                                                                    \
    const int frugal_mpi_rc = (call);                                                                     \
    FRUGAL_CHECK(frugal_mpi_rc == MPI_SUCCESS, what, ": ", #call, " failed: ", mpi_error(frugal_mpi_rc)); \
  } while (0)

// Finalizes MPI at exit when this process initialized it; aborts the job instead after
// a timeout, when a request can never complete.
struct MpiLifetime {
  ~MpiLifetime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (g_failed) MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Finalize();
  }
};

int checked_count(size_t bytes, const std::string& what) {
  FRUGAL_CHECK(bytes <= size_t(INT_MAX), what, ": ", bytes, " bytes is more than one MPI call moves (2^31 - 1)");
  return int(bytes);
}

void check_cpu(const char* op, const Tensor& t) {
  FRUGAL_CHECK(t.defined() && t.device().is_cpu(), "mpi ", op, ": the mpi backend takes CPU tensors, got ",
               t.defined() ? t.describe() : std::string("an undefined tensor"),
               " (use the nccl backend for CUDA tensors)");
}

}  // namespace

struct MpiCommunicator::State {
  MPI_Comm comm = MPI_COMM_NULL;
  bool owned = false;  // split communicators are freed with their last holder
  int rank = 0, size = 1;
  std::string failure;  // the first error; later calls throw it

  ~State() {
    if (owned && !g_failed) MPI_Comm_free(&comm);
  }

  std::string label(uint64_t seq, const char* op) const { return str_cat("mpi ", op, " #", seq, " on rank ", rank); }

  void check_healthy(const std::string& what) const {
    if (!failure.empty()) FRUGAL_FAIL(what, ": the communicator failed earlier: ", failure);
  }

  // Polls `request` until it completes or `timeout` passes (Note [MPI backend]).
  void wait(MPI_Request& request, const std::string& what, Clock::time_point deadline,
            std::chrono::milliseconds timeout) {
    int done = 0;
    for (int polls = 0;; ++polls) {
      FRUGAL_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what);
      if (done) return;
      if (Clock::now() > deadline) {
        failure = str_cat(what, " timed out after ", timeout.count(),
                          " ms (a rank did not join it: did one fail, or call collectives in another order?)");
        g_failed = true;
        FRUGAL_FAIL(failure);
      }
      // Spin briefly (small collectives finish in microseconds), then back off.
      if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(polls > 100000 ? 1000 : 50));
    }
  }
};

namespace {

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool completed() override { return true; }
};

// An MPI_Isend or MPI_Irecv in flight, with the buffer MPI uses and, for a recv into a
// non-contiguous tensor, the copy back.
class MpiP2PWork final : public Work {
 public:
  MpiP2PWork(std::shared_ptr<MpiCommunicator::State> state, Tensor buffer, Tensor target, std::string what,
             std::chrono::milliseconds timeout)
      : state_(std::move(state)),
        buffer_(std::move(buffer)),
        target_(std::move(target)),
        what_(std::move(what)),
        timeout_(timeout) {}

  MPI_Request request = MPI_REQUEST_NULL;

  /// A Work dropped unwaited (the thread and TCP backends finish sends at once, so code written
  /// against them may drop one) still owns the buffer MPI reads or writes: it waits for the
  /// request here, bounded by the timeout, so neither the buffer nor the request leaks into
  /// MPI's hands after it is freed. A failure here has nobody to throw to: it is reported.
  ~MpiP2PWork() override {
    if (done_ || request == MPI_REQUEST_NULL) return;
    try {
      wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "frugal mpi: %s (a dropped Work could not complete)\n", e.what());
    }
  }

  void wait() override {
    if (done_) return;
    // The timeout counts from this wait, not from when the operation was posted (a pipeline
    // posts its receives early and computes before it waits).
    state_->wait(request, what_, Clock::now() + timeout_, timeout_);
    finish();
  }
  bool completed() override {
    if (done_) return true;
    int flag = 0;
    FRUGAL_MPI_CHECK(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), what_);
    if (flag) finish();
    return done_;
  }

 private:
  void finish() {
    done_ = true;
    if (target_.defined() && !target_.is_contiguous()) target_.copy_(buffer_.view(target_.sizes()));
  }

  std::shared_ptr<MpiCommunicator::State> state_;
  Tensor buffer_, target_;
  std::string what_;
  std::chrono::milliseconds timeout_;
  bool done_ = false;
};

}  // namespace

std::shared_ptr<Communicator> make_mpi_world(std::chrono::milliseconds timeout) {
  static std::mutex mu;
  static MpiLifetime lifetime;
  std::lock_guard lock(mu);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    FRUGAL_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "init_process_group (mpi)");
  }
  auto state = std::make_shared<MpiCommunicator::State>();
  state->comm = MPI_COMM_WORLD;
  MPI_Comm_rank(MPI_COMM_WORLD, &state->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &state->size);
  for (const char* name : {"WORLD_SIZE", "RANK"}) {
    const char* v = std::getenv(name);
    const int mine = name[0] == 'W' ? state->size : state->rank;
    FRUGAL_CHECK(!v || std::atoi(v) == mine, "init_process_group (mpi): ", name, "=", v, " but MPI's world says ", mine,
                 " (", state->size,
                 " rank(s)): MPI ranks must be started by mpirun -np N; under frugal-run "
                 "use the tcp backend");
  }
  auto world = std::make_shared<MpiCommunicator>(state);
  world->set_timeout(timeout);
  return world;
}

MpiCommunicator::MpiCommunicator(std::shared_ptr<State> state) : state_(std::move(state)) {}
MpiCommunicator::~MpiCommunicator() = default;

int MpiCommunicator::rank() const { return state_->rank; }
int MpiCommunicator::size() const { return state_->size; }

std::shared_ptr<Work> MpiCommunicator::all_reduce(const Tensor& tensor, ReduceOp op) {
  check_cpu("all_reduce", tensor);
  const std::string what = state_->label(next_seq_++, "all_reduce");
  state_->check_healthy(what);
  const auto deadline = Clock::now() + timeout_;
  const int p = size(), me = rank();
  const int64_t n = tensor.numel();
  const size_t es = element_size(tensor.dtype());
  checked_count(size_t(n) * es, what);
  const Tensor flat = tensor.contiguous();  // the tensor itself when contiguous
  char* data = static_cast<char*>(flat.data());
  auto start = [&](int r) { return int(size_t(n * r / p) * es); };  // balanced chunks, in bytes
  // Reduce-scatter: chunk q of every rank's tensor goes to rank q.
  const size_t np = static_cast<size_t>(p);
  std::vector<int> send_counts(np), send_displs(np), recv_counts(np), recv_displs(np);
  const int mine = start(me + 1) - start(me);
  for (int q = 0; q < p; ++q) {
    send_counts[size_t(q)] = start(q + 1) - start(q), send_displs[size_t(q)] = start(q);
    recv_counts[size_t(q)] = mine, recv_displs[size_t(q)] = q * mine;
  }
  std::vector<char> chunks(size_t(p) * size_t(mine) + 1);
  MPI_Request request;
  FRUGAL_MPI_CHECK(MPI_Ialltoallv(data, send_counts.data(), send_displs.data(), MPI_BYTE, chunks.data(),
                                  recv_counts.data(), recv_displs.data(), MPI_BYTE, state_->comm, &request),
                   what);
  state_->wait(request, what, deadline, timeout_);
  std::vector<const void*> src;
  for (int q = 0; q < p; ++q) src.push_back(chunks.data() + size_t(q) * size_t(mine));
  std::vector<char> reduced(size_t(mine) + 1);
  reduce_in_rank_order(tensor.dtype(), src, reduced.data(), int64_t(size_t(mine) / es), op, "mpi all_reduce");
  // All-gather the reduced chunks into place.
  FRUGAL_MPI_CHECK(MPI_Iallgatherv(reduced.data(), mine, MPI_BYTE, data, send_counts.data(), send_displs.data(),
                                   MPI_BYTE, state_->comm, &request),
                   what);
  state_->wait(request, what, deadline, timeout_);
  if (!tensor.is_contiguous()) tensor.copy_(flat);
  return std::make_shared<DoneWork>();
}

std::shared_ptr<Work> MpiCommunicator::all_gather(const Tensor& input, const Tensor& output) {
  check_cpu("all_gather", input);
  check_cpu("all_gather", output);
  FRUGAL_CHECK(output.is_contiguous() && output.numel() == size() * input.numel() && output.dtype() == input.dtype(),
               "mpi all_gather: output must be contiguous with ", size(),
               " x input's elements and its dtype; got input ", input.describe(), ", output ", output.describe());
  const std::string what = state_->label(next_seq_++, "all_gather");
  state_->check_healthy(what);
  const int bytes = checked_count(size_t(input.numel()) * element_size(input.dtype()) * size_t(size()), what) / size();
  // A copy first: the input may be a view of the output (ZeRO gathers in place).
  const Tensor in = input.clone();
  MPI_Request request;
  FRUGAL_MPI_CHECK(MPI_Iallgather(in.data(), bytes, MPI_BYTE, output.data(), bytes, MPI_BYTE, state_->comm, &request),
                   what);
  state_->wait(request, what, Clock::now() + timeout_, timeout_);
  return std::make_shared<DoneWork>();
}

std::shared_ptr<Work> MpiCommunicator::reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op) {
  check_cpu("reduce_scatter", input);
  check_cpu("reduce_scatter", output);
  const int p = size();
  FRUGAL_CHECK(input.numel() % p == 0 && output.is_contiguous() && output.numel() == input.numel() / p &&
                   output.dtype() == input.dtype(),
               "mpi reduce_scatter: input's elements must split into ", p,
               " chunks and output must be one contiguous chunk of its dtype; got input ", input.describe(),
               ", output ", output.describe());
  const std::string what = state_->label(next_seq_++, "reduce_scatter");
  state_->check_healthy(what);
  const int64_t chunk = input.numel() / p;
  const int bytes = checked_count(size_t(input.numel()) * element_size(input.dtype()), what) / p;
  const Tensor flat = input.contiguous();
  std::vector<char> chunks(size_t(p) * size_t(bytes) + 1);
  MPI_Request request;
  FRUGAL_MPI_CHECK(MPI_Ialltoall(flat.data(), bytes, MPI_BYTE, chunks.data(), bytes, MPI_BYTE, state_->comm, &request),
                   what);
  state_->wait(request, what, Clock::now() + timeout_, timeout_);
  std::vector<const void*> src;
  for (int q = 0; q < p; ++q) src.push_back(chunks.data() + size_t(q) * size_t(bytes));
  reduce_in_rank_order(input.dtype(), src, output.data(), chunk, op, "mpi reduce_scatter");
  return std::make_shared<DoneWork>();
}

std::shared_ptr<Work> MpiCommunicator::broadcast(const Tensor& tensor, int root) {
  check_cpu("broadcast", tensor);
  FRUGAL_CHECK(root >= 0 && root < size(), "mpi broadcast: root ", root, " out of range for ", size(), " ranks");
  const std::string what = state_->label(next_seq_++, "broadcast");
  state_->check_healthy(what);
  const int bytes = checked_count(size_t(tensor.numel()) * element_size(tensor.dtype()), what);
  const Tensor flat = tensor.contiguous();
  MPI_Request request;
  FRUGAL_MPI_CHECK(MPI_Ibcast(flat.data(), bytes, MPI_BYTE, root, state_->comm, &request), what);
  state_->wait(request, what, Clock::now() + timeout_, timeout_);
  if (!tensor.is_contiguous()) tensor.copy_(flat);
  return std::make_shared<DoneWork>();
}

void MpiCommunicator::barrier() {
  const std::string what = state_->label(next_seq_++, "barrier");
  state_->check_healthy(what);
  MPI_Request request;
  FRUGAL_MPI_CHECK(MPI_Ibarrier(state_->comm, &request), what);
  state_->wait(request, what, Clock::now() + timeout_, timeout_);
}

std::shared_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  const std::string what = state_->label(next_seq_++, "split");
  state_->check_healthy(what);
  // Every rank arrives at a timed all-gather first, so MPI_Comm_split (blocking) cannot hang.
  const int mine[2] = {color, key};
  std::vector<int> all(size_t(2 * size()));
  MPI_Request request;
  FRUGAL_MPI_CHECK(MPI_Iallgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, state_->comm, &request), what);
  state_->wait(request, what, Clock::now() + timeout_, timeout_);
  auto child = std::make_shared<State>();
  FRUGAL_MPI_CHECK(MPI_Comm_split(state_->comm, color < 0 ? MPI_UNDEFINED : color, key, &child->comm), what);
  if (color < 0) return nullptr;
  child->owned = true;
  MPI_Comm_rank(child->comm, &child->rank);
  MPI_Comm_size(child->comm, &child->size);
  auto comm = std::make_shared<MpiCommunicator>(child);
  comm->set_timeout(timeout_);
  return comm;
}

std::shared_ptr<Work> MpiCommunicator::send(const Tensor& tensor, int peer) {
  check_cpu("send", tensor);
  FRUGAL_CHECK(peer >= 0 && peer < size() && peer != rank(), "mpi send on rank ", rank(), ": bad peer ", peer, " (",
               size(), " ranks)");
  const std::string what = str_cat("mpi send to rank ", peer, " on rank ", rank());
  state_->check_healthy(what);
  const int bytes = checked_count(size_t(tensor.numel()) * element_size(tensor.dtype()), what);
  const Tensor buffer = tensor.contiguous();  // kept alive by the Work until MPI is done with it
  auto work = std::make_shared<MpiP2PWork>(state_, buffer, Tensor(), what, timeout_);
  FRUGAL_MPI_CHECK(MPI_Isend(buffer.data(), bytes, MPI_BYTE, peer, 0, state_->comm, &work->request), what);
  return work;
}

std::shared_ptr<Work> MpiCommunicator::recv(const Tensor& tensor, int peer) {
  check_cpu("recv", tensor);
  FRUGAL_CHECK(peer >= 0 && peer < size() && peer != rank(), "mpi recv on rank ", rank(), ": bad peer ", peer, " (",
               size(), " ranks)");
  const std::string what = str_cat("mpi recv from rank ", peer, " on rank ", rank());
  state_->check_healthy(what);
  const int bytes = checked_count(size_t(tensor.numel()) * element_size(tensor.dtype()), what);
  const Tensor buffer = tensor.contiguous();
  auto work = std::make_shared<MpiP2PWork>(state_, buffer, tensor, what, timeout_);
  FRUGAL_MPI_CHECK(MPI_Irecv(buffer.data(), bytes, MPI_BYTE, peer, 0, state_->comm, &work->request), what);
  return work;
}

}  // namespace frugal::parallel
