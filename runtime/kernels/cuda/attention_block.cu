// Ring attention's pieces on the GPU (kernels/ops.def: attention_block_forward and _backward;
// kernels.h: attention_merge), the twins of cpu/attention_block.cpp with the same math, built
// from the exact grouped-query kernels' row steps (attention_rows.cuh): one warp per row, the
// head's hd values spread over the lanes (hd <= kMaxHeadSize), an online softmax in the forward. The partial
// outputs and the gradients are fp32 (a ring adds several blocks before one rounding). The
// backward runs two kernels with no atomics (deterministic): one warp per query row for dq, one
// per key row for dk and dv, walking the group's query heads.
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "kernels/cuda/attention_rows.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/kernels.h"

namespace ds::rt::cuda {

namespace {

constexpr int kThreads = 128;  // 4 warps = 4 rows per block
namespace rows = attention_rows;
using rows::kRegs;

struct BlockShape {
  int B, Tq, Tk, NH, KV, hd, q_pos, k_pos;
  float scale;
  __host__ __device__ int group() const { return NH / KV; }
  __host__ __device__ int64_t qkv_stride() const { return int64_t{NH + 2 * KV} * hd; }
  __host__ __device__ int64_t kv_stride() const { return int64_t{2 * KV} * hd; }
  __host__ __device__ int64_t out_stride() const { return int64_t{NH} * hd; }
  // Keys of the block that query i sees: k_pos + j <= q_pos + i.
  // Key row j of kv head g in a block of rows `kvb`: its k and v heads.
  template <typename S>
  __device__ attention_rows::KvRow<S> kv_row(const S* kvb, int j, int g) const {
    const S* r = kvb + j * kv_stride();
    return {r + int64_t{g} * hd, r + int64_t{KV + g} * hd};
  }
  __host__ __device__ int visible(int i) const {
    const int64_t n = int64_t{q_pos} + i - k_pos + 1;
    return static_cast<int>(n < 0 ? 0 : (n > Tk ? Tk : n));
  }
};

BlockShape make_shape(int B, int Tq, int Tk, int NH, int KV, int hd, int q_pos, int k_pos, const char* what) {
  if (NH <= 0 || KV <= 0 || NH % KV != 0 || hd <= 0 || hd > kMaxHeadSize) {
    throw_cuda_error(what, "shape check", __FILE__, __LINE__, 0,
                     ("need NH a positive multiple of KV and 0 < hd <= 256; got NH=" + std::to_string(NH) +
                      " KV=" + std::to_string(KV) + " hd=" + std::to_string(hd))
                         .c_str());
  }
  return BlockShape{B, Tq, Tk, NH, KV, hd, q_pos, k_pos, 1.0f / sqrtf(static_cast<float>(hd))};
}

unsigned warp_blocks(int64_t rows) { return static_cast<unsigned>((rows * 32 + kThreads - 1) / kThreads); }

template <typename S>
__global__ void block_forward_kernel(float* out, float* lse, const S* qkv, const S* kv, BlockShape sh) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= int64_t{sh.B} * sh.NH * sh.Tq) return;
  const int i = static_cast<int>(row % sh.Tq);
  const int64_t bh = row / sh.Tq;
  const int b = static_cast<int>(bh / sh.NH), h = static_cast<int>(bh % sh.NH), g = h / sh.group();
  const S* kvb = kv + int64_t{b} * sh.Tk * sh.kv_stride();
  const int n = sh.visible(i);
  float qr[kRegs], acc[kRegs], m, l;
  rows::load(qr, qkv + (int64_t{b} * sh.Tq + i) * sh.qkv_stride() + int64_t{h} * sh.hd, sh.hd, lane);
  rows::attend<S>(qr, n, sh.hd, lane, sh.scale, [&](int j) { return sh.kv_row(kvb, j, g); }, acc, m, l);
  float* o = out + (int64_t{b} * sh.Tq + i) * sh.out_stride() + int64_t{h} * sh.hd;
  const float inv = n > 0 ? 1.0f / l : 0.0f;
#pragma unroll
  for (int r = 0; r < kRegs; r++) {
    const int d = lane + 32 * r;
    if (d < sh.hd) o[d] = acc[r] * inv;
  }
  if (lane == 0) lse[bh * sh.Tq + i] = n > 0 ? m + logf(l) : -INFINITY;
}

