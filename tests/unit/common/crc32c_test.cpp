// CRC-32C against published check values (the CRC catalogue's check value, RFC 3720's iSCSI
// test vectors) and against a bit-by-bit reference over many lengths and alignments.
#include "common/crc32c.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace ds {
namespace {

uint32_t reference(const unsigned char* p, size_t n, uint32_t crc = 0) {
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
  }
  return ~c;
}

TEST(Crc32c, PublishedCheckValues) {
  EXPECT_EQ(crc32c("123456789"), 0xe3069283u);
  std::vector<unsigned char> v(32, 0);
  EXPECT_EQ(crc32c(v.data(), v.size()), 0x8a9136aau);  // RFC 3720 B.4: 32 bytes of zeros
  std::fill(v.begin(), v.end(), 0xff);
  EXPECT_EQ(crc32c(v.data(), v.size()), 0x62a8ab43u);  // 32 bytes of 0xff
  for (int i = 0; i < 32; ++i) v[static_cast<size_t>(i)] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc32c(v.data(), v.size()), 0x46dd794eu);  // 0x00..0x1f
  EXPECT_EQ(crc32c("", 0), 0u);
  EXPECT_EQ(crc32c_hex(0xe3069283u), "e3069283");
}

TEST(Crc32c, EqualsTheBitwiseReferenceAtEveryLengthAndAlignment) {
  std::mt19937 rng(3);
  std::vector<unsigned char> buf(300);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  for (size_t off = 0; off < 9; ++off) {
    for (size_t n = 0; n + off <= buf.size(); n += 7) {
      EXPECT_EQ(crc32c(buf.data() + off, n), reference(buf.data() + off, n)) << off << " " << n;
    }
  }
}

TEST(Crc32c, IsIncrementalAndMasksAsTfRecordDoes) {
  const std::string a = "hello, ", b = "world";
  EXPECT_EQ(crc32c(b, crc32c(a)), crc32c(a + b));
  const uint32_t c = crc32c("x");
  EXPECT_EQ(crc32c_masked(c), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

}  // namespace
}  // namespace ds
