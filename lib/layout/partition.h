// Partition arithmetic shared by the runtime, the checkpoints and the planner, so all split the
// same way by construction: how ZeRO splits a flat buffer over the data-parallel group
// (Partition) and how big its gradient buckets are (zero_gradient_buffers), and which layers each
// pipeline stage holds (stage_layer_bounds, partition_stages).
//
// Deliberately pure arithmetic over element counts and layer indices: no buffers, no groups, no
// config parsing. Errors are ds::Error (invalid argument) naming the numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "layout/choices.h"
#include "model_spec/shape.h"

namespace ds::layout {

// Every ZeRO partition but the last ones is a multiple of this many elements (64 bytes of fp32),
// so shard boundaries stay aligned.
inline constexpr int64_t kAlignElements = 16;

// A flat buffer of `total` elements split over `size` ranks: stride = ceil(total / size) rounded
// up to kAlignElements; rank r owns the contiguous range [begin(r), begin(r) + count(r)) with
// begin(r) = min(total, r * stride) and count(r) = min(stride, total - begin(r)), so the last
// ranks may own less, or nothing at all, when the group does not divide the total.
class Partition {
 public:
  Partition() = default;  // an empty buffer on one rank
  // invalid_argument for total < 0 or size < 1.
  Partition(int64_t total, int size);
  int64_t total() const { return total_; }
  int size() const { return size_; }
  int64_t stride() const { return stride_; }  // the full partition size (aligned)
  int64_t begin(int r) const;                 // invalid_argument outside [0, size)
  int64_t count(int r) const;
  int64_t end(int r) const { return begin(r) + count(r); }
  // Every rank's count (the counts of reduce_scatter_v / all_gather_v over the whole buffer).
  std::vector<size_t> counts() const;
  // Every rank's share of the global range [lo, hi): counts for a _v collective over that
  // range (they are contiguous in rank order because partitions are).
  std::vector<size_t> counts_in(int64_t lo, int64_t hi) const;
  // The rank that owns global element i.
  int owner(int64_t i) const;

 private:
  int64_t total_ = 0;
  int size_ = 1;
  int64_t stride_ = 0;
};

// Intersection of [a0, a1) and [b0, b1) as [lo, hi) with hi >= lo (empty: hi == lo).
struct Range {
  int64_t lo = 0, hi = 0;
  int64_t size() const { return hi - lo; }
};
Range intersect(int64_t a0, int64_t a1, int64_t b0, int64_t b1);

// ZeRO-2/3's gradient buffers of one model part (elements), as the runtime allocates them
// (runtime/parallel/zero.cpp) and the plan counts them (lib/plan/memory_model.cpp): a bucket with
// room for the largest unit but the token embedding, or for reduce_bucket_size elements of the
// others (whichever is more); the token embedding gets a buffer of its own (0: no such unit).
struct ZeroGradientBuffers {
  int64_t bucket = 0;
  int64_t token_embedding = 0;
};
ZeroGradientBuffers zero_gradient_buffers(const model_spec::ParamLayout& layout, int64_t reduce_bucket_size);

// Layer bounds of every stage: pp + 1 values, bounds[0] = 0, bounds[pp] = n_layer, stage i holds
// layers [bounds[i], bounds[i + 1]), at least one each. Validates the shape; invalid_argument
// when pp < 1 or pp > n_layer (naming both numbers, with a hint).
std::vector<int> stage_layer_bounds(const model_spec::ModelShape& s, int pp, StageSplit split, int tp = 1);

// The ModelPart of every stage (index = pipeline rank): the layers of stage_layer_bounds, the
// embedding on stage 0, the head on stage pp-1, each with the given tp size and rank.
std::vector<model_spec::ModelPart> partition_stages(const model_spec::ModelShape& s, int pp, StageSplit split,
                                                    int tp = 1, int tp_rank = 0);

}  // namespace ds::layout
