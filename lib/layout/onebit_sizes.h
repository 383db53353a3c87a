// The buffers of one 1-bit compressed all-reduce (runtime/parallel/onebit_allreduce.h) of n fp32
// elements over a group of N ranks: pure arithmetic, shared by the runtime and the memory plan.
//   padded      P = n rounded up to a multiple of N x kOneBitBlock (every server chunk whole blocks)
//   chunk       P / N elements, rank r's server chunk
//   message     one chunk's compressed form: chunk / 8 bytes of signs + chunk / kOneBitBlock fp32 scales
//   optimizer   worker error (P fp32) + server error (chunk fp32)
//   comm        the N messages a worker sends, the N it receives, and the N gathered server messages
#pragma once

#include <cstdint>

namespace ds::layout {

inline constexpr int64_t kOneBitBlock = 2048;  // elements per scale

struct OneBitSizes {
  int64_t padded = 0, chunk = 0, message_bytes = 0;
  int64_t optimizer_bytes = 0, comm_bytes = 0;
};

inline OneBitSizes onebit_sizes(int64_t n, int ranks) {
  OneBitSizes s;
  const int64_t unit = static_cast<int64_t>(ranks) * kOneBitBlock;
  s.padded = (n + unit - 1) / unit * unit;
  s.chunk = s.padded / ranks;
  s.message_bytes = s.chunk / 8 + s.chunk / kOneBitBlock * 4;
  s.optimizer_bytes = (s.padded + s.chunk) * 4;
  s.comm_bytes = 3 * ranks * s.message_bytes;
  return s;
}

}  // namespace ds::layout
