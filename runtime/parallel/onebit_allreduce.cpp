// The 1-bit compressed all-reduce (onebit_allreduce.h).
#include "parallel/onebit_allreduce.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "kernels/cpu/optimizer_passes.h"

namespace ds::rt::parallel {

namespace {
// One chunk's message: its signs, then its scales.
struct Message {
  uint8_t* signs;
  float* scales;
};
Message message_at(uint8_t* base, const layout::OneBitSizes& s, int q) {
  uint8_t* m = base + static_cast<size_t>(q) * static_cast<size_t>(s.message_bytes);
  return {m, reinterpret_cast<float*>(m + s.chunk / 8)};
}
}  // namespace

OneBitAllReduce::OneBitAllReduce(comm::Comm& group, int64_t n, Allocator& alloc, Device where)
    : comm_(group), n_(n), sizes_(layout::onebit_sizes(n, group.size())) {
  const size_t msgs = static_cast<size_t>(group.size()) * static_cast<size_t>(sizes_.message_bytes);
  worker_error_ = alloc.allocate(static_cast<size_t>(sizes_.padded) * 4, MemTag::kOptimizer, "1-bit worker error", where);
  server_error_ = alloc.allocate(static_cast<size_t>(sizes_.chunk) * 4, MemTag::kOptimizer, "1-bit server error", where);
  send_ = alloc.allocate(msgs, MemTag::kComm, "1-bit worker messages", where);
  recv_ = alloc.allocate(msgs, MemTag::kComm, "1-bit received messages", where);
  gathered_ = alloc.allocate(msgs, MemTag::kComm, "1-bit server messages", where);
  reset_errors();
}

void OneBitAllReduce::reset_errors() {
  std::memset(worker_error_.data(), 0, worker_error_.bytes());
  std::memset(server_error_.data(), 0, server_error_.bytes());
}

void OneBitAllReduce::run(float* x) {
  const int N = comm_.size(), me = comm_.rank();
  const int64_t C = sizes_.chunk, blk = layout::kOneBitBlock;
  float* y = worker_error_.as<float>();
  // 1. The worker's compensated values (the padding's error stays with the padding).
  for (int64_t i = 0; i < n_; ++i) y[i] += x[i];
  auto* send = static_cast<uint8_t*>(send_.data());
  for (int q = 0; q < N; ++q) {
    const Message m = message_at(send, sizes_, q);
    cpu::onebit_compress(y + q * C, C, blk, m.signs, m.scales);
  }
  // 2. Chunk q to rank q.
  auto* recv = static_cast<uint8_t*>(recv_.data());
  const std::vector<size_t> counts(static_cast<size_t>(N), static_cast<size_t>(sizes_.message_bytes));
  comm_.all_to_all_v(send, counts, recv, counts, comm::DataType::kUInt8);
  // 3. The server's mean of chunk `me` over the workers, compensated and compressed.
  float* z = server_error_.as<float>();
  for (int q = 0; q < N; ++q) {
    const Message m = message_at(recv, sizes_, q);
    cpu::onebit_decompress(m.signs, m.scales, C, blk, 1.0f / static_cast<float>(N), z, /*accumulate=*/true);
  }
  auto* gathered = static_cast<uint8_t*>(gathered_.data());
  const Message mine = message_at(gathered, sizes_, me);
  cpu::onebit_compress(z, C, blk, mine.signs, mine.scales);
  // 4. Every server's chunk to every rank (in place: this rank's message already sits at its slot).
  comm_.all_gather(mine.signs, gathered, static_cast<size_t>(sizes_.message_bytes), comm::DataType::kUInt8);
  // The servers' chunks into x: whole blocks in place, the one block that ends past n through a
  // block-sized buffer on the stack (the padding's values are not wanted).
  const int64_t whole = n_ / blk * blk;
  for (int q = 0; q < N; ++q) {
    const Message m = message_at(gathered, sizes_, q);
    const int64_t lo = q * C;
    if (lo >= n_) break;
    const int64_t in_place = std::min(C, whole - lo);
    if (in_place > 0) cpu::onebit_decompress(m.signs, m.scales, in_place, blk, 1.0f, x + lo, /*accumulate=*/false);
    if (lo + C > n_ && whole < n_) {
      std::array<float, layout::kOneBitBlock> last;
      const int64_t b = (whole - lo) / blk;  // the block within this chunk
      cpu::onebit_decompress(m.signs + b * blk / 8, m.scales + b, blk, blk, 1.0f, last.data(), /*accumulate=*/false);
      std::memcpy(x + whole, last.data(), static_cast<size_t>(n_ - whole) * sizeof(float));
    }
  }
}

}  // namespace ds::rt::parallel
