// train::MetricsLog (train/metrics_log.h): the exact text of CSV and JSON-lines records.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "tests/test_util.h"
#include "train/metrics_log.h"

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
