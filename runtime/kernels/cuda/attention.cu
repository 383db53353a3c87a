// Causal attention on the GPU, exact, for fp32 storage and as the reference (bf16 storage runs
// flash_attention.cu where it takes the shape): grouped-query, with the CPU's layouts and saved
// buffers: qkv (B,T,(NH+2KV)hd), q heads then k heads then v heads, query head h reading kv head
// h / (NH/KV); out (B,T,NH hd); lse (B,NH,T), the log-sum-exp of each scaled score row. A multi-head
// model's attention (B,T,3C) is the same layout with KV = NH, and runs these kernels.
//
// Deliberately the simplest exact formulation, not a tuned kernel:
// - Forward: one warp per query row t of one (b, h). Lane l holds q[d] for d = l, l + 32, ...
//   (up to kMaxHeadSize / 32 registers). For each key j <= t: s = scale * q.k_j (warp sum), then
//   the online softmax update (running max m, running sum l, output accumulator rescaled by
//   exp(m_old - m_new)). out = acc / l, lse = m + log(l).
// - Backward, with P[t,j] = exp(s[t,j] - lse[t]) recomputed and D_t = dO_t . O_t folded into one
//   dot product (dP - D = dO_t . (v_j - O_t)), dS = scale * P * (dP - D):
//     dq kernel: one warp per (b, h, query row t), dq_t = sum over j <= t of dS[t,j] k_j;
//     dkv kernel: one warp per (b, kv head, key row j), walking the group's query heads in head
//                 order and every later query row: dk_j = sum of dS[t,j] q_t, dv_j = sum of
//                 P[t,j] dO_t, in fp32 registers, written once.
//   Every output row is written by exactly one warp: no atomics, no scratch, deterministic.
// Documents (packing, attention_gqa_doc_*): row t walks keys [doc_start, t] only, and the dkv
// kernel stops at the first later row of another document.
// Cost: O(T^2 hd) work like any exact attention, but K/V rows are re-read from L2 by every warp.
// The row steps (online softmax, dq row, one query's dk/dv share) are attention_rows.cuh's, shared
// with ring attention's block kernels (attention_block.cu).
// Storage: templated over the storage type S of qkv, out, dout and dqkv (fp32 or bf16, read
// through ld and written through st: fp32 arithmetic, each output rounded once); lse is fp32.
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "kernels/cuda/attention_rows.cuh"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/kernels.h"

namespace ds::rt::cuda {

namespace {

constexpr int kAttThreads = 128;  // 4 warps = 4 rows per block
namespace rows = attention_rows;
using rows::kRegs;

// ---- grouped-query attention ----

struct GqaShape {
  int B, T, NH, KV, hd;
  float scale;
  __host__ __device__ int group() const { return NH / KV; }
  __host__ __device__ int64_t stride() const { return int64_t{NH + 2 * KV} * hd; }  // qkv row
  __host__ __device__ int64_t ostride() const { return int64_t{NH} * hd; }          // out row
  __host__ __device__ int64_t q_col(int h) const { return int64_t{h} * hd; }
  __host__ __device__ int64_t k_col(int g) const { return int64_t{NH + g} * hd; }
  __host__ __device__ int64_t v_col(int g) const { return int64_t{NH + KV + g} * hd; }
};

GqaShape make_gqa_shape(int B, int T, int NH, int KV, int hd, const char* what) {
  if (NH <= 0 || KV <= 0 || NH % KV != 0 || hd <= 0 || hd > kMaxHeadSize) {
    throw_cuda_error(
        what, "shape check", __FILE__, __LINE__, 0,
        ("need NH a positive multiple of KV and 0 < hd <= 256; got NH=" + std::to_string(NH) +
         " KV=" + std::to_string(KV) + " hd=" + std::to_string(hd))
            .c_str());
  }
  return GqaShape{B, T, NH, KV, hd, 1.0f / sqrtf(static_cast<float>(hd))};
}

// doc (B,T): each row's document start (packing; null: 0), row t attending to keys [doc, t].
__device__ inline int doc_first(const int32_t* doc, int b, int T, int t) {
  return doc == nullptr ? 0 : doc[int64_t{b} * T + t];
}

template <typename S>
__global__ void gqa_forward_kernel(S* out, float* lse, const S* qkv, const int32_t* doc, GqaShape sh) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= int64_t{sh.B} * sh.NH * sh.T) return;
  const int t = static_cast<int>(row % sh.T);
  const int64_t bh = row / sh.T;
  const int b = static_cast<int>(bh / sh.NH), h = static_cast<int>(bh % sh.NH), g = h / sh.group();
  const int64_t st_ = sh.stride();
  const S* base = qkv + int64_t{b} * sh.T * st_;
  float qr[kRegs], acc[kRegs], m, l;
  const int lo = doc_first(doc, b, sh.T, t);
  const S* kv0 = base + lo * st_;
  rows::load(qr, base + t * st_ + sh.q_col(h), sh.hd, lane);
  rows::attend<S>(qr, t + 1 - lo, sh.hd, lane, sh.scale,
                  [&](int j) { return rows::KvRow<S>{kv0 + j * st_ + sh.k_col(g), kv0 + j * st_ + sh.v_col(g)}; },
                  acc, m, l);
  S* o = out + (int64_t{b} * sh.T + t) * sh.ostride() + sh.q_col(h);
  const float inv = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kRegs; i++) {
    const int d = lane + 32 * i;
    if (d < sh.hd) st(o + d, acc[i] * inv);
  }
  if (lane == 0) lse[bh * sh.T + t] = m + logf(l);
}

