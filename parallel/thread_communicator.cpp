#include "parallel/thread_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "tensor/dispatch.h"
#include "tensor/factory.h"
#include "tensor/ops/copy.h"

namespace frugal::parallel {

using Clock = std::chrono::steady_clock;
using detail::str_cat;

namespace threads_detail {

// The state a world group and every group split from it share: one lock, one
// condition variable, and the first failure (the root cause later errors name).
struct Family {
  explicit Family(int world_size) : exited(size_t(world_size), false) {}
  std::mutex mu;
  std::condition_variable cv;
  int failed_rank = -1;  // world rank of the first failure, -1 while healthy
  std::string failure;
  std::vector<bool> exited;  // by world rank

  void fail(int world_rank, const std::string& what) {
    if (failed_rank < 0) failed_rank = world_rank, failure = what;
    cv.notify_all();
  }
};

enum class OpKind { AllReduce, AllGather, ReduceScatter, Broadcast, Barrier, Split };

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::AllReduce: return "all_reduce";
    case OpKind::AllGather: return "all_gather";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::Barrier: return "barrier";
    case OpKind::Split: return "split";
  }
  return "?";
}

// One rank's arguments to a collective.
struct Part {
  Part(OpKind kind, std::chrono::milliseconds timeout) : kind(kind), timeout(timeout) {}
  OpKind kind;
  Tensor input, output;
  ReduceOp reduce = ReduceOp::Sum;
  int root = 0, color = 0, key = 0;
  std::chrono::milliseconds timeout;
};

// One collective of a group, from the first rank's arrival until the last rank's
// thread has computed it.
struct Slot {
  explicit Slot(int n) : parts(size_t(n)) {}
  std::vector<std::optional<Part>> parts;  // by group rank
  int arrived = 0;
  bool done = false;
  std::string error;  // the ranks' arguments disagreed, or the computation threw
  std::vector<std::shared_ptr<ThreadCommunicator>> split_result;  // by group rank
};

struct RecvSlot {
  Tensor tensor;
  bool done = false;
  std::string error;
};

// Messages from one rank to another: the n-th send matches the n-th recv.
struct Channel {
  uint64_t sent = 0, posted = 0;
  std::map<uint64_t, Tensor> unclaimed;                   // sent before their recv was posted
  std::map<uint64_t, std::shared_ptr<RecvSlot>> waiting;  // posted before their send came
};

}  // namespace threads_detail

using namespace threads_detail;

class ThreadGroup {
 public:
  ThreadGroup(std::shared_ptr<Family> family, std::vector<int> members, bool is_world)
      : family(std::move(family)), members(std::move(members)), is_world(is_world), channels(size() * size()) {}

  int size() const { return int(members.size()); }
  Channel& channel(int src, int dst) { return channels[size_t(src * size() + dst)]; }

  /// "rank 1", or "rank 1 (world rank 3)" in a split group.
  std::string label(int rank) const {
    return is_world ? str_cat("rank ", rank) : str_cat("rank ", rank, " (world rank ", members[size_t(rank)], ")");
  }

  /// Throws when the family has failed. Call with the lock held.
  void check_healthy(const std::string& what) const {
    if (family->failed_rank >= 0) FRUGAL_FAIL(what, ": rank ", family->failed_rank, " failed: ", family->failure);
  }

  /// Waits (lock held) until ready(); throws on a failure of the family, on a rank in
  /// missing() that exited, or at `deadline` (then failing the family: see Note
  /// [Threads backend failures]).
  template <typename Ready, typename Missing>
  void wait(std::unique_lock<std::mutex>& lock, const std::string& what, int rank, Clock::time_point deadline,
            std::chrono::milliseconds timeout, Ready ready, Missing missing) {
    while (!ready()) {
      check_healthy(what);
      for (int r : missing())
        if (family->exited[size_t(members[size_t(r)])]) FRUGAL_FAIL(what, ": ", label(r), " exited without joining it");
      if (family->cv.wait_until(lock, deadline) == std::cv_status::timeout && !ready()) {
        std::string absent;
        for (int r : missing()) absent += (absent.empty() ? "" : ", ") + label(r);
        const std::string msg = str_cat(what, " timed out after ", timeout.count(), " ms; not arrived: ", absent);
        family->fail(members[size_t(rank)], msg);
        FRUGAL_FAIL(msg);
      }
    }
  }