__global__ void merge_kernel(float* out, float* lse, const float* part, const float* part_lse, int B, int T,
                             int NH, int hd) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;  // (b, h, t)
  const int lane = threadIdx.x % 32;
  if (row >= int64_t{B} * NH * T) return;
  const int64_t b = row / (int64_t{NH} * T), h = (row / T) % NH, t = row % T;
  const float la = lse[row], lb = part_lse[row];
  if (lb == -INFINITY) return;
  float wa = 0.0f, wb = 1.0f, l = lb;
  if (la != -INFINITY) {
    const float m = fmaxf(la, lb);
    l = m + logf(expf(la - m) + expf(lb - m));
    wa = expf(la - l);
    wb = expf(lb - l);
  }
  float* o = out + (b * T + t) * NH * hd + h * hd;
  const float* p = part + (b * T + t) * NH * hd + h * hd;
  for (int d = lane; d < hd; d += 32) o[d] = la == -INFINITY ? p[d] : wa * o[d] + wb * p[d];
  __syncwarp();
  if (lane == 0) lse[row] = l;
}

template <typename S>
__global__ void block_backward_dq_kernel(float* dq, const S* dout, const S* qkv, const S* kv, const S* out,
                                         const float* lse, BlockShape sh) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= int64_t{sh.B} * sh.NH * sh.Tq) return;
  const int i = static_cast<int>(row % sh.Tq);
  const int64_t bh = row / sh.Tq;
  const int b = static_cast<int>(bh / sh.NH), h = static_cast<int>(bh % sh.NH), g = h / sh.group();
  const int n = sh.visible(i);
  if (n == 0) return;
  const int64_t orow = (int64_t{b} * sh.Tq + i) * sh.out_stride() + int64_t{h} * sh.hd;
  const S* kvb = kv + int64_t{b} * sh.Tk * sh.kv_stride();
  float qr[kRegs], dor[kRegs], orr[kRegs], acc[kRegs];
  rows::load(qr, qkv + (int64_t{b} * sh.Tq + i) * sh.qkv_stride() + int64_t{h} * sh.hd, sh.hd, lane);
  rows::load(dor, dout + orow, sh.hd, lane);
  rows::load(orr, out + orow, sh.hd, lane);
  rows::dq_row<S>(qr, dor, orr, lse[bh * sh.Tq + i], n, sh.hd, lane, sh.scale,
                  [&](int j) { return sh.kv_row(kvb, j, g); }, acc);
  float* dqr = dq + orow;
#pragma unroll
  for (int r = 0; r < kRegs; r++) {
    const int d = lane + 32 * r;
    if (d < sh.hd) dqr[d] += acc[r];
  }
}

template <typename S>
__global__ void block_backward_dkv_kernel(float* dkv, const S* dout, const S* qkv, const S* kv, const S* out,
                                          const float* lse, BlockShape sh) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= int64_t{sh.B} * sh.KV * sh.Tk) return;
  const int j = static_cast<int>(row % sh.Tk);
  const int64_t bg = row / sh.Tk;
  const int b = static_cast<int>(bg / sh.KV), g = static_cast<int>(bg % sh.KV);
  const rows::KvRow<S> kvj = sh.kv_row(kv + int64_t{b} * sh.Tk * sh.kv_stride(), j, g);
  float kr[kRegs], vr[kRegs], dk[kRegs], dv[kRegs];
  rows::load(kr, kvj.k, sh.hd, lane);
  rows::load(vr, kvj.v, sh.hd, lane);
  rows::zero(dk);
  rows::zero(dv);
  // Query i sees key j when i >= k_pos + j - q_pos.
  const int64_t first = int64_t{sh.k_pos} + j - sh.q_pos;
  const int i0 = static_cast<int>(first < 0 ? 0 : first);
  for (int jh = 0; jh < sh.group(); jh++) {
    const int h = g * sh.group() + jh;
    const float* lrow = lse + (int64_t{b} * sh.NH + h) * sh.Tq;
    for (int i = i0; i < sh.Tq; i++) {
      const int64_t orow = (int64_t{b} * sh.Tq + i) * sh.out_stride() + int64_t{h} * sh.hd;
      rows::dkv_query(kr, vr, qkv + (int64_t{b} * sh.Tq + i) * sh.qkv_stride() + int64_t{h} * sh.hd, dout + orow,
                      out + orow, lrow[i], sh.hd, lane, sh.scale, dk, dv);
    }
  }
  float* dkp = dkv + (int64_t{b} * sh.Tk + j) * sh.kv_stride() + int64_t{g} * sh.hd;
  float* dvp = dkv + (int64_t{b} * sh.Tk + j) * sh.kv_stride() + int64_t{sh.KV + g} * sh.hd;
