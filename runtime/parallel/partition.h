// How a flat buffer of `total` elements is split across the data-parallel group: rank r owns the
// contiguous range [begin(r), begin(r) + count(r)). Every partition but the last ones has the
// same size, a multiple of kAlignElements (64 bytes of fp32), so shard boundaries stay aligned;
// the last rank may get less, or nothing at all, when the group does not divide the total.
//
// Deliberately pure arithmetic over element offsets: the buffers themselves belong to the ZeRO
// engine (zero.h) and the trainer. The split itself is model_spec::flat_partition
// (lib/model_spec/partition.h), which the planner calls too, so both split alike by construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model_spec/partition.h"

namespace ds::rt::parallel {

inline constexpr int64_t kAlignElements = model_spec::kPartitionAlignElements;

class Partition {
 public:
  // invalid_argument for total < 0 or size < 1.
  Partition(int64_t total, int size);

  int64_t total() const { return p_.total; }
  int size() const { return p_.size; }
  int64_t stride() const { return p_.stride; }  // the full partition size (aligned)
  int64_t begin(int r) const { return p_.begin(r); }  // invalid_argument outside [0, size)
  int64_t count(int r) const { return p_.count(r); }
  int64_t end(int r) const { return begin(r) + count(r); }
  // Every rank's count (the counts of reduce_scatter_v / all_gather_v over the whole buffer).
  std::vector<size_t> counts() const;
  // Every rank's share of the global range [lo, hi): counts for a _v collective over that
  // range (they are contiguous in rank order because partitions are).
  std::vector<size_t> counts_in(int64_t lo, int64_t hi) const;
  // The rank that owns global element i.
  int owner(int64_t i) const;

 private:
  model_spec::FlatPartition p_;
};

// Intersection of [a0, a1) and [b0, b1) as [lo, hi) with hi >= lo (empty: hi == lo).
struct Range {
  int64_t lo = 0, hi = 0;
  int64_t size() const { return hi - lo; }
};
Range intersect(int64_t a0, int64_t a1, int64_t b0, int64_t b1);

}  // namespace ds::rt::parallel
