// llm.c token files (uint16 and uint32): validation at open, mmap for reading, atomic and
// streaming writes.
#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "common/check.h"
#include "common/error.h"

namespace ds::rt::data {

// The format is little-endian; we read it in place.
static_assert(std::endian::native == std::endian::little, "token files are read in place");

namespace {

// Closes a file descriptor on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// The format a header's magic and version name, or an error naming the file.
TokenFormat format_of_header(const std::string& path, int32_t magic, int32_t version) {
  if (magic == kTokenFileMagic || magic == kTokenFileMagicU32) {
    const bool u16 = magic == kTokenFileMagic;
    const int32_t want = u16 ? kTokenFileVersion : kTokenFileVersionU32;
    if (version != want) {
      throw invalid_argument("token file {}: unsupported version {}, expected {}", path, version,
                             want);
    }
    return u16 ? TokenFormat::kU16 : TokenFormat::kU32;
  }
  std::string hint = magic == kLlmcCheckpointMagic
                         ? "this is an llm.c model checkpoint, not a token file"
                         : "prepare token files with `dstrain data prepare`";
  throw Error(ErrorKind::kInvalidArgument,
              fmt::format("token file {}: wrong magic {}, expected {} (llm.c token file, uint16) "
                          "or {} (uint32)",
                          path, magic, kTokenFileMagic, kTokenFileMagicU32),
              hint);
}

int32_t checked_count(const std::string& path, size_t n) {
  if (n > static_cast<size_t>(INT32_MAX)) {
    throw invalid_argument("token file {}: {} tokens do not fit the header's int32 count "
                           "(at most {})",
                           path, n, INT32_MAX);
  }
  return static_cast<int32_t>(n);
}

[[noreturn]] void throw_too_wide(const std::string& path, uint32_t token, int64_t index) {
  throw Error(ErrorKind::kInvalidArgument,
              fmt::format("token file {}: token {} at index {} does not fit llm.c's uint16 format "
                          "(ids up to 65535)",
                          path, token, index),
              "a vocabulary over 65,536 needs the uint32 format (data prepare chooses it from "
              "the tokenizer's vocabulary size)");
}

}  // namespace

TokenFileHeader parse_token_file_header(std::string_view header, int64_t file_bytes,
                                        const std::string& path) {
  if (header.size() < static_cast<size_t>(kTokenFileHeaderBytes) ||
      file_bytes < kTokenFileHeaderBytes) {
    throw invalid_argument(
        "token file {}: truncated header: the file has {} bytes, the header alone is {} bytes "
        "(256 int32)",
        path, std::min<int64_t>(file_bytes, static_cast<int64_t>(header.size())),
        kTokenFileHeaderBytes);
  }
  int32_t h[3];
  std::memcpy(h, header.data(), sizeof(h));
  const TokenFormat format = format_of_header(path, h[0], h[1]);
  const int64_t count = h[2];
  const int64_t expected_bytes = kTokenFileHeaderBytes + token_width(format) * count;
  if (count < 0 || expected_bytes != file_bytes) {
    throw invalid_argument(
        "token file {}: the header says {} tokens ({} bytes with the header) but the file has "
        "{} bytes",
        path, count, expected_bytes, file_bytes);
  }
  if (count == 0) {
    throw invalid_argument("token file {}: empty corpus (the header says 0 tokens)", path);
  }
  return {format, count};
}

TokenFormat token_format_for_vocab(int64_t vocab_size) {
  return vocab_size <= 65536 ? TokenFormat::kU16 : TokenFormat::kU32;
}

const char* token_format_name(TokenFormat f) {
  return f == TokenFormat::kU16 ? "uint16 (llm.c, magic 20240520 version 1)"
                                : "uint32 (llm.c's 4-byte layout, magic 20240801 version 7)";
}

TokenFile::TokenFile(const std::string& path, int64_t vocab_size) : path_(path) {
  Fd f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) {
    int err = errno;
    if (err == ENOENT) {
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("token file {}: no such file", path),
                  "prepare one with `dstrain data prepare --input TEXT --output DIR` "
                  "(or scripts/prepare-kjv.sh for the King James Bible)");
    }
    throw system_error("token file {}: cannot open: {}", path, errno_string(err));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) {
    throw system_error("token file {}: cannot stat: {}", path, errno_string(errno));
  }
  const int64_t file_bytes = static_cast<int64_t>(st.st_size);
  if (file_bytes < kTokenFileHeaderBytes) {
    throw invalid_argument(
        "token file {}: truncated header: the file has {} bytes, the header alone is {} bytes "
        "(256 int32)",
        path, file_bytes, kTokenFileHeaderBytes);
  }
  map_ = ::mmap(nullptr, static_cast<size_t>(file_bytes), PROT_READ, MAP_PRIVATE, f.fd, 0);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw system_error("token file {}: cannot mmap {} bytes: {}", path, file_bytes,
                       errno_string(errno));
  }
  map_bytes_ = static_cast<size_t>(file_bytes);

  try {
    const TokenFileHeader h = parse_token_file_header(
        std::string_view(static_cast<const char*>(map_), kTokenFileHeaderBytes), file_bytes, path);
    format_ = h.format;
    const int64_t count = h.count;
    count_ = count;
    data_ = static_cast<const char*>(map_) + kTokenFileHeaderBytes;
    ::madvise(map_, map_bytes_, MADV_WILLNEED);
    if (vocab_size > 0) check_vocab(vocab_size);
  } catch (...) {
    close();
    throw;
  }
}

