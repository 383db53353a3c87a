// llm.c token files: validation at open, mmap for reading, atomic writes.
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

}  // namespace

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
    int32_t header[kTokenFileHeaderInts];
    std::memcpy(header, map_, sizeof(header));
    if (header[0] != kTokenFileMagic) {
      std::string hint = header[0] == kLlmcCheckpointMagic
                             ? "this is an llm.c model checkpoint, not a token file"
                             : "prepare token files with `dstrain data prepare`";
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("token file {}: wrong magic {}, expected {} (llm.c token file)",
                              path, header[0], kTokenFileMagic),
                  hint);
    }
    if (header[1] != kTokenFileVersion) {
      throw invalid_argument("token file {}: unsupported version {}, expected {}", path,
                             header[1], kTokenFileVersion);
    }
    const int64_t count = header[2];
    const int64_t expected_bytes = kTokenFileHeaderBytes + 2 * count;
    if (count < 0 || expected_bytes != file_bytes) {
      throw invalid_argument(
          "token file {}: the header says {} tokens ({} bytes with the header) but the file has "
          "{} bytes",
          path, count, expected_bytes, file_bytes);
    }
    if (count == 0) {
      throw invalid_argument("token file {}: empty corpus (the header says 0 tokens)", path);
    }
    count_ = count;
    tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(map_) +
                                                kTokenFileHeaderBytes);
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
      tokens_(std::exchange(other.tokens_, nullptr)),
      count_(std::exchange(other.count_, 0)) {}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    close();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    count_ = std::exchange(other.count_, 0);
  }
  return *this;
}

void TokenFile::close() noexcept {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
  count_ = 0;
}

void TokenFile::check_vocab(int64_t vocab_size) const {
  if (vocab_size <= 0 || vocab_size > 65536) {
    throw invalid_argument("token file {}: vocab_size {} is out of range (1..65536 for uint16 "
                           "tokens)",
                           path_, vocab_size);
  }
  if (vocab_size == 65536) return;  // every uint16 fits
  const uint16_t limit = static_cast<uint16_t>(vocab_size);
  // Find the maximum first (vectorises), then locate the first offender only on failure.
  uint16_t max_token = 0;
  for (int64_t i = 0; i < count_; ++i) max_token = std::max(max_token, tokens_[i]);
  if (max_token < limit) return;
  for (int64_t i = 0; i < count_; ++i) {
    if (tokens_[i] >= limit) {
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("token file {}: token {} at index {} is >= the model's vocab_size {}",
                              path_, tokens_[i], i, vocab_size),
                  "the data was prepared with a larger vocabulary than the model has; prepare it "
                  "with the model's tokenizer or raise model.vocab_size");
    }
  }
}

void write_token_file(const std::string& path, std::span<const uint16_t> tokens) {
  if (tokens.empty()) {
    throw invalid_argument("token file {}: refusing to write an empty corpus (0 tokens)", path);
  }
  if (tokens.size() > static_cast<size_t>(INT32_MAX)) {
    throw invalid_argument("token file {}: {} tokens do not fit the header's int32 count "
                           "(at most {})",
                           path, tokens.size(), INT32_MAX);
  }
  int32_t header[kTokenFileHeaderInts] = {};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<int32_t>(tokens.size());

  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    throw system_error("token file {}: cannot create {}: {}", path, tmp, errno_string(errno));
  }
  bool ok = std::fwrite(header, sizeof(header), 1, f) == 1 &&
            std::fwrite(tokens.data(), sizeof(uint16_t), tokens.size(), f) == tokens.size() &&
            std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  int err = errno;
  if (std::fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    throw system_error("token file {}: cannot write {}: {}", path, tmp, errno_string(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    std::remove(tmp.c_str());
    throw system_error("token file {}: cannot rename {} into place: {}", path, tmp,
                       errno_string(err));
  }
}

}  // namespace ds::rt::data
