// safetensors reading and writing. See safetensors.h for the format and the checks. The header is
// parsed with nlohmann::json and then validated field by field; byte ranges are checked in
// uint64 arithmetic so no offset, however large, can wrap or reach outside the file.
#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/atomic_file.h"
#include "common/error.h"
#include "common/half.h"

namespace ds::rt::ckpt {

namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;  // the reference reader's limit
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); i++) out += fmt::format("{}{}", i ? ", " : "", s[i]);
  return out + "]";
}

StDtype parse_dtype(const std::string& path, const std::string& name, const Json& j) {
  if (!j.is_string()) throw invalid_argument("{}: tensor '{}': \"dtype\" must be a string", path, name);
  const std::string d = j.get<std::string>();
  if (d == "F32") return StDtype::kF32;
  if (d == "BF16") return StDtype::kBF16;
  if (d == "F16") return StDtype::kF16;
  throw invalid_argument("{}: tensor '{}' has dtype {}: dstrain reads F32, BF16 and F16", path, name, d);
}

uint64_t json_u64(const std::string& path, const std::string& name, const char* key, const Json& j) {
  if (!j.is_number_unsigned() && !(j.is_number_integer() && j.get<int64_t>() >= 0)) {
    throw invalid_argument("{}: tensor '{}': \"{}\" must hold non-negative integers", path, name, key);
  }
  return j.get<uint64_t>();
}

StTensorInfo parse_entry(const std::string& path, const std::string& name, const Json& e) {
  if (!e.is_object()) throw invalid_argument("{}: header entry '{}' must be an object", path, name);
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!e.contains(key)) throw invalid_argument("{}: tensor '{}' has no \"{}\"", path, name, key);
  }
  StTensorInfo t;
  t.name = name;
  t.dtype = parse_dtype(path, name, e["dtype"]);
  const Json& sh = e["shape"];
  if (!sh.is_array()) throw invalid_argument("{}: tensor '{}': \"shape\" must be an array", path, name);
  uint64_t numel = 1;
  for (const auto& d : sh) {
    const uint64_t v = json_u64(path, name, "shape", d);
    if (v > (uint64_t{1} << 40) || (v != 0 && numel > (uint64_t{1} << 50) / v)) {
      throw invalid_argument("{}: tensor '{}': shape {} is too large", path, name, sh.dump());
    }
    numel *= v;
    t.shape.push_back(static_cast<int64_t>(v));
  }
  const Json& off = e["data_offsets"];
  if (!off.is_array() || off.size() != 2) {
    throw invalid_argument("{}: tensor '{}': \"data_offsets\" must be [begin, end]", path, name);
  }
  t.begin = json_u64(path, name, "data_offsets", off[0]);
  t.end = json_u64(path, name, "data_offsets", off[1]);
  if (t.end < t.begin) {
    throw invalid_argument("{}: tensor '{}': data_offsets [{}, {}] end before they begin", path, name,
                           t.begin, t.end);
  }
  const uint64_t want = numel * static_cast<uint64_t>(st_dtype_size(t.dtype));
  if (t.end - t.begin != want) {
    throw invalid_argument("{}: tensor '{}': {} x {} needs {} bytes but data_offsets [{}, {}] hold {}", path,
                           name, st_dtype_name(t.dtype), shape_str(t.shape), want, t.begin, t.end,
                           t.end - t.begin);
  }
  return t;
}

// Ranges inside the data section, disjoint, and covering it without holes.
void check_ranges(const std::string& path, std::vector<StTensorInfo> sorted, uint64_t data_size) {
  std::sort(sorted.begin(), sorted.end(),
            [](const StTensorInfo& a, const StTensorInfo& b) { return a.begin < b.begin || (a.begin == b.begin && a.end < b.end); });
  uint64_t cursor = 0;
  const StTensorInfo* prev = nullptr;
  for (const auto& t : sorted) {
    if (t.end > data_size) {
      throw invalid_argument("{}: tensor '{}' data_offsets [{}, {}] reach past the data section ({} bytes): "
                             "the file is truncated or the offsets are wrong",
                             path, t.name, t.begin, t.end, data_size);
    }
    if (prev != nullptr && t.begin < cursor) {
      throw invalid_argument("{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", path, prev->name, prev->begin,
                             prev->end, t.name, t.begin, t.end);
    }
    if (t.begin > cursor) {
      throw invalid_argument("{}: bytes [{}, {}) of the data section belong to no tensor (before '{}')", path,
                             cursor, t.begin, t.name);
    }
    cursor = t.end;
    prev = &t;
  }
  if (cursor != data_size) {
    throw invalid_argument("{}: the data section has {} bytes but its tensors end at {}", path, data_size, cursor);
  }
}

