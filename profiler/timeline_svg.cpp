// Session::timeline_svg: the memory of the session as a picture. Bytes by
// category are stacked areas (one <path> each, a step function: memory changes
// at events and holds between them), reserved bytes a dashed line on top, the
// peak a marked and labelled point; axes in ms and MiB, a legend on the right.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "profiler/session.h"

namespace frugal::profiler {

namespace {

using memory::Category;

constexpr Category kDrawn[] = {Category::Parameters,  Category::Gradients, Category::OptimizerState,
                               Category::Activations, Category::Workspace, Category::Other};
constexpr const char* kColour[] = {"#4e79a7", "#f28e2b", "#76b7b2", "#e15759", "#b07aa1", "#bab0ac"};

constexpr double kMiB = 1024.0 * 1024.0;

// A round tick step (1, 2 or 5 times a power of ten) giving about `ticks` ticks over `range`.
double nice_step(double range, int ticks) {
  if (range <= 0) return 1.0;
  const double raw = range / ticks;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * power) return m * power;
  return 10.0 * power;
}

std::string fmt(const char* format, double a, double b = 0.0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, format, a, b);
  return buf;
}

std::string tick_label(double v) { return fmt(std::fabs(v - std::round(v)) < 1e-9 ? "%.0f" : "%.3g", v); }

struct Sample {
  double ms;
  double reserved;                // MiB
  std::array<double, 6> stacked;  // cumulative MiB over kDrawn, bottom to top
};

Sample sample_of(const TimelinePoint& p, int64_t origin_ns) {
  Sample s{static_cast<double>(p.time_ns - origin_ns) / 1e6, static_cast<double>(p.reserved) / kMiB, {}};
  double sum = 0.0;
  for (size_t k = 0; k < 6; ++k) {
    int64_t bytes = p.by_category[static_cast<size_t>(kDrawn[k])];
    if (kDrawn[k] == Category::Other) bytes += p.by_category[static_cast<size_t>(Category::Unset)];
    sum += static_cast<double>(bytes) / kMiB;
    s.stacked[k] = sum;
  }
  return s;
}

}  // namespace

