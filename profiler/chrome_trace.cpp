// Session::chrome_trace: the Trace Event Format that Perfetto and chrome://tracing
// open. Times are microseconds since start(). Process 0 holds the host threads'
// op spans and the memory counters; on CUDA, process 1 holds the same ops as the
// device executed them (from the CUDA events).
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <string_view>

#include "core/json.h"
#include "profiler/session.h"

namespace frugal::profiler {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// "forward", "backward" or "optimizer": Perfetto colours and filters by it.
const char* phase_of(const core::OpRecord& r) {
  if (r.category == core::Category::OptimizerState) return "optimizer";
  const std::string_view op = r.op;
  if (ends_with(op, "Backward") || op == "AccumulateGrad" || op == "backward") return "backward";
  return "forward";
}

class Writer {
 public:
  explicit Writer(int64_t origin_ns) : origin_ns_(origin_ns) {
    out_ = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [";
  }

  // Opens one event object; the caller appends ", \"args\": {...}" pieces and calls end().
  void begin(const std::string& name, const char* ph, double ts_us, int pid, uint32_t tid) {
    out_ += first_ ? "\n" : ",\n";
    first_ = false;
    char buf[160];
    out_ += "{\"name\": " + json::quote(name);
    std::snprintf(buf, sizeof buf, ", \"ph\": \"%s\", \"ts\": %.3f, \"pid\": %d, \"tid\": %u", ph, ts_us, pid, tid);
    out_ += buf;
  }
  void raw(std::string_view s) { out_ += s; }
  void end() { out_ += "}"; }
  double us(int64_t ns) const { return static_cast<double>(ns - origin_ns_) / 1e3; }
  std::string finish() { return out_ + "\n]}\n"; }

 private:
  std::string out_;
  bool first_ = true;
  int64_t origin_ns_;
};

void append_number(Writer& w, const char* key, double v, bool first = false) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s\"%s\": %.6g", first ? "" : ", ", key, v);
  w.raw(buf);
}

void append_int(Writer& w, const char* key, int64_t v, bool first = false) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s\"%s\": %" PRId64, first ? "" : ", ", key, v);
  w.raw(buf);
}

}  // namespace

std::string Session::chrome_trace() const {
  Writer w(start_ns_);
  const bool device_track = std::any_of(ops_.begin(), ops_.end(), [](const auto& r) { return r.device_start_ms >= 0; });

  w.begin("process_name", "M", 0, 0, 0);
  w.raw(", \"args\": {\"name\": " + json::quote("host (" + options_.device.str() + " profile)") + "}");
  w.end();
  if (device_track) {
    w.begin("process_name", "M", 0, 1, 0);
    w.raw(", \"args\": {\"name\": " + json::quote(options_.device.str() + " device time (CUDA events)") + "}");
    w.end();
  }

  for (const core::OpRecord& r : ops_) {
    const std::string module = module_name(r.module);
    auto args = [&](double device_ms) {
      w.raw(", \"cat\": \"");
      w.raw(phase_of(r));
      w.raw("\", \"args\": {\"module\": " + json::quote(module));
      append_int(w, "depth", r.depth);
      if (device_ms >= 0) append_number(w, "device_ms", device_ms);
      w.raw("}");
    };
    w.begin(r.op, "X", w.us(r.start_ns), 0, r.thread);
    append_number(w, "dur", static_cast<double>(r.end_ns - r.start_ns) / 1e3);
    args(r.device_ms);
    w.end();
    if (r.device_start_ms >= 0 && r.device_ms >= 0) {  // the device's view, on its own track
      w.begin(r.op, "X", r.device_start_ms * 1e3, 1, r.thread);
      append_number(w, "dur", r.device_ms * 1e3);
      args(r.device_ms);
      w.end();
    }
  }

  // Counters: one track each for allocated and reserved bytes, and a stacked track of
  // the bytes by category (the timeline picture's areas).
  auto counters = [&](const TimelinePoint& p) {
    w.begin("allocated bytes", "C", w.us(p.time_ns), 0, 0);
    w.raw(", \"args\": {");
    append_int(w, "allocated", p.allocated, true);
    w.raw("}");
    w.end();
    w.begin("reserved bytes", "C", w.us(p.time_ns), 0, 0);
    w.raw(", \"args\": {");
    append_int(w, "reserved", p.reserved, true);
    w.raw("}");
    w.end();
    w.begin("bytes by category", "C", w.us(p.time_ns), 0, 0);
    w.raw(", \"args\": {");
    for (int c = 1; c < core::kNumCategories; ++c)
      append_int(w, core::to_string(static_cast<core::Category>(c)), p.by_category[static_cast<size_t>(c)], c == 1);
    w.raw("}");
    w.end();
  };
  for (const TimelinePoint& p : timeline_) counters(p);

  for (const memory::TraceEvent& e : events_) {
    if (e.action != memory::TraceAction::Oom) continue;
    w.begin("out of memory", "i", w.us(e.time_ns), 0, 0);
    w.raw(", \"s\": \"g\", \"args\": {");
    append_int(w, "requested", static_cast<int64_t>(e.requested), true);
    append_int(w, "segment", static_cast<int64_t>(e.size));
    append_int(w, "allocated", e.allocated_bytes);
    append_int(w, "reserved", e.reserved_bytes);
    w.raw(", \"op\": " + json::quote(op_label(e.op)) + ", \"module\": " + json::quote(module_name(e.module)) + "}");
    w.end();
  }
  return w.finish();
}

}  // namespace frugal::profiler