template <typename S>
__global__ void gqa_backward_dq_kernel(S* dqkv, const S* dout, const S* qkv, const S* out,
                                       const float* lse, const int32_t* doc, GqaShape sh) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= int64_t{sh.B} * sh.NH * sh.T) return;
  const int t = static_cast<int>(row % sh.T);
  const int64_t bh = row / sh.T;
  const int b = static_cast<int>(bh / sh.NH), h = static_cast<int>(bh % sh.NH), g = h / sh.group();
  const int64_t st_ = sh.stride();
  const int64_t rbase = int64_t{b} * sh.T * st_;
  const int64_t ooff = (int64_t{b} * sh.T + t) * sh.ostride() + sh.q_col(h);
  const S* base = qkv + rbase;
  float qr[kRegs], dor[kRegs], orr[kRegs], acc[kRegs];
  rows::load(qr, base + t * st_ + sh.q_col(h), sh.hd, lane);
  rows::load(dor, dout + ooff, sh.hd, lane);
  rows::load(orr, out + ooff, sh.hd, lane);
  const int lo = doc_first(doc, b, sh.T, t);
  const S* kv0 = base + lo * st_;
  rows::dq_row<S>(qr, dor, orr, lse[bh * sh.T + t], t + 1 - lo, sh.hd, lane, sh.scale,
                  [&](int j) { return rows::KvRow<S>{kv0 + j * st_ + sh.k_col(g), kv0 + j * st_ + sh.v_col(g)}; },
                  acc);
  S* dq = dqkv + rbase + t * st_ + sh.q_col(h);
#pragma unroll
  for (int i = 0; i < kRegs; i++) {
    const int d = lane + 32 * i;
    if (d < sh.hd) st(dq + d, acc[i]);
  }
}

template <typename S>
__global__ void gqa_backward_dkv_kernel(S* dqkv, const S* dout, const S* qkv, const S* out,
                                        const float* lse, const int32_t* doc, GqaShape sh) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= int64_t{sh.B} * sh.KV * sh.T) return;
  const int j = static_cast<int>(row % sh.T);
  const int64_t bg = row / sh.T;
  const int b = static_cast<int>(bg / sh.KV), g = static_cast<int>(bg % sh.KV);
  const int64_t st_ = sh.stride(), os = sh.ostride();
  const int64_t rbase = int64_t{b} * sh.T * st_, obase = int64_t{b} * sh.T * os;
  const S* base = qkv + rbase;
  float kr[kRegs], vr[kRegs], dk[kRegs], dv[kRegs];
  rows::load(kr, base + j * st_ + sh.k_col(g), sh.hd, lane);
  rows::load(vr, base + j * st_ + sh.v_col(g), sh.hd, lane);
  rows::zero(dk);
  rows::zero(dv);
  for (int jh = 0; jh < sh.group(); jh++) {
    const int h = g * sh.group() + jh;
    const float* lrow = lse + (int64_t{b} * sh.NH + h) * sh.T;
    // Later rows of another document never see key j (document starts do not decrease).
    for (int t = j; t < sh.T && doc_first(doc, b, sh.T, t) <= j; t++) {
      rows::dkv_query(kr, vr, base + t * st_ + sh.q_col(h), dout + obase + t * os + sh.q_col(h),
                      out + obase + t * os + sh.q_col(h), lrow[t], sh.hd, lane, sh.scale, dk, dv);
    }
  }
  S* dkp = dqkv + rbase + j * st_ + sh.k_col(g);
  S* dvp = dqkv + rbase + j * st_ + sh.v_col(g);
