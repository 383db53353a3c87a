// Layout of the metrics figure (figure.h). Sizes are fixed in user units (1200 wide; the height
// grows with the rows of small panels and the legend's lines), so the PNG rsvg-convert makes at
// 1:1 is readable without scaling. Each panel: a title above, a light grid at the ticks, tick
// labels on the left and below, the unit on the y axis and "step" on the x axis, then the series,
// run after run in the legend's order. The text widths used to wrap the legend are estimates
// (0.6 of the font size per character); a long label can only make a legend line wrap early.
#include "plot/figure.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"
#include "plot/svg.h"
#include "plot/ticks.h"

namespace ds::plot {

namespace {

constexpr double kWidth = 1200;
constexpr double kPad = 20;
constexpr double kTickFont = 11, kLabelFont = 12, kTitleFont = 13, kLegendFont = 13;
const std::string kAxisColour = "#555555", kGridColour = "#e6e6e6", kTextColour = "#222222";

struct Line {
  std::string field;
  std::string dash;  // empty: solid
  bool markers = false;
};

Line solid(std::string field) {
  return {std::move(field), "", false};
}

struct PanelSpec {
  std::string title;
  std::string y_label;
  std::vector<Line> lines;
  double scale = 1;        // value multiplier (bytes to MiB)
  bool from_zero = false;  // the y axis starts at 0 (quantities whose zero means something)
};

struct Box {
  double x, y, w, h;
};

// Several runs: each later run's lines are narrower, drawn over the earlier, wider ones, so two
// runs with the same curve (fp32 and bf16 losses often agree to the third digit) show as a
// line inside a line rather than one hiding the other.
double run_width(size_t r, size_t runs) {
  static const std::array<double, 4> kWidths = {3.2, 2.0, 1.4, 1.1};
  if (runs == 1) return 1.8;
  return r < kWidths.size() ? kWidths[r] : 1.0;
}

double text_width(const std::string& s, double font) {
  return 0.6 * font * static_cast<double>(s.size());
}

bool any_series(const std::vector<MetricsRun>& runs, const PanelSpec& p) {
  for (const auto& r : runs)
    for (const auto& l : p.lines)
      if (r.series.count(l.field)) return true;
  return false;
}

bool all_zero(const std::vector<MetricsRun>& runs, const std::string& field) {
  for (const auto& r : runs) {
    auto it = r.series.find(field);
    if (it == r.series.end()) continue;
    for (double v : it->second.values)
      if (v != 0) return false;
  }
  return true;
}

// The memory tags of every run: the trainer's in its order, then any other by name.
std::vector<std::string> memory_tags(const std::vector<MetricsRun>& runs) {
  static const std::array<const char*, 8> kOrder = {
      "params", "grads", "optimizer", "activations", "comm", "workspace", "checkpoint", "total"};
  std::set<std::string> seen;
  for (const auto& r : runs)
    for (const auto& [field, s] : r.series)
      if (field.rfind("peak_bytes_", 0) == 0) seen.insert(field.substr(11));
  std::vector<std::string> tags;
  for (const char* t : kOrder)
    if (seen.erase(t)) tags.push_back(t);
  tags.insert(tags.end(), seen.begin(), seen.end());
  return tags;
}

Axis step_axis(const std::vector<MetricsRun>& runs, int ticks) {
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  for (const auto& r : runs)
    for (const auto& [field, s] : r.series) {
      lo = std::min(lo, s.steps.front());
      hi = std::max(hi, s.steps.back());
    }
  return nice_axis(static_cast<double>(lo), static_cast<double>(hi), ticks, /*integer=*/true);
}

Axis value_axis(const std::vector<MetricsRun>& runs, const PanelSpec& p, int ticks) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& r : runs)
    for (const auto& l : p.lines) {
      auto it = r.series.find(l.field);
      if (it == r.series.end()) continue;
      for (double v : it->second.values) {
        lo = std::min(lo, v * p.scale);
        hi = std::max(hi, v * p.scale);
      }
    }
  if (p.from_zero) lo = std::min(lo, 0.0);
  return nice_axis(lo, hi, ticks);
}