TokenFile::~TokenFile() { close(); }

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      data_(std::exchange(other.data_, nullptr)),
      count_(std::exchange(other.count_, 0)),
      format_(other.format_) {}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    close();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    data_ = std::exchange(other.data_, nullptr);
    count_ = std::exchange(other.count_, 0);
    format_ = other.format_;
  }
  return *this;
}

void TokenFile::close() noexcept {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  data_ = nullptr;
  count_ = 0;
}

std::span<const uint16_t> TokenFile::tokens() const {
  DS_CHECK(format_ == TokenFormat::kU16, "{} holds uint32 tokens", path_);
  return {static_cast<const uint16_t*>(data_), static_cast<size_t>(count_)};
}

std::span<const uint32_t> TokenFile::tokens32() const {
  DS_CHECK(format_ == TokenFormat::kU32, "{} holds uint16 tokens", path_);
  return {static_cast<const uint32_t*>(data_), static_cast<size_t>(count_)};
}

void TokenFile::copy(int64_t start, int64_t count, int32_t* out) const {
  DS_CHECK(start >= 0 && count >= 0 && start + count <= count_, "[{}, +{}) in {} tokens", start,
           count, count_);
  if (format_ == TokenFormat::kU16) {
    const uint16_t* p = static_cast<const uint16_t*>(data_) + start;
    for (int64_t i = 0; i < count; ++i) out[i] = p[i];
  } else {
    const uint32_t* p = static_cast<const uint32_t*>(data_) + start;
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(p[i]);
  }
}

uint32_t TokenFile::max_token() const {
  uint32_t m = 0;
  if (format_ == TokenFormat::kU16) {
    for (uint16_t t : tokens()) m = std::max<uint32_t>(m, t);
  } else {
    for (uint32_t t : tokens32()) m = std::max(m, t);
  }
  return m;
}

void TokenFile::check_vocab(int64_t vocab_size) const {
  if (vocab_size <= 0) {
    throw invalid_argument("token file {}: vocab_size {} is out of range (at least 1)", path_,
                           vocab_size);
  }
  if (format_ == TokenFormat::kU16 && vocab_size >= 65536) return;  // every uint16 fits
  // Find the maximum first (vectorises), then locate the first offender only on failure.
  if (max_token() < static_cast<uint64_t>(vocab_size)) return;
  for (int64_t i = 0; i < count_; ++i) {
    if (token(i) >= static_cast<uint64_t>(vocab_size)) {
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("token file {}: token {} at index {} is >= the model's vocab_size {}",
                              path_, token(i), i, vocab_size),
                  "the data was prepared with a larger vocabulary than the model has; prepare it "
                  "with the model's tokenizer or raise model.vocab_size");
    }
  }
}

