// Human-readable reports: format_bytes, memory_summary's table, print_memory_usage.
#include <cstdio>
#include <cstdlib>

#include "memory/allocator.h"
#include "memory/caching_allocator.h"

namespace frugal::memory {

namespace {

// Note [Column widths]
// A value column holds the longest text format_bytes gives a non-negative count,
// "1023.99 KiB" (four digits, the point, two decimals, a unit: 11 characters), and
// counts of up to 11 digits; a narrower column pushes its row's border out of line.
constexpr int kColumn = 11;                             // characters per value column
constexpr int kWidth = 2 + 25 + 4 * (3 + kColumn) + 2;  // per table line, borders included

std::string count_text(int64_t n) { return std::to_string(n); }

std::string rule(char c) { return "|" + std::string(kWidth - 2, c) + "|\n"; }

std::string text_line(const std::string& text) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "| %-*s |\n", kWidth - 4, text.c_str());
  return buf;
}

std::string row(const char* label, const StatCounter& s, std::string (*fmt)(int64_t)) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "| %-25s | %*s | %*s | %*s | %*s |\n", label, kColumn, fmt(s.current).c_str(), kColumn,
                fmt(s.peak).c_str(), kColumn, fmt(s.allocated).c_str(), kColumn, fmt(s.freed).c_str());
  return buf;
}

// A metric for both pools, then each pool.
std::string metric_rows(const char* label, const MemoryStats& s, StatCounter PoolStats::*member,
                        std::string (*fmt)(int64_t)) {
  return row(label, s.*member, fmt) + row("      from small pool", s.small_pool.*member, fmt) +
         row("      from large pool", s.large_pool.*member, fmt);
}

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * fraction);
  return buf;
}

}  // namespace

double PoolStats::fragmentation() const {
  if (reserved_bytes.current <= 0) return 0.0;
  return static_cast<double>(inactive_split_bytes.current) / static_cast<double>(reserved_bytes.current);
}

std::string format_bytes(int64_t bytes) {
  const char* sign = bytes < 0 ? "-" : "";
  const uint64_t magnitude = bytes < 0 ? 0 - static_cast<uint64_t>(bytes) : static_cast<uint64_t>(bytes);
  if (magnitude < 1024) {  // appended, not `sign + std::string`: GCC 12's -Wrestrict misreads that insert
    std::string text = sign;
    text += std::to_string(magnitude);
    text += " B";
    return text;
  }
  // Note [Rounding picks the unit]
  // The unit is chosen on the value as printed, not as computed: 1 MiB - 1 B is
  // 1023.999 KiB, which two decimals would show as "1024.00 KiB". A value that rounds
  // to 1024.00 moves up a unit and reads "1.00 MiB".
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(magnitude) / 1024.0;
  int unit = 0;
  char digits[32];
  for (;;) {
    std::snprintf(digits, sizeof digits, "%.2f", value);
    if (unit == 5 || std::strtod(digits, nullptr) < 1024.0) break;
    value /= 1024.0;
    ++unit;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s%s %s", sign, digits, kUnits[unit]);
  return buf;
}

std::string detail::format_summary(const std::string& title, const MemoryStats& s, size_t limit) {
  std::string out = rule('=');
  out += text_line("frugal memory summary: " + title);
  out += rule('-');
  char header[160];
  std::snprintf(header, sizeof header, "| %-25s | %*s | %*s | %*s | %*s |\n", "Metric", kColumn, "Cur Usage", kColumn,
                "Peak Usage", kColumn, "Tot Alloc", kColumn, "Tot Freed");
  out += header;
  out += rule('-');
  out += metric_rows("Allocated memory", s, &PoolStats::allocated_bytes, format_bytes);
  out += rule('-');
  out += metric_rows("Requested memory", s, &PoolStats::requested_bytes, format_bytes);
  out += rule('-');
  out += metric_rows("Reserved memory", s, &PoolStats::reserved_bytes, format_bytes);
  out += rule('-');
  out += metric_rows("Inactive split memory", s, &PoolStats::inactive_split_bytes, format_bytes);
  out += rule('-');
  out += metric_rows("Active blocks", s, &PoolStats::active_blocks, count_text);
  out += rule('-');
  out += metric_rows("Segments", s, &PoolStats::segments, count_text);
  out += rule('-');
  const double hit_rate = s.num_allocs ? static_cast<double>(s.cache_hits) / static_cast<double>(s.num_allocs) : 0.0;
  out += text_line("Allocs " + count_text(s.num_allocs) + ", frees " + count_text(s.num_frees) + ", cache hits " +
                   count_text(s.cache_hits) + " (" + percent(hit_rate) + ")");
  out += text_line("Segment allocs " + count_text(s.num_segment_allocs) + ", segment frees " +
                   count_text(s.num_segment_frees) + ", alloc retries " + count_text(s.num_alloc_retries) + ", OOMs " +
                   count_text(s.num_ooms));
  out += text_line("Memory limit " + (limit ? format_bytes(static_cast<int64_t>(limit)) : std::string("none")) +
                   ", fragmentation " + percent(s.fragmentation()) + " (inactive split / reserved)");
  out += rule('=');
  return out;
}

std::string memory_summary(Device device) {
  auto& allocator = detail::allocator_for(device, "memory_summary");
  return detail::format_summary("device " + device.str(), allocator.stats(), allocator.limit());
}

void print_memory_usage(Device device, std::ostream& os) {
  const MemoryStats s = stats(device);
  os << device.str() << " allocated " << format_bytes(s.allocated_bytes.current) << " (peak "
     << format_bytes(s.allocated_bytes.peak) << ") reserved " << format_bytes(s.reserved_bytes.current) << ", frag "
     << percent(s.fragmentation()) << '\n';
}

}  // namespace frugal::memory
