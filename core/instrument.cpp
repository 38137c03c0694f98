// The thread-local attribution state (op, module, category) and the op recorder
// behind profiler sessions. See Note [Zero-cost attribution] in core/instrument.h.
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "core/instrument.h"
#include "core/stream.h"

namespace frugal::core {
namespace {

thread_local const char* current_op = "";
thread_local const void* current_module = nullptr;
thread_local Category current_category = Category::Unset;
thread_local int32_t recorded_depth = 0;  // recorded OpScopes open on this thread

std::atomic<bool> recording_on{false};
std::atomic<uint32_t> next_thread_number{0};

uint32_t thread_number() {
  thread_local const uint32_t number = next_thread_number.fetch_add(1, std::memory_order_relaxed);
  return number;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Everything a recording holds, under one mutex: OpScopes on several threads append
// to the same list (a recording is a debugging tool; contention is acceptable).
struct Recorder {
  std::mutex mutex;
  uint64_t id = 0;  // bumped per recording, so a scope opened in an earlier one is ignored
  Device device = kCPU;
  bool time_on_device = false;
  void* origin_event = nullptr;
  std::vector<OpRecord> records;
  std::vector<std::pair<void*, void*>> events;  // per record: CUDA start and end events
  std::unordered_map<uint64_t, const void*> node_modules;
};

// Leaked on purpose: OpScopes may close during static destruction.
Recorder& recorder() {
  static auto* r = new Recorder;
  return *r;
}

}  // namespace

// ---- OpScope ------------------------------------------------------------------------

OpScope::OpScope(const char* name) noexcept : outer_(current_op) {
  current_op = name;
  if (!recording_on.load(std::memory_order_relaxed)) return;
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  if (!recording_on.load(std::memory_order_relaxed)) return;
  void* start_event = nullptr;
  try {  // what may throw, first: a failure loses this op's record, never the op
    if (r.records.size() == r.records.capacity()) {
      r.records.reserve(2 * r.records.size() + 256);
      r.events.reserve(r.records.capacity());
    }
    if (r.time_on_device) start_event = record_timing_event(r.device);
  } catch (...) { return; }
  record_ = static_cast<int64_t>(r.records.size());
  recording_ = r.id;
  r.records.push_back(
      OpRecord{name, current_module, current_category, thread_number(), recorded_depth, now_ns(), 0, -1.0, -1.0});
  r.events.emplace_back(start_event, nullptr);
  ++recorded_depth;
}

OpScope::~OpScope() {
  current_op = outer_;
  if (record_ < 0) return;
  --recorded_depth;
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  if (!recording_on.load(std::memory_order_relaxed) || r.id != recording_) return;
  const auto i = static_cast<size_t>(record_);
  r.records[i].end_ns = now_ns();
  if (r.events[i].first) {
    try {
      r.events[i].second = record_timing_event(r.device);
    } catch (...) {  // leaves this op without a device time
    }
  }
}

const char* OpScope::current() noexcept { return current_op; }

// ---- Categories and modules -----------------------------------------------------------

const char* to_string(Category category) {
  switch (category) {
    case Category::Unset: return "unset";
    case Category::Parameters: return "parameters";
    case Category::Gradients: return "gradients";
    case Category::OptimizerState: return "optimizer_state";
    case Category::Activations: return "activations";
    case Category::Workspace: return "workspace";
    case Category::Other: return "other";
  }
  return "unknown";
}

CategoryScope::CategoryScope(Category category) noexcept : outer_(current_category) { current_category = category; }
CategoryScope::~CategoryScope() { current_category = outer_; }
Category CategoryScope::current() noexcept { return current_category; }

Category effective_category() noexcept {
  if (current_category != Category::Unset) return current_category;
  return *current_op || current_module ? Category::Activations : Category::Other;
}

ModuleScope::ModuleScope(const void* module) noexcept : outer_(current_module) { current_module = module; }
ModuleScope::~ModuleScope() { current_module = outer_; }
const void* ModuleScope::current() noexcept { return current_module; }

bool profiling() noexcept { return recording_on.load(std::memory_order_relaxed); }

// ---- Recording ----------------------------------------------------------------------

void begin_recording(Device device, bool time_ops) {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  FRUGAL_CHECK(!recording_on.load(), "profiler: a recording is already running in this process; stop it first");
  ++r.id;
  r.device = device;
  r.time_on_device = time_ops && device.is_cuda();
  r.records.clear();
  r.events.clear();
  r.node_modules.clear();
  r.origin_event = r.time_on_device ? record_timing_event(device) : nullptr;
  recording_on.store(true);
}

std::vector<OpRecord> end_recording() {
  Recorder& r = recorder();
  std::unique_lock lock(r.mutex);
  FRUGAL_CHECK(recording_on.load(), "profiler: no recording is running");
  recording_on.store(false);
  const int64_t end = now_ns();
  std::vector<OpRecord> records = std::move(r.records);
  std::vector<std::pair<void*, void*>> events = std::move(r.events);
  void* origin = r.origin_event;
  r.records.clear();
  r.events.clear();
  r.node_modules.clear();
  r.origin_event = nullptr;
  const Device device = r.device;
  lock.unlock();

  for (OpRecord& rec : records) {
    if (rec.end_ns == 0) rec.end_ns = end;  // still open: ran until the end
    rec.op = intern(rec.op);                // a copy: the reports outlive the scope's name
  }
  if (origin) {
    // Every recorded event has completed after this. A raw device sync: stopping the
    // profiler is no place for a deferred index error (Note [Deferred index checks]).
    cuda_synchronize(device.index);
    for (size_t i = 0; i < records.size(); ++i) {
      auto [start, stop] = events[i];
      if (start) records[i].device_start_ms = timing_event_elapsed_ms(origin, start);
      if (start && stop) records[i].device_ms = timing_event_elapsed_ms(start, stop);
      if (start) release_timing_event(start);
      if (stop) release_timing_event(stop);
    }
    release_timing_event(origin);
  }
  return records;
}

void note_node_module(uint64_t sequence_nr) {
  if (!profiling() || current_module == nullptr) return;
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  r.node_modules[sequence_nr] = current_module;
}

const void* node_module(uint64_t sequence_nr) {
  Recorder& r = recorder();
  std::lock_guard lock(r.mutex);
  auto it = r.node_modules.find(sequence_nr);
  return it == r.node_modules.end() ? nullptr : it->second;
}

const char* intern(std::string_view name) {
  static std::mutex mutex;
  static auto* names = new std::unordered_set<std::string>;  // leaked: pointers into it outlive statics
  std::lock_guard lock(mutex);
  return names->emplace(name).first->c_str();
}

}  // namespace frugal::core
