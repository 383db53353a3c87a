// Context parallelism's Ulysses attention (DeepSpeed-Ulysses): the sequence of each micro-batch
// is cut into N contiguous parts over the N ranks of a cp group (rank r holds positions
// [r T/N, (r+1) T/N)); around the attention an all-to-all turns the sequence-sharded qkv into
// head-sharded qkv over the whole sequence (rank r: query heads [r NH/N, (r+1) NH/N) and the kv
// heads they read, [r KV/N, (r+1) KV/N)), the rank runs the ordinary grouped-query attention
// (kernels/ops.def: attention_gqa_*) on its heads, and a second all-to-all brings the output back
// to the rank's positions. The backward does the same with dout, out and qkv, and returns dqkv to
// the sequence layout. NH and KV must divide by N (the caller checks the config; this throws).
//
// The exchange is one Comm::all_to_all_v of N equal pieces: rank r sends peer p the columns of
// p's heads for r's positions and receives p's positions of its own heads. The lse stays in the
// head layout (B, NH/N, T), as the backward wants it. Scratch (layout::ulysses_attention_scratch:
// the head-layout copies and the whole-sequence attention's tiles under workspace, the all-to-all
// pieces under comm) is allocated once, at construction, on the rank's device. On a GPU the
// rearranging copies are strided copies on the caller's stream (its kern::DeviceScope) and the
// group is NCCL's (its all-to-all waits on the device for them; no tiles).
#pragma once

#include <cstdint>
#include <vector>

#include "comm/comm.h"
#include "core/allocator.h"

namespace ds::rt::parallel {

struct UlyssesShape {
  int B = 0, T = 0;  // sequences, and the whole sequence's length (the rank holds T/N)
  int NH = 0, KV = 0, hd = 0;
};

class UlyssesAttention {
 public:
  // The scratch for elements of `storage_bytes` comes from `alloc` (tags workspace and comm), on
  // `device`, with attention tiles for OpenMP's current thread count on the CPU.
  UlyssesAttention(comm::Comm& cp, const UlyssesShape& shape, int storage_bytes, Allocator& alloc,
                   Device device = Device::kCpu);

  // out (B,T/N,NH hd) of the rank's positions from its qkv (B,T/N,(NH+2KV)hd); lse_heads
  // (B,NH/N,T) of its heads over the whole sequence, for backward. Collective over the cp group.
  template <typename S>
  void forward(S* out, float* lse_heads, const S* qkv);
  // dqkv (B,T/N,(NH+2KV)hd) overwritten from dout, qkv, the forward's out and lse_heads.
  template <typename S>
  void backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse_heads);

  // Seconds this rank has spent in the all-to-alls (nothing overlaps them), over every call.
  double blocked_seconds() const { return blocked_s_; }

 private:
  // Sequence layout (B,T/N,w_all) <-> head layout (B,T,w_mine) for a row made of `parts` column
  // groups (q heads, then k heads, then v heads: `heads[i]` heads of hd each, split N ways).
  template <typename S>
  void to_heads(S* dst, const S* src, const std::vector<int>& heads);
  template <typename S>
  void to_sequence(S* dst, const S* src, const std::vector<int>& heads);

  template <typename S>
  struct Scratch {
    S *qkv_h, *dqkv_h, *out_h, *dout_h;
    float* tiles;
  };
  template <typename S>
  Scratch<S> scratch();
  uint8_t* pieces(bool receive);  // the all-to-all's send (false) or receive (true) pieces

  comm::Comm& cp_;
  UlyssesShape sh_;
  int n_, r_, Tl_, storage_bytes_, threads_ = 1;
  Device device_;
  double blocked_s_ = 0;
  Buffer work_, comm_buf_;
};

}  // namespace ds::rt::parallel
