#include "parallel/partition.h"

#include <algorithm>

#include "common/error.h"

namespace ds::rt::parallel {

Partition::Partition(int64_t total, int size) : p_(model_spec::flat_partition(total, size)) {}

std::vector<size_t> Partition::counts() const { return counts_in(0, p_.total); }

std::vector<size_t> Partition::counts_in(int64_t lo, int64_t hi) const {
  if (lo < 0 || hi > p_.total || lo > hi) {
    throw invalid_argument("partition: range [{}, {}) is not within [0, {})", lo, hi, p_.total);
  }
  std::vector<size_t> out(static_cast<size_t>(p_.size));
  for (int r = 0; r < p_.size; ++r) {
    out[static_cast<size_t>(r)] = static_cast<size_t>(intersect(lo, hi, begin(r), end(r)).size());
  }
  return out;
}

int Partition::owner(int64_t i) const {
  if (i < 0 || i >= p_.total) throw invalid_argument("partition: element {} outside [0, {})", i, p_.total);
  return static_cast<int>(i / p_.stride);
}

Range intersect(int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
  Range r{std::max(a0, b0), std::min(a1, b1)};
  if (r.hi < r.lo) r.hi = r.lo;
  return r;
}

}  // namespace ds::rt::parallel
