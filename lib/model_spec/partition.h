// Partition arithmetic shared by the runtime and the planner, so both split the same way by
// construction: how ZeRO splits a flat buffer over the data-parallel group (the runtime's
// rt::parallel::Partition wraps flat_partition), and which layers each pipeline stage holds (the
// runtime's rt::parallel::partition_stages and the plan's stage_bounds call stage_layer_bounds).
//
// Deliberately pure arithmetic over element counts and layer indices: no buffers, no groups, no
// config parsing. Errors are ds::Error (invalid argument) naming the numbers.
#pragma once

#include <cstdint>
#include <vector>

#include "model_spec/gpt2_spec.h"

namespace ds::model_spec {

// Every ZeRO partition but the last ones is a multiple of this many elements (64 bytes of fp32),
// so shard boundaries stay aligned.
inline constexpr int64_t kPartitionAlignElements = 16;

// A flat buffer of `total` elements split over `size` ranks: stride = ceil(total / size) rounded
// up to kPartitionAlignElements; rank r owns [begin(r), begin(r) + count(r)) with
// begin(r) = min(total, r * stride) and count(r) = min(stride, total - begin(r)), so the last
// ranks may own less, or nothing, when the group does not divide the total.
struct FlatPartition {
  int64_t total = 0;
  int size = 1;
  int64_t stride = 0;
  // invalid_argument for r outside [0, size).
  int64_t begin(int r) const;
  int64_t count(int r) const;
};
// invalid_argument for total < 0 or size < 1.
FlatPartition flat_partition(int64_t total, int size);

// How pipeline stages split the layers (the config's pipeline.partition).
enum class StageSplit {
  kUniform,     // L / pp layers each, the first L % pp stages one more
  kParameters,  // contiguous ranges minimising the largest stage's parameter count on one tp rank,
                // counting wte + wpe on the first stage and lnf + the tied wte on the last (as the
                // model parts hold them); ties go to the earliest boundary
};

// Layer bounds of every stage: pp + 1 values, bounds[0] = 0, bounds[pp] = n_layer, stage i holds
// layers [bounds[i], bounds[i + 1]), at least one each. Validates the shape; invalid_argument
// when pp < 1 or pp > n_layer (naming both numbers, with a hint).
std::vector<int> stage_layer_bounds(const Gpt2Shape& s, int pp, StageSplit split, int tp = 1);

}  // namespace ds::model_spec
