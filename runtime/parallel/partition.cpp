#include "parallel/partition.h"

#include <algorithm>

#include "common/error.h"

namespace ds::rt::parallel {

Partition::Partition(int64_t total, int size) : total_(total), size_(size) {
  if (total < 0 || size < 1) {
    throw invalid_argument("partition: need total >= 0 and size >= 1, got total {} size {}", total,
                           size);
  }
  int64_t per = (total + size - 1) / size;
  stride_ = (per + kAlignElements - 1) / kAlignElements * kAlignElements;
}

int64_t Partition::begin(int r) const {
  if (r < 0 || r >= size_) throw invalid_argument("partition: rank {} outside [0, {})", r, size_);
  return std::min(total_, stride_ * r);
}

int64_t Partition::count(int r) const {
  int64_t b = begin(r);
  return std::min(stride_, total_ - b);
}

std::vector<size_t> Partition::counts() const { return counts_in(0, total_); }

std::vector<size_t> Partition::counts_in(int64_t lo, int64_t hi) const {
  if (lo < 0 || hi > total_ || lo > hi) {
    throw invalid_argument("partition: range [{}, {}) is not within [0, {})", lo, hi, total_);
  }
  std::vector<size_t> out(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    out[static_cast<size_t>(r)] = static_cast<size_t>(intersect(lo, hi, begin(r), end(r)).size());
  }
  return out;
}

int Partition::owner(int64_t i) const {
  if (i < 0 || i >= total_) throw invalid_argument("partition: element {} outside [0, {})", i, total_);
  return static_cast<int>(i / stride_);
}

Range intersect(int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
  Range r{std::max(a0, b0), std::min(a1, b1)};
  if (r.hi < r.lo) r.hi = r.lo;
  return r;
}

}  // namespace ds::rt::parallel
