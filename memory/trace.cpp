#include "memory/trace.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "core/instrument.h"
#include "memory/caching_allocator.h"

namespace frugal::memory {

namespace {
thread_local char current_tag[kTraceTagCapacity] = "";

void copy_tag(char (&dst)[kTraceTagCapacity], std::string_view src) {
  size_t n = std::min(src.size(), kTraceTagCapacity - 1);
  std::memcpy(dst, src.data(), n);
  dst[n] = '\0';
}

uintptr_t address(void* p) { return reinterpret_cast<uintptr_t>(p); }

// JSON string escaping for tags (the only free-form field).
void append_json_string(std::string& out, const char* s) {
  out += '"';
  for (; *s; ++s) {
    unsigned char c = static_cast<unsigned char>(*s);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}
}  // namespace

const char* to_string(TraceAction action) {
  switch (action) {
    case TraceAction::Alloc: return "alloc";
    case TraceAction::Free: return "free";
    case TraceAction::SegmentAlloc: return "segment_alloc";
    case TraceAction::SegmentFree: return "segment_free";
    case TraceAction::Oom: return "oom";
    case TraceAction::Relabel: return "relabel";
  }
  return "unknown";
}

TraceTag::TraceTag(std::string_view tag) {
  std::memcpy(outer_, current_tag, kTraceTagCapacity);
  copy_tag(current_tag, tag);
}

TraceTag::~TraceTag() { std::memcpy(current_tag, outer_, kTraceTagCapacity); }

const char* TraceTag::current() { return current_tag; }

void detail::TraceRing::record(TraceEvent event) {
  if (events_.empty()) return;
  event.seq = next_seq_;
  event.time_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  std::memcpy(event.tag, current_tag, kTraceTagCapacity);
  event.op = core::OpScope::current();
  event.module = core::ModuleScope::current();
  // A free reports the category its block held (a .grad freed by zero_grad is a gradient,
  // whatever scope frees it); a block allocated before tracing began gets the scope's.
  if (event.action == TraceAction::Free) {
    const auto it = live_.find(event.ptr);
    event.category = it != live_.end() ? it->second : core::effective_category();
    if (it != live_.end()) live_.erase(it);
  } else if (event.action == TraceAction::Relabel) {
    if (const auto it = live_.find(event.ptr); it != live_.end()) it->second = event.category;
  } else {
    event.category = core::effective_category();
    if (event.action == TraceAction::Alloc) live_[event.ptr] = event.category;
  }
  events_[next_seq_ % events_.size()] = event;
  ++next_seq_;
  if (!peak_ || event.allocated_bytes > peak_->allocated_bytes) peak_ = event;
}

std::vector<TraceEvent> detail::TraceRing::events() const {
  size_t n = std::min<uint64_t>(next_seq_, events_.size());
  std::vector<TraceEvent> out;
  out.reserve(n);
  for (uint64_t seq = next_seq_ - n; seq < next_seq_; ++seq) out.push_back(events_[seq % events_.size()]);
  return out;
}

void enable_trace(Device device, size_t capacity) {
  detail::allocator_for(device, "enable_trace").enable_trace(capacity);
}

void disable_trace(Device device) { detail::allocator_for(device, "disable_trace").enable_trace(0); }

void relabel(Device device, const void* data, core::Category category) {
  if (!core::profiling() || data == nullptr) return;
  detail::allocator_for(device, "relabel").trace_relabel(data, category);
}

std::vector<TraceEvent> trace_events(Device device) {
  return detail::allocator_for(device, "trace_events").trace_events();
}

std::optional<TraceEvent> trace_peak(Device device) { return detail::allocator_for(device, "trace_peak").trace_peak(); }

std::string trace_to_text(const std::vector<TraceEvent>& events) {
  std::string out;
  char line[384];
  std::snprintf(line, sizeof line, "%8s %12s %-13s %12s %12s %18s %12s %12s  %-15s %s / %s\n", "seq", "t_us", "action",
                "size", "requested", "ptr", "allocated", "reserved", "category", "op", "tag");
  out += line;
  int64_t t0 = events.empty() ? 0 : events.front().time_ns;
  for (const TraceEvent& e : events) {
    std::snprintf(line, sizeof line,
                  "%8" PRIu64 " %12.3f %-13s %12zu %12zu   0x%016" PRIxPTR " %12" PRId64 " %12" PRId64
                  "  %-15s %s / %s\n",
                  e.seq, static_cast<double>(e.time_ns - t0) / 1e3, to_string(e.action), e.size, e.requested,
                  address(e.ptr), e.allocated_bytes, e.reserved_bytes, to_string(e.category), e.op ? e.op : "", e.tag);
    out += line;
  }
  return out;
}

std::string trace_to_json(const std::vector<TraceEvent>& events) {
  std::string out = "[";
  char buf[320];
  for (size_t i = 0; i < events.size(); ++i) {
    const TraceEvent& e = events[i];
    std::snprintf(buf, sizeof buf,
                  "%s\n  {\"seq\": %" PRIu64 ", \"time_ns\": %" PRId64
                  ", \"action\": \"%s\", \"size\": %zu, \"requested\": %zu, \"ptr\": \"0x%" PRIxPTR
                  "\", \"stream\": \"0x%" PRIxPTR
                  "\", "
                  "\"allocated_bytes\": %" PRId64 ", \"reserved_bytes\": %" PRId64 ", \"tag\": ",
                  i ? "," : "", e.seq, e.time_ns, to_string(e.action), e.size, e.requested, address(e.ptr),
                  address(e.stream), e.allocated_bytes, e.reserved_bytes);
    out += buf;
    append_json_string(out, e.tag);
    out += ", \"op\": ";
    append_json_string(out, e.op ? e.op : "");
    std::snprintf(buf, sizeof buf, ", \"module\": \"0x%" PRIxPTR "\", \"category\": \"%s\"}",
                  address(const_cast<void*>(e.module)), to_string(e.category));
    out += buf;
  }
  out += events.empty() ? "]" : "\n]";
  return out;
}

}  // namespace frugal::memory
