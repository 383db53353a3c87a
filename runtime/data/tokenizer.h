// Tokenizers: text to token ids and back. One interface, five implementations:
//   byte           vocabulary 256, token = byte value; lossless for any input, no special tokens
//   gpt2           GPT-2's byte-level BPE (gpt2_bpe.h), <|endoftext|> = 50256
//   hf             a Hugging Face byte-level BPE tokenizer.json (hf_tokenizer.h): GPT-2, Llama-3, Qwen2
//   sentencepiece  a SentencePiece model through libsentencepiece (sentencepiece_tokenizer.h)
//   llmc           llm.c's gpt2_tokenizer.bin (llmc_tokenizer.h): decode only
// `dstrain data prepare` encodes with the same object `dstrain data inspect` decodes with, so
// encoding and decoding are one code path per tokenizer.
//
// Encoding is thread-safe (const; per-thread caches live inside the implementation), so one
// tokenizer serves every worker of the parallel encoder (encode_pipeline.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ds::rt::data {

inline constexpr int kByteVocabSize = 256;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // "byte", "gpt2", "hf", "sentencepiece" or "llmc".
  virtual std::string_view name() const = 0;
  // Ids are in [0, vocab_size).
  virtual int64_t vocab_size() const = 0;
  // The token `data prepare` writes before every document (GPT-2's <|endoftext|>, a
  // SentencePiece model's BOS), or -1 for none.
  virtual int64_t document_token() const = 0;
  // False for a decode-only tokenizer (llm.c's tokenizer file).
  virtual bool can_encode() const { return true; }

  // Appends the ids of `text` to `out`. Throws ds::Error (invalid usage) when !can_encode().
  virtual void encode(std::string_view text, std::vector<uint32_t>& out) const = 0;
  // Appends the bytes `tokens` stand for to `out`. Throws ds::Error (invalid argument) naming
  // the first id outside [0, vocab_size) and its index.
  virtual void decode(std::span<const uint32_t> tokens, std::string& out) const = 0;

  // Where the parallel encoder may cut `text` (encoding the two sides separately gives the same
  // ids as encoding the whole): the smallest cut point >= `from`, or std::string_view::npos
  // when there is none in `text` (the encoder then reads on). 0 < result < text.size().
  virtual size_t cut_point(std::string_view text, size_t from) const = 0;

  std::vector<uint32_t> encode(std::string_view text) const {
    std::vector<uint32_t> out;
    encode(text, out);
    return out;
  }
  std::string decode(std::span<const uint32_t> tokens) const {
    std::string out;
    decode(tokens, out);
    return out;
  }
};

// The byte-level tokenizer as a Tokenizer: no document token, cut anywhere.
class ByteTokenizer final : public Tokenizer {
 public:
  using Tokenizer::decode;
  using Tokenizer::encode;
  std::string_view name() const override { return "byte"; }
  int64_t vocab_size() const override { return kByteVocabSize; }
  int64_t document_token() const override { return -1; }
  void encode(std::string_view text, std::vector<uint32_t>& out) const override;
  void decode(std::span<const uint32_t> tokens, std::string& out) const override;
  size_t cut_point(std::string_view text, size_t from) const override;
};

// Which tokenizer to open, as `dstrain data prepare/inspect` name it.
struct TokenizerSpec {
  std::string kind = "byte";  // byte | gpt2 | hf | sentencepiece | llmc
  std::string path;           // gpt2: the vocabulary directory; sentencepiece: the .model file;
                              // hf: a directory holding tokenizer.json, or that file;
                              // llmc: gpt2_tokenizer.bin; byte: unused
};

// Opens `spec`. Throws ds::Error (invalid argument) naming the file or directory on bad input
// and an unknown kind.
std::unique_ptr<Tokenizer> open_tokenizer(const TokenizerSpec& spec);

// The byte-level tokenizer as free functions (uint16 tokens, as the first token files held).
void encode_bytes(std::string_view text, std::vector<uint16_t>& out);
std::vector<uint16_t> encode_bytes(std::string_view text);

// The bytes the tokens stand for. Throws ds::Error (invalid argument) naming the first token
// >= 256 and its index.
std::string decode_bytes(std::span<const uint16_t> tokens);
std::string decode_bytes(std::span<const int32_t> tokens);

}  // namespace ds::rt::data
