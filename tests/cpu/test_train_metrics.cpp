// train::MetricsLog (train/metrics_log.h): the exact text of CSV and JSON-lines records, and
// what truncate_after keeps of a resumed run's log.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/dead_pid.h"
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

// ---- truncate_after: a resumed run drops what it will log again (Note [Truncating a resumed log]) ----

namespace {
void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}
train::MetricsLogOptions keep_until(int64_t last, const std::string& key = "step") {
  return {.append = true, .truncate_after = {{key, last}}};
}
}  // namespace

TEST_CASE("metrics log: truncate_after keeps the CSV header and the rows up to the step, quoted fields whole") {
  const std::string path = temp_path("frugal_metrics_cut", ".csv");
  const std::string head = "step,loss,\"a,b\"\n1,0.5,x\n2,0.25,\"two\nlines, \"\"quoted\"\"\"\n3,0.125,y\n";
  // Logged to 5, resumed from 3 without truncation (4 and 5 again), killed; now resumed from 3.
  write_text(path, head + "4,0.1,\"4,\"\"\"\n5,0.05,z\n4,0.1,again\n5,0.05,again\n3.0,0.125,float step\n");
  {
    train::MetricsLog log(path, keep_until(3));
    CHECK(read(path) == head + "3.0,0.125,float step\n");  // by value: every copy past 3 goes
    log.write({{"step", int64_t(4)}, {"loss", 0.1}, {"a,b", std::string("new")}});
  }
  CHECK(read(path) == head + "3.0,0.125,float step\n4,0.1,new\n");
  // The key may be any column, quoted in the header too.
  write_text(path, "step,\"a,b\"\n1,10\n2,20\n3,30\n");
  { train::MetricsLog log(path, keep_until(20, "a,b")); }
  CHECK(read(path) == "step,\"a,b\"\n1,10\n2,20\n");
  // Nothing past the step: nothing rewritten. All past it: the header alone.
  { train::MetricsLog log(path, keep_until(7)); }
  CHECK(read(path) == "step,\"a,b\"\n1,10\n2,20\n");
  { train::MetricsLog log(path, keep_until(0)); }
  CHECK(read(path) == "step,\"a,b\"\n");
  // Without append the file is replaced, as always.
  {
    train::MetricsLog log(path, {.truncate_after = {{"step", 1}}});
    log.write({{"step", int64_t(9)}});
  }
  CHECK(read(path) == "step\n9\n");
  std::remove(path.c_str());
}

TEST_CASE("metrics log: truncate_after keeps CRLF rows as they were and drops a cut last line") {
  const std::string path = temp_path("frugal_metrics_cut_crlf", ".csv");
  write_text(path, "step,loss\r\n1,0.5\r\n2,0.2\r\n3,0.1\r\n4,0.0");  // killed mid-line
  {
    train::MetricsLog log(path, keep_until(2));
    log.write({{"step", int64_t(3)}, {"loss", 0.125}});
  }
  CHECK(read(path) == "step,loss\r\n1,0.5\r\n2,0.2\r\n3,0.125\n");
  // A cut line is dropped even when the step it shows is kept ("1" of "12", or a whole "2").
  write_text(path, "step,loss\n1,0.5\n2,0.2\n1");
  { train::MetricsLog log(path, keep_until(5)); }
  CHECK(read(path) == "step,loss\n1,0.5\n2,0.2\n");
  // A cut header: no header; the next record writes one.
  write_text(path, "ste");
  {
    train::MetricsLog log(path, keep_until(5));
    log.write({{"step", int64_t(1)}});
  }
  CHECK(read(path) == "step\n1\n");
  std::remove(path.c_str());
}

TEST_CASE("metrics log: truncate_after on JSON lines, and a record without the key kept only before the cut") {
  const std::string path = temp_path("frugal_metrics_cut", ".jsonl");
  const std::string kept =
      "{\"step\": 1, \"loss\": 0.5}\n"
      "{\"step\": 2.0, \"loss\": 0.25, \"note\": \"step 9\"}\r\n"
      "{\"epoch\": 1, \"mean_loss\": 0.4}\n";  // a summary of steps that stay
  write_text(path, kept +
                       "{\"step\": 3, \"loss\": 0.1}\n"
                       "{\"epoch\": 2, \"mean_loss\": 0.2}\n"  // summed up step 3: dropped
                       "{\"loss\": 0.3, \"step\": 2}\n"        // an old resume's copy of 2: kept
                       "{\"step\": 1e1}\n"
                       "{\"step\": 4, \"lo");
  {
    train::MetricsLog log(path, keep_until(2));
    log.write({{"step", int64_t(3)}, {"loss", 0.125}});
  }
  CHECK(read(path) == kept + "{\"loss\": 0.3, \"step\": 2}\n{\"step\": 3, \"loss\": 0.125}\n");
  std::remove(path.c_str());
}