  std::shared_ptr<Family> family;
  std::vector<int> members;  // world rank of each group rank
  bool is_world;
  std::map<uint64_t, std::shared_ptr<Slot>> open;  // collectives some rank has not reached, by sequence number
  std::vector<Channel> channels;                   // [src * size + dst]
};

namespace {

// A collective's write into a rank's tensor. Raw, as NCCL's: a collective is no autograd op,
// and the thread that writes is whichever rank arrived last, perhaps inside a checkpoint's
// recompute of its own (whose check of in-place writes is about that thread's function).
// The version moves as for any write.
void write_into(const Tensor& dst, const Tensor& src) {
  ops::copy_into(dst, src);
  dst.bump_version();
}

std::string describe_op(OpKind kind, uint64_t seq, const std::string& rank_label) {
  return str_cat("threads ", op_name(kind), " #", seq, " on ", rank_label);
}

// ---- the computation, run once by the last rank to arrive ---------------------

// Reduces the ranks' inputs element by element in rank order, in the type's
// compute precision, into a fresh contiguous 1-D tensor.
Tensor reduce_tensors_in_rank_order(const std::vector<Tensor>& inputs, ReduceOp op) {
  const int64_t numel = inputs[0].numel();
  const DType dtype = inputs[0].dtype();
  std::vector<Tensor> flat;
  for (const Tensor& t : inputs) flat.push_back(t.contiguous());
  Tensor out = empty({numel}, TensorOptions(dtype));
  std::vector<const void*> src;
  for (const Tensor& t : flat) src.push_back(t.data());
  reduce_in_rank_order(dtype, src, out.data(), numel, op, to_string(op));
  return out;
}

std::string describe_part(const Part& p) {
  std::string s = op_name(p.kind);
  if (p.input.defined()) s.append(" ").append(p.input.describe());
  if (p.kind == OpKind::AllReduce || p.kind == OpKind::ReduceScatter) s += str_cat(" ", to_string(p.reduce));
  if (p.kind == OpKind::Broadcast) s += str_cat(" root ", p.root);
  return s;
}

// Throws unless every rank called the same collective with matching arguments.
void check_agreement(const std::vector<std::optional<Part>>& parts) {
  const Part& p0 = *parts[0];
  bool agree = true;
  for (const auto& p : parts) {
    agree = agree && p->kind == p0.kind && p->reduce == p0.reduce && p->root == p0.root;
    if (p0.input.defined())
      agree = agree && p->input.dtype() == p0.input.dtype() && p->input.numel() == p0.input.numel();
  }
  if (agree) return;
  std::string all;
  for (size_t r = 0; r < parts.size(); ++r) all += str_cat(r ? "; " : "", "rank ", r, ": ", describe_part(*parts[r]));
  FRUGAL_FAIL(
      "the ranks' calls disagree (every rank must call the same collectives in the same order, with "
      "tensors of one dtype and size): ",
      all);
}

void compute(Slot& slot, const std::shared_ptr<ThreadGroup>& group) {
  check_agreement(slot.parts);
  const int n = int(slot.parts.size());
  const Part& p0 = *slot.parts[0];
  std::vector<Tensor> inputs;
  for (const auto& p : slot.parts) inputs.push_back(p->input);
  switch (p0.kind) {
    case OpKind::AllReduce: {
      const Tensor sum = reduce_tensors_in_rank_order(inputs, p0.reduce);
      for (const Tensor& t : inputs) write_into(t, sum.view(t.sizes()));
      break;
    }
    case OpKind::AllGather: {
      const int64_t m = p0.input.numel();
      const Tensor all = empty({n * m}, TensorOptions(p0.input.dtype()));
      for (int r = 0; r < n; ++r) write_into(all.narrow(0, r * m, m), inputs[size_t(r)].reshape({m}));
      for (const auto& p : slot.parts) write_into(p->output.view({n * m}), all);
      break;
    }
    case OpKind::ReduceScatter: {
      const Tensor sum = reduce_tensors_in_rank_order(inputs, p0.reduce);
      const int64_t chunk = p0.input.numel() / n;
      for (int r = 0; r < n; ++r) {
        const Tensor& out = slot.parts[size_t(r)]->output;
        write_into(out.view({chunk}), sum.narrow(0, r * chunk, chunk));
      }
      break;
    }
    case OpKind::Broadcast: {
      const Tensor src = inputs[size_t(p0.root)].contiguous();
      for (int r = 0; r < n; ++r)
        if (r != p0.root) write_into(inputs[size_t(r)], src.view(inputs[size_t(r)].sizes()));
      break;
    }
    case OpKind::Barrier: break;
    case OpKind::Split: {
      // Ranks of one color, ordered by (key, parent rank), form a new group.
      std::map<int, std::vector<std::pair<int, int>>> by_color;
      for (int r = 0; r < n; ++r)
        if (slot.parts[size_t(r)]->color >= 0)
          by_color[slot.parts[size_t(r)]->color].push_back({slot.parts[size_t(r)]->key, r});
      slot.split_result.assign(size_t(n), nullptr);
      for (auto& [color, ranks] : by_color) {
        std::sort(ranks.begin(), ranks.end());
        std::vector<int> members;
        for (auto [key, r] : ranks) members.push_back(group->members[size_t(r)]);
        auto child = std::make_shared<ThreadGroup>(group->family, members, false);
        for (size_t i = 0; i < ranks.size(); ++i) {
          const int r = ranks[i].second;
          slot.split_result[size_t(r)] =
              std::make_shared<ThreadCommunicator>(child, int(i), slot.parts[size_t(r)]->timeout);
        }
      }
      break;
    }
  }
}

// ---- Work handles ---------------------------------------------------------------

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool completed() override { return true; }
};

