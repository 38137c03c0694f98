#include "train/metrics_log.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <set>

#include "core/error.h"

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

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') out += '\\', out += char(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else out += char(c);
  }
  return out + "\"";
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
  return json ? json_string(s) : csv_field(s);
}

}  // namespace

std::string format_metrics(const MetricsRecord& record, MetricsFormat format) {
  const bool json = format != MetricsFormat::Csv;
  std::string line = json ? "{" : "";
  for (size_t i = 0; i < record.size(); ++i) {
    if (i) line += json ? ", " : ",";
    if (json) line += json_string(record[i].first) + ": ";
    line += value_text(record[i].second, json);
  }
  return json ? line + "}" : line;
}

MetricsLog::MetricsLog(std::string path, MetricsLogOptions options) : path_(std::move(path)) {
  format_ = options.format;
  if (format_ == MetricsFormat::Auto)
    format_ = path_.size() >= 4 && path_.compare(path_.size() - 4, 4, ".csv") == 0 ? MetricsFormat::Csv
                                                                                   : MetricsFormat::JsonLines;
  if (options.append && format_ == MetricsFormat::Csv) {  // the existing header is the columns
    if (std::FILE* in = std::fopen(path_.c_str(), "r")) {
      std::string header;
      for (int c; (c = std::fgetc(in)) != EOF && c != '\n';) header += char(c);
      std::fclose(in);
      size_t start = 0;
      while (!header.empty()) {
        const size_t comma = header.find(',', start);
        columns_.push_back(header.substr(start, comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    }
  }
  file_ = std::fopen(path_.c_str(), options.append ? "a" : "w");
  FRUGAL_CHECK(file_ != nullptr, "MetricsLog: cannot open '", path_, "' for writing (", std::strerror(errno), ")");
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
      for (const auto& [key, value] : record) got.append(got.empty() ? "" : ",").append(key);
      for (const std::string& c : columns_) want.append(want.empty() ? "" : ",").append(c);
      FRUGAL_CHECK(got == want, "MetricsLog::write(", path_, "): a CSV record must have the header's columns (", want,
                   "), got (", got, ")");
    }
  }
  text += format_metrics(record, format_) + "\n";
  const bool ok = std::fputs(text.c_str(), file_) >= 0 && std::fflush(file_) == 0;
  FRUGAL_CHECK(ok, "MetricsLog::write: cannot write '", path_, "' (", std::strerror(errno), ")");
}

}  // namespace frugal::train
