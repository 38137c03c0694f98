// The NCCL backend: see Note [Communication stream] and Note [NCCL watchdog] in
// parallel/nccl_communicator.h.
#include "parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/cuda_check.h"
#include "memory/allocator.h"
#include "tensor/factory.h"

namespace frugal::parallel {

using Clock = std::chrono::steady_clock;
using detail::str_cat;

#define FRUGAL_NCCL_CHECK(expr)                                                                                \
  do {                                                                                                         \
    const ncclResult_t frugal_nccl_ = (expr);                                                                  \
    if (frugal_nccl_ != ncclSuccess && frugal_nccl_ != ncclInProgress) [[unlikely]]                            \
      FRUGAL_FAIL("NCCL error '", ncclGetErrorString(frugal_nccl_), "' (", int(frugal_nccl_), ") in ", #expr); \
  } while (0)

namespace {

ncclDataType_t nccl_type(DType t, const std::string& what, bool reduces) {
  switch (t) {
    case DType::Float32: return ncclFloat32;
    case DType::Float16: return ncclFloat16;
    case DType::BFloat16: return ncclBfloat16;
    case DType::Float64: return ncclFloat64;
    case DType::Int32: return ncclInt32;
    case DType::Int64: return ncclInt64;
    case DType::Bool:
      FRUGAL_CHECK(!reduces, what, ": cannot reduce bool tensors (NCCL would add their bytes)");
      return ncclUint8;
    case DType::UInt8:
      FRUGAL_CHECK(!reduces, what, ": cannot reduce uint8 tensors (codes or masks: Note [Storage-only uint8])");
      return ncclUint8;
  }
  FRUGAL_FAIL(what, ": no NCCL type for ", dtype_name(t));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

// One issued op: its completion event and what to call it in errors.
struct WorkRecord {
  std::string what;  // "nccl all_reduce #3 on rank 0"
  cudaEvent_t done = nullptr;
  cudaStream_t stream = nullptr;
  Clock::time_point started;
  bool launched = false;  // false while the CommGroup that issued it is open

  ~WorkRecord() {
    if (done) cudaEventDestroy(done);
  }
};

}  // namespace

// ---- communication streams: made once per device, never destroyed ----------------------

// Note [Communication streams outlive communicators]
// Collectives mark their tensors as used on the communicator's stream (memory::record_stream,
// in issue() below), and the caching allocator keeps that mark until the block is freed, when
// it records an event on the stream so the block is reused only after the stream's work.
// Tensors routinely outlive their communicator (a model whose parameters a DDP broadcast, an
// FSDP shard freed after the wrapper that owned the communicator), so destroying the stream
// with the communicator would leave the allocator recording an event on a dead stream: a
// host crash at teardown (seen with FSDP on one NCCL rank). So a communicator's stream is
// taken from a per-device pool and given back, drained, when the communicator goes: the
// handle stays valid for the life of the process, as PyTorch's pooled streams do.
namespace {

class StreamPool {
 public:
  cudaStream_t take(int device) {
    {
      std::lock_guard lock(mu_);
      auto& free = free_[device];
      if (!free.empty()) {
        cudaStream_t s = free.back();
        free.pop_back();
        return s;
      }
    }
    int least = 0, greatest = 0;  // the highest priority: communication should not queue behind compute
    FRUGAL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s = nullptr;
    FRUGAL_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    return s;
  }
  void give_back(int device, cudaStream_t s) {
    std::lock_guard lock(mu_);
    free_[device].push_back(s);
  }

 private:
  std::mutex mu_;
  std::map<int, std::vector<cudaStream_t>> free_;
};

StreamPool& stream_pool() {
  static auto* pool = new StreamPool;  // leaked: blocks may be freed during static destruction
  return *pool;
}

}  // namespace

// ---- shared state: the NCCL handle, its stream and its watchdog -------------------

struct NcclCommunicator::State {
  ncclComm_t comm = nullptr;  // null once aborted or destroyed
  int rank = 0, size = 0;
  Device device;
  cudaStream_t stream = nullptr;
  cudaEvent_t inputs_ready = nullptr;
  std::atomic<int64_t> timeout_ms;
  uint64_t next_seq = 1;

  std::mutex mu;  // guards comm's use, outstanding, abort_reason, stopping
  std::condition_variable cv;
  std::vector<std::shared_ptr<WorkRecord>> outstanding;  // launched, not yet seen complete
  std::string abort_reason;                              // non-empty once aborted
  bool stopping = false;
  std::thread watchdog;

  State(ncclComm_t c, Device d, std::chrono::milliseconds timeout) : comm(c), device(d), timeout_ms(timeout.count()) {
    CudaDeviceGuard guard(device.index);
    FRUGAL_NCCL_CHECK(ncclCommUserRank(comm, &rank));
    FRUGAL_NCCL_CHECK(ncclCommCount(comm, &size));
    stream = stream_pool().take(device.index);  // Note [Communication streams outlive communicators]
    FRUGAL_CUDA_CHECK(cudaEventCreateWithFlags(&inputs_ready, cudaEventDisableTiming));
    watchdog = std::thread([this] { watch(); });
  }

  ~State() {
    {
      std::lock_guard lock(mu);
      stopping = true;
    }
    cv.notify_all();
    watchdog.join();
    CudaDeviceGuard guard(device.index);
    shut_down();
    cudaEventDestroy(inputs_ready);
    cudaStreamSynchronize(stream);  // drained: the next communicator starts on an idle stream
    stream_pool().give_back(device.index, stream);
  }

  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms.load()); }
  std::string label() const { return str_cat("rank ", rank, " of ", size, " (", device.str(), ")"); }

  /// Aborts the communicator (lock held): see Note [NCCL watchdog].
  void abort_locked(const std::string& reason) {
    if (!abort_reason.empty()) return;
    abort_reason = reason;
    if (comm) ncclCommAbort(comm);
    comm = nullptr;
    cv.notify_all();
  }

  /// Throws when aborted (lock held).
  void check_usable(const std::string& what) const {
    if (!abort_reason.empty()) FRUGAL_FAIL(what, ": the communicator was aborted: ", abort_reason);
  }

  /// Non-blocking NCCL calls may return ncclInProgress; polls (releasing the lock, so
  /// the watchdog can abort) until the communicator `c` settles, at most timeout().
  void settle(std::unique_lock<std::mutex>& lock, ncclComm_t c, ncclResult_t result, const std::string& what) {
    const auto deadline = Clock::now() + timeout();
    while (result == ncclInProgress) {
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      lock.lock();
      check_usable(what);
      if (Clock::now() > deadline) {
        abort_locked(str_cat(what, " timed out after ", timeout().count(), " ms while NCCL set it up"));
        check_usable(what);
      }
      ncclCommGetAsyncError(c, &result);
    }
    if (result != ncclSuccess) {
      const std::string last = ncclGetLastError(c);
      abort_locked(str_cat(what, " failed: ", ncclGetErrorString(result), last.empty() ? "" : " (" + last + ")"));
      check_usable(what);
    }
  }

  void launch(const std::shared_ptr<WorkRecord>& w) {  // lock held
    FRUGAL_CUDA_CHECK(cudaEventRecord(w->done, w->stream));
    w->started = Clock::now();
    w->launched = true;
    outstanding.push_back(w);
  }

  void watch() {
    cudaSetDevice(device.index);
    std::unique_lock lock(mu);
    while (!stopping) {
      const auto poll = std::clamp(timeout() / 20, std::chrono::milliseconds(1), std::chrono::milliseconds(100));
      cv.wait_for(lock, poll);
      if (stopping || !abort_reason.empty()) continue;
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        const std::string last = ncclGetLastError(comm);
        abort_locked(
            str_cat("NCCL reported '", ncclGetErrorString(async), "' on ", label(), last.empty() ? "" : ": " + last));
        continue;
      }
      const auto now = Clock::now();
      std::erase_if(outstanding, [&](const std::shared_ptr<WorkRecord>& w) {
        if (!abort_reason.empty()) return false;
        const cudaError_t q = cudaEventQuery(w->done);
        if (q == cudaSuccess) return true;
        if (q != cudaErrorNotReady) abort_locked(str_cat(w->what, " failed: CUDA error ", cudaGetErrorString(q)));
        else if (now - w->started > timeout())
          abort_locked(str_cat(w->what, " timed out after ", timeout().count(),
                               " ms (a rank did not join it, or died); the communicator was aborted"));
        return false;
      });
    }
  }