class CollectiveWork final : public Work {
 public:
  CollectiveWork(std::shared_ptr<ThreadGroup> group, std::shared_ptr<Slot> slot, std::string what, int rank,
                 Clock::time_point issued, std::chrono::milliseconds timeout)
      : group_(std::move(group)),
        slot_(std::move(slot)),
        what_(std::move(what)),
        rank_(rank),
        deadline_(issued + timeout),
        timeout_(timeout) {}

  void wait() override {
    std::unique_lock lock(group_->family->mu);
    group_->wait(
        lock, what_, rank_, deadline_, timeout_, [&] { return slot_->done; },
        [&] {
          std::vector<int> absent;
          for (int r = 0; r < group_->size(); ++r)
            if (!slot_->parts[size_t(r)]) absent.push_back(r);
          return absent;
        });
    if (!slot_->error.empty()) FRUGAL_FAIL(what_, ": ", slot_->error);
  }
  bool completed() override {
    std::lock_guard lock(group_->family->mu);
    return slot_->done;
  }
  const Slot& slot() const { return *slot_; }

 private:
  std::shared_ptr<ThreadGroup> group_;
  std::shared_ptr<Slot> slot_;
  std::string what_;
  int rank_;
  Clock::time_point deadline_;
  std::chrono::milliseconds timeout_;
};

class RecvWork final : public Work {
 public:
  RecvWork(std::shared_ptr<ThreadGroup> group, std::shared_ptr<RecvSlot> slot, std::string what, int rank, int peer,
           Clock::time_point issued, std::chrono::milliseconds timeout)
      : group_(std::move(group)),
        slot_(std::move(slot)),
        what_(std::move(what)),
        rank_(rank),
        peer_(peer),
        deadline_(issued + timeout),
        timeout_(timeout) {}

  void wait() override {
    std::unique_lock lock(group_->family->mu);
    group_->wait(
        lock, what_, rank_, deadline_, timeout_, [&] { return slot_->done; }, [&] { return std::vector<int>{peer_}; });
    if (!slot_->error.empty()) FRUGAL_FAIL(what_, ": ", slot_->error);
  }
  bool completed() override {
    std::lock_guard lock(group_->family->mu);
    return slot_->done;
  }

 private:
  std::shared_ptr<ThreadGroup> group_;
  std::shared_ptr<RecvSlot> slot_;
  std::string what_;
  int rank_, peer_;
  Clock::time_point deadline_;
  std::chrono::milliseconds timeout_;
};

// Copies a message into the tensor a recv was posted with (lock held).
void deliver(RecvSlot& slot, const Tensor& message) {
  if (message.dtype() != slot.tensor.dtype() || message.numel() != slot.tensor.numel())
    slot.error =
        str_cat("the matching send carried ", message.describe(), " but recv was given ", slot.tensor.describe());
  else write_into(slot.tensor, message.view(slot.tensor.sizes()));
  slot.done = true;
}

void check_cpu(const char* op, const Tensor& t) {
  FRUGAL_CHECK(t.defined(), "threads ", op, ": undefined tensor");
  FRUGAL_CHECK(t.device().is_cpu(), "threads ", op, ": the in-process backend works on CPU tensors, got ",
               t.describe());
}

}  // namespace

