#include "train/metrics_log.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/json.h"

namespace frugal::train {

namespace {

std::string number(double v, bool json) {
  if (std::isnan(v)) return json ? "null" : "nan";
  if (std::isinf(v)) return json ? "null" : (v > 0 ? "inf" : "-inf");
  // The shortest text that reads back as v, with '.' in every locale (printf's %g writes
  // "0,5" under a comma-decimal locale: not JSON, and an extra CSV column).
  char buf[40];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, ec == std::errc() ? end : buf);
}

/// A header line's fields, read back as csv_field wrote them (quoted fields may hold commas
/// and doubled quotes; a CRLF line's '\r' is not part of the last name).
std::vector<std::string> csv_fields(std::string line) {
  if (!line.empty() && line.back() == '\r') line.pop_back();
  std::vector<std::string> fields(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
      fields.back() += '"';  // a doubled quote inside quotes
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (c == ',' && !quoted) {
      fields.emplace_back();
    } else {
      fields.back() += c;
    }
  }
  return fields;
}

// RFC 4180: quoted when it holds a comma, a quote or a line break; quotes doubled.
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string value_text(const MetricValue& v, bool json) {
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return number(*d, json);
  const std::string& s = std::get<std::string>(v);
  return json ? json::quote(s) : csv_field(s);
}

}  // namespace

std::string format_metrics(const MetricsRecord& record, MetricsFormat format) {
  const bool json = format != MetricsFormat::Csv;
  std::string line = json ? "{" : "";
  for (size_t i = 0; i < record.size(); ++i) {
    if (i) line += json ? ", " : ",";
    if (json) line += json::quote(record[i].first) + ": ";
    line += value_text(record[i].second, json);
  }
  return json ? line + "}" : line;
}

MetricsLog::MetricsLog(std::string path, MetricsLogOptions options) : path_(std::move(path)) {
  format_ = options.format;
  if (format_ == MetricsFormat::Auto)
    format_ = path_.size() >= 4 && path_.compare(path_.size() - 4, 4, ".csv") == 0 ? MetricsFormat::Csv
                                                                                   : MetricsFormat::JsonLines;
  bool ends_mid_line = false;  // a run killed while writing a line
  if (options.append) {
    if (std::FILE* in = std::fopen(path_.c_str(), "rb")) {
      std::string header;  // the existing header is the columns
      for (int c; (c = std::fgetc(in)) != EOF && c != '\n';) header += char(c);
      if (format_ == MetricsFormat::Csv && !header.empty()) columns_ = csv_fields(header);
      ends_mid_line = std::fseek(in, -1, SEEK_END) == 0 && std::fgetc(in) != '\n';
      std::fclose(in);
    }
  }
  file_ = std::fopen(path_.c_str(), options.append ? "a" : "w");
  FRUGAL_CHECK(file_ != nullptr, "MetricsLog: cannot open '", path_, "' for writing (", std::strerror(errno), ")");
  // The cut line stays a broken row of its own rather than the start of the next record.
  if (ends_mid_line) std::fputc('\n', file_);
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::write(const MetricsRecord& record) {
  FRUGAL_CHECK(!record.empty(), "MetricsLog::write(", path_, "): the record is empty");
  std::set<std::string> seen;
  for (const auto& [key, value] : record)
    FRUGAL_CHECK(seen.insert(key).second, "MetricsLog::write(", path_, "): key '", key, "' is given twice");
  std::string text;
  if (format_ == MetricsFormat::Csv) {
    if (columns_.empty()) {
      for (const auto& [key, value] : record) {
        columns_.push_back(key);
        text.append(text.empty() ? "" : ",").append(csv_field(key));
      }
      text += '\n';
    } else {
      std::string got, want;
      for (const auto& [key, value] : record) got.append(got.empty() ? "" : ",").append(csv_field(key));
      for (const std::string& c : columns_) want.append(want.empty() ? "" : ",").append(csv_field(c));
      FRUGAL_CHECK(got == want, "MetricsLog::write(", path_, "): a CSV record must have the header's columns (", want,
                   "), got (", got, ")");
    }
  }
  text += format_metrics(record, format_) + "\n";
  const bool ok = std::fputs(text.c_str(), file_) >= 0 && std::fflush(file_) == 0;
  FRUGAL_CHECK(ok, "MetricsLog::write: cannot write '", path_, "' (", std::strerror(errno), ")");
}

}  // namespace frugal::train
