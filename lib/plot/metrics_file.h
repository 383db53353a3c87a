// Reads the metrics files `dstrain train --metrics` writes (runtime/train/metrics.h: one JSON
// object per line, one line per step) into the series a plot draws.
//
// Kept per step: `loss`, `val_loss` (evaluation steps only), `lr`, `tokens_per_s` and rank 0's
// `peak_bytes_<tag>` (the `_rank<r>` copies of --metrics-all-ranks and every other field are
// ignored). A field that is null (a NaN written by the trainer) or absent leaves a gap: that
// step has no point in that series. When a step appears more than once (a resumed run appends
// to its file and repeats the steps after its checkpoint) the last record of that step wins.
//
// Failures are ds::Error (invalid_argument) naming the file, and the 1-based line for a bad line:
//   "cannot read metrics file F: No such file or directory"
//   "F:3: not a JSON object"
//   "F:3: the record has no \"step\""
//   "F:3: \"step\" must be a non-negative integer, got -1"
//   "F:3: \"loss\" must be a number, got \"abc\""
//   "F: no metrics records (the file is empty)"
// Blank lines are skipped.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ds::plot {

// One field over the steps that have it, in increasing step order.
struct Series {
  std::vector<int64_t> steps;
  std::vector<double> values;
  bool empty() const { return steps.empty(); }
};

struct MetricsRun {
  std::string path;   // the file read
  std::string label;  // the legend's name for it (read_metrics_file: the file's stem)
  // Field name -> series: "loss", "val_loss", "lr", "tokens_per_s", "peak_bytes_<tag>". Only
  // fields with at least one point are present.
  std::map<std::string, Series> series;
};

// Reads one metrics file; see the header comment for what is kept and the errors.
MetricsRun read_metrics_file(const std::string& path);

// True for the names of the fields read_metrics_file keeps.
bool is_plotted_field(const std::string& name);

}  // namespace ds::plot
