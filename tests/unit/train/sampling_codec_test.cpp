// The tokenizer `dstrain sample` decodes with (train/sampling.h, codec_for): byte-level for a
// vocabulary of 256 or less, the named tokenizer otherwise (GPT-2's BPE here, on its real
// vocabulary), and a clear error naming the options when a larger vocabulary has none.
#include <gtest/gtest.h>

#include "common/error.h"
#include "data/tokenizer.h"
#include "train/sampling.h"
#include "unit/data/gpt2_vocab.h"

namespace ds::rt::train {
namespace {

TEST(SamplingCodec, ByteLevelForSmallVocabularies) {
  const auto c = codec_for(256);
  EXPECT_EQ(c->name(), "byte-level");
  EXPECT_EQ(c->encode("Hi"), (std::vector<int32_t>{'H', 'i'}));
  EXPECT_EQ(c->decode({'o', 'k'}), "ok");
  EXPECT_EQ(c->start_token(), '\n');
}

TEST(SamplingCodec, Gpt2BpeRoundTripsAndStartsFromEndOfText) {
  DS_REQUIRE_GPT2_VOCAB();
  const data::TokenizerSpec spec{"gpt2", test::gpt2_vocab_dir()};
  const auto c = codec_for(50304, &spec);  // GPT-2's padded vocabulary
  const auto ids = c->encode("In the beginning God created the heaven and the earth.");
  EXPECT_EQ(ids.front(), 818);  // "In"
  EXPECT_EQ(c->decode(ids), "In the beginning God created the heaven and the earth.");
  EXPECT_EQ(c->start_token(), 50256);  // <|endoftext|>
}

TEST(SamplingCodec, ALargeVocabularyWithoutATokenizerIsAnErrorNamingTheOptions) {
  try {
    codec_for(50304);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tokenizer given for a vocabulary of 50304 tokens"), std::string::npos)
        << e.what();
    EXPECT_NE(e.hint().find("--tokenizer gpt2 --vocab DIR"), std::string::npos) << e.hint();
  }
}

TEST(SamplingCodec, ATokenizerLargerThanTheModelIsAnError) {
  DS_REQUIRE_GPT2_VOCAB();
  const data::TokenizerSpec spec{"gpt2", test::gpt2_vocab_dir()};
  EXPECT_THROW(codec_for(1024, &spec), Error);
}

}  // namespace
}  // namespace ds::rt::train
