#include "parallel/ring_attention.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "common/check.h"
#include "common/error.h"
#include "layout/context_parallel.h"
#include "kernels/dispatch.h"
#include "parallel/typed_comm.h"

namespace ds::rt::parallel {

namespace {

// Elements of one chunk (B,C,width) of each buffer of a call; the buffers hold the rank's two
// chunks one after the other: [chunk 0][chunk 1].
struct ChunkSizes {
  int64_t qkv, kv, out, lse;
};
ChunkSizes chunk_sizes(const RingShape& s) {
  const int64_t rows = static_cast<int64_t>(s.B) * s.C;
  return {rows * s.qkv_stride(), rows * s.kv_stride(), rows * s.out_stride(), rows * s.NH};
}

// Every move below goes through kern:: (kernels/dispatch.h): memcpy on the CPU, stream-ordered
// strided copies and kernels inside a CUDA scope (the buffers are then device memory).

// Chunk k's rows of a (B,2C,ld) buffer, columns [col, col + width), into chunk-major dst: one
// strided copy of C rows per sequence.
template <typename T>
void gather_chunk(T* dst, const T* src, const RingShape& s, int64_t ld, int64_t col, int64_t width, int k) {
  const size_t z = sizeof(T);
  for (int b = 0; b < s.B; b++) {
    const T* from = src + (static_cast<int64_t>(b) * 2 * s.C + static_cast<int64_t>(k) * s.C) * ld + col;
    kern::copy_rows(dst + static_cast<int64_t>(b) * s.C * width, width * z, from, ld * z, width * z, s.C);
  }
}

// The reverse, from fp32 chunk-major rows into a (B,2C,ld) buffer of type S, rounded once: the
// chunk converted into `tmp` (B C width elements of S), then copied to its rows.
template <typename S>
void scatter_chunk(S* dst, const float* src, S* tmp, const RingShape& s, int64_t ld, int64_t col, int64_t width,
                   int k) {
  const size_t z = sizeof(S);
  kern::convert(tmp, src, static_cast<int64_t>(s.B) * s.C * width);
  for (int b = 0; b < s.B; b++) {
    S* to = dst + (static_cast<int64_t>(b) * 2 * s.C + static_cast<int64_t>(k) * s.C) * ld + col;
    kern::copy_rows(to, ld * z, tmp + static_cast<int64_t>(b) * s.C * width, width * z, width * z, s.C);
  }
}

// lse (B,NH,2C) <-> chunk-major (B,NH,C) per chunk: B NH rows of C floats.
void lse_to_chunk(float* dst, const float* lse, const RingShape& s, int k) {
  const size_t c = static_cast<size_t>(s.C) * sizeof(float);
  kern::copy_rows(dst, c, lse + static_cast<int64_t>(k) * s.C, 2 * c, c, static_cast<size_t>(s.B) * s.NH);
}
void lse_from_chunk(float* lse, const float* src, const RingShape& s, int k) {
  const size_t c = static_cast<size_t>(s.C) * sizeof(float);
  kern::copy_rows(lse + static_cast<int64_t>(k) * s.C, 2 * c, src, c, c, static_cast<size_t>(s.B) * s.NH);
}

// Sends `send` to the next rank and receives the previous rank's into `recv`, asynchronously
// (Comm::ring_exchange_async: on shm a collective through the group's segment); finish() adds the
// seconds it waited to *blocked.
struct RingStep {
  comm::WorkPtr exchanged;
  void start(comm::Comm& cp, const void* send, void* recv, size_t count, comm::DataType dt) {
    exchanged = cp.ring_exchange_async(send, recv, count, dt);
  }
  void finish(double* blocked) {
    const auto t0 = std::chrono::steady_clock::now();
    if (exchanged) exchanged->wait();
    exchanged.reset();
    *blocked += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

}  // namespace

RingAttention::RingAttention(comm::Comm& cp, const RingShape& shape, int storage_bytes, Allocator& alloc,
                             Device device)
    : cp_(cp), sh_(shape), n_(cp.size()), r_(cp.rank()), storage_bytes_(storage_bytes), device_(device) {
  if (sh_.B <= 0 || sh_.C <= 0 || sh_.NH <= 0 || sh_.KV <= 0 || sh_.hd <= 0 || sh_.NH % sh_.KV != 0) {
    throw invalid_usage("ring attention: B={} C={} NH={} KV={} hd={}: every size must be positive and KV must divide NH",
                        sh_.B, sh_.C, sh_.NH, sh_.KV, sh_.hd);
  }
  threads_ = device_ == Device::kCpu ? omp_get_max_threads() : 0;  // the CUDA block kernels need no tiles
  const layout::CpAttentionShape as{sh_.B, 2 * n_ * sh_.C, sh_.NH, sh_.KV, sh_.hd, n_, layout::CpMethod::kRing,
                                    storage_bytes, threads_};
  const layout::CpScratchBytes b = layout::ring_attention_scratch(as);
  work_ = alloc.allocate(static_cast<size_t>(b.workspace), MemTag::kWorkspace, "ring attention scratch", device_);
  comm_buf_ = alloc.allocate(static_cast<size_t>(b.comm), MemTag::kComm, "ring attention blocks in flight", device_);
}

// The scratch's parts (layout::cp_attention_scratch): workspace = [q 2cq | o 2co | dO 2co] (S),
// aligned, then fp32 [3 co + 3 cl] (forward: acc 2co, part co, acc_lse 2cl, part_lse cl;
// backward: dq 2co, l 2cl), then the block kernels' tiles (cpu::attention_block_scratch_floats
// per thread); comm = [kv 2ckv | kv_next 2ckv] (S), aligned, then fp32 [dkv 2ckv | dkv_next 2ckv].
template <typename S>
struct RingAttention::Scratch {
  S *q, *o, *dO, *kv, *kv_next;
  float *acc, *part, *acc_lse, *part_lse, *dq, *l, *tiles, *dkv, *dkv_next;
};

template <typename S>
RingAttention::Scratch<S> RingAttention::scratch() {
  DS_CHECK(static_cast<int>(sizeof(S)) == storage_bytes_, "ring attention: scratch sized for another element type");
  DS_CHECK(device_ != Device::kCpu || omp_get_max_threads() <= threads_,
           "ring attention: scratch sized for {} threads, OpenMP now has {}", threads_, omp_get_max_threads());
  const ChunkSizes z = chunk_sizes(sh_);
  Scratch<S> p{};
  S* ws = static_cast<S*>(work_.data());
  p.q = ws;
  p.o = p.q + 2 * z.qkv;
  p.dO = p.o + 2 * z.out;
  float* wf = reinterpret_cast<float*>(static_cast<char*>(work_.data()) +
                                       layout::cp_align_bytes(static_cast<int64_t>(sizeof(S)) * (2 * z.qkv + 4 * z.out)));
  p.acc = wf;
  p.part = p.acc + 2 * z.out;
  p.acc_lse = p.part + z.out;
  p.part_lse = p.acc_lse + 2 * z.lse;
  p.dq = wf;
  p.l = p.dq + 2 * z.out;
  p.tiles = wf + 3 * z.out + 3 * z.lse;
  S* cs = static_cast<S*>(comm_buf_.data());
  p.kv = cs;
  p.kv_next = p.kv + 2 * z.kv;
  p.dkv = reinterpret_cast<float*>(static_cast<char*>(comm_buf_.data()) +
                                   layout::cp_align_bytes(static_cast<int64_t>(sizeof(S)) * 4 * z.kv));
  p.dkv_next = p.dkv + 2 * z.kv;
  return p;
}

template <typename S>
void RingAttention::forward(S* out, float* lse, const S* qkv) {
  const RingShape& s = sh_;
  const ChunkSizes z = chunk_sizes(s);
  const int64_t cq = z.qkv, ckv = z.kv, co = z.out, cl = z.lse;
  const Scratch<S> sc = scratch<S>();
  S *q = sc.q, *kv = sc.kv, *kv_next = sc.kv_next;
  float *acc = sc.acc, *acc_lse = sc.acc_lse, *part = sc.part, *part_lse = sc.part_lse;
  for (int k = 0; k < 2; k++) {
    gather_chunk(q + k * cq, qkv, s, s.qkv_stride(), 0, s.qkv_stride(), k);
    gather_chunk(kv + k * ckv, qkv, s, s.qkv_stride(), s.out_stride(), s.kv_stride(), k);
  }
  kern::fill_zero(acc, static_cast<size_t>(2 * co) * sizeof(float));
  kern::fill_f32(acc_lse, -std::numeric_limits<float>::infinity(), 2 * cl);
  const comm::DataType dt = comm_dtype(dtype_of<S>);
  for (int step = 0; step < n_; step++) {
    const int src = (r_ - step + n_) % n_;  // whose chunks `kv` holds
    RingStep next;
    if (step + 1 < n_) next.start(cp_, kv, kv_next, static_cast<size_t>(2 * ckv), dt);
    for (int kq = 0; kq < 2; kq++) {
      const int qp = ring_chunk_position(r_, n_, kq, s.C);
      for (int kk = 0; kk < 2; kk++) {
        const int kp = ring_chunk_position(src, n_, kk, s.C);
        if (kp > qp + s.C - 1) continue;  // wholly in the causal future
        kern::attention_block_forward(part, part_lse, q + kq * cq, kv + kk * ckv, sc.tiles, s.B, s.C, s.C, s.NH, s.KV,
                                      s.hd, qp, kp);
        kern::attention_merge(acc + kq * co, acc_lse + kq * cl, part, part_lse, s.B, s.C, s.NH, s.hd);
      }
    }
    if (step + 1 < n_) {
      next.finish(&blocked_s_);
      std::swap(kv, kv_next);
    }
  }
  for (int k = 0; k < 2; k++) {  // the gathered queries are spent: their scratch rounds the output
    scatter_chunk(out, acc + k * co, q, s, s.out_stride(), 0, s.out_stride(), k);
    lse_from_chunk(lse, acc_lse + k * cl, s, k);
  }
}

template <typename S>
void RingAttention::backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse) {
  const RingShape& s = sh_;
  const ChunkSizes z = chunk_sizes(s);
  const int64_t cq = z.qkv, ckv = z.kv, co = z.out, cl = z.lse;
  const Scratch<S> sc = scratch<S>();
  S *q = sc.q, *o = sc.o, *dO = sc.dO, *kv = sc.kv, *kv_next = sc.kv_next;
  float *l = sc.l, *dq = sc.dq, *dkv = sc.dkv, *dkv_next = sc.dkv_next;
  for (int k = 0; k < 2; k++) {
    gather_chunk(q + k * cq, qkv, s, s.qkv_stride(), 0, s.qkv_stride(), k);
    gather_chunk(kv + k * ckv, qkv, s, s.qkv_stride(), s.out_stride(), s.kv_stride(), k);
    gather_chunk(o + k * co, out, s, s.out_stride(), 0, s.out_stride(), k);
    gather_chunk(dO + k * co, dout, s, s.out_stride(), 0, s.out_stride(), k);
    lse_to_chunk(l + k * cl, lse, s, k);
  }
  kern::fill_zero(dq, static_cast<size_t>(2 * co) * sizeof(float));
  kern::fill_zero(dkv, static_cast<size_t>(2 * ckv) * sizeof(float));
  const comm::DataType dt = comm_dtype(dtype_of<S>);
  for (int step = 0; step < n_; step++) {
    const int src = (r_ - step + n_) % n_;
    RingStep next_kv;
    if (step + 1 < n_) next_kv.start(cp_, kv, kv_next, static_cast<size_t>(2 * ckv), dt);
    for (int kq = 0; kq < 2; kq++) {
      const int qp = ring_chunk_position(r_, n_, kq, s.C);
      for (int kk = 0; kk < 2; kk++) {
        const int kp = ring_chunk_position(src, n_, kk, s.C);
        if (kp > qp + s.C - 1) continue;
        kern::attention_block_backward(dq + kq * co, dkv + kk * ckv, dO + kq * co, q + kq * cq, kv + kk * ckv,
                                       o + kq * co, l + kq * cl, sc.tiles, s.B, s.C, s.C, s.NH, s.KV, s.hd, qp, kp);
      }
    }
    if (n_ > 1) {
      // The accumulator moves on after every step: after the last one, it goes home.
      RingStep next_dkv;
      next_dkv.start(cp_, dkv, dkv_next, static_cast<size_t>(2 * ckv), comm::DataType::kFloat32);
      next_dkv.finish(&blocked_s_);
      std::swap(dkv, dkv_next);
      if (step + 1 < n_) {
        next_kv.finish(&blocked_s_);
        std::swap(kv, kv_next);
      }
    }
  }
  for (int k = 0; k < 2; k++) {  // the gathered queries are spent: their scratch rounds the gradients
    scatter_chunk(dqkv, dq + k * co, q, s, s.qkv_stride(), 0, s.out_stride(), k);
    scatter_chunk(dqkv, dkv + k * ckv, q, s, s.qkv_stride(), s.out_stride(), s.kv_stride(), k);
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
