// The straggler report (straggler.h).
#include "train/straggler.h"

#include <algorithm>

#include <fmt/format.h>

namespace ds::rt::train {

std::vector<std::string> StragglerWatch::observe(const std::vector<double>& ms) {
  std::vector<std::string> named;
  if (ms.size() < 2) return named;
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  streak_.resize(n, 0);
  for (size_t q = 0; q < n; ++q) {
    const bool slow = median > 0 && ms[q] > (1.0 + slower_by_) * median;
    streak_[q] = slow ? streak_[q] + 1 : 0;
    if (streak_[q] == steps_) {
      named.push_back(fmt::format("rank {} computed {:.0f}% slower than the median ({:.1f} ms against {:.1f} ms) "
                                  "for {} steps in a row",
                                  q, 100.0 * (ms[q] / median - 1.0), ms[q], median, steps_));
    }
  }
  return named;
}

}  // namespace ds::rt::train
