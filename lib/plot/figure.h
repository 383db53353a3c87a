// The picture `dstrain plot` draws from one or more metrics files (metrics_file.h), as an SVG
// document:
//
//   legend     one colour per run (its label) and the line styles: solid = train loss,
//              dashed with dots = validation loss
//   main panel train loss and validation loss against step, "loss (nats)"
//   small      "lr" (learning rate), "tokens/s" (throughput), then one panel per peak-memory tag
//   panels     in MiB (params, grads, optimizer, activations, comm, workspace, total, then any
//              other tag by name), three to a row
//
// With several runs the first is drawn widest and each later one narrower on top of it, so
// identical curves stay visible. Every panel shares the step axis (the union of the runs'
// steps). A panel is drawn only if some run has its field; a memory tag that is 0 at every step
// of every run is left out and named in a note under the panels. Each series of each run is
// exactly one <polyline> (the validation loss also has a <circle> per point); axes, grid and
// legend use <line>, <rect> and <text> only.
#pragma once

#include <string>
#include <vector>

#include "plot/metrics_file.h"

namespace ds::plot {

// The colour of the i-th run (Tableau's ten, then repeating).
const std::string& run_colour(size_t i);

// The figure for `runs` (at least one), each drawn in run_colour(index) and named by its label.
std::string metrics_figure_svg(const std::vector<MetricsRun>& runs);

}  // namespace ds::plot