#pragma unroll
  for (int i = 0; i < kRegs; i++) {
    const int d = lane + 32 * i;
    if (d < sh.hd) {
      st(dkp + d, dk[i]);
      st(dvp + d, dv[i]);
    }
  }
}

template <typename S>
void gqa_forward_impl(S* out, float* lse, const S* qkv, const int32_t* doc, int B, int T, int NH, int KV, int hd,
                      cudaStream_t stream) {
  const GqaShape sh = make_gqa_shape(B, T, NH, KV, hd, "attention_gqa_forward");
  const int64_t rows = int64_t{B} * NH * T;
  if (rows <= 0) return;
  gqa_forward_kernel<S>
      <<<blocks_for(rows * 32, kAttThreads), kAttThreads, 0, stream>>>(out, lse, qkv, doc, sh);
  DS_CUDA_CHECK_LAUNCH("gqa_forward_kernel");
}

template <typename S>
void gqa_backward_impl(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse, const int32_t* doc,
                       int B, int T, int NH, int KV, int hd, cudaStream_t stream) {
  const GqaShape sh = make_gqa_shape(B, T, NH, KV, hd, "attention_gqa_backward");
  const int64_t qrows = int64_t{B} * NH * T, kvrows = int64_t{B} * KV * T;
  if (qrows <= 0) return;
  gqa_backward_dq_kernel<S><<<blocks_for(qrows * 32, kAttThreads), kAttThreads, 0, stream>>>(
      dqkv, dout, qkv, out, lse, doc, sh);
  DS_CUDA_CHECK_LAUNCH("gqa_backward_dq_kernel");
  gqa_backward_dkv_kernel<S><<<blocks_for(kvrows * 32, kAttThreads), kAttThreads, 0, stream>>>(
      dqkv, dout, qkv, out, lse, doc, sh);
  DS_CUDA_CHECK_LAUNCH("gqa_backward_dkv_kernel");
}

// Multi-head (B,T,3C) rows are the grouped-query layout with KV = NH.
int mha_head_size(int C, int NH) {
  if (NH <= 0 || C % NH != 0 || C / NH > kMaxHeadSize) {
    throw_cuda_error("attention", "shape check", __FILE__, __LINE__, 0,
                     ("C must be a multiple of NH with head size C/NH <= 256; got C=" +
                      std::to_string(C) + " NH=" + std::to_string(NH))
                         .c_str());
  }
  return C / NH;
}

}  // namespace

namespace typed {

template <typename S>
void attention_forward(S* out, float* lse, const S* qkv, float* /*scratch*/, int B, int T, int C,
                       int NH, cudaStream_t stream) {
  const int hs = mha_head_size(C, NH);
  if constexpr (std::is_same_v<S, Bf16>) {
    if (use_flash_attention(hs, out, qkv, out, qkv)) {
      flash_attention_forward_bf16(reinterpret_cast<uint16_t*>(out), lse,
                                   reinterpret_cast<const uint16_t*>(qkv), B, T, NH, NH, hs, stream);
      return;
    }
  }
  gqa_forward_impl(out, lse, qkv, nullptr, B, T, NH, NH, hs, stream);
}

template <typename S>
void attention_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse,
                        float* /*scratch*/, int B, int T, int C, int NH, cudaStream_t stream) {
  const int hs = mha_head_size(C, NH);
  if constexpr (std::is_same_v<S, Bf16>) {
    if (use_flash_attention(hs, dqkv, dout, qkv, out)) {
      flash_attention_backward_bf16(reinterpret_cast<uint16_t*>(dqkv), reinterpret_cast<const uint16_t*>(dout),
                                    reinterpret_cast<const uint16_t*>(qkv), reinterpret_cast<const uint16_t*>(out),
                                    lse, B, T, NH, NH, hs, stream);
      return;
    }
  }
  gqa_backward_impl(dqkv, dout, qkv, out, lse, nullptr, B, T, NH, NH, hs, stream);
}

