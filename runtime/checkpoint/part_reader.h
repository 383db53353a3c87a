// Reads this rank's part of a sharded checkpoint, whatever layout wrote it.
//
// A checkpoint holds, per writing rank, a contiguous range of the flat layout of that rank's part
// (its pipeline stage's layers, its tensor-parallel shard; manifest.h). Reading for a new layout:
//   - same tensor-parallel size, pipeline split and partition method: this rank's part is the
//     union of the old shards at its (stage, tp rank), re-partitioned for any data-parallel size
//     and ZeRO stage (each shard is read once and the requested range cut out);
//   - another tp size, pp split or partition method (a "universal" resume): each tensor of this
//     part is rebuilt whole from the old parts that held it (every old tp rank's shard of the old
//     stage holding its layer; replicated tensors from tp rank 0; wte and wpe from the first
//     stage, lnf from the last) and this rank's shard cut out of it (model_spec::full_index on
//     both sides). Old parts are read whole once per tensor name and kept while that name is read,
//     so host memory up to the model's size is used.
// Errors are invalid_argument naming the manifest or the shard and what does not fit.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/shard_file.h"
#include "core/dtype.h"
#include "layout/choices.h"
#include "model_spec/shape.h"

namespace ds::rt::ckpt {

// Where this rank's part sits in the new layout.
struct PartTarget {
  model_spec::ModelShape shape;
  model_spec::ModelPart part;      // this rank's (tp size and rank inside)
  int pp = 1, stage = 0;           // pipeline size and this rank's stage
  std::string partition;           // the new pipeline partition's name
};

class PartReader {
 public:
  PartReader(std::string dir, const ShardLayout& old, const PartTarget& target);
  ~PartReader();

  // Whether the old layout differs in tp, pp or the partition method (tensors are rebuilt).
  bool resharding() const { return reshard_ != nullptr; }
  // Whether the shards hold tensor `name` (checked on the first non-empty shard of this part).
  bool has(const std::string& name);
  // Elements [lo, hi) of this part's tensor `name` (a flat-layout range), stored as `dtype`, into
  // dst (host; hi - lo elements of that type). A tensor stored as another dtype is an error
  // naming the shard, the tensor and both types.
  void read(const std::string& name, DType dtype, int64_t lo, int64_t hi, void* dst);
  void read(const std::string& name, int64_t lo, int64_t hi, float* dst) { read(name, DType::kF32, lo, hi, dst); }
  // The dtype name ("f32", "bf16", "f16") tensor `name` is stored as ("" when nothing to read).
  std::string dtype_of(const std::string& name);

  struct ShardSet;  // the shards covering one old part
  struct Reshard;   // rebuilding tensors from every old part

 private:
  std::string dir_, where_;
  std::unique_ptr<ShardSet> same_;
  std::unique_ptr<Reshard> reshard_;
};

// The shard index's name of a dtype: "f32", "bf16", "f16".
const char* shard_dtype_name(DType t);

}  // namespace ds::rt::ckpt