  /// Blocks the host until `w` completes, or throws once the communicator is aborted.
  void wait_host(const WorkRecord& w) {
    std::unique_lock lock(mu);
    while (true) {
      check_usable(w.what);
      const cudaError_t q = cudaEventQuery(w.done);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) FRUGAL_FAIL(w.what, ": CUDA error ", cudaGetErrorString(q));
      cv.wait_for(lock, std::chrono::microseconds(50));
    }
  }

  // Waits for the ops in flight, then destroys the handle; aborts when they do not finish.
  void shut_down() {
    if (!comm) return;
    const auto deadline = Clock::now() + timeout();
    bool drained = false;
    while (!drained && Clock::now() < deadline) {
      drained = cudaStreamQuery(stream) != cudaErrorNotReady;
      if (!drained) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    ncclResult_t r = drained ? ncclCommFinalize(comm) : ncclInternalError;
    while (r == ncclInProgress && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      ncclCommGetAsyncError(comm, &r);
    }
    if (r == ncclSuccess) ncclCommDestroy(comm);
    else ncclCommAbort(comm);
    comm = nullptr;
  }
};

// ---- Work -------------------------------------------------------------------------

namespace {

using State = NcclCommunicator::State;

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<State> state, std::shared_ptr<WorkRecord> record)
      : state_(std::move(state)), record_(std::move(record)) {}

  void wait() override {
    std::lock_guard lock(state_->mu);
    FRUGAL_CHECK(record_->launched, record_->what, ": Work::wait() before its CommGroup ended");
    if (!state_->abort_reason.empty() && cudaEventQuery(record_->done) != cudaSuccess)
      FRUGAL_FAIL(record_->what, ": the communicator was aborted: ", state_->abort_reason);
    CudaDeviceGuard guard(state_->device.index);
    FRUGAL_CUDA_CHECK(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(current_stream(state_->device).handle), record_->done, 0));
  }
  bool completed() override {
    std::lock_guard lock(state_->mu);
    if (!record_->launched) return false;
    return !state_->abort_reason.empty() || cudaEventQuery(record_->done) == cudaSuccess;
  }
  const WorkRecord& record() const { return *record_; }

 private:
  std::shared_ptr<State> state_;
  std::shared_ptr<WorkRecord> record_;
};