TEST_CASE("metrics log: truncate_after refuses a record without the key or with no number there, changing nothing") {
  const std::string csv = temp_path("frugal_metrics_cut_bad", ".csv");
  const std::string jsonl = temp_path("frugal_metrics_cut_bad", ".jsonl");
  const auto refused = [&](const std::string& path, const std::string& text, const std::vector<std::string>& parts) {
    write_text(path, text);
    std::vector<std::string> all = {"MetricsLog: " + path + ": keeping the records with step <= 2: "};
    all.insert(all.end(), parts.begin(), parts.end());
    check_error([&] { train::MetricsLog log(path, keep_until(2)); }, all);
    CHECK(read(path) == text);
  };
  refused(csv, "epoch,loss\n1,0.5\n2,0.4\n3,0.3\n", {"line 1: the header has no column 'step' (it has epoch,loss)"});
  refused(csv, "loss,step\n0.5,1\n0.4\n0.3,3\n", {"line 3, column 'step': the row has 1 fields, no column 2"});
  refused(csv, "step,loss\n1,0.5\n\"a\nb\",0.4\nabc,0.3\n3,0.2\n",
          {"line 3, column 'step' holds \"a\nb\", not a number"});  // the line it starts on
  refused(csv, "step,loss\n1,0.5\nnan,0.3\n3,0.2\n", {"line 3, column 'step' holds \"nan\", not a number"});
  refused(csv, "step,loss\n1,0.5\n,0.3\n3,0.2\n", {"line 3, column 'step' holds \"\", not a number"});
  refused(jsonl, "{\"step\": 1}\n{\"step\": \"2\"}\n{\"step\": 3}\n", {"line 2, key 'step' holds a string"});
  refused(jsonl, "{\"step\": 1}\n{\"step\": null}\n{\"step\": 3}\n", {"line 2, key 'step' holds a null"});
  refused(jsonl, "{\"step\": 1}\n{\"step\": 2,\n{\"step\": 3}\n", {"line 2 is not JSON: JSON:"});
  refused(jsonl, "{\"step\": 1}\n[1, 2]\n{\"step\": 3}\n", {"line 2 is a JSON array, not an object"});
  std::remove(csv.c_str());
  std::remove(jsonl.c_str());
}

TEST_CASE(
    "metrics log: truncate_after rewrites atomically: an unwritable directory leaves the log as it was, a killed "
    "rewrite no temporary") {
  ScratchDir dir("frugal_metrics_cut_atomic");
  const std::string path = (dir.path / "metrics.csv").string();
  const std::string text = "step,loss\n1,0.5\n2,0.4\n3,0.3\n";
  write_text(path, text);
  std::filesystem::permissions(path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  if (::geteuid() != 0) {  // root writes anywhere
    std::filesystem::permissions(dir.path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
    check_error([&] { train::MetricsLog log(path, keep_until(2)); },
                {"MetricsLog: " + path + ": keeping the records with step <= 2: cannot create " + path + ".tmp.",
                 "Permission denied", path + " is unchanged"});
    CHECK(read(path) == text);
    {  // nothing to drop: nothing to rewrite, and the file itself can be appended to
      train::MetricsLog log(path, keep_until(3));
      log.write({{"step", int64_t(4)}, {"loss", 0.2}});
    }
    CHECK(read(path) == text + "4,0.2\n");
    std::filesystem::permissions(dir.path, std::filesystem::perms::owner_all);
  }
  // A temporary of a killed rewrite is removed by the next (Note [Temporary files of a save]).
  write_text(path + ".tmp." + std::to_string(dead_pid()) + ".0123456789abcdef", "step,loss\n");
  // Through a symbolic link: the link stays, its target is rewritten with its permissions.
  const std::string link = (dir.path / "link.csv").string();
  std::filesystem::create_symlink(path, link);
  { train::MetricsLog log(link, keep_until(1)); }
  CHECK(std::filesystem::is_symlink(link));
  CHECK(read(path) == "step,loss\n1,0.5\n");
  CHECK((std::filesystem::status(path).permissions() & std::filesystem::perms::mask) ==
        (std::filesystem::perms::owner_read | std::filesystem::perms::owner_write));
  for (const auto& entry : std::filesystem::directory_iterator(dir.path))  // no temporary left
    CHECK(entry.path().filename().string().find(".tmp.") == std::string::npos);
}
