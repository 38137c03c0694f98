// The profiler's text tables: what was live at the peak, where the time went, and
// the allocator's segments at the end.
#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>

#include "profiler/session.h"

namespace frugal::profiler {

namespace {

/// `s` for a table cell: control characters (a newline in a module name would break the row)
/// shown as '?', and a long name cut from the left (the end is the telling part) at a
/// character boundary, never inside a UTF-8 sequence. Widths count bytes, as printf's do.
std::string fit(std::string s, size_t width) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  if (s.size() <= width) return s;
  size_t from = s.size() - (width - 3);
  while (from < s.size() && (static_cast<unsigned char>(s[from]) & 0xC0) == 0x80) ++from;  // a continuation byte
  return "..." + s.substr(from);
}

std::string line(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string line(const char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return std::string(buf) + "\n";
}

std::string percent(int64_t part, int64_t whole) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f%%",
                whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0);
  return buf;
}

}  // namespace

std::string Session::top_allocations_table(size_t n) const {
  using memory::format_bytes;
  std::string out = line("Memory live at the peak on %s: %s allocated at %.3f ms (%s at start; %zu trace events%s)",
                         options_.device.str().c_str(), format_bytes(peak_allocated_).c_str(),
                         static_cast<double>(peak_time_ns_ - start_ns_) / 1e6, format_bytes(start_allocated_).c_str(),
                         events_.size(), lost_events_ ? ", the oldest lost: raise trace_capacity" : "");
  out += line("%-24s %-28s %-16s %8s %12s %7s", "op", "module", "category", "blocks", "bytes", "share");
  out += std::string(100, '-') + "\n";
  int64_t rest_bytes = 0, rest_blocks = 0;
  size_t rest_groups = 0;
  for (size_t i = 0; i < at_peak_.size(); ++i) {
    const AllocationGroup& g = at_peak_[i];
    if (i < n) {
      out += line("%-24s %-28s %-16s %8" PRId64 " %12s %7s", fit(g.op, 24).c_str(), fit(g.module, 28).c_str(),
                  core::to_string(g.category), g.blocks, format_bytes(g.bytes).c_str(),
                  percent(g.bytes, peak_allocated_).c_str());
    } else {
      rest_bytes += g.bytes;
      rest_blocks += g.blocks;
      ++rest_groups;
    }
  }
  if (rest_groups)
    out += line("%-24s %-28s %-16s %8" PRId64 " %12s %7s",
                std::string("(").append(std::to_string(rest_groups)).append(" more groups)").c_str(), "", "",
                rest_blocks, format_bytes(rest_bytes).c_str(), percent(rest_bytes, peak_allocated_).c_str());
  out += std::string(100, '-') + "\n";
  out += line("%-24s %-28s %-16s %8s %12s", "total at peak", "", "", "", format_bytes(peak_allocated_).c_str());
  out += "By category at the peak:";
  const auto by_category = category_bytes_at_peak();
  for (int c = 1; c < core::kNumCategories; ++c)
    if (by_category[static_cast<size_t>(c)])
      out += std::string(" ") + core::to_string(static_cast<core::Category>(c)) + " " +
             format_bytes(by_category[static_cast<size_t>(c)]) + " (" +
             percent(by_category[static_cast<size_t>(c)], peak_allocated_) + ")";
  return out + "\n";
}

std::string Session::op_time_table(size_t n) const {
  const std::vector<OpTime> times = op_times();
  double self_total = 0.0;
  bool device = false;
  for (const OpTime& t : times) {
    self_total += t.self_ms;
    device = device || t.device_total_ms >= 0;
  }
  std::string out = line("Op times on %s: %zu op calls in %.3f ms of profile (host clock%s; total includes nested ops)",
                         options_.device.str().c_str(), ops_.size(), static_cast<double>(stop_ns_ - start_ns_) / 1e6,
                         device ? ", device from CUDA events" : "");
  out += line("%-28s %8s %11s %11s %10s %7s%s", "op", "calls", "total ms", "self ms", "mean ms", "share",
              device ? "   device ms  dev mean" : "");
  out += std::string(device ? 101 : 80, '-') + "\n";
  for (size_t i = 0; i < times.size() && i < n; ++i) {
    const OpTime& t = times[i];
    char dev[48] = "";
    if (device && t.device_total_ms >= 0)
      std::snprintf(dev, sizeof dev, " %11.3f %9.4f", t.device_total_ms,
                    t.device_total_ms / static_cast<double>(t.calls));
    char share[16];
    std::snprintf(share, sizeof share, "%.1f%%", self_total > 0 ? 100.0 * t.self_ms / self_total : 0.0);
    out += line("%-28s %8" PRId64 " %11.3f %11.3f %10.4f %7s%s", fit(t.op, 28).c_str(), t.calls, t.total_ms, t.self_ms,
                t.total_ms / static_cast<double>(t.calls), share, dev);
  }
  if (times.size() > n) out += line("(%zu more ops)", times.size() - n);
  return out;
}

std::string Session::snapshot_text(size_t max_blocks) const {
  using memory::format_bytes;
  std::string out =
      line("Allocator snapshot at stop on %s: %zu segments", options_.device.str().c_str(), final_snapshot_.size());
  size_t shown = 0, hidden = 0;
  for (const memory::SegmentInfo& seg : final_snapshot_) {
    int64_t used = 0;
    size_t live = 0;
    for (const memory::BlockInfo& b : seg.blocks)
      if (b.state == memory::BlockState::Allocated) {
        used += static_cast<int64_t>(b.size);
        ++live;
      }
    out += line("segment %p %s (%s pool): %zu blocks, %zu allocated (%s), %s cached", seg.base,
                format_bytes(static_cast<int64_t>(seg.size)).c_str(), seg.small_pool ? "small" : "large",
                seg.blocks.size(), live, format_bytes(used).c_str(),
                format_bytes(static_cast<int64_t>(seg.size) - used).c_str());
    for (const memory::BlockInfo& b : seg.blocks) {
      if (shown >= max_blocks) {
        ++hidden;
        continue;
      }
      ++shown;
      const size_t offset = static_cast<size_t>(static_cast<const char*>(b.ptr) - static_cast<const char*>(seg.base));
      const char* state = b.state == memory::BlockState::Allocated ? "allocated"
                          : b.state == memory::BlockState::Free    ? "free"
                                                                   : "awaiting events";
      std::string owner;
      if (b.state == memory::BlockState::Allocated) {
        auto it = owners_at_stop_.find(b.ptr);
        owner = it == owners_at_stop_.end()
                    ? "  (not seen by the trace)"
                    : "  " + std::string(core::to_string(it->second.category)) + "  " + it->second.op +
                          (it->second.module.empty() ? "" : " in " + it->second.module);
      }
      out += line("  +%-10zu %12s  %-15s%s", offset, format_bytes(static_cast<int64_t>(b.size)).c_str(), state,
                  owner.c_str());
    }
  }
  if (hidden) out += line("  (%zu more blocks)", hidden);
  return out;
}

}  // namespace frugal::profiler
