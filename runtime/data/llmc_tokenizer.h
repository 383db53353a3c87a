// llm.c's tokenizer file, gpt2_tokenizer.bin, as llm.c's train_gpt2.py writes it and
// llmc/tokenizer.h reads it: a header of 256 little-endian int32 (magic 20240328, version 2,
// vocab size, EOT id; version 1 has no EOT field and means GPT-2's 50257 tokens with EOT 50256),
// then every token's bytes in id order, each as a uint8 length (1..255) followed by that many
// bytes. It can only decode (llm.c prints samples with it); `data prepare --tokenizer gpt2`
// writes one beside the data so that llm.c decodes ours, and `data inspect` decodes llm.c's data
// with theirs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace ds::rt::data {

inline constexpr int32_t kLlmcTokenizerMagic = 20240328;

class LlmcTokenizer final : public Tokenizer {
 public:
  // Reads `path`. Throws ds::Error (invalid argument) naming the file for bad content.
  static std::unique_ptr<LlmcTokenizer> from_file(const std::string& path);
  // Parses a whole file's bytes (the fuzz entry point); `name` is what errors call it. Throws for
  // a short header, a wrong magic, an unknown version, a vocab size < 1, version 1 with a vocab
  // size other than 50257, an EOT id outside the vocabulary, a zero-length token and a file that
  // ends early or runs on (the token whose bytes are missing).
  static std::unique_ptr<LlmcTokenizer> parse(std::string_view bytes, const std::string& name);
  LlmcTokenizer(std::vector<std::string> tokens, int64_t eot);

  using Tokenizer::decode;
  using Tokenizer::encode;
  std::string_view name() const override { return "llmc"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  int64_t document_token() const override { return eot_; }
  bool can_encode() const override { return false; }
  void encode(std::string_view text, std::vector<uint32_t>& out) const override;
  void decode(std::span<const uint32_t> tokens, std::string& out) const override;
  size_t cut_point(std::string_view text, size_t from) const override;

  const std::vector<std::string>& tokens() const { return tokens_; }

 private:
  std::vector<std::string> tokens_;
  int64_t eot_;
};

// Writes `tok`'s vocabulary (every id's decoded bytes) in llm.c's layout, version 2, atomically.
// Throws ds::Error (invalid argument) naming the file for a token of 0 or over 255 bytes, which
// the layout cannot hold, and a tokenizer without a document (EOT) token.
void write_llmc_tokenizer(const std::string& path, const Tokenizer& tok);

}  // namespace ds::rt::data
