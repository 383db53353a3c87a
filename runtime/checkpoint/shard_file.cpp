#include "checkpoint/shard_file.h"

#include <cstring>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "checkpoint/atomic_file.h"
#include "common/crc32c.h"
#include "common/error.h"

namespace ds::rt::ckpt {

namespace {
constexpr char kMagicV1[8] = {'D', 'S', 'S', 'H', 'A', 'R', 'D', '1'};
constexpr char kMagic[8] = {'D', 'S', 'S', 'H', 'A', 'R', 'D', '2'};
constexpr uint64_t kHeaderV1 = 16, kHeader = 24;
constexpr uint64_t kAlign = 64;
uint64_t align_up(uint64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

uint32_t load_u32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
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
    index["tensors"].push_back({{"name", e.name},
                                {"dtype", e.dtype},
                                {"shape", e.shape},
                                {"offset", off},
                                {"bytes", e.bytes},
                                {"crc32c", crc32c_hex(crc32c(e.data, e.bytes))}});
    end = off + e.bytes;
    off = align_up(end);
  }
  std::string idx = index.dump();
  uint64_t data_start = align_up(kHeader + idx.size());
  // The head (header, index, padding), then every tensor from where it lies, each followed by the
  // zeros up to the next alignment: no copy of the shard (a first touch of its size would cost
  // more than its write).
  std::string head(data_start, '\0');
  std::memcpy(head.data(), kMagic, 8);
  uint64_t n = idx.size();
  std::memcpy(head.data() + 8, &n, 8);
  const uint32_t idx_crc = crc32c(idx);
  std::memcpy(head.data() + 16, &idx_crc, 4);
  const uint32_t head_crc = crc32c(head.data(), 20);
  std::memcpy(head.data() + 20, &head_crc, 4);
  std::memcpy(head.data() + kHeader, idx.data(), idx.size());
  static const char kZeros[kAlign] = {};
  std::vector<std::string_view> parts = {head};
  off = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const auto& e = entries_[i];
    if (e.bytes) parts.emplace_back(static_cast<const char*>(e.data), e.bytes);
    const uint64_t next = align_up(off + e.bytes);
    if (i + 1 < entries_.size() && next > off + e.bytes) parts.emplace_back(kZeros, next - off - e.bytes);
    off = next;
  }
  write_file_atomic(path, parts);
}

namespace {

// An index entry's shape must describe its bytes: dims >= 0 and, for the dtypes dstrain writes,
// elements x element size == bytes (found by tests/fuzz: a shape of [-2] or [1000000] over 8
// bytes was accepted, and its readers sized buffers from the shape).
void check_entry_shape(const std::string& path, const std::string& name, const std::string& dtype,
                       const std::vector<int64_t>& shape, uint64_t bytes) {
  const uint64_t elem = dtype == "f32" ? 4 : dtype == "bf16" || dtype == "f16" ? 2 : dtype == "i64" ? 8 : 0;
  uint64_t want = elem;
  bool overflow = false;
  for (int64_t d : shape) {
    if (d < 0) throw invalid_argument("{}: corrupt checkpoint shard index: tensor '{}' has a negative dimension", path, name);
    overflow = overflow || __builtin_mul_overflow(want, static_cast<uint64_t>(d), &want);
  }
  if (elem != 0 && (overflow || want != bytes)) {
    throw invalid_argument("{}: corrupt checkpoint shard index: tensor '{}' of shape [{}] {} holds {} bytes, not its "
                           "elements x {}",
                           path, name, fmt::join(shape, ", "), dtype, bytes, elem);
  }
}

}  // namespace

ShardReader::ShardReader(const std::string& path) : path_(path) {
  blob_ = read_file(path, "checkpoint shard");
  const bool v1 = blob_.size() >= kHeaderV1 && std::memcmp(blob_.data(), kMagicV1, 8) == 0;
  const bool v2 = blob_.size() >= kHeader && std::memcmp(blob_.data(), kMagic, 8) == 0;
  if (!v1 && !v2) {
    throw invalid_argument("{}: not a dstrain checkpoint shard (bad magic or truncated header)", path);
  }
  checksummed_ = v2;
  const uint64_t header = v2 ? kHeader : kHeaderV1;
  if (v2 && crc32c(blob_.data(), 20) != load_u32(blob_.data() + 20)) {
    throw invalid_argument("{}: the shard's header (bytes 0-23) fails its CRC-32C check: the file is corrupt", path);
  }
  uint64_t n = 0;
  std::memcpy(&n, blob_.data() + 8, 8);
  if (n > blob_.size() - header) {
    throw invalid_argument("{}: truncated checkpoint shard (index of {} bytes, file of {})", path, n, blob_.size());
  }
  const std::string_view idx(blob_.data() + header, n);
  if (v2 && crc32c(idx) != load_u32(blob_.data() + 16)) {
    throw invalid_argument("{}: the shard's index (bytes {}-{}) fails its CRC-32C check: the file is corrupt", path,
                           header, header + n - 1);
  }
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(idx);
  } catch (const std::exception& e) {
    throw invalid_argument("{}: corrupt checkpoint shard index: {}", path, e.what());
  }
  data_start_ = align_up(header + n);
  try {
    for (const auto& t : index.at("tensors")) {
      Entry e{t.at("dtype").get<std::string>(), t.at("shape").get<std::vector<int64_t>>(),
              t.at("offset").get<uint64_t>(), t.at("bytes").get<uint64_t>(), std::nullopt};
      if (v2) e.crc = static_cast<uint32_t>(std::stoul(t.at("crc32c").get<std::string>(), nullptr, 16));
      if (e.offset > blob_.size() || e.bytes > blob_.size() || data_start_ + e.offset + e.bytes > blob_.size()) {
        throw invalid_argument("{}: truncated checkpoint shard: tensor '{}' ends past the file end", path,
                               t.at("name").get<std::string>());
      }
      check_entry_shape(path, t.at("name").get<std::string>(), e.dtype, e.shape, e.bytes);
      index_[t.at("name").get<std::string>()] = std::move(e);
    }
  } catch (const nlohmann::json::exception& e) {
    throw invalid_argument("{}: corrupt checkpoint shard index: {}", path, e.what());
  } catch (const std::logic_error& e) {  // stoul of a malformed checksum
    throw invalid_argument("{}: corrupt checkpoint shard index: a tensor's crc32c is not hex", path);
  }
}

void ShardReader::check_crc(const std::string& name, const Entry& e) const {
  if (!e.crc) return;
  const uint32_t got = crc32c(blob_.data() + data_start_ + e.offset, e.bytes);
  if (got != *e.crc) {
    const uint64_t first = data_start_ + e.offset;
    throw invalid_argument(
        "{}: tensor '{}' (bytes {}-{} of the file) fails its CRC-32C check (stored {}, computed {}): the shard is "
        "corrupt",
        path_, name, first, first + e.bytes - (e.bytes > 0 ? 1 : 0), crc32c_hex(*e.crc), crc32c_hex(got));
  }
}

bool ShardReader::verify() const {
  for (const auto& [name, e] : index_) check_crc(name, e);
  return checksummed_;
}

std::vector<std::string> ShardReader::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : index_) out.push_back(k);
  return out;
}

const std::string& ShardReader::dtype_of(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end()) throw invalid_argument("{}: checkpoint has no tensor '{}'", path_, name);
  return it->second.dtype;
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
  check_crc(name, e);
  if (bytes) std::memcpy(out, blob_.data() + data_start_ + e.offset, bytes);
}

}  // namespace ds::rt::ckpt
