// train::MetricsLog (train/metrics_log.h): the exact text of CSV and JSON-lines records.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "tests/test_util.h"
#include "train/metrics_log.h"
#include "train/progress.h"

using namespace frugal;
using namespace frugal::testing;

namespace {
std::string read(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}
}  // namespace

TEST_CASE("metrics log: JSON lines, one object per record, keys in order, flushed as written") {
  const std::string path = temp_path("frugal_metrics", ".jsonl");
  {
    train::MetricsLog log(path);
    CHECK(log.format() == train::MetricsFormat::JsonLines);
    log.write({{"step", int64_t(1)}, {"loss", 0.5}, {"phase", std::string("train \"a\"")}});
    CHECK(read(path) == "{\"step\": 1, \"loss\": 0.5, \"phase\": \"train \\\"a\\\"\"}\n");  // already on disk
    log.write({{"step", int64_t(2)}, {"loss", 0.1}, {"lr", NAN}, {"inf", -INFINITY}});
  }
  CHECK(read(path) ==
        "{\"step\": 1, \"loss\": 0.5, \"phase\": \"train \\\"a\\\"\"}\n"
        "{\"step\": 2, \"loss\": 0.1, \"lr\": null, \"inf\": null}\n");
  std::remove(path.c_str());
}

TEST_CASE("metrics log: CSV, a header from the first record, the same columns after, append") {
  const std::string path = temp_path("frugal_metrics", ".csv");
  {
    train::MetricsLog log(path);
    CHECK(log.format() == train::MetricsFormat::Csv);
    log.write({{"epoch", int64_t(1)}, {"loss", 0.25}, {"note", std::string("a,b")}});
    log.write({{"epoch", int64_t(2)}, {"loss", NAN}, {"note", std::string("say \"hi\"")}});
    check_error(
        [&] {
          log.write({{"epoch", int64_t(3)}, {"acc", 0.5}});
        },
        {"MetricsLog::write(" + path + ")", "the header's columns (epoch,loss,note), got (epoch,acc)"});
    check_error([&] { log.write({}); }, {"the record is empty"});
    check_error([&] { log.write({{"a", 1.0}, {"a", 2.0}}); }, {"key 'a' is given twice"});
  }
  {
    train::MetricsLog log(path, {.append = true});  // a resumed run: the header is kept
    log.write({{"epoch", int64_t(3)}, {"loss", 0.125}, {"note", std::string("")}});
    check_error([&] { log.write({{"loss", 1.0}}); }, {"(epoch,loss,note), got (loss)"});
  }
  CHECK(read(path) == "epoch,loss,note\n1,0.25,\"a,b\"\n2,nan,\"say \"\"hi\"\"\"\n3,0.125,\n");
  std::remove(path.c_str());
  check_error([] { train::MetricsLog("/nonexistent_dir_frugal/m.csv"); },
              {"MetricsLog: cannot open '/nonexistent_dir_frugal/m.csv' for writing"});
}

TEST_CASE("metrics log: appending reads a quoted or CRLF header, and a cut last line stays its own row") {
  // Appending refused its own header when a column needed quotes ("a,b": the header was split
  // at every comma) or ended in CRLF; after a run killed mid-line the next row joined it.
  const std::string path = temp_path("frugal_metrics_append", ".csv");
  {
    train::MetricsLog log(path);
    log.write({{"step", int64_t(1)}, {"a,b", 0.5}, {"say \"x\"", 1.0}});
  }
  {
    train::MetricsLog log(path, {.append = true});
    log.write({{"step", int64_t(2)}, {"a,b", 0.25}, {"say \"x\"", 2.0}});
  }
  CHECK(read(path) == "step,\"a,b\",\"say \"\"x\"\"\"\n1,0.5,1\n2,0.25,2\n");
  {
    std::ofstream(path, std::ios::binary) << "step,loss\r\n1,0.5\r\n2,0.2";  // CRLF, and cut mid-line
  }
  {
    train::MetricsLog log(path, {.append = true});
    log.write({{"step", int64_t(3)}, {"loss", 0.1}});
  }
  CHECK(read(path) == "step,loss\r\n1,0.5\r\n2,0.2\n3,0.1\n");
  std::remove(path.c_str());
  // JSON lines stay JSON: a stray byte in a string is written as U+FFFD.
  const std::string jpath = temp_path("frugal_metrics_utf8", ".jsonl");
  {
    train::MetricsLog log(jpath);
    log.write({{"note", std::string("bad\xff")}});
  }
  CHECK(read(jpath) == "{\"note\": \"bad\\ufffd\"}\n");
  std::remove(jpath.c_str());
  CHECK(train::format_clock(1e20) == "?");
}