// Ops issued inside open CommGroups on this thread, launched when the outermost ends.
struct GroupState {
  int depth = 0;
  std::vector<std::pair<std::shared_ptr<State>, std::shared_ptr<WorkRecord>>> pending;
};
thread_local GroupState t_group;

// Issues one NCCL call on `state`'s stream, ordered after the caller's current
// stream (see Note [Communication stream]).
template <typename Call>
std::shared_ptr<NcclWork> issue(const std::shared_ptr<State>& state, const char* op, const std::vector<Tensor>& tensors,
                                Call&& call) {
  for (const Tensor& t : tensors) {
    FRUGAL_CHECK(t.device() == state->device, "nccl ", op, ": tensor ", t.describe(), " is not on this rank's device ",
                 state->device.str());
    FRUGAL_CHECK(t.is_contiguous(), "nccl ", op, ": NCCL needs contiguous tensors, got ", t.describe());
  }
  CudaDeviceGuard guard(state->device.index);
  std::unique_lock lock(state->mu);
  auto record = std::make_shared<WorkRecord>();
  record->what = str_cat("nccl ", op, " #", state->next_seq++, " on ", state->label());
  state->check_usable(record->what);
  const auto compute = static_cast<cudaStream_t>(current_stream(state->device).handle);
  FRUGAL_CUDA_CHECK(cudaEventRecord(state->inputs_ready, compute));
  FRUGAL_CUDA_CHECK(cudaStreamWaitEvent(state->stream, state->inputs_ready, 0));
  state->settle(lock, state->comm, call(state->comm, state->stream), record->what);
  for (const Tensor& t : tensors) memory::record_stream(t.impl().storage->data, Stream{state->stream, state->device});
  FRUGAL_CUDA_CHECK(cudaEventCreateWithFlags(&record->done, cudaEventDisableTiming));
  record->stream = state->stream;
  if (t_group.depth > 0) t_group.pending.push_back({state, record});
  else state->launch(record);
  return std::make_shared<NcclWork>(state, record);
}