void pread_all(int fd, char* dst, uint64_t n, uint64_t at, const std::string& path) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, dst, static_cast<size_t>(std::min<uint64_t>(n, 1u << 30)), static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw system_error("read {}: {}", path, errno_string(errno));
    if (r == 0) throw invalid_argument("{}: the file ends early (truncated while reading)", path);
    dst += r;
    at += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
}

}  // namespace

const char* st_dtype_name(StDtype d) {
  switch (d) {
    case StDtype::kF32: return "F32";
    case StDtype::kBF16: return "BF16";
    case StDtype::kF16: return "F16";
  }
  return "?";
}

int st_dtype_size(StDtype d) { return d == StDtype::kF32 ? 4 : 2; }

int64_t StTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw system_error("open safetensors file {}: {}", path, errno_string(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw system_error("stat {}: {}", path, errno_string(err));
  }
  try {
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size < 8) throw invalid_argument("{}: {} bytes is too short for a safetensors file (truncated?)", path, size);
    unsigned char lenb[8];
    pread_all(fd_, reinterpret_cast<char*>(lenb), 8, 0, path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | lenb[i];
    if (n > kMaxHeaderBytes) throw invalid_argument("{}: header length {} is over the 100 MiB limit", path, n);
    if (n > size - 8) {
      throw invalid_argument("{}: header length {} reaches past the end of the file ({} bytes): truncated", path, n,
                             size);
    }
    std::string header(n, '\0');
    pread_all(fd_, header.data(), n, 8, path);
    Json j = Json::parse(header, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      throw invalid_argument("{}: the header is not a JSON object", path);
    }
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "__metadata__") {
        if (!it->is_object()) throw invalid_argument("{}: \"__metadata__\" must be an object", path);
        for (auto m = it->begin(); m != it->end(); ++m) {
          if (!m->is_string()) throw invalid_argument("{}: __metadata__.{} must be a string", path, m.key());
          metadata_[m.key()] = m->get<std::string>();
        }
        continue;
      }
      tensors_.push_back(parse_entry(path, it.key(), *it));
    }
    data_start_ = 8 + n;
    check_ranges(path, tensors_, size - data_start_);
    std::sort(tensors_.begin(), tensors_.end(),
              [](const StTensorInfo& a, const StTensorInfo& b) { return a.begin < b.begin; });
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

const StTensorInfo* SafetensorsFile::find(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

void SafetensorsFile::read_f32(const std::string& name, const std::vector<int64_t>& shape, float* dst) const {
  const StTensorInfo* t = find(name);
  if (t == nullptr) throw invalid_argument("{}: no tensor '{}'", path_, name);
  if (!shape.empty() && shape != t->shape) {
    throw invalid_argument("{}: tensor '{}' has shape {} but the model expects {}", path_, name, shape_str(t->shape),
                           shape_str(shape));
  }
  const uint64_t bytes = t->end - t->begin;
  if (t->dtype == StDtype::kF32) {
    pread_all(fd_, reinterpret_cast<char*>(dst), bytes, data_start_ + t->begin, path_);
    return;
  }
  std::vector<uint16_t> raw(static_cast<size_t>(t->numel()));
  pread_all(fd_, reinterpret_cast<char*>(raw.data()), bytes, data_start_ + t->begin, path_);
  const bool bf = t->dtype == StDtype::kBF16;
  for (size_t i = 0; i < raw.size(); i++) dst[i] = bf ? bf16_to_f32(raw[i]) : f16_to_f32(raw[i]);
}

// ---- sets -----------------------------------------------------------------------------------

SafetensorsSet::SafetensorsSet(const std::string& path) : path_(path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    files_.push_back(std::make_unique<SafetensorsFile>(path));
  } else if (fs::exists(fs::path(path) / kIndexName, ec)) {
    const std::string ipath = (fs::path(path) / kIndexName).string();
    Json j = Json::parse(read_file(ipath, "safetensors index"), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      throw invalid_argument("{}: expected a JSON object with a \"weight_map\" object", ipath);
    }
    std::map<std::string, size_t> file_index;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it->is_string()) throw invalid_argument("{}: weight_map.{} must be a file name", ipath, it.key());
      const std::string f = it->get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
        throw invalid_argument("{}: weight_map.{} is '{}': expected a file name in the same directory", ipath,
                               it.key(), f);
      }
      auto [fit, added] = file_index.emplace(f, files_.size());
      if (added) files_.push_back(std::make_unique<SafetensorsFile>((fs::path(path) / f).string()));
      if (files_[fit->second]->find(it.key()) == nullptr) {
        throw invalid_argument("{}: weight_map puts '{}' in {}, which has no such tensor", ipath, it.key(), f);
      }
      where_[it.key()] = fit->second;
    }
    return;
  } else if (fs::exists(fs::path(path) / kSingleName, ec)) {
    files_.push_back(std::make_unique<SafetensorsFile>((fs::path(path) / kSingleName).string()));
  } else {
    throw invalid_argument("{}: a directory without {} or {}", path, kIndexName, kSingleName);
  }
  for (const auto& t : files_[0]->tensors()) where_[t.name] = 0;
}

