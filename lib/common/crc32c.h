// CRC-32C (Castagnoli, polynomial 0x1EDC6F41, reflected; the checksum of iSCSI, ext4, TFRecord
// and Google's storage formats): what every file dstrain writes and reads back is checked with
// (checkpoint shards and manifests, llm.c exports, TensorBoard event records).
//
// crc32c(data) of "123456789" is 0xE3069283. Incremental: crc32c(b, crc32c(a)) equals the CRC of
// a followed by b. Uses the SSE4.2 crc32 instruction when the CPU has it (checked once at run
// time), a slicing table otherwise; both give the same value. Thread-safe, no allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ds {

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
inline uint32_t crc32c(std::string_view s, uint32_t crc = 0) { return crc32c(s.data(), s.size(), crc); }

// TFRecord's masked form: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
inline uint32_t crc32c_masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

// "e3069283": 8 lowercase hex digits, as manifests store it.
std::string crc32c_hex(uint32_t crc);

}  // namespace ds
