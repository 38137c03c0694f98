#include "train/progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

namespace frugal::train {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string epoch_text(int64_t epoch, int64_t epochs) {
  std::string text = "epoch ";  // appended: GCC 12's -Wrestrict misreads `"..." + std::string&&`
  text += std::to_string(epoch);
  if (epochs > 0) text.append("/").append(std::to_string(epochs));
  return text;
}

std::string printf_string(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

}  // namespace

std::string format_clock(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds >= 9e18) return "?";  // llround overflows past 2^63
  const long long s = std::llround(seconds);
  char buf[48];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

std::string format_progress(const ProgressState& s) {
  std::string line;
  if (s.epoch > 0) line.append(epoch_text(s.epoch, s.epochs)).append("  ");
  line.append("step ").append(std::to_string(s.step));
  if (s.steps > 0) line.append("/").append(std::to_string(s.steps));
  line.append("  loss ").append(printf_string("%.4f", s.loss)).append("  ").append(printf_string("%.0f", s.rate));
  line.append(" ").append(s.unit).append("/s");
  if (s.steps > 0) line.append("  ETA ").append(format_clock(s.eta_seconds));
  if (!s.extra.empty()) line += "  " + s.extra;
  return line;
}

std::string format_epoch_summary(int64_t epoch, int64_t epochs, double mean_loss, double rate, const std::string& unit,
                                 double seconds, const std::string& extra) {
  std::string line = epoch_text(epoch, epochs) + "  mean loss " + printf_string("%.4f", mean_loss) + "  " +
                     printf_string("%.0f", rate) + " " + unit + "/s  " + format_clock(seconds);
  if (!extra.empty()) line += "  " + extra;
  return line;
}

Progress::Progress(ProgressOptions options) : options_(std::move(options)) {
  terminal_ = options_.terminal.value_or(options_.out != nullptr && ::isatty(::fileno(options_.out)) == 1);
  start_ = now_seconds();
}

Progress::~Progress() { break_line(); }

void Progress::start_epoch(int64_t epoch, int64_t steps) {
  break_line();
  epoch_ = epoch, steps_ = steps, samples_ = 0;
  start_ = now_seconds(), last_draw_ = -1;
}

double Progress::elapsed() const { return now_seconds() - start_; }

double Progress::rate() const {
  const double secs = elapsed();
  return secs > 0 ? double(samples_) / secs : 0.0;
}

void Progress::update(int64_t step, int64_t samples, double loss, const std::string& extra) {
  samples_ = samples;
  const bool last = steps_ > 0 && step >= steps_;
  const double t = now_seconds();
  if (terminal_) {
    if (!last && last_draw_ >= 0 && t - last_draw_ < options_.redraw_seconds) return;
  } else if (options_.log_every <= 0 || step % options_.log_every != 0) {
    return;
  }
  last_draw_ = t;
  const double r = rate();
  // The samples still to come, from the mean samples per step so far.
  const double left = steps_ > 0 && step > 0 ? double(steps_ - step) * double(samples) / double(step) : 0.0;
  emit(format_progress({.epoch = options_.epochs < 0 ? 0 : epoch_ + 1,
                        .epochs = options_.epochs,
                        .step = step,
                        .steps = steps_,
                        .loss = loss,
                        .rate = r,
                        .eta_seconds = r > 0 ? left / r : NAN,
                        .unit = options_.unit,
                        .extra = extra}),
       false);
}

double Progress::end_epoch(double mean_loss, const std::string& extra) {
  const double secs = elapsed();
  emit(format_epoch_summary(epoch_ + 1, std::max<int64_t>(options_.epochs, 0), mean_loss, rate(), options_.unit, secs,
                            extra),
       true);
  return secs;
}

void Progress::break_line() {
  if (!mid_line_ || !options_.out) return;
  std::fputc('\n', options_.out);
  std::fflush(options_.out);
  mid_line_ = false, drawn_ = 0;
}

void Progress::emit(const std::string& line, bool final_line) {
  if (!options_.out) return;
  if (terminal_) {
    // '\r', the line, and blanks over what is left of a longer line drawn before.
    const size_t pad = drawn_ > line.size() ? drawn_ - line.size() : 0;
    std::fprintf(options_.out, "\r%s%*s", line.c_str(), int(pad), "");
    drawn_ = line.size();
    mid_line_ = true;
    if (final_line) break_line();
  } else {
    std::fprintf(options_.out, "%s\n", line.c_str());
  }
  std::fflush(options_.out);
}

}  // namespace frugal::train
