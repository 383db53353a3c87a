// CRC-32C (crc32c.h). The table path processes 8 bytes per step with eight 256-entry tables
// (slicing-by-8); the SSE4.2 path feeds the crc32 instruction 8 bytes at a time. Both are the
// reflected CRC with initial value ~0 and final xor ~0, so they agree bit for bit.
#include "common/crc32c.h"

#include <array>
#include <cstring>

#include <fmt/format.h>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ds {

namespace {

constexpr uint32_t kPoly = 0x82f63b78u;  // 0x1EDC6F41 reflected

struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (size_t s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};

uint32_t crc_table(const unsigned char* p, size_t n, uint32_t c) {
  static const Tables tables;
  const auto& t = tables.t;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = t[7][w & 0xff] ^ t[6][(w >> 8) & 0xff] ^ t[5][(w >> 16) & 0xff] ^ t[4][(w >> 24) & 0xff] ^
        t[3][(w >> 32) & 0xff] ^ t[2][(w >> 40) & 0xff] ^ t[1][(w >> 48) & 0xff] ^ t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc_sse42(const unsigned char* p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = _mm_crc32_u64(c64, w);
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}

bool have_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (have_sse42()) return ~crc_sse42(p, n, c);
#endif
  return ~crc_table(p, n, c);
}

std::string crc32c_hex(uint32_t crc) { return fmt::format("{:08x}", crc); }

}  // namespace ds
