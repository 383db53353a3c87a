// Byte-level tokenizer: a byte is its own token.
#include "data/tokenizer.h"

#include "common/error.h"

namespace ds::rt::data {

namespace {

template <typename T>
std::string decode_impl(std::span<const T> tokens) {
  std::string out;
  out.resize(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t t = tokens[i];
    if (t < 0 || t >= kByteVocabSize) {
      throw invalid_argument("byte tokenizer: token {} at index {} is outside the vocabulary "
                             "(0..{})",
                             t, i, kByteVocabSize - 1);
    }
    out[i] = static_cast<char>(static_cast<unsigned char>(t));
  }
  return out;
}

}  // namespace

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

std::string decode_bytes(std::span<const uint16_t> tokens) { return decode_impl(tokens); }
std::string decode_bytes(std::span<const int32_t> tokens) { return decode_impl(tokens); }

}  // namespace ds::rt::data
