// Instruction / chat data (SFT): JSONL examples to tokens with a per-token loss mask, and the
// mask files that sit beside token files.
//
// Input, one JSON object a line (blank lines skipped):
//   {"prompt": "...", "completion": "..."}      a user message then an assistant message
//   {"messages": [{"role": "user", "content": "..."}, ...]}
// An example is: the tokenizer's document token (if it has one; not counted), then each segment
// of the chat template's rendering (chat.h) tokenized on its own, counted when trainable.
//
// Mask file, beside each token file as "<token file>.mask" (train.bin -> train.bin.mask,
// train_000000.bin -> train_000000.bin.mask; a "*.bin" glob never matches one): a header of 256
// little-endian int32 (magic 20261205, version 1, token count, the rest zero), then one byte per
// token of the token file: 1 = the token counts as a target in the loss, 0 = it does not.
// Written atomically (a temporary name, then rename); validated on read: magic, version, the
// count against the file size and against the token file's count, every byte 0 or 1.
// Not here: templates (chat_template.h), how the loader applies a mask (loader.h).
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/chat.h"
#include "data/tokenizer.h"

namespace ds::rt::data {

inline constexpr int32_t kMaskFileMagic = 20261205;
inline constexpr int32_t kMaskFileVersion = 1;

// "<token file>.mask".
std::string mask_path_for(const std::string& token_path);

// A mask file read whole into memory (one byte per token). Throws ds::Error (invalid argument)
// naming the file for: a truncated header, a wrong magic or version, a count that disagrees with
// the file size or with `expected_count` (the token file's), and a byte other than 0 or 1 (its
// index).
class MaskFile {
 public:
  MaskFile(const std::string& path, int64_t expected_count);
  const std::string& path() const { return path_; }
  int64_t size() const { return static_cast<int64_t>(mask_.size()); }
  std::span<const uint8_t> mask() const { return mask_; }

 private:
  std::string path_;
  std::vector<uint8_t> mask_;
};

// Writes a mask file as a stream, like TokenFileWriter: to "path.tmp.<pid>", then finish()
// writes the count, flushes and renames into place; destroyed unfinished it removes the
// temporary. Throws ds::Error naming the file on I/O failure.
class MaskFileWriter {
 public:
  explicit MaskFileWriter(std::string path);
  ~MaskFileWriter();
  MaskFileWriter(const MaskFileWriter&) = delete;
  MaskFileWriter& operator=(const MaskFileWriter&) = delete;
  void append(std::span<const uint8_t> mask);
  int64_t count() const { return count_; }
  void finish();

 private:
  std::string path_, tmp_;
  std::FILE* file_ = nullptr;
  int64_t count_ = 0;
};

// One JSONL line as messages. `where` is "FILE:LINE". Throws ds::Error (invalid argument) naming
// `where` for malformed JSON, a line that is not an object with either "prompt" and
// "completion" (strings) or "messages" (an array of objects with string "role" and "content").
std::vector<ChatMessage> parse_sft_line(std::string_view line, const std::string& where);

// Appends one example's tokens and mask (same length) to `tokens` and `mask`: the document
// token (mask 0), then each segment of `tmpl`'s rendering. Throws what the template throws.
void encode_sft_example(const Tokenizer& tok, const ChatTemplate& tmpl,
                        const std::vector<ChatMessage>& messages, const std::string& where,
                        std::vector<uint32_t>& tokens, std::vector<uint8_t>& mask);

}  // namespace ds::rt::data
