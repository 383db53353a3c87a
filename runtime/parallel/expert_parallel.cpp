// Expert parallelism's all-to-all (expert_parallel.h).
#include "parallel/expert_parallel.h"

#include <chrono>

namespace ds::rt::parallel {

bool ExpertParallelHooks::ep_all_to_all(const void* in, const std::vector<int64_t>& send, void* out,
                                        const std::vector<int64_t>& recv, size_t elem_bytes) {
  std::vector<size_t> s(send.size()), r(recv.size());
  for (size_t q = 0; q < send.size(); ++q) s[q] = static_cast<size_t>(send[q]) * elem_bytes;
  for (size_t q = 0; q < recv.size(); ++q) r[q] = static_cast<size_t>(recv[q]) * elem_bytes;
  const auto t0 = std::chrono::steady_clock::now();
  ep_->all_to_all_v(in, s, out, r, comm::DataType::kUInt8);
  blocked_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return true;
}

}  // namespace ds::rt::parallel
