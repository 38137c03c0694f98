// train::Progress (train/progress.h): the line's text, exactly, and what reaches a file
// (one line per epoch, or per log_every steps) or a terminal ('\r' redraws).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "train/progress.h"

using namespace frugal;

namespace {

// Everything written to `f` so far.
std::string contents(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s += char(c);
  return s;
}

int count(const std::string& s, char c) { return int(std::count(s.begin(), s.end(), c)); }

}  // namespace

TEST_CASE("progress: format_clock, format_progress and format_epoch_summary") {
  CHECK(train::format_clock(0) == "0:00");
  CHECK(train::format_clock(59.4) == "0:59");
  CHECK(train::format_clock(59.6) == "1:00");
  CHECK(train::format_clock(3599) == "59:59");
  CHECK(train::format_clock(3600 * 2 + 61) == "2:01:01");
  CHECK(train::format_clock(NAN) == "?");
  CHECK(train::format_clock(INFINITY) == "?");

  CHECK(train::format_progress({.epoch = 2,
                                .epochs = 10,
                                .step = 300,
                                .steps = 938,
                                .loss = 0.41234,
                                .rate = 5120.4,
                                .eta_seconds = 12.2}) ==
        "epoch 2/10  step 300/938  loss 0.4123  5120 samples/s  ETA 0:12");
  CHECK(train::format_progress({.epoch = 3, .step = 7, .loss = 1, .rate = 10, .unit = "img", .extra = "lr 1.00e-03"}) ==
        "epoch 3  step 7  loss 1.0000  10 img/s  lr 1.00e-03");  // steps unknown: no ETA
  CHECK(train::format_progress(
            {.step = 50, .steps = 100, .loss = 2.5, .rate = 1e6, .eta_seconds = 75, .unit = "tokens"}) ==
        "step 50/100  loss 2.5000  1000000 tokens/s  ETA 1:15");
  CHECK(train::format_epoch_summary(1, 10, 0.4098, 44025.2, "samples", 1.4) ==
        "epoch 1/10  mean loss 0.4098  44025 samples/s  0:01");
  CHECK(train::format_epoch_summary(4, 0, 0.5, 10, "img", 75, "test accuracy 0.9") ==
        "epoch 4  mean loss 0.5000  10 img/s  1:15  test accuracy 0.9");
}

TEST_CASE("progress: not on a terminal, one line per epoch (and per log_every steps when asked)") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    train::Progress p({.epochs = 2, .out = f, .terminal = false});
    CHECK(!p.terminal());
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      p.start_epoch(epoch, 5);
      for (int64_t step = 1; step <= 5; ++step) p.update(step, step * 10, 1.0 / double(step));
      p.end_epoch(0.25);
    }
  }
  const std::string one_per_epoch = contents(f);
  std::fclose(f);
  CHECK(count(one_per_epoch, '\r') == 0);
  CHECK(count(one_per_epoch, '\n') == 2);
  CHECK(one_per_epoch.rfind("epoch 1/2  mean loss 0.2500  ", 0) == 0);
  CHECK(one_per_epoch.find("\nepoch 2/2  mean loss 0.2500  ") != std::string::npos);

  f = std::tmpfile();
  {
    train::Progress p({.out = f, .terminal = false, .log_every = 2});
    p.start_epoch(0, 5);
    for (int64_t step = 1; step <= 5; ++step) p.update(step, step * 10, 0.5);
    p.end_epoch(0.5);
  }
  const std::string logged = contents(f);
  std::fclose(f);
  CHECK(count(logged, '\n') == 3);  // steps 2 and 4, then the summary
  CHECK(logged.rfind("epoch 1  step 2/5  loss 0.5000  ", 0) == 0);
  CHECK(logged.find("\nepoch 1  step 4/5  loss 0.5000  ") != std::string::npos);
  CHECK(logged.find("step 5/5") == std::string::npos);
}

TEST_CASE("progress: on a terminal the line is redrawn with '\\r' and ended by the summary or break_line") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    train::Progress p({.epochs = 1, .out = f, .terminal = true, .redraw_seconds = 0});
    p.start_epoch(0, 3);
    p.update(1, 100, 2.0, "a longer extra text");
    p.update(2, 200, 1.5);
    p.update(3, 300, 1.0);
    p.end_epoch(1.5);
    p.start_epoch(0, 3);
    p.update(1, 100, 2.0);
    p.break_line();  // an error is about to be printed
    p.break_line();  // once is enough
  }
  const std::string s = contents(f);
  std::fclose(f);
  CHECK(count(s, '\r') == 5);
  CHECK(count(s, '\n') == 2);
  CHECK(s.rfind("\repoch 1/1  step 1/3  loss 2.0000  ", 0) == 0);
  // The shorter second line blanks the end of the first.
  const size_t second = s.find("\repoch 1/1  step 2/3");
  REQUIRE(second != std::string::npos);
  CHECK(s.find("  a longer extra text\r") < second);
  CHECK(s.substr(0, s.find('\n')).find("\repoch 1/1  mean loss 1.5000") != std::string::npos);
}
