#include "common/strings.h"

#include <gtest/gtest.h>

namespace ds {
namespace {

TEST(Strings, ParseIntAcceptsOnlyWholeIntegers) {
  EXPECT_EQ(parse_int("42"), 42);
  EXPECT_EQ(parse_int("-7"), -7);
  EXPECT_EQ(parse_int("+3"), 3);
  EXPECT_FALSE(parse_int(""));
  EXPECT_FALSE(parse_int("4x"));
  EXPECT_FALSE(parse_int("1.5"));
  EXPECT_FALSE(parse_int("-"));
  EXPECT_FALSE(parse_int("99999999999999999999"));
}

TEST(Strings, ClosestMatchSuggestsTypos) {
  std::vector<std::string> keys = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                   "gradient_accumulation_steps"};
  EXPECT_EQ(closest_match("train_batch_sise", keys), "train_batch_size");
  EXPECT_EQ(closest_match("gradient_accumulation_step", keys), "gradient_accumulation_steps");
  EXPECT_FALSE(closest_match("zzz", keys));
}

TEST(Strings, BytesRoundTrip) {
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1.5 * 1024 * 1024 * 1024), "1.50 GiB");
  EXPECT_DOUBLE_EQ(*parse_bytes("80GB"), 80e9);
  EXPECT_DOUBLE_EQ(*parse_bytes("80 GiB"), 80.0 * (1ull << 30));
  EXPECT_DOUBLE_EQ(*parse_bytes("1.5e9"), 1.5e9);
  EXPECT_FALSE(parse_bytes("12 parsecs"));
  EXPECT_FALSE(parse_bytes("-1GB"));
}

TEST(Strings, SplitAndTrim) {
  EXPECT_EQ(split("a@b@c", '@'), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(split("", ','), (std::vector<std::string>{""}));
  EXPECT_EQ(trim("  x y \t"), "x y");
}

}  // namespace
}  // namespace ds
