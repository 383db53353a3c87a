// Nice numbers after Heckbert ("Nice numbers for graph labels", Graphics Gems, 1990): round the
// data's extent to 1, 2, 5 or 10 x 10^k, take the tick step as the nice number nearest
// extent / (ticks - 1), and extend the range outwards to multiples of the step. Labels then need
// exactly as many decimals as the step has, which tick_labels computes from the step alone so
// that every label of an axis has the same form.
#include "plot/ticks.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace ds::plot {

namespace {

// The nice number nearest x (round) or at least x (ceil): 1, 2, 5 or 10 x 10^k.
double nice_number(double x, bool round) {
  const double exp = std::floor(std::log10(x));
  const double f = x / std::pow(10.0, exp);
  double nf;
  if (round) {
    nf = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
  } else {
    nf = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
  }
  return nf * std::pow(10.0, exp);
}

int decimals_for(double step) {
  return std::max(0, -static_cast<int>(std::floor(std::log10(step) + 1e-9)));
}

void trim_zeros(std::string& mantissa) {
  if (mantissa.find('.') == std::string::npos) return;
  while (mantissa.back() == '0') mantissa.pop_back();
  if (mantissa.back() == '.') mantissa.pop_back();
}

}  // namespace

Axis nice_axis(double data_lo, double data_hi, int target_ticks, bool integer) {
  Axis a;
  if (!std::isfinite(data_lo) || !std::isfinite(data_hi)) {
    a.ticks = {0, 0.5, 1};
    a.step = 0.5;
    return a;
  }
  if (data_lo > data_hi) std::swap(data_lo, data_hi);
  if (data_hi - data_lo <= std::abs(data_hi) * 1e-12) {
    // One value: a range around it (a tenth of its magnitude, or 1 about zero).
    const double pad = data_hi == 0 ? 1 : std::abs(data_hi) * 0.1;
    data_lo -= pad;
    data_hi += pad;
  }
  target_ticks = std::max(2, target_ticks);
  const double extent = nice_number(data_hi - data_lo, false);
  double step = nice_number(extent / (target_ticks - 1), true);
  if (integer) step = std::max(1.0, std::round(step));
  a.step = step;
  a.lo = std::floor(data_lo / step + 1e-9) * step;
  a.hi = std::ceil(data_hi / step - 1e-9) * step;
  const int n = static_cast<int>(std::lround((a.hi - a.lo) / step));
  for (int i = 0; i <= n; ++i) {
    double t = a.lo + i * step;
    if (std::abs(t) < step * 1e-9) t = 0;  // -0 and rounding dust at zero
    a.ticks.push_back(t);
  }
  return a;
}

std::vector<std::string> tick_labels(const Axis& axis) {
  std::vector<std::string> out;
  double biggest = 0;
  for (double t : axis.ticks) biggest = std::max(biggest, std::abs(t));
  for (double t : axis.ticks) {
    std::string s;
    if (t == 0) {
      s = "0";
    } else if (biggest >= 1e5) {
      const bool mega = biggest >= 1e8;
      const double scale = mega ? 1e6 : 1e3;
      s = fmt::format("{:.{}f}{}", t / scale, decimals_for(axis.step / scale), mega ? "M" : "k");
    } else if (axis.step < 1e-3) {
      const int exp = static_cast<int>(std::floor(std::log10(std::abs(t)) + 1e-9));
      const int digits =
          std::max(0, exp - static_cast<int>(std::floor(std::log10(axis.step) + 1e-9)));
      std::string m = fmt::format("{:.{}f}", t / std::pow(10.0, exp), digits);
      trim_zeros(m);
      s = fmt::format("{}e{}", m, exp);
    } else {
      s = fmt::format("{:.{}f}", t, decimals_for(axis.step));
    }
    out.push_back(s);
  }
  return out;
}

}  // namespace ds::plot