std::string Session::timeline_svg(int width, int height) const {
  const double left = 80, right = 190, top = 44, bottom = 56;
  const double plot_w = std::max(100.0, width - left - right), plot_h = std::max(100.0, height - top - bottom);

  // Samples, thinned to one per pixel column: each column shows the point with the most
  // allocated bytes in it, so a spike (the peak above all) stays at least a pixel wide.
  std::vector<Sample> samples;
  const double end_ms =
      std::max(static_cast<double>(stop_ns_ - start_ns_) / 1e6,
               timeline_.empty() ? 0.0 : static_cast<double>(timeline_.back().time_ns - start_ns_) / 1e6);
  const double span_ms = end_ms > 0 ? end_ms : 1.0;
  const size_t columns = static_cast<size_t>(plot_w);
  for (size_t i = 0; i < timeline_.size();) {
    const size_t column = static_cast<size_t>(
        std::clamp(static_cast<double>(timeline_[i].time_ns - start_ns_) / 1e6 / span_ms, 0.0, 1.0) * columns);
    size_t best = i, j = i;
    for (; j < timeline_.size(); ++j) {
      const size_t c = static_cast<size_t>(
          std::clamp(static_cast<double>(timeline_[j].time_ns - start_ns_) / 1e6 / span_ms, 0.0, 1.0) * columns);
      if (c != column) break;
      if (timeline_[j].allocated > timeline_[best].allocated) best = j;
    }
    samples.push_back(sample_of(timeline_[best], start_ns_));
    samples.back().ms = static_cast<double>(column) * span_ms / static_cast<double>(columns);  // its left edge
    i = j;
  }
  if (samples.empty()) samples.push_back(Sample{0.0, static_cast<double>(start_reserved_) / kMiB, {}});

  double y_max = static_cast<double>(peak_allocated_) / kMiB;
  for (const Sample& s : samples) y_max = std::max({y_max, s.reserved, s.stacked[5]});
  if (y_max <= 0) y_max = 1.0;
  const double y_step = nice_step(y_max, 5);
  y_max = std::ceil(y_max / y_step) * y_step;
  const double x_step = nice_step(span_ms, 6);

  auto X = [&](double ms) { return left + std::clamp(ms / span_ms, 0.0, 1.0) * plot_w; };
  auto Y = [&](double mib) { return top + plot_h - mib / y_max * plot_h; };

  std::string svg = fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\"", width, height);
  svg += fmt(" viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", width, height);
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += "<text x=\"" + fmt("%.1f", left) + "\" y=\"24\" font-size=\"15\">Memory on " + options_.device.str() +
         " by category (" + fmt("%.2f", static_cast<double>(peak_allocated_) / kMiB) + " MiB peak)</text>\n";

  // Grid and axes.
  for (double v = 0; v <= y_max + 1e-9; v += y_step) {
    const std::string y = fmt("%.1f", Y(v));
    svg += "<line x1=\"" + fmt("%.1f", left) + "\" y1=\"" + y + "\" x2=\"" + fmt("%.1f", left + plot_w) + "\" y2=\"" +
           y + "\" stroke=\"#e6e6e6\"/>\n";
    svg += "<text x=\"" + fmt("%.1f", left - 6) + "\" y=\"" + fmt("%.1f", Y(v) + 4) + "\" text-anchor=\"end\">" +
           tick_label(v) + "</text>\n";
  }
  for (double t = 0; t <= span_ms + 1e-9; t += x_step) {
    const std::string x = fmt("%.1f", X(t));
    svg += "<line x1=\"" + x + "\" y1=\"" + fmt("%.1f", top + plot_h) + "\" x2=\"" + x + "\" y2=\"" +
           fmt("%.1f", top + plot_h + 5) + "\" stroke=\"black\"/>\n";
    svg += "<text x=\"" + x + "\" y=\"" + fmt("%.1f", top + plot_h + 19) + "\" text-anchor=\"middle\">" +
           tick_label(t) + "</text>\n";
  }
  svg += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">time (ms)</text>\n", left + plot_w / 2,
             top + plot_h + 42);
  svg += fmt("<text transform=\"translate(%.1f,%.1f) rotate(-90)\" text-anchor=\"middle\">memory (MiB)</text>\n", 22,
             top + plot_h / 2);

  // Stacked areas: band k lies between stacked[k-1] and stacked[k], as steps.
  for (size_t k = 0; k < 6; ++k) {
    std::string d;
    auto at = [&](size_t i, bool upper) {
      return upper ? samples[i].stacked[k] : (k ? samples[i].stacked[k - 1] : 0.0);
    };
    auto next_ms = [&](size_t i) { return i + 1 < samples.size() ? samples[i + 1].ms : end_ms; };
    for (size_t i = 0; i < samples.size(); ++i) {
      d += (i ? " L" : "M") + fmt("%.2f,%.2f", X(samples[i].ms), Y(at(i, true)));
      d += " L" + fmt("%.2f,%.2f", X(next_ms(i)), Y(at(i, true)));
    }
    for (size_t i = samples.size(); i-- > 0;) {
      d += " L" + fmt("%.2f,%.2f", X(next_ms(i)), Y(at(i, false)));
      d += " L" + fmt("%.2f,%.2f", X(samples[i].ms), Y(at(i, false)));
    }
    svg += std::string("<path class=\"category\" data-category=\"") + memory::to_string(kDrawn[k]) + "\" fill=\"" +
           kColour[k] + "\" fill-opacity=\"0.85\" stroke=\"none\" d=\"" + d + " Z\"/>\n";
  }

  // Reserved bytes.
  std::string points;
  for (size_t i = 0; i < samples.size(); ++i) {
    const double next = i + 1 < samples.size() ? samples[i + 1].ms : end_ms;
    points += fmt("%.2f,%.2f ", X(samples[i].ms), Y(samples[i].reserved));
    points += fmt("%.2f,%.2f ", X(next), Y(samples[i].reserved));
  }
  svg +=
      "<polyline class=\"reserved\" fill=\"none\" stroke=\"black\" stroke-width=\"1.5\" stroke-dasharray=\"6,3\" "
      "points=\"" +
      points + "\"/>\n";

  // Axes on top of the areas.
  svg += fmt("<line x1=\"%.1f\" y1=\"%.1f\"", left, top);
  svg += fmt(" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", left, top + plot_h);
  svg += fmt("<line x1=\"%.1f\" y1=\"%.1f\"", left, top + plot_h);
  svg += fmt(" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", left + plot_w, top + plot_h);

  // The peak.
  const double peak_ms = static_cast<double>(peak_time_ns_ - start_ns_) / 1e6;
  const double peak_mib = static_cast<double>(peak_allocated_) / kMiB;
  const double px = X(peak_ms), py = Y(peak_mib);
  svg += fmt("<line class=\"peak\" x1=\"%.2f\" y1=\"%.2f\"", px, top);
  svg += fmt(" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#d62728\" stroke-dasharray=\"3,3\"/>\n", px, top + plot_h);
  svg += fmt("<circle cx=\"%.2f\" cy=\"%.2f\" r=\"4\" fill=\"#d62728\"/>\n", px, py);
  const bool label_left = px > left + plot_w * 0.7;
  svg += fmt("<text x=\"%.2f\" y=\"%.2f\"", px + (label_left ? -8 : 8), std::max(top + 12, py - 8));
  svg += std::string(" fill=\"#d62728\" text-anchor=\"") + (label_left ? "end" : "start") + "\">peak " +
         fmt("%.2f MiB at %.3f ms", peak_mib, peak_ms) + "</text>\n";

  // Legend, top category first as in the stack.
  const double lx = left + plot_w + 20;
  double ly = top + 4;
  for (size_t k = 6; k-- > 0; ly += 20) {
    svg += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"14\"", lx, ly);
    svg += std::string(" fill=\"") + kColour[k] + "\"/>\n";
    svg += fmt("<text x=\"%.1f\" y=\"%.1f\">", lx + 20, ly + 11) + memory::to_string(kDrawn[k]) + "</text>\n";
  }
  svg += fmt("<line x1=\"%.1f\" y1=\"%.1f\"", lx, ly + 7);
  svg += fmt(" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\" stroke-width=\"1.5\" stroke-dasharray=\"6,3\"/>\n", lx + 14,
             ly + 7);
  svg += fmt("<text x=\"%.1f\" y=\"%.1f\">reserved</text>\n", lx + 20, ly + 11);
  svg += "</svg>\n";
  return svg;
}

}  // namespace frugal::profiler
