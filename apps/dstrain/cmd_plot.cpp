// `dstrain plot METRICS.jsonl... [-o FILE.svg|FILE.png] [--label NAME]...`: the curves of one
// or more training runs in one picture (lib/plot/figure.h): loss and validation loss large,
// learning rate, tokens/s and peak memory per tag small, one colour per run. SVG is written by
// our own writer; PNG converts that SVG with rsvg-convert (lib/plot/png.h).
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <iostream>

#include <fmt/format.h>

#include "commands.h"
#include "common/error.h"
#include "plot/figure.h"
#include "plot/metrics_file.h"
#include "plot/png.h"

namespace ds::cli {

namespace {

struct PlotOptions {
  std::vector<std::string> metrics;
  std::string output = "plot.svg";
  std::vector<std::string> labels;
};

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw system_error("cannot write {}: {}", path, errno_string(errno));
  out << text;
  out.flush();
  if (!out) throw system_error("cannot write {}: {}", path, errno_string(errno));
}

int run_plot(const PlotOptions& o) {
  const bool png = ends_with(o.output, ".png");
  if (!png && !ends_with(o.output, ".svg")) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("-o {}: the output must end in .svg or .png", o.output),
                "-o plot.svg (our own SVG) or -o plot.png (through rsvg-convert)");
  }
  if (o.labels.size() > o.metrics.size()) {
    throw invalid_argument("--label given {} times for {} metrics file{}", o.labels.size(),
                           o.metrics.size(), o.metrics.size() == 1 ? "" : "s");
  }
  std::vector<plot::MetricsRun> runs;
  for (size_t i = 0; i < o.metrics.size(); ++i) {
    runs.push_back(plot::read_metrics_file(o.metrics[i]));
    if (i < o.labels.size()) runs.back().label = o.labels[i];
  }
  const std::string svg = plot::metrics_figure_svg(runs);
  if (png) {
    plot::write_png(svg, o.output);
  } else {
    write_text_file(o.output, svg);
  }
  std::cout << fmt::format("wrote {} ({} run{})\n", o.output, runs.size(),
                           runs.size() == 1 ? "" : "s");
  return 0;
}

}  // namespace

void add_plot_command(CLI::App& app, std::vector<Command>& out) {
  auto o = std::make_shared<PlotOptions>();
  auto* sub = app.add_subcommand(
      "plot",
      "draw training curves from --metrics files: loss, val loss, lr, tokens/s, peak memory");
  sub->add_option("metrics", o->metrics, "metrics files (JSONL) that dstrain train --metrics wrote")
      ->required();
  sub->add_option("-o,--output", o->output,
                  "the picture: FILE.svg, or FILE.png (needs rsvg-convert)")
      ->capture_default_str();
  sub->add_option("--label", o->labels,
                  "legend name of the next metrics file, in order (default: the file's stem)")
      ->take_all()
      ->expected(1);
  out.push_back({sub, [o] { return run_plot(*o); }});
}

}  // namespace ds::cli
