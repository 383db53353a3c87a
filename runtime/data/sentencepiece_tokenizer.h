// SentencePiece (Kudo & Richardson 2018) through Debian's libsentencepiece: encoding with an
// existing model (Llama 2's tokenizer.model is one) and training a BPE or unigram model.
//
// Text is encoded line by line, as `spm_encode` does: each line, with its '\n' if it has one, is
// one Encode call (so every line gets the model's dummy prefix "▁"). With the default
// normalisation (nmt_nfkc) a '\n' becomes a space and trailing spaces go, so the ids equal
// spm_encode's; with an identity normaliser and byte fallback (Llama 2's model) the newline
// survives as <0x0A>. The document token is the model's BOS (or -1 when it has none).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace ds::rt::data {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  // Loads a .model file. Throws ds::Error (invalid argument) naming it when it does not load.
  static std::unique_ptr<SentencePieceTokenizer> from_file(const std::string& path);
  // Loads a serialized ModelProto (the fuzz entry point); `name` is what errors call it.
  static std::unique_ptr<SentencePieceTokenizer> parse(std::string_view model_proto,
                                                       const std::string& name);
  ~SentencePieceTokenizer() override;

  using Tokenizer::decode;
  using Tokenizer::encode;
  std::string_view name() const override { return "sentencepiece"; }
  int64_t vocab_size() const override;
  int64_t document_token() const override;  // BOS, or -1
  void encode(std::string_view text, std::vector<uint32_t>& out) const override;
  void decode(std::span<const uint32_t> tokens, std::string& out) const override;
  size_t cut_point(std::string_view text, size_t from) const override;  // after a '\n'

 private:
  explicit SentencePieceTokenizer(std::unique_ptr<sentencepiece::SentencePieceProcessor> p);
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  bool drop_newline_ = false;  // the model's normaliser removes a line's trailing '\n'
};

struct SentencePieceTraining {
  std::vector<std::string> inputs;  // text files (no commas in their paths)
  std::string model_prefix;         // writes <prefix>.model and <prefix>.vocab
  int64_t vocab_size = 0;
  std::string model_type = "bpe";   // bpe | unigram
  int64_t max_sentences = 2000000;  // lines sampled for training (input_sentence_size)
  int threads = 1;
};

// Trains a model with byte fallback (every byte encodable) and full character coverage. Throws
// ds::Error (invalid argument) with SentencePiece's own message when training fails (a vocabulary
// too small for the text's characters, for one).
void train_sentencepiece(const SentencePieceTraining& t);

}  // namespace ds::rt::data
