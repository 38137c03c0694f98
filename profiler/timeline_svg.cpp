// Session::timeline_svg: the memory of the session as a picture. Bytes by
// category are stacked areas (one <path> each, a step function: memory changes
// at events and holds between them), reserved bytes a dashed line on top, the
// peak a marked and labelled point; axes in ms and MiB, a legend on the right.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "profiler/session.h"

namespace frugal::profiler {

namespace {

using core::Category;

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

// Samples of `timeline`, thinned to one per pixel column: each column shows the point with
// the most allocated bytes in it, so a spike (the peak above all) stays at least a pixel wide.
std::vector<Sample> thinned(const std::vector<TimelinePoint>& timeline, int64_t start_ns, double span_ms,
                            size_t columns) {
  std::vector<Sample> samples;
  auto column_of = [&](const TimelinePoint& p) {
    return static_cast<size_t>(std::clamp(static_cast<double>(p.time_ns - start_ns) / 1e6 / span_ms, 0.0, 1.0) *
                               columns);
  };
  for (size_t i = 0; i < timeline.size();) {
    const size_t column = column_of(timeline[i]);
    size_t best = i, j = i;
    for (; j < timeline.size() && column_of(timeline[j]) == column; ++j)
      if (timeline[j].allocated > timeline[best].allocated) best = j;
    samples.push_back(sample_of(timeline[best], start_ns));
    samples.back().ms = static_cast<double>(column) * span_ms / static_cast<double>(columns);  // its left edge
    i = j;
  }
  return samples;
}

// The plot area and its scales: milliseconds to x, MiB to y.
struct Plot {
  double left, top, w, h, span_ms, y_max;
  double X(double ms) const { return left + std::clamp(ms / span_ms, 0.0, 1.0) * w; }
  double Y(double mib) const { return top + h - mib / y_max * h; }
};

std::string grid_and_labels(const Plot& p, double y_step, double x_step) {
  std::string svg;
  for (double v = 0; v <= p.y_max + 1e-9; v += y_step) {
    const std::string y = fmt("%.1f", p.Y(v));
    svg += "<line x1=\"" + fmt("%.1f", p.left) + "\" y1=\"" + y + "\" x2=\"" + fmt("%.1f", p.left + p.w) + "\" y2=\"" +
           y + "\" stroke=\"#e6e6e6\"/>\n";
    svg += "<text x=\"" + fmt("%.1f", p.left - 6) + "\" y=\"" + fmt("%.1f", p.Y(v) + 4) + "\" text-anchor=\"end\">" +
           tick_label(v) + "</text>\n";
  }
  for (double t = 0; t <= p.span_ms + 1e-9; t += x_step) {
    const std::string x = fmt("%.1f", p.X(t));
    svg += "<line x1=\"" + x + "\" y1=\"" + fmt("%.1f", p.top + p.h) + "\" x2=\"" + x + "\" y2=\"" +
           fmt("%.1f", p.top + p.h + 5) + "\" stroke=\"black\"/>\n";
    svg += "<text x=\"" + x + "\" y=\"" + fmt("%.1f", p.top + p.h + 19) + "\" text-anchor=\"middle\">" +
           tick_label(t) + "</text>\n";
  }
  svg += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">time (ms)</text>\n", p.left + p.w / 2,
             p.top + p.h + 42);
  svg += fmt("<text transform=\"translate(%.1f,%.1f) rotate(-90)\" text-anchor=\"middle\">memory (MiB)</text>\n", 22,
             p.top + p.h / 2);
  return svg;
}

// Stacked areas: band k lies between stacked[k-1] and stacked[k], as steps; then the
// reserved bytes as a dashed step line.
std::string areas_and_reserved(const Plot& p, const std::vector<Sample>& samples, double end_ms) {
  std::string svg;
  auto next_ms = [&](size_t i) { return i + 1 < samples.size() ? samples[i + 1].ms : end_ms; };
  for (size_t k = 0; k < 6; ++k) {
    std::string d;
    auto at = [&](size_t i, bool upper) {
      return upper ? samples[i].stacked[k] : (k ? samples[i].stacked[k - 1] : 0.0);
    };
    for (size_t i = 0; i < samples.size(); ++i) {
      d += (i ? " L" : "M") + fmt("%.2f,%.2f", p.X(samples[i].ms), p.Y(at(i, true)));
      d += " L" + fmt("%.2f,%.2f", p.X(next_ms(i)), p.Y(at(i, true)));
    }
    for (size_t i = samples.size(); i-- > 0;) {
      d += " L" + fmt("%.2f,%.2f", p.X(next_ms(i)), p.Y(at(i, false)));
      d += " L" + fmt("%.2f,%.2f", p.X(samples[i].ms), p.Y(at(i, false)));
    }
    svg += std::string("<path class=\"category\" data-category=\"") + core::to_string(kDrawn[k]) + "\" fill=\"" +
           kColour[k] + "\" fill-opacity=\"0.85\" stroke=\"none\" d=\"" + d + " Z\"/>\n";
  }
  std::string points;
  for (size_t i = 0; i < samples.size(); ++i) {
    points += fmt("%.2f,%.2f ", p.X(samples[i].ms), p.Y(samples[i].reserved));
    points += fmt("%.2f,%.2f ", p.X(next_ms(i)), p.Y(samples[i].reserved));
  }
  svg +=
      "<polyline class=\"reserved\" fill=\"none\" stroke=\"black\" stroke-width=\"1.5\" stroke-dasharray=\"6,3\" "
      "points=\"" +
      points + "\"/>\n";
  return svg;
}

std::string axes(const Plot& p) {
  std::string svg = fmt("<line x1=\"%.1f\" y1=\"%.1f\"", p.left, p.top);
  svg += fmt(" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", p.left, p.top + p.h);
  svg += fmt("<line x1=\"%.1f\" y1=\"%.1f\"", p.left, p.top + p.h);
  svg += fmt(" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", p.left + p.w, p.top + p.h);
  return svg;
}

// The peak: a dashed vertical line, a dot and its label (left of it near the right edge).
std::string peak_mark(const Plot& p, double peak_ms, double peak_mib) {
  const double px = p.X(peak_ms), py = p.Y(peak_mib);
  std::string svg = fmt("<line class=\"peak\" x1=\"%.2f\" y1=\"%.2f\"", px, p.top);
  svg += fmt(" x2=\"%.2f\" y2=\"%.2f\" stroke=\"#d62728\" stroke-dasharray=\"3,3\"/>\n", px, p.top + p.h);
  svg += fmt("<circle cx=\"%.2f\" cy=\"%.2f\" r=\"4\" fill=\"#d62728\"/>\n", px, py);
  const bool label_left = px > p.left + p.w * 0.7;
  svg += fmt("<text x=\"%.2f\" y=\"%.2f\"", px + (label_left ? -8 : 8), std::max(p.top + 12, py - 8));
  svg += std::string(" fill=\"#d62728\" text-anchor=\"") + (label_left ? "end" : "start") + "\">peak " +
         fmt("%.2f MiB at %.3f ms", peak_mib, peak_ms) + "</text>\n";
  return svg;
}

// The legend right of the plot, top category first as in the stack, then "reserved".
std::string legend(const Plot& p) {
  const double lx = p.left + p.w + 20;
  double ly = p.top + 4;
  std::string svg;
  for (size_t k = 6; k-- > 0; ly += 20) {
    svg += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"14\"", lx, ly);
    svg += std::string(" fill=\"") + kColour[k] + "\"/>\n";
    svg += fmt("<text x=\"%.1f\" y=\"%.1f\">", lx + 20, ly + 11) + core::to_string(kDrawn[k]) + "</text>\n";
  }
  svg += fmt("<line x1=\"%.1f\" y1=\"%.1f\"", lx, ly + 7);
  svg += fmt(" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\" stroke-width=\"1.5\" stroke-dasharray=\"6,3\"/>\n", lx + 14,
             ly + 7);
  svg += fmt("<text x=\"%.1f\" y=\"%.1f\">reserved</text>\n", lx + 20, ly + 11);
  return svg;
}

}  // namespace

