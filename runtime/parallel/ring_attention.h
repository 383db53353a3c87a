// Context parallelism's ring attention (Megatron's context parallelism, torchtitan's CP): the
// sequence of each micro-batch is cut into 2N chunks of C tokens over the N ranks of a cp group,
// and rank r holds chunks r and 2N-1-r (the causal load balance: every rank gets one early and
// one late chunk, so every rank does the same attention work). Its local rows are chunk r then
// chunk 2N-1-r, C each, for each of the B sequences.
//
// Forward: each rank keeps its queries; the keys and values (one compact (B,C,2 KV hd) block per
// chunk) travel around the ring, N steps, rank r sending to r+1 and receiving from r-1 while it
// computes on the block it holds (the transfer is asynchronous, so it overlaps the compute). Each
// (query chunk, key chunk) pair runs the block kernel (kernels/ops.def: attention_block_forward;
// pairs wholly in the causal future are skipped) and the partial results are merged by their
// log-sum-exp (kern::attention_merge) in fp32; the output is rounded once at the end.
// Backward: the key/value blocks travel the ring again, each with an fp32 accumulator of its dK
// and dV; a rank adds its queries' share (attention_block_backward, from the merged output and
// lse) and passes both on; after N steps one last transfer brings every accumulator home.
//
// The result equals the unsplit grouped-query attention (ops.def: attention_gqa_*) on the whole
// sequence, rows reordered to the rank's chunks (tests/multiproc/parallel: against the single
// process at cp 2 and 4). Scratch (layout::cp_attention_scratch: the gathered chunks and the fp32
// accumulators under workspace, the blocks in flight under comm) is allocated once, at
// construction, on the rank's device. On the CPU the block kernels keep per-task vectors of one
// key/value block's head (2 C hd floats) besides, outside the allocator. On a GPU every gather,
// merge and kernel is queued on the caller's stream (its kern::DeviceScope) and the group is NCCL's,
// whose exchange waits on the device for the work queued before it (comm/nccl_comm.h): the
// transfer of the next block overlaps the kernels of this one.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/comm.h"
#include "core/allocator.h"

namespace ds::rt::parallel {

struct RingShape {
  int B = 0, C = 0;  // sequences, and tokens per chunk (the rank holds 2C per sequence)
  int NH = 0, KV = 0, hd = 0;
  int64_t qkv_stride() const { return static_cast<int64_t>(NH + 2 * KV) * hd; }
  int64_t out_stride() const { return static_cast<int64_t>(NH) * hd; }
  int64_t kv_stride() const { return static_cast<int64_t>(2 * KV) * hd; }
};

// Where chunk `k` (0: the early one, 1: the late one) of cp rank `r` of `n` starts in the whole
// sequence, in tokens.
inline int ring_chunk_position(int r, int n, int k, int C) { return (k == 0 ? r : 2 * n - 1 - r) * C; }

class RingAttention {
 public:
  // `cp`: the context-parallel group (N = its size; N = 1 runs the local attention as blocks).
  // The scratch for elements of `storage_bytes` comes from `alloc` (tags workspace and comm), on
  // `device` (kCuda: the calls run inside a CUDA kern::DeviceScope, the buffers on the device).
  RingAttention(comm::Comm& cp, const RingShape& shape, int storage_bytes, Allocator& alloc,
                Device device = Device::kCpu);

  // out (B,2C,NH hd) and lse (B,NH,2C) of the rank's rows from its qkv (B,2C,(NH+2KV)hd),
  // overwritten. Collective over the cp group.
  template <typename S>
  void forward(S* out, float* lse, const S* qkv);
  // dqkv (B,2C,(NH+2KV)hd) overwritten from dout and the forward's out and lse. Collective.
  template <typename S>
  void backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse);

  // Seconds this rank has waited on transfers still in flight after its compute (the ring's
  // exposed communication), over every call so far.
  double blocked_seconds() const { return blocked_s_; }

 private:
  // The scratch's parts, carved for element type S.
  template <typename S>
  struct Scratch;
  template <typename S>
  Scratch<S> scratch();

  comm::Comm& cp_;
  RingShape sh_;
  int n_, r_, storage_bytes_;
  Device device_;
  int threads_ = 1;  // OpenMP threads the block kernels' tiles are sized for (0 on a GPU)
  double blocked_s_ = 0;
  Buffer work_, comm_buf_;
};

}  // namespace ds::rt::parallel