const StTensorInfo* SafetensorsSet::find(const std::string& name) const {
  auto it = where_.find(name);
  return it == where_.end() ? nullptr : files_[it->second]->find(name);
}

const SafetensorsFile& SafetensorsSet::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw invalid_argument("{}: no tensor '{}'", path_, name);
  return *files_[it->second];
}

void SafetensorsSet::read_f32(const std::string& name, const std::vector<int64_t>& shape, float* dst) const {
  file_of(name).read_f32(name, shape, dst);
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  for (const auto& [n, i] : where_) out.push_back(n);
  return out;
}

// ---- writing --------------------------------------------------------------------------------

namespace {

uint64_t tensor_bytes(const StTensorOut& t) {
  return static_cast<uint64_t>(t.values.size()) * static_cast<uint64_t>(st_dtype_size(t.dtype));
}

void append_values(std::string& out, const StTensorOut& t) {
  const size_t at = out.size();
  out.resize(at + tensor_bytes(t));
  char* p = out.data() + at;
  if (t.dtype == StDtype::kF32) {
    std::memcpy(p, t.values.data(), t.values.size() * 4);
    return;
  }
  for (size_t i = 0; i < t.values.size(); i++) {
    const uint16_t h = t.dtype == StDtype::kBF16 ? f32_to_bf16(t.values[i]) : f32_to_f16(t.values[i]);
    std::memcpy(p + 2 * i, &h, 2);
  }
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<StTensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t cursor = 0;
  for (const auto& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (numel != static_cast<int64_t>(t.values.size())) {
      throw invalid_argument("writing {}: tensor '{}' has shape {} but {} values", path, t.name, shape_str(t.shape),
                             t.values.size());
    }
    if (t.name == "__metadata__" || header.contains(t.name)) {
      throw invalid_argument("writing {}: tensor name '{}' is used twice or reserved", path, t.name);
    }
    header[t.name] = {{"dtype", st_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {cursor, cursor + tensor_bytes(t)}}};
    cursor += tensor_bytes(t);
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + h.size() + cursor);
  for (int i = 0; i < 8; i++) out.push_back(static_cast<char>((h.size() >> (8 * i)) & 0xff));
  out += h;
  for (const auto& t : tensors) append_values(out, t);
  write_file_atomic(path, out);
}

std::vector<std::string> write_safetensors_dir(const std::string& dir, const std::vector<StTensorOut>& tensors,
                                               uint64_t max_shard_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw system_error("create directory {}: {}", dir, ec.message());
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (size_t i = 0; i < tensors.size(); i++) {
    const uint64_t b = tensor_bytes(tensors[i]);
    if (in_shard > 0 && in_shard + b > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
    total += b;
  }
  std::vector<std::string> names;
  if (shards.size() == 1) {
    write_safetensors((fs::path(dir) / kSingleName).string(), tensors, {{"format", "pt"}});
    return {kSingleName};
  }
  Json weight_map = Json::object();
  for (size_t s = 0; s < shards.size(); s++) {
    const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    std::vector<StTensorOut> part;
    for (size_t i : shards[s]) {
      part.push_back(tensors[i]);
      weight_map[tensors[i].name] = name;
    }
    write_safetensors((fs::path(dir) / name).string(), part, {{"format", "pt"}});
    names.push_back(name);
  }
  const Json index{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file_atomic((fs::path(dir) / kIndexName).string(), index.dump(2) + "\n");
  names.push_back(kIndexName);
  return names;
}

}  // namespace ds::rt::ckpt