// ---- ThreadCommunicator ----------------------------------------------------------

ThreadCommunicator::ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank, std::chrono::milliseconds timeout)
    : group_(std::move(group)), rank_(rank), timeout_(timeout) {}

int ThreadCommunicator::size() const { return group_->size(); }

namespace {

// Adds this rank's part to collective `seq`; the last rank to arrive computes it.
std::shared_ptr<CollectiveWork> issue(const std::shared_ptr<ThreadGroup>& group, int rank, uint64_t seq, Part part) {
  const auto issued = Clock::now();
  const std::string what = describe_op(part.kind, seq, group->label(rank));
  const auto timeout = part.timeout;
  Family& family = *group->family;
  std::shared_ptr<Slot> slot;
  bool last = false;
  {
    std::lock_guard lock(family.mu);
    group->check_healthy(what);
    auto& open = group->open[seq];
    if (!open) open = std::make_shared<Slot>(group->size());
    slot = open;
    slot->parts[size_t(rank)] = std::move(part);
    last = ++slot->arrived == group->size();
    if (last) group->open.erase(seq);
  }
  if (last) {
    std::string error;
    try {
      compute(*slot, group);
    } catch (const std::exception& e) { error = e.what(); }
    std::lock_guard lock(family.mu);
    slot->error = error;
    slot->done = true;
    family.cv.notify_all();
  }
  return std::make_shared<CollectiveWork>(group, slot, what, rank, issued, timeout);
}

}  // namespace

std::shared_ptr<Work> ThreadCommunicator::all_reduce(const Tensor& tensor, ReduceOp op) {
  check_cpu("all_reduce", tensor);
  Part part(OpKind::AllReduce, timeout_);
  part.input = tensor, part.reduce = op;
  return issue(group_, rank_, next_seq_++, std::move(part));
}

std::shared_ptr<Work> ThreadCommunicator::all_gather(const Tensor& input, const Tensor& output) {
  check_cpu("all_gather", input);
  check_cpu("all_gather", output);
  FRUGAL_CHECK(output.is_contiguous() && output.numel() == size() * input.numel() && output.dtype() == input.dtype(),
               "threads all_gather: output must be contiguous with ", size(),
               " x input's elements and its dtype; got input ", input.describe(), ", output ", output.describe());
  Part part(OpKind::AllGather, timeout_);
  part.input = input, part.output = output;
  return issue(group_, rank_, next_seq_++, std::move(part));
}

std::shared_ptr<Work> ThreadCommunicator::reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op) {
  check_cpu("reduce_scatter", input);
  check_cpu("reduce_scatter", output);
  FRUGAL_CHECK(input.numel() % size() == 0 && output.is_contiguous() && output.numel() == input.numel() / size() &&
                   output.dtype() == input.dtype(),
               "threads reduce_scatter: input's elements must split into ", size(),
               " chunks and output must be one contiguous chunk of its dtype; got input ", input.describe(),
               ", output ", output.describe());
  Part part(OpKind::ReduceScatter, timeout_);
  part.input = input, part.output = output, part.reduce = op;
  return issue(group_, rank_, next_seq_++, std::move(part));
}

std::shared_ptr<Work> ThreadCommunicator::broadcast(const Tensor& tensor, int root) {
  check_cpu("broadcast", tensor);
  FRUGAL_CHECK(root >= 0 && root < size(), "threads broadcast: root ", root, " out of range for ", size(), " ranks");
  Part part(OpKind::Broadcast, timeout_);
  part.input = tensor, part.root = root;
  return issue(group_, rank_, next_seq_++, std::move(part));
}

void ThreadCommunicator::barrier() { issue(group_, rank_, next_seq_++, Part(OpKind::Barrier, timeout_))->wait(); }

std::shared_ptr<Communicator> ThreadCommunicator::split(int color, int key) {
  Part part(OpKind::Split, timeout_);
  part.color = color, part.key = key;
  auto work = issue(group_, rank_, next_seq_++, std::move(part));
  work->wait();
  return work->slot().split_result[size_t(rank_)];
}

