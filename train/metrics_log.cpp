#include "train/metrics_log.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/json.h"
#include "nn/atomic_file.h"

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

// Note [Truncating a resumed log]
// A run resumed from the checkpoint of step s logs steps s+1.. again, which its previous life
// may have logged already. MetricsLogOptions::truncate_after keeps the records up to s and
// drops the rest before appending. It filters by value, not at the first later record: a log
// appended by an earlier resume without it (1..1350, then 1201..1300) loses every copy past s.
// A JSON line without the key (an epoch summary, a note) has no step of its own; it is kept
// when it was written before the first record dropped (it summed up steps that stay), else
// dropped with them. A last record without its line break was cut by a crash mid-write (write
// puts a whole line and flushes): it is dropped, whatever step it shows (a cut "1250" reads
// as 12). A record that should have the key and lacks it, or holds no number there, is an
// error: guessing would drop or keep the wrong rows. The kept bytes are copied as they were
// (quotes, CRLF), into a temporary beside the file that is fsynced and renamed over it
// (write_file_atomically, see Note [Temporary files of a save]): a crash or a full disk
// mid-rewrite leaves the old log, and the next rewrite removes the temporary a kill left.
// Nothing is rewritten when nothing would be dropped.

// One record of a log: text[begin, end) holds it with its line break; `line` is where it starts.
struct RawRecord {
  size_t begin = 0, end = 0;
  int64_t line = 0;
  bool whole = false;  // ends in its line break
};

// The records of `text`. A CSV field that starts with a quote may hold line breaks up to its
// closing quote (a doubled quote inside it is a quote); a quote elsewhere is a character.
std::vector<RawRecord> split_records(const std::string& text, bool csv) {
  std::vector<RawRecord> out;
  int64_t line = 1, lines_inside = 0;  // lines_inside: line breaks within the record's quotes
  bool quoted = false, field_start = true;
  size_t begin = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') ++i;
      else if (c == '"') quoted = false;
      else if (c == '\n') ++lines_inside;
      continue;
    }
    if (csv && c == '"' && field_start) {
      quoted = true;
      field_start = false;
      continue;
    }
    field_start = c == ',' || c == '\n';
    if (c != '\n') continue;
    out.push_back({begin, i + 1, line, true});
    begin = i + 1;
    line += 1 + lines_inside;
    lines_inside = 0;
  }
  if (begin < text.size()) out.push_back({begin, text.size(), line, false});
  return out;
}

// Whether `text` is a number <= last; nullopt when it is not a finite number.
std::optional<bool> at_most(std::string_view text, int64_t last) {
  const char* end = text.data() + text.size();
  int64_t i = 0;
  if (auto [p, ec] = std::from_chars(text.data(), end, i); ec == std::errc() && p == end) return i <= last;
  double d = 0;
  if (auto [p, ec] = std::from_chars(text.data(), end, d); ec == std::errc() && p == end && std::isfinite(d))
    return d <= double(last);
  return std::nullopt;
}

std::string read_all(std::FILE* in) {
  std::string text;
  char buf[1 << 16];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, in)) > 0;) text.append(buf, n);
  return text;
}

// Note [Truncating a resumed log]: keeps the header and the records whose `cut.key` is <= cut.last.
void truncate_log(const std::string& path, bool csv, const MetricsTruncate& cut) {
  std::FILE* in = std::fopen(path.c_str(), "rb");
  if (!in) return;  // none yet (one that cannot be read cannot be opened for appending either)
  const std::string text = read_all(in);
  const bool read_ok = !std::ferror(in);
  std::fclose(in);
  const std::string op =
      "MetricsLog: " + path + ": keeping the records with " + cut.key + " <= " + std::to_string(cut.last);
  const std::string why = op + ": ";
  FRUGAL_CHECK(read_ok, why, "cannot read it");
  const std::vector<RawRecord> records = split_records(text, csv);
  std::string kept;
  bool dropped = false, changed = false;  // a record dropped; any byte left out
  size_t column = 0;
  for (size_t r = 0; r < records.size(); ++r) {
    const RawRecord& rec = records[r];
    std::string body = text.substr(rec.begin, rec.end - rec.begin);
    if (!rec.whole) {  // cut by a crash mid-write
      changed = true;
      break;
    }
    body.pop_back();  // the '\n'
    if (!body.empty() && body.back() == '\r') body.pop_back();
    if (csv && r == 0) {  // the header
      const std::vector<std::string> names = csv_fields(body);
      auto it = std::find(names.begin(), names.end(), cut.key);
      FRUGAL_CHECK(it != names.end(), why, "line 1: the header has no column '", cut.key, "' (it has ", body, ")");
      column = size_t(it - names.begin());
      kept.append(text, rec.begin, rec.end - rec.begin);
      continue;
    }
    if (body.find_first_not_of(" \t") == std::string::npos) {  // a blank line: no record
      changed = true;
      continue;
    }
    std::string value;
    std::string where = "line " + std::to_string(rec.line) + ", " + (csv ? "column '" : "key '") + cut.key + "'";
    if (csv) {
      const std::vector<std::string> fields = csv_fields(body);
      FRUGAL_CHECK(column < fields.size(), why, where, ": the row has ", fields.size(), " fields, no column ",
                   column + 1);
      value = fields[column];
    } else {
      json::Value object;
      try {
        object = json::parse(body);
      } catch (const Error& e) { rethrow_with_context(e, why + "line " + std::to_string(rec.line) + " is not JSON: "); }
      FRUGAL_CHECK(object.is_object(), why, "line ", rec.line, " is a JSON ", json::type_name(object.type),
                   ", not an object");
      const json::Value* v = object.find(cut.key);
      if (!v) {  // an epoch summary: kept with the records before it
        if (!dropped) kept.append(text, rec.begin, rec.end - rec.begin);
        changed |= dropped;
        continue;
      }
      FRUGAL_CHECK(v->type == json::Value::Type::Number, why, where, " holds a ", json::type_name(v->type),
                   ", not a number");
      value = v->text;
    }
    const std::optional<bool> keep = at_most(value, cut.last);
    FRUGAL_CHECK(keep.has_value(), why, where, " holds \"", value, "\", not a number");
    if (*keep) kept.append(text, rec.begin, rec.end - rec.begin);
    else dropped = changed = true;
  }
  if (changed) nn::write_file_atomically(path, kept, op);  // "<path> is unchanged" when it fails
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
  if (options.append && options.truncate_after)
    truncate_log(path_, format_ == MetricsFormat::Csv, *options.truncate_after);
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