#pragma unroll
  for (int r = 0; r < kRegs; r++) {
    const int d = lane + 32 * r;
    if (d < sh.hd) {
      dkp[d] += dk[r];
      dvp[d] += dv[r];
    }
  }
}

}  // namespace

void attention_merge(float* out, float* lse, const float* part, const float* part_lse, int B, int T, int NH,
                     int hd, cudaStream_t stream) {
  const int64_t rows = int64_t{B} * NH * T;
  if (rows <= 0) return;
  merge_kernel<<<warp_blocks(rows), kThreads, 0, stream>>>(out, lse, part, part_lse, B, T, NH, hd);
  DS_CUDA_CHECK_LAUNCH("attention_merge");
}

namespace typed {

template <typename S>
void attention_block_forward(float* out, float* lse, const S* qkv, const S* kv, float* /*scratch: CPU only*/, int B,
                             int Tq, int Tk, int NH, int KV, int hd, int q_pos, int k_pos, cudaStream_t stream) {
  const BlockShape sh = make_shape(B, Tq, Tk, NH, KV, hd, q_pos, k_pos, "attention_block_forward");
  const int64_t rows = int64_t{B} * NH * Tq;
  if (rows <= 0) return;
  block_forward_kernel<S><<<warp_blocks(rows), kThreads, 0, stream>>>(out, lse, qkv, kv, sh);
  DS_CUDA_CHECK_LAUNCH("attention_block_forward");
}

template <typename S>
void attention_block_backward(float* dq, float* dkv, const S* dout, const S* qkv, const S* kv, const S* out,
                              const float* lse, float* /*scratch: CPU only*/, int B, int Tq, int Tk, int NH, int KV,
                              int hd, int q_pos, int k_pos, cudaStream_t stream) {
  const BlockShape sh = make_shape(B, Tq, Tk, NH, KV, hd, q_pos, k_pos, "attention_block_backward");
  const int64_t qrows = int64_t{B} * NH * Tq, krows = int64_t{B} * KV * Tk;
  if (qrows <= 0 || krows <= 0) return;
  block_backward_dq_kernel<S><<<warp_blocks(qrows), kThreads, 0, stream>>>(dq, dout, qkv, kv, out, lse, sh);
  DS_CUDA_CHECK_LAUNCH("attention_block_backward (dq)");
  block_backward_dkv_kernel<S><<<warp_blocks(krows), kThreads, 0, stream>>>(dkv, dout, qkv, kv, out, lse, sh);
  DS_CUDA_CHECK_LAUNCH("attention_block_backward (dk, dv)");
}

#define DS_CUDA_INST_S(S)                                                                                        \
  template void attention_block_forward<S>(float*, float*, const S*, const S*, float*, int, int, int, int, int,  \
                                           int, int, int, cudaStream_t);                                          \
  template void attention_block_backward<S>(float*, float*, const S*, const S*, const S*, const S*,              \
                                            const float*, float*, int, int, int, int, int, int, int, int,        \
                                            cudaStream_t);
DS_CUDA_FOR_EACH_STORAGE(DS_CUDA_INST_S)
#undef DS_CUDA_INST_S

}  // namespace typed

}  // namespace ds::rt::cuda
