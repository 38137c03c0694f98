#include "profiler/session.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <tuple>

#include "core/error.h"
#include "nn/module.h"
#include "optim/optimizer.h"

namespace frugal::profiler {

namespace {

constexpr const char* kBeforeStart = "(before start)";

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const void* storage_data(const Tensor& t) { return t.defined() ? t.impl().storage->data.get() : nullptr; }

void write_file(const std::string& path, const std::string& text, const char* what) {
  std::ofstream out(path, std::ios::binary);
  FRUGAL_CHECK(out.good(), "profiler: cannot open '", path, "' to write the ", what);
  out << text;
  FRUGAL_CHECK(out.good(), "profiler: writing the ", what, " to '", path, "' failed");
}

}  // namespace

Session::Session(Options options) : options_(options) {}

Session::~Session() {
  if (!running_) return;
  try {
    stop();
  } catch (...) {  // a destructor must not throw; the results are lost
  }
}

void Session::attach(const nn::Module& model, const std::string& name) {
  module_names_[&model] = name.empty() ? std::string("(").append(model.type_name()).append(")") : name;
  const std::string prefix = name.empty() ? "" : name + ".";
  // A module used at several places (one ReLU object in two blocks) keeps its first path,
  // as torch's named_modules() lists it: one pointer cannot tell its call sites apart.
  for (const auto& [path, m] : model.named_modules()) module_names_.try_emplace(m.get(), prefix + path);
  // Each tensor's owner is its innermost module: named_* list a parent's own entries
  // before its children's, so a later (deeper) name overwrites.
  auto owner_of = [&](const std::string& key) -> const void* {
    const size_t dot = key.rfind('.');
    if (dot == std::string::npos) return &model;
    for (const auto& [path, m] : model.named_modules())
      if (path == key.substr(0, dot)) return m.get();
    return &model;
  };
  for (const auto& [key, p] : model.named_parameters()) {
    const void* owner = owner_of(key);
    if (const void* d = storage_data(p)) known_blocks_[d] = KnownBlock::of(p, core::Category::Parameters, owner);
    if (const void* g = storage_data(p.grad()))
      known_blocks_[g] = KnownBlock::of(p.grad(), core::Category::Gradients, owner);
  }
  for (const auto& [key, b] : model.named_buffers())
    if (const void* d = storage_data(b))
      known_blocks_[d] = KnownBlock::of(b, core::Category::Parameters, owner_of(key));
}

void Session::attach(const optim::Optimizer& optimizer) {
  for (const auto& [key, t] : optimizer.state_dict())
    if (key.rfind("state.", 0) == 0)
      if (const void* d = storage_data(t))
        known_blocks_[d] = KnownBlock::of(t, core::Category::OptimizerState, nullptr);
}

void Session::start() {
  FRUGAL_CHECK(!running_, "profiler: start() while the session is already running");
  FRUGAL_CHECK(options_.trace_capacity > 0,
               "profiler: Options::trace_capacity must be positive (the allocator events the session keeps), got 0");
  events_.clear();
  ring_peak_.reset();
  ops_.clear();
  timeline_.clear();
  at_peak_.clear();
  owners_at_stop_.clear();
  lost_events_ = 0;
  // The start time first: an op another thread opens once recording began must not start
  // before the session (enable_trace below takes a while).
  const int64_t start_ns = now_ns();
  core::begin_recording(options_.device, options_.time_ops);  // first: it refuses a second session
  // Trace on before the snapshot: a block another thread allocates in between is then
  // in both, which the replay tolerates, rather than in neither.
  try {
    memory::enable_trace(options_.device, options_.trace_capacity);
  } catch (...) {
    core::end_recording();
    throw;
  }
  start_snapshot_ = memory::snapshot(options_.device);
  const memory::MemoryStats s = memory::stats(options_.device);
  start_allocated_ = s.allocated_bytes.current;
  start_reserved_ = s.reserved_bytes.current;
  start_ns_ = start_ns;
  running_ = true;
}

void Session::stop() {
  FRUGAL_CHECK(running_, "profiler: stop() without start()");
  running_ = false;
  ops_ = core::end_recording();  // synchronizes the device first
  stop_ns_ = now_ns();
  events_ = memory::trace_events(options_.device);
  ring_peak_ = memory::trace_peak(options_.device);
  memory::disable_trace(options_.device);
  for (memory::TraceEvent& e : events_)  // copies of the op names, so the reports outlive them
    if (e.op && *e.op) e.op = core::intern(e.op);
  final_snapshot_ = memory::snapshot(options_.device);
  analyse();
}

std::string Session::module_name(const void* module) const {
  if (!module) return "";
  auto it = module_names_.find(module);
  if (it != module_names_.end()) return it->second;
  char buf[40];
  std::snprintf(buf, sizeof buf, "module@%p", module);
  return buf;
}

std::string Session::op_label(const char* op) const {
  if (op == nullptr || *op == '\0') return "(outside ops)";
  return op;
}

Session::LiveMap Session::initial_live() const {
  LiveMap live;
  for (const memory::SegmentInfo& seg : start_snapshot_)
    for (const memory::BlockInfo& b : seg.blocks) {
      if (b.state != memory::BlockState::Allocated) continue;
      Live l{static_cast<int64_t>(b.size), core::Category::Other, kBeforeStart, nullptr};
      if (auto it = known_blocks_.find(b.ptr); it != known_blocks_.end()) {
        const std::shared_ptr<Storage> storage = it->second.storage.lock();
        if (storage && storage->data.get() == b.ptr) {  // not a dead tensor's block handed on
          l.category = it->second.category;
          l.module = it->second.module;
        }
      }
      live[b.ptr] = l;
    }
  return live;
}

// See Note [Replaying the trace]. Replays events [0, until) over `live`.
void Session::replay(const LiveMap& initial, size_t until, LiveMap& live, std::vector<TimelinePoint>* timeline) const {
  live = initial;
  std::array<int64_t, core::kNumCategories> by_category{};
  for (const auto& [ptr, l] : live) by_category[static_cast<size_t>(l.category)] += l.size;
  // After an overflow the replay starts from nothing (the events that made the blocks then
  // live are lost): what a point's categories miss of its allocated bytes is "other".
  const auto point = [&](int64_t time_ns, int64_t allocated, int64_t reserved) {
    TimelinePoint p{time_ns, allocated, reserved, by_category};
    if (lost_events_ > 0) {
      int64_t known = 0;
      for (int64_t b : by_category) known += b;
      p.by_category[static_cast<size_t>(core::Category::Other)] += std::max<int64_t>(allocated - known, 0);
    }
    return p;
  };
  if (timeline) timeline->push_back(point(start_ns_, start_allocated_, start_reserved_));
  for (size_t i = 0; i < until && i < events_.size(); ++i) {
    const memory::TraceEvent& e = events_[i];
    switch (e.action) {
      case memory::TraceAction::Alloc: {
        Live& l = live[e.ptr];
        if (l.size) by_category[static_cast<size_t>(l.category)] -= l.size;  // seen twice (see start())
        l = Live{static_cast<int64_t>(e.size), e.category, e.op, e.module};
        by_category[static_cast<size_t>(l.category)] += l.size;
        break;
      }
      case memory::TraceAction::Free:
        if (auto it = live.find(e.ptr); it != live.end()) {
          by_category[static_cast<size_t>(it->second.category)] -= it->second.size;
          live.erase(it);
        }
        break;
      case memory::TraceAction::Relabel:
        if (auto it = live.find(e.ptr); it != live.end()) {
          by_category[static_cast<size_t>(it->second.category)] -= it->second.size;
          it->second.category = e.category;
          by_category[static_cast<size_t>(e.category)] += it->second.size;
        }
        break;
      default: break;  // segments and OOMs change no block
    }
    if (timeline) timeline->push_back(point(e.time_ns, e.allocated_bytes, e.reserved_bytes));
  }
}

void Session::analyse() {
  lost_events_ = events_.empty() ? 0 : events_.front().seq;
  // The peak: the first event with the most allocated bytes (or the start, if nothing grew).
  size_t peak_until = 0;  // events replayed to reach the peak state
  peak_allocated_ = start_allocated_;
  peak_time_ns_ = start_ns_;
  for (size_t i = 0; i < events_.size(); ++i)
    if (events_[i].allocated_bytes > peak_allocated_) {
      peak_allocated_ = events_[i].allocated_bytes;
      peak_time_ns_ = events_[i].time_ns;
      peak_until = i + 1;
    }
  if (ring_peak_ && ring_peak_->allocated_bytes > peak_allocated_) {  // Note [The peak outlives the ring]
    peak_allocated_ = ring_peak_->allocated_bytes;
    peak_time_ns_ = ring_peak_->time_ns;
    peak_until = 0;  // with an empty initial set (events were lost): all of it is "(trace overflow)"
  }

  const LiveMap initial = lost_events_ ? LiveMap{} : initial_live();
  LiveMap live;
  replay(initial, events_.size(), live, &timeline_);
  for (const auto& [ptr, l] : live)
    owners_at_stop_[ptr] = BlockOwner{op_label(l.op), module_name(l.module), l.category};

  replay(initial, peak_until, live, nullptr);
  std::map<std::tuple<std::string, std::string, core::Category>, AllocationGroup> groups;
  int64_t sum = 0;
  for (const auto& [ptr, l] : live) {
    std::string op = op_label(l.op), module = module_name(l.module);
    AllocationGroup& g = groups[{op, module, l.category}];
    if (g.blocks == 0) g = AllocationGroup{op, module, l.category, 0, 0};
    g.bytes += l.size;
    ++g.blocks;
    sum += l.size;
  }
  for (auto& [key, g] : groups) at_peak_.push_back(std::move(g));
  if (sum != peak_allocated_)  // only after an overflow (or blocks allocated during start())
    at_peak_.push_back(AllocationGroup{"(trace overflow)", "", core::Category::Other, peak_allocated_ - sum, 0});
  std::stable_sort(at_peak_.begin(), at_peak_.end(),
                   [](const AllocationGroup& a, const AllocationGroup& b) { return a.bytes > b.bytes; });
}

std::array<int64_t, core::kNumCategories> Session::category_bytes_at_peak() const {
  std::array<int64_t, core::kNumCategories> out{};
  for (const AllocationGroup& g : at_peak_) out[static_cast<size_t>(g.category)] += g.bytes;
  return out;
}

std::vector<OpTime> Session::op_times() const {
  // Self time: an op's duration less its direct children's. Records are in start order,
  // so a per-thread stack of open records finds each one's parent.
  std::vector<double> self_ms(ops_.size());
  std::map<uint32_t, std::vector<size_t>> open;  // by thread
  for (size_t i = 0; i < ops_.size(); ++i) {
    const core::OpRecord& r = ops_[i];
    self_ms[i] = static_cast<double>(r.end_ns - r.start_ns) / 1e6;
    std::vector<size_t>& stack = open[r.thread];
    while (!stack.empty() && ops_[stack.back()].end_ns <= r.start_ns) stack.pop_back();
    if (!stack.empty() && r.depth > ops_[stack.back()].depth) self_ms[stack.back()] -= self_ms[i];
    stack.push_back(i);
  }
  std::map<std::string, OpTime> by_op;
  for (size_t i = 0; i < ops_.size(); ++i) {
    const core::OpRecord& r = ops_[i];
    OpTime& t = by_op[r.op];
    if (t.calls == 0) t = OpTime{r.op, 0, 0.0, 0.0, -1.0};
    ++t.calls;
    t.total_ms += static_cast<double>(r.end_ns - r.start_ns) / 1e6;
    t.self_ms += self_ms[i];
    if (r.device_ms >= 0) t.device_total_ms = std::max(t.device_total_ms, 0.0) + r.device_ms;
  }
  std::vector<OpTime> out;
  for (auto& [name, t] : by_op) out.push_back(std::move(t));
  std::stable_sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.self_ms > b.self_ms; });
  return out;
}

std::string Session::report(size_t top_n) const {
  return top_allocations_table(top_n) + "\n" + op_time_table() + "\n" + snapshot_text();
}

void Session::write_chrome_trace(const std::string& path) const { write_file(path, chrome_trace(), "Chrome trace"); }
void Session::write_timeline_svg(const std::string& path) const { write_file(path, timeline_svg(), "timeline SVG"); }

void Session::write_files(const std::string& dir) const {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  FRUGAL_CHECK(!error, "profiler: cannot make the folder '", dir, "' for the trace and timeline: ", error.message());
  write_chrome_trace(dir + "/trace.json");
  write_timeline_svg(dir + "/timeline.svg");
}

}  // namespace frugal::profiler
