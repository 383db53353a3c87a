#include "parallel/ring_attention.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "common/error.h"
#include "kernels/dispatch.h"
#include "parallel/typed_comm.h"

namespace ds::rt::parallel {

namespace {

constexpr int kTagKv = 7101;   // a key/value block on its way around the ring
constexpr int kTagDkv = 7102;  // its dK and dV accumulator (backward)

// Elements of one chunk (B,C,width) of each buffer of a call; the buffers hold the rank's two
// chunks one after the other: [chunk 0][chunk 1].
struct ChunkSizes {
  int64_t qkv, kv, out, lse;
};
ChunkSizes chunk_sizes(const RingShape& s) {
  const int64_t rows = static_cast<int64_t>(s.B) * s.C;
  return {rows * s.qkv_stride(), rows * s.kv_stride(), rows * s.out_stride(), rows * s.NH};
}

// Chunk k's rows of a (B,2C,ld) buffer, columns [col, col + width), into chunk-major dst.
template <typename T>
void gather_chunk(T* dst, const T* src, const RingShape& s, int64_t ld, int64_t col, int64_t width, int k) {
  for (int b = 0; b < s.B; b++) {
    for (int i = 0; i < s.C; i++) {
      const T* from = src + (static_cast<int64_t>(b) * 2 * s.C + static_cast<int64_t>(k) * s.C + i) * ld + col;
      std::memcpy(dst + (static_cast<int64_t>(b) * s.C + i) * width, from, static_cast<size_t>(width) * sizeof(T));
    }
  }
}

// The reverse, from fp32 chunk-major rows into a (B,2C,ld) buffer of type S, rounded once.
template <typename S>
void scatter_chunk(S* dst, const float* src, const RingShape& s, int64_t ld, int64_t col, int64_t width, int k) {
  for (int b = 0; b < s.B; b++) {
    for (int i = 0; i < s.C; i++) {
      S* to = dst + (static_cast<int64_t>(b) * 2 * s.C + static_cast<int64_t>(k) * s.C + i) * ld + col;
      kern::convert(to, src + (static_cast<int64_t>(b) * s.C + i) * width, width);
    }
  }
}

// lse (B,NH,2C) <-> chunk-major (B,NH,C) per chunk.
void lse_to_chunk(float* dst, const float* lse, const RingShape& s, int k) {
  for (int bh = 0; bh < s.B * s.NH; bh++) {
    std::memcpy(dst + static_cast<int64_t>(bh) * s.C, lse + static_cast<int64_t>(bh) * 2 * s.C + static_cast<int64_t>(k) * s.C,
                static_cast<size_t>(s.C) * sizeof(float));
  }
}
void lse_from_chunk(float* lse, const float* src, const RingShape& s, int k) {
  for (int bh = 0; bh < s.B * s.NH; bh++) {
    std::memcpy(lse + static_cast<int64_t>(bh) * 2 * s.C + static_cast<int64_t>(k) * s.C, src + static_cast<int64_t>(bh) * s.C,
                static_cast<size_t>(s.C) * sizeof(float));
  }
}

// Sends `send` to the next rank and receives the previous rank's into `recv`, asynchronously.
struct RingStep {
  comm::WorkPtr sent, received;
  void start(comm::Comm& cp, const void* send, void* recv, size_t count, comm::DataType dt, int tag) {
    const int n = cp.size(), r = cp.rank();
    sent = cp.send_async(send, count, dt, (r + 1) % n, tag);
    received = cp.recv_async(recv, count, dt, (r + n - 1) % n, tag);
  }
  void finish() {
    if (sent) sent->wait();
    if (received) received->wait();
    sent.reset();
    received.reset();
  }
};

}  // namespace

RingAttention::RingAttention(comm::Comm& cp, const RingShape& shape) : cp_(cp), sh_(shape), n_(cp.size()), r_(cp.rank()) {
  if (sh_.B <= 0 || sh_.C <= 0 || sh_.NH <= 0 || sh_.KV <= 0 || sh_.hd <= 0 || sh_.NH % sh_.KV != 0) {
    throw invalid_usage("ring attention: B={} C={} NH={} KV={} hd={}: every size must be positive and KV must divide NH",
                        sh_.B, sh_.C, sh_.NH, sh_.KV, sh_.hd);
  }
}

template <typename S>
void RingAttention::forward(S* out, float* lse, const S* qkv) {
  const RingShape& s = sh_;
  const ChunkSizes z = chunk_sizes(s);
  const int64_t cq = z.qkv, ckv = z.kv, co = z.out, cl = z.lse;
  std::vector<S> q(static_cast<size_t>(2 * cq)), kv(static_cast<size_t>(2 * ckv)), kv_next(kv.size());
  for (int k = 0; k < 2; k++) {
    gather_chunk(q.data() + k * cq, qkv, s, s.qkv_stride(), 0, s.qkv_stride(), k);
    gather_chunk(kv.data() + k * ckv, qkv, s, s.qkv_stride(), s.out_stride(), s.kv_stride(), k);
  }
  std::vector<float> acc(static_cast<size_t>(2 * co), 0.0f), acc_lse(static_cast<size_t>(2 * cl), -std::numeric_limits<float>::infinity());
  std::vector<float> part(static_cast<size_t>(co)), part_lse(static_cast<size_t>(cl));
  const comm::DataType dt = comm_dtype(dtype_of<S>);
  for (int step = 0; step < n_; step++) {
    const int src = (r_ - step + n_) % n_;  // whose chunks `kv` holds
    RingStep next;
    if (step + 1 < n_) next.start(cp_, kv.data(), kv_next.data(), kv.size(), dt, kTagKv);
    for (int kq = 0; kq < 2; kq++) {
      const int qp = ring_chunk_position(r_, n_, kq, s.C);
      for (int kk = 0; kk < 2; kk++) {
        const int kp = ring_chunk_position(src, n_, kk, s.C);
        if (kp > qp + s.C - 1) continue;  // wholly in the causal future
        kern::attention_block_forward(part.data(), part_lse.data(), q.data() + kq * cq, kv.data() + kk * ckv, s.B, s.C,
                                      s.C, s.NH, s.KV, s.hd, qp, kp);
        kern::attention_merge(acc.data() + kq * co, acc_lse.data() + kq * cl, part.data(), part_lse.data(), s.B, s.C,
                              s.NH, s.hd);
      }
    }
    if (step + 1 < n_) {
      next.finish();
      std::swap(kv, kv_next);
    }
  }
  for (int k = 0; k < 2; k++) {
    scatter_chunk(out, acc.data() + k * co, s, s.out_stride(), 0, s.out_stride(), k);
    lse_from_chunk(lse, acc_lse.data() + k * cl, s, k);
  }
}

template <typename S>
void RingAttention::backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse) {
  const RingShape& s = sh_;
  const ChunkSizes z = chunk_sizes(s);
  const int64_t cq = z.qkv, ckv = z.kv, co = z.out, cl = z.lse;
  std::vector<S> q(static_cast<size_t>(2 * cq)), o(static_cast<size_t>(2 * co)), dO(o.size()), kv(static_cast<size_t>(2 * ckv)),
      kv_next(kv.size());
  std::vector<float> l(static_cast<size_t>(2 * cl));
  for (int k = 0; k < 2; k++) {
    gather_chunk(q.data() + k * cq, qkv, s, s.qkv_stride(), 0, s.qkv_stride(), k);
    gather_chunk(kv.data() + k * ckv, qkv, s, s.qkv_stride(), s.out_stride(), s.kv_stride(), k);
    gather_chunk(o.data() + k * co, out, s, s.out_stride(), 0, s.out_stride(), k);
    gather_chunk(dO.data() + k * co, dout, s, s.out_stride(), 0, s.out_stride(), k);
    lse_to_chunk(l.data() + k * cl, lse, s, k);
  }
  std::vector<float> dq(static_cast<size_t>(2 * co), 0.0f), dkv(static_cast<size_t>(2 * ckv), 0.0f), dkv_next(dkv.size());
  const comm::DataType dt = comm_dtype(dtype_of<S>);
  for (int step = 0; step < n_; step++) {
    const int src = (r_ - step + n_) % n_;
    RingStep next_kv;
    if (step + 1 < n_) next_kv.start(cp_, kv.data(), kv_next.data(), kv.size(), dt, kTagKv);
    for (int kq = 0; kq < 2; kq++) {
      const int qp = ring_chunk_position(r_, n_, kq, s.C);
      for (int kk = 0; kk < 2; kk++) {
        const int kp = ring_chunk_position(src, n_, kk, s.C);
        if (kp > qp + s.C - 1) continue;
        kern::attention_block_backward(dq.data() + kq * co, dkv.data() + kk * ckv, dO.data() + kq * co,
                                       q.data() + kq * cq, kv.data() + kk * ckv, o.data() + kq * co,
                                       l.data() + kq * cl, s.B, s.C, s.C, s.NH, s.KV, s.hd, qp, kp);
      }
    }
    if (n_ > 1) {
      // The accumulator moves on after every step: after the last one, it goes home.
      RingStep next_dkv;
      next_dkv.start(cp_, dkv.data(), dkv_next.data(), dkv.size(), comm::DataType::kFloat32, kTagDkv);
      next_dkv.finish();
      std::swap(dkv, dkv_next);
      if (step + 1 < n_) {
        next_kv.finish();
        std::swap(kv, kv_next);
      }
    }
  }
  for (int k = 0; k < 2; k++) {
    scatter_chunk(dqkv, dq.data() + k * co, s, s.qkv_stride(), 0, s.out_stride(), k);
    scatter_chunk(dqkv, dkv.data() + k * ckv, s, s.qkv_stride(), s.out_stride(), s.kv_stride(), k);
  }
}

#define DS_RING_INST(S)                                                          \
  template void RingAttention::forward<S>(S*, float*, const S*);                 \
  template void RingAttention::backward<S>(S*, const S*, const S*, const S*, const float*);
DS_RING_INST(float)
DS_RING_INST(bf16)
DS_RING_INST(f16)
#undef DS_RING_INST

}  // namespace ds::rt::parallel
