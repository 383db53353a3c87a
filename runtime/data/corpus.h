// A corpus: one token file or many shards (llm.c's fineweb_train_*.bin), read as the
// concatenation of its files in sorted path order, as llm.c's loader globs them. The loader
// (loader.h) sees one stream of n tokens, so its windows, epochs, shuffle and exact resume are
// those of the unsplit file; a window that spans a shard boundary reads from both shards.
//
// Sources are paths or glob patterns (glob(3): *, ?, [...]); every match of every source is
// taken, and the union is sorted by byte order. Shards may mix the uint16 and uint32 formats.
// Loss masks (sft.h): when a file has "<file>.mask" beside it, the corpus reads it too (every
// shard must have one then, or none); the loader turns masked-out targets into -1.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/sft.h"
#include "data/token_file.h"

namespace ds::rt::data {

// Expands `sources` (paths or globs) into the sorted list of files. Throws ds::Error (invalid
// argument) naming the pattern for a glob that matches nothing, and the file for one named twice.
// A source without glob characters is kept as it is (TokenFile names it when it is missing).
std::vector<std::string> expand_sources(const std::vector<std::string>& sources);

class TokenCorpus {
 public:
  // Opens every file of expand_sources(sources); each is validated as TokenFile does (so an
  // empty shard is an error naming it). vocab_size > 0 checks every token of every shard.
  explicit TokenCorpus(const std::vector<std::string>& sources, int64_t vocab_size = 0);
  explicit TokenCorpus(const std::string& source, int64_t vocab_size = 0)
      : TokenCorpus(std::vector<std::string>{source}, vocab_size) {}

  int64_t size() const { return total_; }  // tokens in all shards
  // For messages: the file, or "first (+K more shards: first .. last)".
  const std::string& path() const { return description_; }
  std::span<const TokenFile> files() const { return files_; }

  // out[k] = token (start + k) of the concatenation; [start, start+count) must lie in it.
  void copy(int64_t start, int64_t count, int32_t* out) const;

  // Loss masks: whether every file has a mask file beside it (sft.h). Opening throws ds::Error
  // naming the shard without one when only some have, and what MaskFile throws.
  bool has_mask() const { return !mask_.empty(); }
  // targets[k] = -1 (kIgnoreTarget) where token (start + k) is masked out; no-op without masks.
  void apply_mask(int64_t start, int64_t count, int32_t* targets) const;
  // Tokens of [start, start+count) that count (all of them without masks).
  int64_t counted(int64_t start, int64_t count) const;

 private:
  std::vector<uint8_t> mask_;  // every file's mask, concatenated (empty: no masks)
  std::vector<TokenFile> files_;
  std::vector<int64_t> offsets_;  // (files + 1): first token of each file in the concatenation
  int64_t total_ = 0;
  std::string description_;
};

// The write side: a token stream into DIR/<stem>.bin, or with shard_tokens > 0 into
// DIR/<stem>_000000.bin, DIR/<stem>_000001.bin, ... of shard_tokens tokens each (the last may
// be shorter), each written atomically by TokenFileWriter. Throws what TokenFileWriter throws.
class ShardWriter {
 public:
  // with_masks: every file gets its loss mask beside it ("<file>.mask", sft.h) from the masks
  // given to append; without, a stale mask beside a file written is removed.
  ShardWriter(std::string dir, std::string stem, TokenFormat format, int64_t shard_tokens,
              bool with_masks = false);
  ~ShardWriter();
  // `mask` (with_masks only): one byte per token of `tokens`.
  void append(std::span<const uint32_t> tokens, std::span<const uint8_t> mask = {});
  int64_t count() const { return total_; }
  // Finishes the open file; returns every file written with its token count. With shards, also
  // removes DIR/<stem>_NNNNNN.bin files past the last one written (left by an earlier, larger
  // run, which a glob would otherwise pick up) and names them in `removed`.
  std::vector<std::pair<std::string, int64_t>> finish(std::vector<std::string>* removed = nullptr);

 private:
  std::string shard_path(int64_t index) const;
  std::string dir_, stem_;
  TokenFormat format_;
  int64_t shard_tokens_;
  int64_t total_ = 0;
  std::unique_ptr<TokenFileWriter> current_;
  bool with_masks_ = false;
  std::unique_ptr<MaskFileWriter> current_mask_;
  void finish_current();
  std::vector<std::pair<std::string, int64_t>> done_;
};

}  // namespace ds::rt::data
