// A Hugging Face tokenizer.json of the byte-level BPE kind (GPT-2, Llama-3, Qwen2 and their
// descendants ship one) as a Tokenizer of kind "hf". What is read:
//   model            type "BPE": vocab (string -> id), merges ("a b" strings or [a, b] pairs, in
//                    rank order), ignore_merges (a whole pre-token found in the vocab is one
//                    token, as Llama-3 sets); dropout null, no byte_fallback, no subword affixes
//   normalizer       null or NFC (Qwen2), through ICU
//   pre_tokenizer    ByteLevel with use_regex (GPT-2's pattern; add_prefix_space allowed), or a
//                    Sequence of Split (Regex, behavior Isolated, invert false) + ByteLevel
//                    (use_regex false). Split patterns are matched by hand-written scanners, not a
//                    regex engine, so only these strings are accepted, exactly:
//                      GPT-2's, Llama-3's (\p{N}{1,3}) and Qwen2's (\p{N}) patterns
//                    (kHfSupportedPatterns); any other is an error naming it.
//   added_tokens     split out of the text before normalization and pre-tokenization, leftmost
//                    first and the longest at a position (special or not); lstrip, rstrip and
//                    single_word must be false
//   decoder          ByteLevel (decoding is the reverse byte map; added tokens decode to their
//                    content)
//   post_processor   ByteLevel, TemplateProcessing or a Sequence of them: only read for the BOS
//                    that the template puts first; encode() never adds it
// and from tokenizer_config.json beside it (optional): bos_token, eos_token (a string or
// {"content": ...}). Anything else in those places is a ds::Error naming the file and the JSON
// path. Not here: WordPiece, Unigram, SentencePiece-style (Metaspace) files (SentencePiece models
// go through sentencepiece_tokenizer.h), the chat template (jinja_chat_template.h).
//
// document_token(): the BOS (tokenizer_config.json's bos_token, else the post-processor's
// template's first special token), else <|endoftext|> when the tokenizer has it (GPT-2, Qwen2),
// else -1.
//
// Encoding is thread-safe; pieces' ids are cached per thread as in gpt2_bpe.h, and merges are
// found in an open-addressing table keyed by the id pair.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace ds::rt::data {

// The Split patterns the scanners implement, as tokenizer.json spells them (after JSON decoding).
extern const char* const kHfGpt2Pattern;
extern const char* const kHfLlama3Pattern;
extern const char* const kHfQwen2Pattern;

class HfTokenizer final : public Tokenizer {
 public:
  // `path` is a directory holding tokenizer.json (and optionally tokenizer_config.json), or the
  // tokenizer.json file itself (then a tokenizer_config.json beside it is read too). Throws
  // ds::Error (invalid argument) naming the file and JSON path for unsupported or malformed
  // content, and naming the path when there is no tokenizer.json.
  static std::unique_ptr<HfTokenizer> from_path(const std::string& path);

  // Parses the contents (the test and fuzz entry point: no file system). `config_json` may be
  // empty (no tokenizer_config.json). The names are what errors call the two files.
  static std::unique_ptr<HfTokenizer> parse(std::string_view tokenizer_json,
                                            std::string_view config_json,
                                            const std::string& tokenizer_name,
                                            const std::string& config_name);

  ~HfTokenizer() override;
  using Tokenizer::decode;
  using Tokenizer::encode;

  std::string_view name() const override { return "hf"; }
  int64_t vocab_size() const override;  // max id + 1 over the vocab and the added tokens
  int64_t document_token() const override;
  void encode(std::string_view text, std::vector<uint32_t>& out) const override;
  // Throws ds::Error (invalid argument) naming the first id that is neither in the vocab nor
  // an added token, and its index.
  void decode(std::span<const uint32_t> tokens, std::string& out) const override;
  // After a run of \r/\n followed by a printable ASCII character, outside any added token (no
  // pattern merges a newline with a following non-space). npos when the pre-tokenizer adds a
  // prefix space (each side would get one).
  size_t cut_point(std::string_view text, size_t from) const override;

  // The id of an added token's content or of a vocab string (in the byte-level alphabet).
  std::optional<uint32_t> token_id(std::string_view token) const;
  // tokenizer_config.json's eos_token's id, or -1.
  int64_t eos_token() const;
  // "gpt2", "llama3" or "qwen2": which scanner pre-tokenizes.
  std::string_view pattern_name() const;

  struct Tables;  // vocabulary, merges, added tokens, options (hf_tokenizer.cpp)

 private:
  explicit HfTokenizer(std::unique_ptr<Tables> t);
  std::unique_ptr<Tables> t_;
  uint64_t instance_id_;  // tags this tokenizer's entries in the per-thread piece cache
};

}  // namespace ds::rt::data
