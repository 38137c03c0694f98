#pragma once
// MetricsLog: one record per step or epoch, appended to a CSV or JSON-lines file and
// flushed as it is written, so a crashed run keeps its history and a plot script (pandas,
// jq) reads it as it grows.
//
//   train::MetricsLog log("run/metrics.jsonl");            // .csv: CSV, else JSON lines
//   log.write({{"step", step}, {"loss", loss}, {"lr", lr}});
//
// CSV: a header row from the first record's keys; every later record must have the same
// keys in the same order (a CSV column cannot appear later). JSON lines: one object per
// line, keys in the given order; numbers are written with 17 significant digits (so a
// double reads back exactly), integers as integers, inf and NaN as null in JSON and as
// "inf"/"nan" in CSV.
//
// A run resumed from a checkpoint logs again the steps it had logged after that checkpoint
// (saved at 1200, logged to 1350, killed): appending with truncate_after first drops them,
//
//   const int64_t step = ckpt.resume(state).value_or(0);
//   train::MetricsLog log("run/metrics.csv", {.append = step > 0, .truncate_after = {{"step", step}}});
//
// so the file holds each step once (Note [Truncating a resumed log]).
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace frugal::train {

/// A metric's value: a number or a short text (a phase name, a checkpoint path).
using MetricValue = std::variant<int64_t, double, std::string>;
/// One record: (name, value) in column order.
using MetricsRecord = std::vector<std::pair<std::string, MetricValue>>;

enum class MetricsFormat { Auto, JsonLines, Csv };

/// Which records of an appended log a resumed run keeps: those whose `key` (a CSV column, a
/// JSON key) holds a number <= `last`.
struct MetricsTruncate {
  std::string key = "step";
  int64_t last = 0;
};

struct MetricsLogOptions {
  MetricsFormat format = MetricsFormat::Auto;  ///< Auto: Csv for a ".csv" path, else JsonLines
  bool append = false;  ///< add to an existing file (CSV: its header must match) instead of replacing it
  /// With append: first rewrite the existing file (atomically: a temporary renamed over it)
  /// keeping the CSV header and the records whose `key` is <= `last`; a JSON line without the
  /// key (an epoch summary) is kept when it comes before the first record dropped. A cut last
  /// line (a run killed mid-write) is dropped. Throws naming the file, line and key, the file
  /// as it was, for a record whose key is missing or not a number, or when the rewrite fails.
  /// Without append the file is replaced anyway, and this is not used.
  std::optional<MetricsTruncate> truncate_after = std::nullopt;
};

class MetricsLog {
 public:
  /// Opens (creates, truncates, or with append opens and perhaps truncate_after's) `path`;
  /// throws naming it when it cannot be written.
  explicit MetricsLog(std::string path, MetricsLogOptions options = {});
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  /// Appends one record and flushes. Throws for an empty record, a key given twice, or (CSV)
  /// keys other than the header's.
  void write(const MetricsRecord& record);

  MetricsFormat format() const { return format_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  MetricsFormat format_;
  std::FILE* file_ = nullptr;
  std::vector<std::string> columns_;  // CSV: the header, once written
};

/// One record as the line MetricsLog writes (without the '\n'); for CSV the values only.
std::string format_metrics(const MetricsRecord& record, MetricsFormat format);

}  // namespace frugal::train
