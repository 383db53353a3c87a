// The byte-level tokenizer, and open_tokenizer's choice among the five kinds.
#include "data/tokenizer.h"

#include "common/error.h"
#include "data/gpt2_bpe.h"
#include "data/hf_tokenizer.h"
#include "data/llmc_tokenizer.h"
#include "data/sentencepiece_tokenizer.h"

namespace ds::rt::data {

namespace {

template <typename T>
void decode_bytes_into(std::span<const T> tokens, std::string& out) {
  const size_t base = out.size();
  out.resize(base + tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t t = tokens[i];
    if (t < 0 || t >= kByteVocabSize) {
      throw invalid_argument("byte tokenizer: token {} at index {} is outside the vocabulary "
                             "(0..{})",
                             t, i, kByteVocabSize - 1);
    }
    out[base + i] = static_cast<char>(static_cast<unsigned char>(t));
  }
}

}  // namespace

void ByteTokenizer::encode(std::string_view text, std::vector<uint32_t>& out) const {
  const size_t base = out.size();
  out.resize(base + text.size());
  for (size_t i = 0; i < text.size(); ++i) out[base + i] = static_cast<unsigned char>(text[i]);
}

void ByteTokenizer::decode(std::span<const uint32_t> tokens, std::string& out) const {
  decode_bytes_into(tokens, out);
}

size_t ByteTokenizer::cut_point(std::string_view text, size_t from) const {
  return from == 0 ? (text.size() > 1 ? 1 : std::string_view::npos)
                   : (from < text.size() ? from : std::string_view::npos);
}

std::unique_ptr<Tokenizer> open_tokenizer(const TokenizerSpec& spec) {
  if (spec.kind == "byte") return std::make_unique<ByteTokenizer>();
  if (spec.kind == "gpt2") {
    if (spec.path.empty()) {
      throw Error(ErrorKind::kInvalidArgument, "tokenizer gpt2 needs its vocabulary directory",
                  "pass --vocab DIR (scripts/fetch-gpt2-tokenizer.sh fetches GPT-2's into "
                  "data/gpt2)");
    }
    return Gpt2Tokenizer::from_dir(spec.path);
  }
  if (spec.kind == "hf") {
    if (spec.path.empty()) {
      throw Error(ErrorKind::kInvalidArgument, "tokenizer hf needs its tokenizer.json",
                  "pass --vocab DIR (a Hugging Face model directory) or --vocab tokenizer.json");
    }
    return HfTokenizer::from_path(spec.path);
  }
  if (spec.kind == "sentencepiece" || spec.kind == "llmc") {
    if (spec.path.empty()) {
      throw invalid_argument("tokenizer {} needs its file ({})", spec.kind,
                             spec.kind == "llmc" ? "--llmc-tokenizer gpt2_tokenizer.bin"
                                                 : "--model tokenizer.model");
    }
    if (spec.kind == "llmc") return LlmcTokenizer::from_file(spec.path);
    return SentencePieceTokenizer::from_file(spec.path);
  }
  throw invalid_argument("unknown tokenizer \"{}\": expected byte, gpt2, hf, sentencepiece or llmc",
                         spec.kind);
}

void encode_bytes(std::string_view text, std::vector<uint16_t>& out) {
  const size_t base = out.size();
  out.resize(base + text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    out[base + i] = static_cast<unsigned char>(text[i]);
  }
}

std::vector<uint16_t> encode_bytes(std::string_view text) {
  std::vector<uint16_t> out;
  encode_bytes(text, out);
  return out;
}

std::string decode_bytes(std::span<const uint16_t> tokens) {
  std::string out;
  decode_bytes_into(tokens, out);
  return out;
}

std::string decode_bytes(std::span<const int32_t> tokens) {
  std::string out;
  decode_bytes_into(tokens, out);
  return out;
}

}  // namespace ds::rt::data