std::string Session::timeline_svg(int width, int height) const {
  const double left = 80, right = 190, top = 44, bottom = 56;
  const double plot_w = std::max(100.0, width - left - right), plot_h = std::max(100.0, height - top - bottom);
  const double end_ms =
      std::max(static_cast<double>(stop_ns_ - start_ns_) / 1e6,
               timeline_.empty() ? 0.0 : static_cast<double>(timeline_.back().time_ns - start_ns_) / 1e6);
  const double span_ms = end_ms > 0 ? end_ms : 1.0;
  std::vector<Sample> samples = thinned(timeline_, start_ns_, span_ms, static_cast<size_t>(plot_w));
  if (samples.empty()) samples.push_back(Sample{0.0, static_cast<double>(start_reserved_) / kMiB, {}});

  double y_max = static_cast<double>(peak_allocated_) / kMiB;
  for (const Sample& s : samples) y_max = std::max({y_max, s.reserved, s.stacked[5]});
  if (y_max <= 0) y_max = 1.0;
  const double y_step = nice_step(y_max, 5);
  y_max = std::ceil(y_max / y_step) * y_step;
  const Plot plot{left, top, plot_w, plot_h, span_ms, y_max};

  std::string svg = fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\"", width, height);
  svg += fmt(" viewBox=\"0 0 %.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n", width, height);
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += "<text x=\"" + fmt("%.1f", left) + "\" y=\"24\" font-size=\"15\">Memory on " + options_.device.str() +
         " by category (" + fmt("%.2f", static_cast<double>(peak_allocated_) / kMiB) + " MiB peak)</text>\n";
  svg += grid_and_labels(plot, y_step, nice_step(span_ms, 6));
  svg += areas_and_reserved(plot, samples, end_ms);
  svg += axes(plot);  // on top of the areas
  svg += peak_mark(plot, static_cast<double>(peak_time_ns_ - start_ns_) / 1e6,
                   static_cast<double>(peak_allocated_) / kMiB);
  svg += legend(plot);
  svg += "</svg>\n";
  return svg;
}

}  // namespace frugal::profiler
