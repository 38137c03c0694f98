#pragma once
// Small helpers for the benchmark programs: host timing by median, aligned tables,
// and the "name: value" key figures that scripts read.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace frugal::bench {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Median wall time in seconds of `fn()`, after `warmup` untimed calls.
template <typename F>
double time_median(F&& fn, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> t(static_cast<size_t>(std::max(reps, 1)));
  for (auto& x : t) {
    const double t0 = now_seconds();
    fn();
    x = now_seconds() - t0;
  }
  return median(std::move(t));
}

/// Nanoseconds per call of a very cheap `fn()`: the median over `blocks` blocks of
/// the mean time of `per_block` back-to-back calls (a clock read per call would cost
/// more than the call).
template <typename F>
double ns_per_call(F&& fn, int blocks, int per_block) {
  for (int i = 0; i < per_block; ++i) fn();  // warm-up
  std::vector<double> t(static_cast<size_t>(blocks));
  for (auto& x : t) {
    const double t0 = now_seconds();
    for (int i = 0; i < per_block; ++i) fn();
    x = (now_seconds() - t0) * 1e9 / per_block;
  }
  return median(std::move(t));
}

/// Rows of strings printed with aligned columns (first column left, others right).
class Table {
 public:
  explicit Table(std::string title, std::vector<std::string> header) : title_(std::move(title)) {
    rows_.push_back(std::move(header));
  }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print() const {
    std::vector<size_t> w;
    for (const auto& r : rows_)
      for (size_t c = 0; c < r.size(); ++c) {
        if (w.size() <= c) w.push_back(0);
        w[c] = std::max(w[c], r[c].size());
      }
    std::printf("\n%s\n", title_.c_str());
    for (size_t i = 0; i < rows_.size(); ++i) {
      std::string line = " ";
      for (size_t c = 0; c < rows_[i].size(); ++c) {
        const std::string& s = rows_[i][c];
        const std::string pad(w[c] - s.size(), ' ');
        line += "  " + (c == 0 ? s + pad : pad + s);
      }
      std::printf("%s\n", line.c_str());
      if (i == 0) {
        size_t total = 1;
        for (size_t x : w) total += x + 2;
        std::printf("  %s\n", std::string(total - 2, '-').c_str());
      }
    }
  }

 private:
  std::string title_;
  std::vector<std::vector<std::string>> rows_;
};

/// printf into a std::string.
template <typename... Args>
std::string fmt(const char* f, Args... args) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), f, args...);
  return buf;
}

/// The "name: value" lines printed after the tables.
class KeyFigures {
 public:
  void add(std::string name, double value, const char* format = "%.3f") {
    figures_.emplace_back(std::move(name), fmt(format, value));
  }
  void print() const {
    std::printf("\nkey figures\n");
    for (const auto& [name, value] : figures_) std::printf("%s: %s\n", name.c_str(), value.c_str());
  }

 private:
  std::vector<std::pair<std::string, std::string>> figures_;
};

}  // namespace frugal::bench
