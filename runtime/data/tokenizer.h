// The byte-level tokenizer: vocabulary 256, token = byte value. Lossless for any input (UTF-8 or
// not), no merges, no special tokens. Not here: BPE (GPT-2's tokenizer); data prepared with one
// elsewhere still trains here through the token file format.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ds::rt::data {

inline constexpr int kByteVocabSize = 256;

// Appends one token per byte of `text` to `out`.
void encode_bytes(std::string_view text, std::vector<uint16_t>& out);
std::vector<uint16_t> encode_bytes(std::string_view text);

// The bytes the tokens stand for. Throws ds::Error (invalid argument) naming the first token
// >= 256 and its index.
std::string decode_bytes(std::span<const uint16_t> tokens);
std::string decode_bytes(std::span<const int32_t> tokens);

}  // namespace ds::rt::data