std::string describe(const char* op, const std::shared_ptr<State>& s) {
  return str_cat("nccl ", op, " on ", s->label());
}

// Creates a non-blocking communicator config (see Note [NCCL watchdog]).
ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

}  // namespace

// ---- NcclCommunicator ------------------------------------------------------------------

NcclUniqueId nccl_unique_id() {
  ncclUniqueId id;
  FRUGAL_NCCL_CHECK(ncclGetUniqueId(&id));
  NcclUniqueId out;
  static_assert(sizeof(id) == sizeof(out));
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

void set_cuda_device(Device device) {
  FRUGAL_CHECK(device.is_cuda(), "set_cuda_device: ", device.str(), " is not a CUDA device");
  FRUGAL_CUDA_CHECK(cudaSetDevice(device.index));
}

NcclCommunicator::NcclCommunicator(const NcclUniqueId& id, int rank, int size, Device device,
                                   std::chrono::milliseconds timeout) {
  if (device.is_cpu()) {
    int current = 0;
    FRUGAL_CUDA_CHECK(cudaGetDevice(&current));
    device = cuda(current);
  }
  FRUGAL_CHECK(rank >= 0 && rank < size, "nccl init: rank ", rank, " out of range for ", size, " ranks");
  FRUGAL_CHECK(device.index < cuda_device_count(), "nccl init on rank ", rank, ": ", device.str(), " does not exist (",
               cuda_device_count(), " visible)");
  CudaDeviceGuard guard(device.index);
  ncclUniqueId uid;
  std::memcpy(&uid, id.data(), sizeof(uid));
  ncclConfig_t config = nonblocking_config();
  ncclComm_t comm = nullptr;
  FRUGAL_NCCL_CHECK(ncclCommInitRankConfig(&comm, size, uid, rank, &config));
  // Wait for the other ranks (polling, so a rank that never comes is a timeout, not a hang).
  const auto deadline = Clock::now() + timeout;
  ncclResult_t r = ncclInProgress;
  while (r == ncclInProgress) {
    ncclCommGetAsyncError(comm, &r);
    if (r == ncclInProgress && Clock::now() > deadline) {
      ncclCommAbort(comm);
      FRUGAL_FAIL("nccl init on rank ", rank, " of ", size, ": the other ranks did not join within ", timeout.count(),
                  " ms");
    }
    if (r == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (r != ncclSuccess) {
    const std::string last = ncclGetLastError(comm);
    ncclCommAbort(comm);
    FRUGAL_FAIL("nccl init on rank ", rank, " of ", size, " failed: ", ncclGetErrorString(r), " (", last, ")");
  }
  state_ = std::make_shared<State>(comm, device, timeout);
}

NcclCommunicator::NcclCommunicator(FromSplit, std::shared_ptr<State> state) : state_(std::move(state)) {}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::rank() const { return state_->rank; }
int NcclCommunicator::size() const { return state_->size; }
Device NcclCommunicator::device() const { return state_->device; }
Stream NcclCommunicator::comm_stream() const { return Stream{state_->stream, state_->device}; }
void NcclCommunicator::set_timeout(std::chrono::milliseconds timeout) { state_->timeout_ms = timeout.count(); }
std::chrono::milliseconds NcclCommunicator::timeout() const { return state_->timeout(); }
bool NcclCommunicator::aborted() const {
  std::lock_guard lock(state_->mu);
  return !state_->abort_reason.empty();
}

std::shared_ptr<Work> NcclCommunicator::all_reduce(const Tensor& tensor, ReduceOp op) {
  const ncclDataType_t type = nccl_type(tensor.dtype(), describe("all_reduce", state_), true);
  return issue(state_, "all_reduce", {tensor}, [&](ncclComm_t c, cudaStream_t s) {
    return ncclAllReduce(tensor.data(), tensor.data(), size_t(tensor.numel()), type, nccl_op(op), c, s);
  });
}

std::shared_ptr<Work> NcclCommunicator::all_gather(const Tensor& input, const Tensor& output) {
  FRUGAL_CHECK(output.numel() == size() * input.numel() && output.dtype() == input.dtype(),
               describe("all_gather", state_), ": output must hold ", size(),
               " x input's elements in its dtype; got input ", input.describe(), ", output ", output.describe());
  const ncclDataType_t type = nccl_type(input.dtype(), describe("all_gather", state_), false);
  return issue(state_, "all_gather", {input, output}, [&](ncclComm_t c, cudaStream_t s) {
    return ncclAllGather(input.data(), output.data(), size_t(input.numel()), type, c, s);
  });
}

std::shared_ptr<Work> NcclCommunicator::reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op) {
  FRUGAL_CHECK(input.numel() == size() * output.numel() && output.dtype() == input.dtype(),
               describe("reduce_scatter", state_), ": input must hold ", size(),
               " x output's elements in its dtype; got input ", input.describe(), ", output ", output.describe());
  const ncclDataType_t type = nccl_type(input.dtype(), describe("reduce_scatter", state_), true);
  return issue(state_, "reduce_scatter", {input, output}, [&](ncclComm_t c, cudaStream_t s) {
    return ncclReduceScatter(input.data(), output.data(), size_t(output.numel()), type, nccl_op(op), c, s);
  });
}

std::shared_ptr<Work> NcclCommunicator::broadcast(const Tensor& tensor, int root) {
  FRUGAL_CHECK(root >= 0 && root < size(), describe("broadcast", state_), ": root ", root, " out of range");
  const ncclDataType_t type = nccl_type(tensor.dtype(), describe("broadcast", state_), false);
  return issue(state_, "broadcast", {tensor}, [&](ncclComm_t c, cudaStream_t s) {
    return ncclBroadcast(tensor.data(), tensor.data(), size_t(tensor.numel()), type, root, c, s);
  });
}

std::shared_ptr<Work> NcclCommunicator::send(const Tensor& tensor, int peer) {
  FRUGAL_CHECK(peer >= 0 && peer < size() && peer != rank(), describe("send", state_), ": bad peer ", peer);
  const ncclDataType_t type = nccl_type(tensor.dtype(), describe("send", state_), false);
  return issue(state_, "send", {tensor}, [&](ncclComm_t c, cudaStream_t s) {
    return ncclSend(tensor.data(), size_t(tensor.numel()), type, peer, c, s);
  });
}

std::shared_ptr<Work> NcclCommunicator::recv(const Tensor& tensor, int peer) {
  FRUGAL_CHECK(peer >= 0 && peer < size() && peer != rank(), describe("recv", state_), ": bad peer ", peer);
  const ncclDataType_t type = nccl_type(tensor.dtype(), describe("recv", state_), false);
  return issue(state_, "recv", {tensor}, [&](ncclComm_t c, cudaStream_t s) {
    return ncclRecv(tensor.data(), size_t(tensor.numel()), type, peer, c, s);
  });
}

std::pair<std::shared_ptr<Work>, std::shared_ptr<Work>> NcclCommunicator::send_recv(const Tensor& to_send,
                                                                                    int send_peer,
                                                                                    const Tensor& to_recv,
                                                                                    int recv_peer) {
  CommGroup group;  // one fused launch: both transfers progress together
  auto sent = send(to_send, send_peer);
  auto received = recv(to_recv, recv_peer);
  group.end();
  return {std::move(sent), std::move(received)};
}

void NcclCommunicator::barrier() {
  FRUGAL_CHECK(t_group.depth == 0, describe("barrier", state_), ": not allowed inside a CommGroup");
  const Tensor token = zeros({1}, TensorOptions(kFloat32, state_->device));
  auto work = issue(state_, "barrier", {token}, [&](ncclComm_t c, cudaStream_t s) {
    return ncclAllReduce(token.data(), token.data(), 1, ncclFloat32, ncclSum, c, s);
  });
  state_->wait_host(work->record());
}

std::shared_ptr<Communicator> NcclCommunicator::split(int color, int key) {
  FRUGAL_CHECK(t_group.depth == 0, describe("split", state_), ": not allowed inside a CommGroup");
  CudaDeviceGuard guard(state_->device.index);
  std::unique_lock lock(state_->mu);
  const std::string what = str_cat("nccl split #", state_->next_seq++, " on ", state_->label());
  state_->check_usable(what);
  ncclConfig_t config = nonblocking_config();
  ncclComm_t child = nullptr;
  ncclResult_t r = ncclCommSplit(state_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
  // A non-blocking split reports its progress on the parent, and NCCL writes `child` only
  // once it is complete (it may return ncclSuccess before that): wait for the parent.
  if (r == ncclSuccess || r == ncclInProgress) ncclCommGetAsyncError(state_->comm, &r);
  state_->settle(lock, state_->comm, r, what);
  if (color < 0) return nullptr;
  FRUGAL_CHECK(child != nullptr, what, ": NCCL completed the split without a communicator for color ", color);
  ncclResult_t child_state = ncclSuccess;
  ncclCommGetAsyncError(child, &child_state);
  state_->settle(lock, child, child_state, what);
  auto state = std::make_shared<State>(child, state_->device, state_->timeout());
  return std::shared_ptr<NcclCommunicator>(new NcclCommunicator(FromSplit{}, std::move(state)));
}

// ---- CommGroup -----------------------------------------------------------------------

CommGroup::CommGroup() : uncaught_(std::uncaught_exceptions()) {
  FRUGAL_NCCL_CHECK(ncclGroupStart());
  ++t_group.depth;
}

void CommGroup::end() {
  if (ended_) return;
  ended_ = true;
  const ncclResult_t r = ncclGroupEnd();
  if (--t_group.depth > 0) {
    FRUGAL_NCCL_CHECK(r);
    return;
  }
  auto pending = std::move(t_group.pending);
  t_group.pending.clear();
  // Settle each communicator the group used, then launch (record the events of) its ops.
  std::vector<State*> settled;
  std::string failure;
  for (auto& [state, record] : pending) {
    std::unique_lock lock(state->mu);
    if (std::find(settled.begin(), settled.end(), state.get()) == settled.end()) {
      settled.push_back(state.get());
      try {
        state->check_usable(record->what);
        ncclResult_t status = r;
        if (status == ncclInProgress || status == ncclSuccess) ncclCommGetAsyncError(state->comm, &status);
        state->settle(lock, state->comm, status, record->what + " (in a CommGroup)");
      } catch (const std::exception& e) {
        if (failure.empty()) failure = e.what();
        continue;
      }
    }
    if (state->abort_reason.empty()) state->launch(record);
  }
  if (!failure.empty()) FRUGAL_FAIL("CommGroup: ", failure);
  FRUGAL_NCCL_CHECK(r);
}

CommGroup::~CommGroup() noexcept(false) {
  if (ended_) return;
  if (std::uncaught_exceptions() > uncaught_) {  // unwinding: close the group, swallow its error
    try {
      end();
    } catch (...) {}
    return;
  }
  end();
}

}  // namespace frugal::parallel