void draw_panel(SvgWriter& svg, const Box& b, const Axis& xa, const PanelSpec& p,
                const std::vector<MetricsRun>& runs, int y_ticks) {
  const Axis ya = value_axis(runs, p, y_ticks);
  auto px = [&](double s) { return b.x + (s - xa.lo) / (xa.hi - xa.lo) * b.w; };
  auto py = [&](double v) { return b.y + b.h - (v - ya.lo) / (ya.hi - ya.lo) * b.h; };

  svg.text({b.x, b.y - 8}, p.title, {kTitleFont, Anchor::kStart, 0, true, kTextColour});
  svg.rect(b.x, b.y, b.w, b.h, "#ffffff");
  const Stroke grid{kGridColour, 1, ""};
  const Stroke tick{kAxisColour, 1, ""};
  const auto y_labels = tick_labels(ya);
  for (size_t i = 0; i < ya.ticks.size(); ++i) {
    const double y = py(ya.ticks[i]);
    svg.line({b.x, y}, {b.x + b.w, y}, grid);
    svg.line({b.x - 4, y}, {b.x, y}, tick);
    svg.text({b.x - 7, y + kTickFont * 0.35}, y_labels[i],
             {kTickFont, Anchor::kEnd, 0, false, kTextColour});
  }
  const auto x_labels = tick_labels(xa);
  for (size_t i = 0; i < xa.ticks.size(); ++i) {
    const double x = px(xa.ticks[i]);
    svg.line({x, b.y}, {x, b.y + b.h}, grid);
    svg.line({x, b.y + b.h}, {x, b.y + b.h + 4}, tick);
    svg.text({x, b.y + b.h + 6 + kTickFont}, x_labels[i],
             {kTickFont, Anchor::kMiddle, 0, false, kTextColour});
  }
  const Stroke frame{kAxisColour, 1, ""};
  svg.rect(b.x, b.y, b.w, b.h, "none", &frame);
  svg.text({b.x + b.w / 2, b.y + b.h + 10 + kTickFont + kLabelFont}, "step",
           {kLabelFont, Anchor::kMiddle, 0, false, kTextColour});
  double widest = 0;
  for (const auto& l : y_labels) widest = std::max(widest, text_width(l, kTickFont));
  svg.text({b.x - 14 - widest - kLabelFont * 0.4, b.y + b.h / 2}, p.y_label,
           {kLabelFont, Anchor::kMiddle, -90, false, kTextColour});

  for (size_t r = 0; r < runs.size(); ++r) {
    for (const auto& l : p.lines) {
      auto it = runs[r].series.find(l.field);
      if (it == runs[r].series.end()) continue;
      const Series& s = it->second;
      std::vector<Point> pts;
      pts.reserve(s.steps.size());
      for (size_t i = 0; i < s.steps.size(); ++i) {
        pts.push_back({px(static_cast<double>(s.steps[i])), py(s.values[i] * p.scale)});
      }
      svg.polyline(pts, {run_colour(r), run_width(r, runs.size()), l.dash});
      if (l.markers)
        for (const auto& pt : pts)
          svg.circle(pt, 1.2 + 0.7 * run_width(r, runs.size()), run_colour(r));
    }
  }
}

// The legend from y down; returns the y below it.
double draw_legend(SvgWriter& svg, const std::vector<MetricsRun>& runs, double y, bool has_val) {
  struct Entry {
    std::string text;
    std::string colour;
    std::string dash;
    bool marker;
  };
  std::vector<Entry> entries;
  for (size_t r = 0; r < runs.size(); ++r)
    entries.push_back({runs[r].label, run_colour(r), "", false});
  entries.push_back({"train loss", kAxisColour, "", false});
  if (has_val) entries.push_back({"val loss", kAxisColour, "6 4", true});
  const double row = kLegendFont + 9, swatch = 26;
  double x = kPad;
  y += kLegendFont;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    const double w = swatch + 6 + text_width(e.text, kLegendFont) + 22;
    if (x > kPad && x + w > kWidth - kPad) {
      x = kPad;
      y += row;
    }
    if (i == runs.size()) x += 14;  // a gap between the runs and the line styles
    const double mid = y - kLegendFont * 0.35;
    svg.line({x, mid}, {x + swatch, mid}, {e.colour, i < runs.size() ? 4.0 : 1.6, e.dash});
    if (e.marker) svg.circle({x + swatch / 2, mid}, 3, e.colour);
    svg.text({x + swatch + 6, y}, e.text, {kLegendFont, Anchor::kStart, 0, false, kTextColour});
    x += w;
  }
  return y + row - kLegendFont;
}

}  // namespace

