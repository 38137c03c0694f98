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
#include <cstdio>
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

struct MetricsLogOptions {
  MetricsFormat format = MetricsFormat::Auto;  ///< Auto: Csv for a ".csv" path, else JsonLines
  bool append = false;  ///< add to an existing file (CSV: its header must match) instead of replacing it
};

class MetricsLog {
 public:
  /// Opens (creates or truncates) `path`; throws naming it when it cannot be written.
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
