// Token files in llm.c's format: a header of 256 little-endian int32 (magic 20240520, version 1,
// token count, the rest zero) followed by the tokens as little-endian uint16. Data prepared for
// llm.c trains here unchanged, and ours trains in llm.c.
//
// TokenFile maps a file read-only (mmap) and validates it once at open; afterwards reading tokens
// is plain memory access. write_token_file writes atomically (a temporary name, then rename).
// Not here: sharded corpora (llm.c's glob of shards), tokenization (tokenizer.h), batching
// (loader.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace ds::rt::data {

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int kTokenFileHeaderInts = 256;
inline constexpr int64_t kTokenFileHeaderBytes = kTokenFileHeaderInts * 4;  // 1024
// llm.c's GPT-2 checkpoint magic, recognised only to say so when one is passed as a token file.
inline constexpr int32_t kLlmcCheckpointMagic = 20240326;

// A read-only, memory-mapped token file. Move-only; the mapping lives as long as the object.
// Thread safety: const methods may be called from any number of threads.
class TokenFile {
 public:
  // Opens and validates `path`. Throws ds::Error naming the file for: a missing file, a header
  // shorter than 1024 bytes, a wrong magic (found and expected), a version other than 1, a token
  // count that disagrees with the file size, and an empty corpus (0 tokens).
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
  std::span<const uint16_t> tokens() const { return {tokens_, static_cast<size_t>(count_)}; }

  // Throws ds::Error (invalid argument) naming the file, the first token >= vocab_size and its
  // index. Used when the model's vocabulary is known only after opening.
  void check_vocab(int64_t vocab_size) const;

 private:
  void close() noexcept;

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t count_ = 0;
};

// Writes `tokens` to `path` in llm.c's format: to `path.tmp.<pid>` first, flushed, then renamed
// over `path`, so a reader never sees a partial file. Throws ds::Error naming the file on any
// I/O failure (the temporary is removed), for an empty token list, or for more tokens than the
// header's int32 count can hold.
void write_token_file(const std::string& path, std::span<const uint16_t> tokens);

}  // namespace ds::rt::data
