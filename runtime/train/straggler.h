// The straggler report (with wall_clock_breakdown): every rank's compute time of the step (its
// forward and backward phases, step_clock.h) gathered over the host world, and a rank named
// when it computes more than `slower_by` (a fraction: 0.2 = 20%) above the ranks' median for
// `steps` steps in a row (training.straggler_slower_by, training.straggler_steps). Slow compute,
// not slow communication: a rank waiting on its peers spends that time outside forward/backward.
// Named once per streak; a streak ends when the rank comes back within the bound.
#pragma once

#include <string>
#include <vector>

namespace ds::rt::train {

class StragglerWatch {
 public:
  StragglerWatch(double slower_by, int steps) : slower_by_(slower_by), steps_(steps) {}

  // One step's compute milliseconds of every rank (index = world rank). Returns the ranks that
  // have just been slower than the bound for `steps` steps in a row, with their line each
  // ("rank 3 computed 45% slower than the median (12.1 ms against 8.3 ms) for 5 steps in a row").
  std::vector<std::string> observe(const std::vector<double>& ms);

 private:
  double slower_by_;
  int steps_;
  std::vector<int> streak_;
};

}  // namespace ds::rt::train
