// Token files in llm.c's formats: a header of 256 little-endian int32 (magic, version, token
// count, the rest zero) followed by the tokens, little-endian:
//   uint16  magic 20240520, version 1   llm.c's 2-byte format (vocabularies up to 65,536)
//   uint32  magic 20240801, version 7   llm.c's 4-byte format (dev/data/data_common.py's second
//                                       header), for vocabularies over 65,536
// Data prepared for llm.c trains here unchanged, and ours trains in llm.c. A token that does not
// fit the format being written is an error, never truncated.
//
// TokenFile maps a file read-only (mmap) and validates it once at open; afterwards reading tokens
// is plain memory access. Writers write atomically (a temporary name, then rename).
// Not here: sharded corpora (corpus.h), tokenization (tokenizer.h), batching (loader.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ds::rt::data {

inline constexpr int32_t kTokenFileMagic = 20240520;  // uint16 tokens
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int32_t kTokenFileMagicU32 = 20240801;  // uint32 tokens
inline constexpr int32_t kTokenFileVersionU32 = 7;

enum class TokenFormat { kU16, kU32 };
// kU16 for vocabularies up to 65,536 (llm.c's 2-byte format), kU32 above.
TokenFormat token_format_for_vocab(int64_t vocab_size);
const char* token_format_name(TokenFormat f);  // "uint16 (llm.c, magic 20240520)" / "uint32 (...)"
inline int token_width(TokenFormat f) { return f == TokenFormat::kU16 ? 2 : 4; }
inline constexpr int kTokenFileHeaderInts = 256;
inline constexpr int64_t kTokenFileHeaderBytes = kTokenFileHeaderInts * 4;  // 1024
// llm.c's checkpoint magic (checkpoint/llmc_format.h), recognised only to say so when one is passed as a token file.
inline constexpr int32_t kLlmcCheckpointMagic = 20240326;

// A token file's header checked against the file's size: the fuzz entry point (no file system).
// `header` holds at least the first 1024 bytes. Throws ds::Error naming `path` as TokenFile's
// constructor does (truncated header, magic, version, count against size, empty corpus).
struct TokenFileHeader {
  TokenFormat format;
  int64_t count;
};
TokenFileHeader parse_token_file_header(std::string_view header, int64_t file_bytes,
                                        const std::string& path);

// A read-only, memory-mapped token file. Move-only; the mapping lives as long as the object.
// Thread safety: const methods may be called from any number of threads.
class TokenFile {
 public:
  // Opens and validates `path`. Throws ds::Error naming the file for: a missing file, a header
  // shorter than 1024 bytes, a wrong magic (found and expected), a version that does not belong
  // to the magic, a token count that disagrees with the file size, and an empty corpus.
  // When vocab_size > 0, every token is also checked to be < vocab_size (one pass over the file;
  // the error names the first offending token and its index).
  explicit TokenFile(const std::string& path, int64_t vocab_size = 0);
  ~TokenFile();
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return count_; }  // number of tokens
  TokenFormat format() const { return format_; }
  // The tokens of a uint16 / a uint32 file (DS_CHECK on the other format).
  std::span<const uint16_t> tokens() const;
  std::span<const uint32_t> tokens32() const;
  uint32_t token(int64_t i) const {
    return format_ == TokenFormat::kU16 ? static_cast<const uint16_t*>(data_)[i]
                                        : static_cast<const uint32_t*>(data_)[i];
  }
  // out[k] = token(start + k) for k < count; [start, start+count) must lie in the file.
  void copy(int64_t start, int64_t count, int32_t* out) const;
  // The largest token (one pass over the file).
  uint32_t max_token() const;

  // Throws ds::Error (invalid argument) naming the file, the first token >= vocab_size and its
  // index. Used when the model's vocabulary is known only after opening. vocab_size >= 1.
  void check_vocab(int64_t vocab_size) const;

 private:
  void close() noexcept;

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const void* data_ = nullptr;
  int64_t count_ = 0;
  TokenFormat format_ = TokenFormat::kU16;
};

// Writes `tokens` to `path` in llm.c's format: to `path.tmp.<pid>` first, flushed, then renamed
// over `path`, so a reader never sees a partial file. Throws ds::Error naming the file on any
// I/O failure (the temporary is removed), for an empty token list, or for more tokens than the
// header's int32 count can hold.
void write_token_file(const std::string& path, std::span<const uint16_t> tokens);
// The same for uint32 ids in `format`; a token >= 65,536 into kU16 throws naming the file, the
// token and its index (nothing is written).
void write_token_file(const std::string& path, std::span<const uint32_t> tokens,
                      TokenFormat format);

// Writes one token file as a stream: tokens go to `path.tmp.<pid>` as they come; finish() writes
// the count into the header, flushes and renames into place. A writer destroyed unfinished (an
// error on the way) removes its temporary. Throws ds::Error naming the file on I/O failure, for a
// token that does not fit `format` (the token and its index: never truncated), for more tokens
// than the header's int32 count holds, and at finish() for 0 tokens.
class TokenFileWriter {
 public:
  TokenFileWriter(std::string path, TokenFormat format);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  void append(std::span<const uint32_t> tokens);
  int64_t count() const { return count_; }
  const std::string& path() const { return path_; }
  void finish();

 private:
  std::string path_, tmp_;
  TokenFormat format_;
  std::FILE* file_ = nullptr;
  int64_t count_ = 0;
  std::vector<uint16_t> narrow_;  // staging for kU16
};

}  // namespace ds::rt::data
