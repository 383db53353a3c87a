#include "parallel/ulysses_attention.h"

#include <chrono>
#include <numeric>

#include <omp.h>

#include "common/check.h"
#include "common/error.h"
#include "layout/context_parallel.h"
#include "kernels/dispatch.h"
#include "parallel/typed_comm.h"

namespace ds::rt::parallel {

namespace {

// Columns of peer p's share of a row made of head groups (q, k, v): for each group, its heads
// [p h/N, (p+1) h/N) of hd values. Calls fn(column in the whole row, column in the share, width).
template <typename Fn>
void for_each_share_column(const std::vector<int>& heads, int n, int p, int hd, Fn&& fn) {
  int64_t whole = 0, share = 0;
  for (int h : heads) {
    const int64_t w = static_cast<int64_t>(h / n) * hd;
    fn(whole + p * w, share, w);
    whole += static_cast<int64_t>(h) * hd;
    share += w;
  }
}

int64_t row_width(const std::vector<int>& heads, int hd, int n = 1) {
  return static_cast<int64_t>(std::accumulate(heads.begin(), heads.end(), 0) / n) * hd;
}

// One all-to-all of `n` pieces of `piece` bytes each (piece p of `send` goes to rank p, piece p of
// `recv` comes from rank p; my own piece is copied), adding the seconds to *blocked.
void exchange(comm::Comm& cp, const uint8_t* send, uint8_t* recv, size_t piece, double* blocked) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<size_t> counts(static_cast<size_t>(cp.size()), piece);
  cp.all_to_all_v(send, counts, recv, counts, comm::DataType::kUInt8);
  *blocked += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

UlyssesAttention::UlyssesAttention(comm::Comm& cp, const UlyssesShape& shape, int storage_bytes, Allocator& alloc,
                                   Device device)
    : cp_(cp),
      sh_(shape),
      n_(cp.size()),
      r_(cp.rank()),
      Tl_(shape.T / cp.size()),
      storage_bytes_(storage_bytes),
      device_(device) {
  if (sh_.B <= 0 || sh_.T <= 0 || sh_.NH <= 0 || sh_.KV <= 0 || sh_.hd <= 0 || sh_.NH % sh_.KV != 0) {
    throw invalid_usage("Ulysses attention: B={} T={} NH={} KV={} hd={}: every size must be positive and KV must "
                        "divide NH",
                        sh_.B, sh_.T, sh_.NH, sh_.KV, sh_.hd);
  }
  if (sh_.T % n_ != 0 || sh_.NH % n_ != 0 || sh_.KV % n_ != 0) {
    throw invalid_usage("Ulysses attention over {} ranks needs the sequence ({}), the query heads ({}) and the kv "
                        "heads ({}) divisible by {}",
                        n_, sh_.T, sh_.NH, sh_.KV, n_);
  }
  threads_ = device_ == Device::kCpu ? omp_get_max_threads() : 0;  // the CUDA attention needs no tiles
  const layout::CpAttentionShape as{sh_.B, sh_.T, sh_.NH, sh_.KV, sh_.hd, n_, layout::CpMethod::kUlysses,
                                    storage_bytes, threads_};
  const layout::CpScratchBytes b = layout::ulysses_attention_scratch(as);
  work_ = alloc.allocate(static_cast<size_t>(b.workspace), MemTag::kWorkspace, "Ulysses attention scratch", device_);
  comm_buf_ = alloc.allocate(static_cast<size_t>(b.comm), MemTag::kComm, "Ulysses all-to-all pieces", device_);
}

// The scratch's parts (layout::ulysses_attention_scratch): workspace = [qkv_h | dqkv_h | out_h |
// dout_h] (S, head layout over the whole sequence), aligned, then the attention's fp32 tiles;
// comm = [send pieces | receive pieces], n of the largest (qkv's) each.
template <typename S>
UlyssesAttention::Scratch<S> UlyssesAttention::scratch() {
  DS_CHECK(static_cast<int>(sizeof(S)) == storage_bytes_, "Ulysses attention: scratch sized for another element type");
  DS_CHECK(device_ != Device::kCpu || omp_get_max_threads() <= threads_,
           "Ulysses attention: scratch sized for {} threads, OpenMP now has {}", threads_, omp_get_max_threads());
  const int64_t nqkv = static_cast<int64_t>(sh_.B) * sh_.T * (sh_.NH + 2 * sh_.KV) / n_ * sh_.hd;
  const int64_t nout = static_cast<int64_t>(sh_.B) * sh_.T * sh_.NH / n_ * sh_.hd;
  Scratch<S> p{};
  p.qkv_h = static_cast<S*>(work_.data());
  p.dqkv_h = p.qkv_h + nqkv;
  p.out_h = p.dqkv_h + nqkv;
  p.dout_h = p.out_h + nout;
  p.tiles = reinterpret_cast<float*>(static_cast<char*>(work_.data()) +
                                     layout::cp_align_bytes(static_cast<int64_t>(sizeof(S)) * (2 * nqkv + 2 * nout)));
  return p;
}

uint8_t* UlyssesAttention::pieces(bool receive) {
  return static_cast<uint8_t*>(comm_buf_.data()) + (receive ? comm_buf_.bytes() / 2 : 0);
}

// Every rearrangement is a strided copy per (peer, head group) or per (peer, sequence) through
// kern::copy_rows: memcpy per row on the CPU, one stream-ordered copy on a GPU.
template <typename S>
void UlyssesAttention::to_heads(S* dst, const S* src, const std::vector<int>& heads) {
  const int64_t w_all = row_width(heads, sh_.hd), w_mine = row_width(heads, sh_.hd, n_);
  const size_t z = sizeof(S), rows = static_cast<size_t>(sh_.B) * Tl_;
  const size_t piece = rows * w_mine * z;
  uint8_t *send = pieces(false), *recv = pieces(true);
  for (int p = 0; p < n_; p++) {  // my rows, p's heads
    S* out = reinterpret_cast<S*>(send + static_cast<size_t>(p) * piece);
    for_each_share_column(heads, n_, p, sh_.hd, [&](int64_t whole, int64_t share, int64_t w) {
      kern::copy_rows(out + share, w_mine * z, src + whole, w_all * z, w * z, rows);
    });
  }
  exchange(cp_, send, recv, piece, &blocked_s_);
  const size_t run = static_cast<size_t>(Tl_) * w_mine * z;  // one sequence's rows of a piece
  for (int p = 0; p < n_; p++) {  // p's rows, my heads
    const S* in = reinterpret_cast<const S*>(recv + static_cast<size_t>(p) * piece);
    kern::copy_rows(dst + static_cast<int64_t>(p) * Tl_ * w_mine, static_cast<size_t>(sh_.T) * w_mine * z, in, run,
                    run, static_cast<size_t>(sh_.B));
  }
}

template <typename S>
void UlyssesAttention::to_sequence(S* dst, const S* src, const std::vector<int>& heads) {
  const int64_t w_all = row_width(heads, sh_.hd), w_mine = row_width(heads, sh_.hd, n_);
  const size_t z = sizeof(S), rows = static_cast<size_t>(sh_.B) * Tl_;
  const size_t piece = rows * w_mine * z;
  uint8_t *send = pieces(false), *recv = pieces(true);
  const size_t run = static_cast<size_t>(Tl_) * w_mine * z;
  for (int p = 0; p < n_; p++) {  // p's rows of my heads
    S* out = reinterpret_cast<S*>(send + static_cast<size_t>(p) * piece);
    kern::copy_rows(out, run, src + static_cast<int64_t>(p) * Tl_ * w_mine, static_cast<size_t>(sh_.T) * w_mine * z,
                    run, static_cast<size_t>(sh_.B));
  }
  exchange(cp_, send, recv, piece, &blocked_s_);
  for (int p = 0; p < n_; p++) {  // my rows, p's heads
    const S* in = reinterpret_cast<const S*>(recv + static_cast<size_t>(p) * piece);
    for_each_share_column(heads, n_, p, sh_.hd, [&](int64_t whole, int64_t share, int64_t w) {
      kern::copy_rows(dst + whole, w_all * z, in + share, w_mine * z, w * z, rows);
    });
  }
}

template <typename S>
void UlyssesAttention::forward(S* out, float* lse_heads, const S* qkv) {
  const int NHl = sh_.NH / n_, KVl = sh_.KV / n_;
  const std::vector<int> qkv_heads = {sh_.NH, sh_.KV, sh_.KV}, out_heads = {sh_.NH};
  const Scratch<S> sc = scratch<S>();
  to_heads(sc.qkv_h, qkv, qkv_heads);
  kern::attention_gqa_forward(sc.out_h, lse_heads, sc.qkv_h, sc.tiles, sh_.B, sh_.T, NHl, KVl, sh_.hd);
  to_sequence(out, sc.out_h, out_heads);
}

template <typename S>
void UlyssesAttention::backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse_heads) {
  const int NHl = sh_.NH / n_, KVl = sh_.KV / n_;
  const std::vector<int> qkv_heads = {sh_.NH, sh_.KV, sh_.KV}, out_heads = {sh_.NH};
  const Scratch<S> sc = scratch<S>();
  to_heads(sc.qkv_h, qkv, qkv_heads);
  to_heads(sc.out_h, out, out_heads);
  to_heads(sc.dout_h, dout, out_heads);
  kern::attention_gqa_backward(sc.dqkv_h, sc.dout_h, sc.qkv_h, sc.out_h, lse_heads, sc.tiles, sh_.B, sh_.T, NHl, KVl,
                               sh_.hd);
  to_sequence(dqkv, sc.dqkv_h, qkv_heads);
}

#define DS_ULYSSES_INST(S)                                                      \
  template void UlyssesAttention::forward<S>(S*, float*, const S*);             \
  template void UlyssesAttention::backward<S>(S*, const S*, const S*, const S*, const float*);
DS_ULYSSES_INST(float)
DS_ULYSSES_INST(bf16)
DS_ULYSSES_INST(f16)
#undef DS_ULYSSES_INST

}  // namespace ds::rt::parallel