std::shared_ptr<Work> ThreadCommunicator::send(const Tensor& tensor, int peer) {
  check_cpu("send", tensor);
  FRUGAL_CHECK(peer >= 0 && peer < size() && peer != rank_, "threads send on ", group_->label(rank_), ": bad peer ",
               peer, " (", size(), " ranks)");
  const Tensor message = tensor.clone();  // send completes now: the caller may reuse `tensor`
  std::lock_guard lock(group_->family->mu);
  Channel& ch = group_->channel(rank_, peer);
  const uint64_t index = ch.sent++;
  group_->check_healthy(str_cat("threads send #", index + 1, " to rank ", peer, " on ", group_->label(rank_)));
  if (auto it = ch.waiting.find(index); it != ch.waiting.end()) {
    deliver(*it->second, message);
    ch.waiting.erase(it);
    group_->family->cv.notify_all();
  } else {
    ch.unclaimed.emplace(index, message);
  }
  return std::make_shared<DoneWork>();
}

std::shared_ptr<Work> ThreadCommunicator::recv(const Tensor& tensor, int peer) {
  check_cpu("recv", tensor);
  FRUGAL_CHECK(peer >= 0 && peer < size() && peer != rank_, "threads recv on ", group_->label(rank_), ": bad peer ",
               peer, " (", size(), " ranks)");
  const auto issued = Clock::now();
  auto slot = std::make_shared<RecvSlot>();
  slot->tensor = tensor;
  std::lock_guard lock(group_->family->mu);
  Channel& ch = group_->channel(peer, rank_);
  const uint64_t index = ch.posted++;
  const std::string what = str_cat("threads recv #", index + 1, " from rank ", peer, " on ", group_->label(rank_));
  if (auto it = ch.unclaimed.find(index); it != ch.unclaimed.end()) {
    deliver(*slot, it->second);
    ch.unclaimed.erase(it);
  } else {
    group_->check_healthy(what);
    ch.waiting.emplace(index, slot);
  }
  return std::make_shared<RecvWork>(group_, slot, what, rank_, peer, issued, timeout_);
}

void ThreadCommunicator::mark_failed(const std::string& what) {
  std::lock_guard lock(group_->family->mu);
  group_->family->fail(group_->members[size_t(rank_)], what);
}

void ThreadCommunicator::mark_exited() {
  std::lock_guard lock(group_->family->mu);
  group_->family->exited[size_t(group_->members[size_t(rank_)])] = true;
  group_->family->cv.notify_all();
}

int ThreadCommunicator::first_failed_rank() const {
  std::lock_guard lock(group_->family->mu);
  return group_->family->failed_rank;
}

// ---- factories and the runner ------------------------------------------------------

std::vector<std::shared_ptr<ThreadCommunicator>> make_thread_communicators(int n, std::chrono::milliseconds timeout) {
  FRUGAL_CHECK(n >= 1, "make_thread_communicators: need at least one rank, got ", n);
  std::vector<int> members(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) members[size_t(r)] = r;
  auto group = std::make_shared<ThreadGroup>(std::make_shared<Family>(n), members, true);
  std::vector<std::shared_ptr<ThreadCommunicator>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(std::make_shared<ThreadCommunicator>(group, r, timeout));
  return comms;
}

void run_ranks(int n, const std::function<void(const std::shared_ptr<Communicator>&)>& fn,
               std::chrono::milliseconds timeout) {
  auto comms = make_thread_communicators(n, timeout);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::string> messages(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      const auto& comm = comms[size_t(r)];
      try {
        fn(comm);
      } catch (const std::exception& e) {
        errors[size_t(r)] = std::current_exception();
        messages[size_t(r)] = e.what();
        comm->mark_failed(e.what());
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
        messages[size_t(r)] = "a non-standard exception";
        comm->mark_failed(messages[size_t(r)]);
      }
      comm->mark_exited();
    });
  }
  for (auto& t : threads) t.join();
  // Report the root cause: the rank that failed first, not those that failed because of it.
  int first = comms[0]->first_failed_rank();
  if (first < 0 || !errors[size_t(first)]) {
    first = -1;
    for (int r = 0; r < n && first < 0; ++r)
      if (errors[size_t(r)]) first = r;
  }
  if (first < 0) return;
  try {
    std::rethrow_exception(errors[size_t(first)]);
  } catch (const std::exception&) {
    throw Error(str_cat("run_ranks: rank ", first, " failed: ", messages[size_t(first)]));
  }
  // Anything else (a test framework's own exception) propagates unchanged.
}

void run_ranks(int n, const std::function<void(Communicator&)>& fn, std::chrono::milliseconds timeout) {
  run_ranks(n, std::function<void(const std::shared_ptr<Communicator>&)>([&](const std::shared_ptr<Communicator>& c) {
              fn(*c);
            }),
            timeout);
}

}  // namespace frugal::parallel
