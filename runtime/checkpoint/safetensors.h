// Hugging Face's safetensors format, read and written by our own code: an 8-byte little-endian
// header length N, N bytes of JSON ({"name": {"dtype", "shape", "data_offsets": [begin, end]},
// optional "__metadata__": {string: string}}), then the raw little-endian data; offsets are
// relative to the first byte after the header. A model too big for one file is several such
// files plus `model.safetensors.index.json` ({"metadata": {...}, "weight_map": {name: file}}).
//
// Reading checks everything before trusting it: the header length against the file size, the
// JSON's shape, each dtype (F32, BF16 and F16 only), each shape against its byte range, every
// range inside the data section, no two ranges overlapping and no byte left unindexed (the
// format's rule), so a bad file is an invalid_argument naming the file and the tensor, never a
// read past the end. Data is read per tensor with pread (a file is never loaded whole).
//
// Not here: which tensor is which model parameter (runtime/train/hf_weights), bf16 rounding
// rules beyond common/half.h (round to nearest even), dtypes other than the three.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ds::rt::ckpt {

enum class StDtype { kF32, kBF16, kF16 };
const char* st_dtype_name(StDtype d);  // "F32", "BF16", "F16"
int st_dtype_size(StDtype d);          // bytes per element

struct StTensorInfo {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the data section
  int64_t numel() const;
};

// One safetensors file, its header read and validated on open.
class SafetensorsFile {
 public:
  // Throws invalid_argument (bad or truncated file, naming it) or system_error (cannot open).
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<StTensorInfo>& tensors() const { return tensors_; }  // in file order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const StTensorInfo* find(const std::string& name) const;  // null when absent
  // The tensor's values as fp32 (BF16/F16 widen exactly) into dst (numel() floats). Throws
  // invalid_argument when absent or when `shape` (if not empty) differs from the file's.
  void read_f32(const std::string& name, const std::vector<int64_t>& shape, float* dst) const;

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t data_start_ = 0;
  std::vector<StTensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A model's weights: one .safetensors file, or a directory holding model.safetensors.index.json
// and its shards (or a single model.safetensors). Every name of the index must be in its shard.
class SafetensorsSet {
 public:
  explicit SafetensorsSet(const std::string& path);
  // Null when no file holds `name`.
  const StTensorInfo* find(const std::string& name) const;
  void read_f32(const std::string& name, const std::vector<int64_t>& shape, float* dst) const;
  std::vector<std::string> names() const;  // sorted
  const std::string& path() const { return path_; }

 private:
  const SafetensorsFile& file_of(const std::string& name) const;
  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> files_ index
};

// A tensor to write: fp32 values stored as `dtype` (rounded to nearest even for 16 bits).
struct StTensorOut {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;
  std::vector<float> values;  // numel of shape
};

// Writes one file atomically (header padded with spaces to a multiple of 8 bytes, tensors in the
// given order, contiguous). invalid_argument on a duplicate name or values/shape mismatch.
void write_safetensors(const std::string& path, const std::vector<StTensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes `tensors` into directory `dir` (created if missing): one model.safetensors when they
// fit in max_shard_bytes, else model-0000i-of-0000n.safetensors shards (tensors in order, a new
// shard when the next would overflow) plus model.safetensors.index.json. Returns the file names.
std::vector<std::string> write_safetensors_dir(const std::string& dir,
                                               const std::vector<StTensorOut>& tensors,
                                               uint64_t max_shard_bytes);

}  // namespace ds::rt::ckpt