void write_token_file(const std::string& path, std::span<const uint16_t> tokens) {
  std::vector<uint32_t> wide(tokens.begin(), tokens.end());
  write_token_file(path, wide, TokenFormat::kU16);
}

void write_token_file(const std::string& path, std::span<const uint32_t> tokens,
                      TokenFormat format) {
  if (tokens.empty()) {
    throw invalid_argument("token file {}: refusing to write an empty corpus (0 tokens)", path);
  }
  checked_count(path, tokens.size());
  if (format == TokenFormat::kU16) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] > 0xFFFF) throw_too_wide(path, tokens[i], static_cast<int64_t>(i));
    }
  }
  TokenFileWriter w(path, format);
  w.append(tokens);
  w.finish();
}

TokenFileWriter::TokenFileWriter(std::string path, TokenFormat format)
    : path_(std::move(path)), tmp_(fmt::format("{}.tmp.{}", path_, ::getpid())), format_(format) {
  file_ = std::fopen(tmp_.c_str(), "wb");
  if (file_ == nullptr) {
    throw system_error("token file {}: cannot create {}: {}", path_, tmp_, errno_string(errno));
  }
  const int32_t header[kTokenFileHeaderInts] = {};
  if (std::fwrite(header, sizeof(header), 1, file_) != 1) {
    const int err = errno;
    std::fclose(file_);
    file_ = nullptr;
    std::remove(tmp_.c_str());
    throw system_error("token file {}: cannot write {}: {}", path_, tmp_, errno_string(err));
  }
}

TokenFileWriter::~TokenFileWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(tmp_.c_str());
  }
}

void TokenFileWriter::append(std::span<const uint32_t> tokens) {
  DS_CHECK(file_ != nullptr, "append after finish on {}", path_);
  checked_count(path_, static_cast<size_t>(count_) + tokens.size());
  size_t written;
  if (format_ == TokenFormat::kU16) {
    narrow_.resize(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (tokens[i] > 0xFFFF) throw_too_wide(path_, tokens[i], count_ + static_cast<int64_t>(i));
      narrow_[i] = static_cast<uint16_t>(tokens[i]);
    }
    written = std::fwrite(narrow_.data(), 2, narrow_.size(), file_);
  } else {
    written = std::fwrite(tokens.data(), 4, tokens.size(), file_);
  }
  if (written != tokens.size()) {
    throw system_error("token file {}: cannot write {}: {}", path_, tmp_, errno_string(errno));
  }
  count_ += static_cast<int64_t>(tokens.size());
}

void TokenFileWriter::finish() {
  DS_CHECK(file_ != nullptr, "finish twice on {}", path_);
  if (count_ == 0) {
    throw invalid_argument("token file {}: refusing to write an empty corpus (0 tokens)", path_);
  }
  int32_t header[3] = {format_ == TokenFormat::kU16 ? kTokenFileMagic : kTokenFileMagicU32,
                       format_ == TokenFormat::kU16 ? kTokenFileVersion : kTokenFileVersionU32,
                       static_cast<int32_t>(count_)};
  bool ok = std::fflush(file_) == 0 && std::fseek(file_, 0, SEEK_SET) == 0 &&
            std::fwrite(header, sizeof(header), 1, file_) == 1 && std::fflush(file_) == 0 &&
            ::fsync(::fileno(file_)) == 0;
  int err = errno;
  if (std::fclose(file_) != 0 && ok) {
    ok = false;
    err = errno;
  }
  file_ = nullptr;
  if (!ok) {
    std::remove(tmp_.c_str());
    throw system_error("token file {}: cannot write {}: {}", path_, tmp_, errno_string(err));
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    err = errno;
    std::remove(tmp_.c_str());
    throw system_error("token file {}: cannot rename {} into place: {}", path_, tmp_,
                       errno_string(err));
  }
}

}  // namespace ds::rt::data
