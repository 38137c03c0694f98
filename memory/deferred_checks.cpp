// The registry of deferred checks (Note [Deferred index checks] in deferred_checks.h).
#include "memory/deferred_checks.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "memory/allocator.h"
#include "memory/pinned.h"

namespace frugal::memory {

namespace {

constexpr size_t kRecordWords = 3;     // flag, value, position
constexpr size_t kSlotsPerChunk = 64;  // slots come in pinned blocks of this many

std::atomic<bool>& sync_flag() {
  static std::atomic<bool> flag = [] {
    const char* env = std::getenv("FRUGAL_SYNC_INDEX_CHECKS");
    return env != nullptr && std::strcmp(env, "") != 0 && std::strcmp(env, "0") != 0;
  }();
  return flag;
}

// One registry per CUDA device, created together on first use and never destroyed
// (pending checks may be resolved during exit). Creating them installs resolve_checks
// as synchronize's hook (core/stream.h): before that no check can be pending.
detail::PendingChecks& registry(Device device) {
  static const std::vector<detail::PendingChecks*> all = [] {
    std::vector<detail::PendingChecks*> v;
    for (int i = 0; i < cuda_device_count(); ++i)
      v.push_back(new detail::PendingChecks(cuda(i).str(), detail::make_cuda_check_transport(i)));
    core::set_synchronize_hook(&resolve_checks);
    return v;
  }();
  FRUGAL_CHECK(device.is_cuda() && device.index >= 0 && size_t(device.index) < all.size(),
               "deferred checks: no CUDA device ", device.str(), " (this process sees ", all.size(), ")");
  return *all[size_t(device.index)];
}

}  // namespace

bool sync_checks() { return sync_flag().load(std::memory_order_relaxed); }
void set_sync_checks(bool on) { sync_flag().store(on, std::memory_order_relaxed); }

void defer_check(Stream stream, const void* record, CheckMessage message) {
  if (core::GraphCapture* capture = core::current_graph_capture())
    return registry(stream.device).add_captured(*capture, stream, record, std::move(message));
  registry(stream.device).add(stream, record, std::move(message));
}

void resolve_checks(Device device) {
  if (device.is_cpu()) return;
  registry(device).resolve();
}

size_t pending_check_count(Device device) { return device.is_cpu() ? 0 : registry(device).pending(); }
size_t check_slot_count(Device device) { return device.is_cpu() ? 0 : registry(device).slots(); }

namespace detail {

PendingChecks::PendingChecks(std::string device_name, std::unique_ptr<CheckTransport> transport)
    : device_name_(std::move(device_name)), transport_(std::move(transport)) {}

PendingChecks::Slot PendingChecks::take_slot() {
  if (free_.empty()) {
    DataPtr chunk = allocate_pinned(kSlotsPerChunk * kRecordWords * sizeof(int64_t));
    auto* words = static_cast<int64_t*>(chunk.get());
    chunks_.push_back(std::move(chunk));
    for (size_t i = kSlotsPerChunk; i-- > 0;) free_.push_back(Slot{words + i * kRecordWords, nullptr});
  }
  Slot s = free_.back();
  free_.pop_back();
  if (s.event == nullptr) {
    s.event = transport_->create_event();
    ++slots_;
  }
  return s;
}

void PendingChecks::add(Stream stream, const void* record, CheckMessage message) {
  std::string failure;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const Slot s = take_slot();
    try {
      transport_->copy_record(stream, record, s.host, s.event);
    } catch (...) {
      free_.push_back(s);
      throw;
    }
    pending_.push_back(Pending{s, std::move(message)});  // filed first: a throw below cannot lose it
    // Only older checks are retired here: the new one may already be complete (a tiny
    // kernel), but raising it at its own op would make where an error appears depend on timing.
    failure = retire(/*oldest_only=*/true, "at a later index-checked op", /*keep_newest=*/true);
  }
  if (!failure.empty()) throw Error(failure);
}

void PendingChecks::add_captured(core::GraphCapture& capture, Stream stream, const void* record, CheckMessage message) {
  // Allocated on the captured stream: the graph's pool, held by the closure as long as the graph.
  auto copy = std::make_shared<DataPtr>(allocate(stream.device, kRecordWords * sizeof(int64_t), stream));
  transport_->copy_record_on_device(stream, record, copy->get());
  // (This registry lives as long as the process.)
  capture.after_replay.push_back(
      [this, copy, message = std::move(message)](Stream replayed) { add(replayed, copy->get(), message); });
}

void PendingChecks::resolve() {
  std::string failure;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.empty()) return;
    failure = retire(/*oldest_only=*/false, "at a later synchronization", /*keep_newest=*/false);
  }
  if (!failure.empty()) throw Error(failure);
}

std::string PendingChecks::retire(bool oldest_only, const char* where, bool keep_newest) {
  std::string first;
  size_t failed = 0;
  // A count, not an end iterator: erasing from a deque's middle invalidates iterators.
  size_t to_examine = pending_.size() - (keep_newest && !pending_.empty() ? 1 : 0);
  for (auto it = pending_.begin(); to_examine > 0; --to_examine) {
    if (!transport_->completed(it->slot.event)) {
      if (oldest_only) break;
      ++it;
      continue;
    }
    const int64_t* w = it->slot.host;
    if (w[0] != 0 && failed++ == 0) first = it->message(w[1], w[2]);
    free_.push_back(it->slot);
    it = pending_.erase(it);
  }
  if (failed == 0) return first;
  std::string text = first + "  [detected " + where + " with " + device_name_ +
                     ": CUDA index checks are deferred; FRUGAL_SYNC_INDEX_CHECKS=1 or "
                     "ops::set_sync_index_checks(true) raises them at the op]";
  if (failed > 1) text += " (and " + std::to_string(failed - 1) + " more failed index checks)";
  return text;
}

size_t PendingChecks::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

size_t PendingChecks::slots() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_;
}

}  // namespace detail
}  // namespace frugal::memory
