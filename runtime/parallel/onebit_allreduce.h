// The compressed all-reduce of DeepSpeed's 1-bit optimizers (1-bit Adam, 0/1 Adam, 1-bit LAMB;
// runtime/comm/nccl.py's compressed_allreduce), with error feedback on both sides, over any Comm
// over host memory (shm, Gloo; a GPU run's optimizer state is on the host and the exchange takes
// a host dp group, as DeepSpeed's MPI backend without cuda_aware).
//
// run(x) leaves in x (n fp32 elements, every rank) the mean over the group of the ranks' x, each
// seen through two 1-bit compressions (sizes: layout/onebit_sizes.h, P the padded length):
//   1. worker: y = x + worker_error (zero padded to P); per block of kOneBitBlock elements a scale
//      s = ||y_b|| / sqrt(|b|) and the signs (sign(0) = +1, as DeepSpeed); worker_error = y - s sign(y);
//   2. all-to-all: chunk q of the signs and scales (P/N elements) goes to rank q;
//   3. server (rank r, chunk r): z = (1/N) sum over workers of s sign + server_error, compressed the
//      same way, server_error = z - s' sign(z);
//   4. all-gather of the server messages; every rank decompresses the whole buffer into x.
// Bytes sent per rank: 2 (N-1)/N (P/8 + 4 P/kOneBitBlock), about 1/32 of an fp32 ring all-reduce.
// DeepSpeed keeps one worker scale per tensor and one server scale per chunk; dstrain one per
// block of kOneBitBlock elements on both sides (a finer scale, 1.6% more bytes).
// Buffers: the errors under MemTag::kOptimizer, the messages under kComm, allocated once.
#pragma once

#include <cstdint>

#include "comm/comm.h"
#include "core/allocator.h"
#include "layout/onebit_sizes.h"

namespace ds::rt::parallel {

class OneBitAllReduce {
 public:
  // `group` moves host memory (shm, Gloo); the buffers are `where` (pinned host on a GPU run).
  OneBitAllReduce(comm::Comm& group, int64_t n, Allocator& alloc, Device where = Device::kCpu);

  void run(float* x);
  // Zeroes both error buffers (0/1 Adam at its freeze; a resume, as DeepSpeed's load_state_dict).
  void reset_errors();
  const layout::OneBitSizes& sizes() const { return sizes_; }
  const float* worker_error() const { return worker_error_.as<float>(); }  // P elements

 private:
  comm::Comm& comm_;
  int64_t n_ = 0;
  layout::OneBitSizes sizes_;
  Buffer worker_error_, server_error_, send_, recv_, gathered_;
};

}  // namespace ds::rt::parallel
