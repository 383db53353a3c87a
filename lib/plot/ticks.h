// Axis ranges and tick marks at round values (1, 2 or 5 times a power of ten), and their labels.
// Pure functions; no drawing.
#pragma once

#include <string>
#include <vector>

namespace ds::plot {

struct Axis {
  double lo = 0, hi = 1;      // the axis range: multiples of `step` around the data
  double step = 1;            // the distance between ticks
  std::vector<double> ticks;  // lo, lo + step, ..., hi
};

// An axis covering [data_lo, data_hi] with about `target_ticks` ticks (Heckbert's "nice numbers",
// Graphics Gems 1990): the step is 1, 2 or 5 x 10^k and both ends are multiples of it.
// `integer`: the step is at least 1 (an axis of steps). A degenerate range (lo == hi) is widened
// around the value. Non-finite input gives the axis [0, 1].
Axis nice_axis(double data_lo, double data_hi, int target_ticks = 5, bool integer = false);

// Labels for the axis's ticks, as short as the step allows: "0", "2.5", "40000", "150k", "2e-4",
// "1.5e-3". Values of 100000 and more in magnitude are written in k or M; steps below 0.001 in
// scientific notation, each value with the mantissa digits the step needs.
std::vector<std::string> tick_labels(const Axis& axis);

}  // namespace ds::plot
