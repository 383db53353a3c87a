// The byte-level tokenizer: every byte round-trips, UTF-8 becomes its bytes, bad ids are named.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "data/tokenizer.h"

namespace ds::rt::data {
namespace {

TEST(Tokenizer, EveryByteRoundTrips) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const auto tokens = encode_bytes(all);
  ASSERT_EQ(tokens.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(tokens[b], b);
  EXPECT_EQ(decode_bytes(tokens), all);
}

TEST(Tokenizer, Utf8IsItsBytes) {
  const std::string text = "In the beginning \xc3\xa9";  // "é" is two bytes
  const auto tokens = encode_bytes(text);
  EXPECT_EQ(tokens.size(), 19u);
  EXPECT_EQ(tokens[0], 'I');
  EXPECT_EQ(tokens[17], 0xc3);
  EXPECT_EQ(tokens[18], 0xa9);
  std::vector<int32_t> wide(tokens.begin(), tokens.end());
  EXPECT_EQ(decode_bytes(wide), text);
}

TEST(Tokenizer, EncodeAppends) {
  std::vector<uint16_t> out = {7};
  encode_bytes("ab", out);
  EXPECT_EQ(out, (std::vector<uint16_t>{7, 'a', 'b'}));
  EXPECT_TRUE(encode_bytes("").empty());
}

TEST(Tokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  try {
    decode_bytes(std::vector<uint16_t>{65, 256});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "byte tokenizer: token 256 at index 1 is outside the vocabulary (0..255)");
  }
  EXPECT_THROW(decode_bytes(std::vector<int32_t>{-1}), Error);
}

}  // namespace
}  // namespace ds::rt::data