const std::string& run_colour(size_t i) {
  static const std::array<std::string, 10> kTableau = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                       "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                                                       "#bcbd22", "#17becf"};
  return kTableau[i % kTableau.size()];
}

std::string metrics_figure_svg(const std::vector<MetricsRun>& runs) {
  if (runs.empty()) throw Error(ErrorKind::kInternal, "metrics_figure_svg: no runs");
  PanelSpec loss{"loss", "loss (nats)", {solid("loss"), {"val_loss", "6 4", true}}};
  std::vector<PanelSpec> small = {
      {"learning rate", "lr", {solid("lr")}, 1, true},
      {"throughput", "tokens/s", {solid("tokens_per_s")}, 1, true},
  };
  // training.eval_tasks: per task its accuracies (acc solid, acc_norm dashed) and LAMBADA's perplexity.
  std::set<std::string> tasks;
  for (const auto& r : runs)
    for (const auto& [field, series] : r.series)
      if (field.rfind("eval_", 0) == 0 && field.size() > 9 && field.compare(field.size() - 4, 4, "_acc") == 0)
        tasks.insert(field.substr(5, field.size() - 9));
  for (const auto& t : tasks) {
    const std::string p = "eval_" + t + "_";
    small.push_back({"eval: " + t, "accuracy", {{p + "acc", "", true}, {p + "acc_norm", "6 4", true}}, 1, true});
    small.push_back({"eval: " + t + " perplexity", "ppl", {{p + "ppl", "", true}}, 1, false});
  }
  std::vector<std::string> left_out;
  for (const auto& tag : memory_tags(runs)) {
    const std::string field = "peak_bytes_" + tag;
    if (all_zero(runs, field)) {
      left_out.push_back(tag);
      continue;
    }
    small.push_back({"peak memory: " + tag, "MiB", {solid(field)}, 1.0 / (1024.0 * 1024.0), true});
  }
  small.erase(std::remove_if(small.begin(), small.end(),
                             [&](const PanelSpec& p) { return !any_series(runs, p); }),
              small.end());
  bool has_val = false;
  for (const auto& r : runs) has_val = has_val || r.series.count("val_loss");

  // Layout first (the height depends on it), drawing second.
  constexpr int kCols = 3;
  const double main_left = 86, main_right = 24, main_h = 380, below = 52, title = 28;
  const double cell_w = (kWidth - 2 * kPad) / kCols, small_left = 76, small_right = 18,
               small_h = 150;
  const double cell_h = title + small_h + below + 8;
  const int rows = static_cast<int>((small.size() + kCols - 1) / kCols);

  SvgWriter probe(kWidth, 100);  // the legend's height, measured by drawing it once
  const double legend_bottom = draw_legend(probe, runs, kPad, has_val);
  const double main_top = legend_bottom + title + 6;
  const double small_top = main_top + main_h + below + 8;
  const double note_y = small_top + rows * cell_h + (left_out.empty() ? 0 : 4);
  const double height = note_y + (left_out.empty() ? 0 : kTickFont + 8) + kPad / 2;

  SvgWriter svg(kWidth, height);
  svg.rect(0, 0, kWidth, height, "#ffffff");
  draw_legend(svg, runs, kPad, has_val);
  // One step range for every panel; the wide panel gets finer ticks when they fit that range.
  const Axis small_x = step_axis(runs, 5);
  Axis main_x = step_axis(runs, 9);
  if (main_x.lo != small_x.lo || main_x.hi != small_x.hi) main_x = small_x;
  if (any_series(runs, loss)) {
    draw_panel(svg, {main_left, main_top, kWidth - main_left - main_right, main_h}, main_x, loss,
               runs, 10);
  }
  for (size_t i = 0; i < small.size(); ++i) {
    const double cx = kPad + static_cast<double>(i % kCols) * cell_w;
    const double cy = small_top + static_cast<double>(i / kCols) * cell_h + title;
    draw_panel(svg, {cx + small_left, cy, cell_w - small_left - small_right, small_h}, small_x,
               small[i], runs, 5);
  }
  if (!left_out.empty()) {
    std::string names;
    for (const auto& t : left_out) names += (names.empty() ? "" : ", ") + t;
    svg.text({kPad, note_y}, fmt::format("peak memory not drawn (0 at every step): {}", names),
             {kTickFont, Anchor::kStart, 0, false, kAxisColour});
  }
  return svg.finish();
}

}  // namespace ds::plot
