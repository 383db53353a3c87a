#include "checkpoint/shard_file.h"

#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "checkpoint/atomic_file.h"
#include "common/error.h"

namespace ds::rt::ckpt {

namespace {
constexpr char kMagic[8] = {'D', 'S', 'S', 'H', 'A', 'R', 'D', '1'};
constexpr uint64_t kAlign = 64;
uint64_t align_up(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
}  // namespace

void ShardWriter::add(const std::string& name, const std::string& dtype,
                      std::vector<int64_t> shape, const void* data, size_t bytes) {
  for (const auto& e : entries_) {
    if (e.name == name) throw Error(ErrorKind::kInternal, "checkpoint tensor '" + name + "' added twice");
  }
  entries_.push_back(Entry{name, dtype, std::move(shape), data, bytes});
}

void ShardWriter::write(const std::string& path) const {
  nlohmann::json index;
  index["tensors"] = nlohmann::json::array();
  uint64_t off = 0, end = 0;  // end: the last tensor's last byte (no padding after it)
  for (const auto& e : entries_) {
    index["tensors"].push_back(
        {{"name", e.name}, {"dtype", e.dtype}, {"shape", e.shape}, {"offset", off}, {"bytes", e.bytes}});
    end = off + e.bytes;
    off = align_up(end);
  }
  std::string idx = index.dump();
  uint64_t header = 16 + idx.size();
  uint64_t data_start = align_up(header);
  std::string blob(data_start + end, '\0');
  std::memcpy(blob.data(), kMagic, 8);
  uint64_t n = idx.size();
  std::memcpy(blob.data() + 8, &n, 8);
  std::memcpy(blob.data() + 16, idx.data(), idx.size());
  off = 0;
  for (const auto& e : entries_) {
    if (e.bytes) std::memcpy(blob.data() + data_start + off, e.data, e.bytes);
    off = align_up(off + e.bytes);
  }
  write_file_atomic(path, blob);
}

ShardReader::ShardReader(const std::string& path) : path_(path) {
  blob_ = read_file(path, "checkpoint shard");
  if (blob_.size() < 16 || std::memcmp(blob_.data(), kMagic, 8) != 0) {
    throw invalid_argument("{}: not a dstrain checkpoint shard (bad magic or truncated header)",
                           path);
  }
  uint64_t n = 0;
  std::memcpy(&n, blob_.data() + 8, 8);
  if (n > blob_.size() - 16) {
    throw invalid_argument("{}: truncated checkpoint shard (index of {} bytes, file of {})", path,
                           n, blob_.size());
  }
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(blob_.substr(16, n));
  } catch (const std::exception& e) {
    throw invalid_argument("{}: corrupt checkpoint shard index: {}", path, e.what());
  }
  data_start_ = align_up(16 + n);
  try {
    for (const auto& t : index.at("tensors")) {
      Entry e{t.at("dtype").get<std::string>(), t.at("shape").get<std::vector<int64_t>>(),
              t.at("offset").get<uint64_t>(), t.at("bytes").get<uint64_t>()};
      if (data_start_ + e.offset + e.bytes > blob_.size()) {
        throw invalid_argument("{}: truncated checkpoint shard: tensor '{}' ends past the file end",
                               path, t.at("name").get<std::string>());
      }
      index_[t.at("name").get<std::string>()] = std::move(e);
    }
  } catch (const nlohmann::json::exception& e) {
    throw invalid_argument("{}: corrupt checkpoint shard index: {}", path, e.what());
  }
}

std::vector<std::string> ShardReader::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : index_) out.push_back(k);
  return out;
}

const std::vector<int64_t>& ShardReader::shape_of(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw invalid_argument("{}: checkpoint has no tensor '{}'", path_, name);
  return it->second.shape;
}

void ShardReader::read(const std::string& name, const std::string& dtype,
                       const std::vector<int64_t>& shape, void* out, size_t bytes) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw invalid_argument("{}: checkpoint has no tensor '{}'", path_, name);
  const Entry& e = it->second;
  if (e.shape != shape || e.dtype != dtype) {
    throw invalid_argument(
        "{}: tensor '{}' is {} [{}] in the checkpoint but the config needs {} [{}]", path_, name,
        e.dtype, fmt::join(e.shape, ", "), dtype, fmt::join(shape, ", "));
  }
  if (e.bytes != bytes) {
    throw invalid_argument("{}: tensor '{}' has {} bytes, expected {}", path_, name, e.bytes, bytes);
  }
  if (bytes) std::memcpy(out, blob_.data() + data_start_ + e.offset, bytes);
}

}  // namespace ds::rt::ckpt