#define DS_CUDA_INST_S(S)                                                                        \
  template void attention_forward<S>(S*, float*, const S*, float*, int, int, int, int,           \
                                     cudaStream_t);                                              \
  template void attention_backward<S>(S*, const S*, const S*, const S*, const float*, float*,    \
                                      int, int, int, int, cudaStream_t);
DS_CUDA_FOR_EACH_STORAGE(DS_CUDA_INST_S)
#undef DS_CUDA_INST_S



// bf16 runs flash attention where it takes the shape (use_flash_attention); the exact kernels
// otherwise and for fp32.
template <typename S>
void attention_gqa_forward(S* out, float* lse, const S* qkv, float* /*scratch*/, int B, int T,
                           int NH, int KV, int hd, cudaStream_t stream) {
  if constexpr (std::is_same_v<S, Bf16>) {
    if (NH > 0 && KV > 0 && NH % KV == 0 && use_flash_attention(hd, out, qkv, out, qkv)) {
      flash_attention_forward_bf16(reinterpret_cast<uint16_t*>(out), lse,
                                   reinterpret_cast<const uint16_t*>(qkv), B, T, NH, KV, hd, stream);
      return;
    }
  }
  gqa_forward_impl(out, lse, qkv, nullptr, B, T, NH, KV, hd, stream);
}
template <typename S>
void attention_gqa_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse,
                            float* /*scratch*/, int B, int T, int NH, int KV, int hd,
                            cudaStream_t stream) {
  if constexpr (std::is_same_v<S, Bf16>) {
    if (NH > 0 && KV > 0 && NH % KV == 0 && use_flash_attention(hd, dqkv, dout, qkv, out)) {
      flash_attention_backward_bf16(reinterpret_cast<uint16_t*>(dqkv), reinterpret_cast<const uint16_t*>(dout),
                                    reinterpret_cast<const uint16_t*>(qkv), reinterpret_cast<const uint16_t*>(out),
                                    lse, B, T, NH, KV, hd, stream);
      return;
    }
  }
  gqa_backward_impl(dqkv, dout, qkv, out, lse, nullptr, B, T, NH, KV, hd, stream);
}

#define DS_CUDA_INST_S(S)                                                                        \
  template void attention_gqa_forward<S>(S*, float*, const S*, float*, int, int, int, int, int,   \
                                         cudaStream_t);                                          \
  template void attention_gqa_backward<S>(S*, const S*, const S*, const S*, const float*, float*, \
                                          int, int, int, int, int, cudaStream_t);
DS_CUDA_FOR_EACH_STORAGE(DS_CUDA_INST_S)
#undef DS_CUDA_INST_S

// With documents (packing) every storage type runs the exact kernels, each row walking only its
// document's keys (flash_attention.cu has no document mask yet); null doc_start is the above.
template <typename S>
void attention_gqa_doc_forward(S* out, float* lse, const S* qkv, const int32_t* doc_start, float* scratch, int B,
                               int T, int NH, int KV, int hd, cudaStream_t stream) {
  if (doc_start == nullptr) return attention_gqa_forward(out, lse, qkv, scratch, B, T, NH, KV, hd, stream);
  gqa_forward_impl(out, lse, qkv, doc_start, B, T, NH, KV, hd, stream);
}
template <typename S>
void attention_gqa_doc_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse,
                                const int32_t* doc_start, float* scratch, int B, int T, int NH, int KV, int hd,
                                cudaStream_t stream) {
  if (doc_start == nullptr) {
    return attention_gqa_backward(dqkv, dout, qkv, out, lse, scratch, B, T, NH, KV, hd, stream);
  }
  gqa_backward_impl(dqkv, dout, qkv, out, lse, doc_start, B, T, NH, KV, hd, stream);
}

#define DS_CUDA_INST_S(S)                                                                                      \
  template void attention_gqa_doc_forward<S>(S*, float*, const S*, const int32_t*, float*, int, int, int, int, \
                                             int, cudaStream_t);                                               \
  template void attention_gqa_doc_backward<S>(S*, const S*, const S*, const S*, const float*, const int32_t*,  \
                                              float*, int, int, int, int, int, cudaStream_t);
DS_CUDA_FOR_EACH_STORAGE(DS_CUDA_INST_S)
#undef DS_CUDA_INST_S

}  // namespace typed

}  // namespace ds::rt::cuda
