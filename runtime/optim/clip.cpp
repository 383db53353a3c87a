// The clipping coefficient (the norms themselves are kernels: kernels/cpu/norm.cpp).
#include "optim/clip.h"

#include <algorithm>
#include <cmath>

namespace ds::rt::optim {

double clip_coefficient(double total_norm, double max_norm) {
  if (max_norm <= 0 || !std::isfinite(total_norm)) return 1.0;
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

}  // namespace ds::rt::optim
