// One rank's share of a checkpoint: named tensors in one self-describing file, checksummed.
//
//   bytes 0-7    magic "DSSHARD2"
//   bytes 8-15   uint64 little-endian: length N of the JSON index
//   bytes 16-19  uint32 little-endian: CRC-32C of the N index bytes
//   bytes 20-23  uint32 little-endian: CRC-32C of bytes 0-19
//   N bytes      JSON index: {"tensors": [{"name", "dtype", "shape", "offset", "bytes",
//                "crc32c"}...]} (crc32c: 8 hex digits, of the tensor's bytes)
//   data         each tensor's raw bytes at its offset (from the start of the data section,
//                64-byte aligned)
// Files of the first format ("DSSHARD1": no checksums, no bytes 16-23) are still read; they
// cannot be verified.
//
// Every read is verified: the header and index when the file is opened, a tensor's CRC-32C when
// it is read (or all of them by verify()). A mismatch is an invalid_argument naming the file,
// the tensor and its byte range in the file, so a flipped bit is never a silently different
// model. Not a general tensor format: it holds exactly what dstrain's runtime writes, and the
// reader checks every tensor it is asked for against the shape the caller expects.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ds::rt::ckpt {

class ShardWriter {
 public:
  // Records a tensor; `data` must stay valid until write(). Names must be unique.
  void add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
           const void* data, size_t bytes);
  // Writes the file atomically (temp name + rename).
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name, dtype;
    std::vector<int64_t> shape;
    const void* data;
    size_t bytes;
  };
  std::vector<Entry> entries_;
};

class ShardReader {
 public:
  // Reads and validates the file's header and index; errors name the file and the fault.
  explicit ShardReader(const std::string& path);

  bool has(const std::string& name) const { return index_.count(name) != 0; }
  std::vector<std::string> names() const;
  // Copies the tensor into `out` after checking dtype and shape; a mismatch is an
  // invalid_argument naming the file, the tensor, and both shapes.
  void read(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape,
            void* out, size_t bytes) const;
  const std::vector<int64_t>& shape_of(const std::string& name) const;
  const std::string& dtype_of(const std::string& name) const;
  // Checks every tensor's CRC-32C (throws as read() does). False for a first-format file, which
  // has no checksums to check.
  bool verify() const;
  bool checksummed() const { return checksummed_; }

 private:
  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t offset, bytes;
    std::optional<uint32_t> crc;
  };
  void check_crc(const std::string& name, const Entry& e) const;
  std::string path_;
  bool checksummed_ = false;
  std::string blob_;
  size_t data_start_ = 0;
  std::map<std::string, Entry> index_;
};

}  // namespace ds::rt::ckpt
