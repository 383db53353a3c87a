// Causal (grouped-query) attention for bf16 storage on the tensor cores, in FlashAttention-2's
// schedule: the scores never leave the chip. Same layouts and saved buffers as the exact kernels
// (attention.cu): qkv (B,T,(NH+2KV)hd) with q heads, then k heads, then v heads (a multi-head
// (B,T,3C) is KV = NH), out (B,T,NH hd), lse (B,NH,T) the natural log-sum-exp of each scaled score
// row; query head h reads kv head h / (NH/KV).
//
// Tiles of 64 query rows and 64 key rows; 4 warps, each owning 16 rows of the block's tile. Every
// product is an m16n8k16 bf16 mma with fp32 accumulation; operands come from shared memory through
// ldmatrix (.trans where the product needs the tile's columns). As PyTorch's autocast and the CPU's
// bf16 path (cpu/attention_bf16.cpp) run it: q, k, v, o, dO enter the products as stored; P and dS
// are rounded to bf16 where they enter a product; the softmax, the lse, D = dO.O and dS are fp32.
// - forward: a block per (query tile, b, h); the online softmax keeps the running max and sum per
//   row in registers (base-2 exponentials), O in fp32 registers, written once.
// - backward, two kernels, neither with atomics (each output element written by one thread, sums
//   in a fixed order: deterministic):
//     dq:  a block per (query tile, b, h) walks the key tiles up to its diagonal;
//     dkv: a block per (key tile, b, kv head) walks the group's query heads and every query tile
//          from its diagonal on, summing the group's dK and dV in fp32 registers.
//   D_t = dO_t . O_t is recomputed per query tile from the stored dO and O (no scratch buffer).
// Shapes: hd in {16, 32, 64, 80, 96, 128}; any T; pointers 16-byte aligned
// (flash_attention_supported). Everything else runs the exact kernels, which stay the fp32 path
// and the reference (set_attention_kernel(AttentionKernel::kExact) forces them).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "kernels/cuda/column_sums.cuh"  // reduction_scratch
#include "kernels/cuda/device_util.cuh"
#include "kernels/cuda/flash_attention.cuh"
#include "kernels/cuda/kernels.h"

namespace ds::rt::cuda {

namespace {

constexpr int kTile = 64;  // query rows and key rows per tile
constexpr int kWarps = 4;  // 16 rows of the tile each
constexpr int kThreads = 32 * kWarps;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

thread_local AttentionKernel t_attention_kernel = AttentionKernel::kFlash;

struct FlashShape {
  int B, T, NH, KV;
  int64_t row;      // elements per qkv / dqkv row: (NH + 2 KV) hd
  int64_t out_row;  // elements per out / dout row: NH hd
  float scale;      // 1 / sqrt(hd)
};

// Shared-memory row stride of a (64, HD) bf16 tile: 8 elements of padding spread ldmatrix's row
// addresses over the banks; every row start stays 16-byte aligned.
template <int HD>
constexpr int kStride = HD + 8;
template <int HD>
constexpr int kTileElems = kTile * kStride<HD>;

// c += a b: one m16n8k16 product, bf16 operands, fp32 accumulators.
__device__ __forceinline__ void mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Four 8x8 bf16 matrices; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const uint16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// The A operand (16 x 16, row-major) at rows r0.., columns k0.. of a tile.
template <int HD>
__device__ __forceinline__ void load_a(uint32_t a[4], const uint16_t* s, int r0, int k0, int lane) {
  ldsm_x4(a, s + (r0 + (lane & 15)) * kStride<HD> + k0 + (lane >> 4) * 8);
}
// B operands of two n8 tiles, B(k, n) = s[n][k] (the tile's rows n0..n0+15 are B's columns):
// b[0..1] for columns n0..n0+7, b[2..3] for n0+8..n0+15, k0..k0+15.
template <int HD>
__device__ __forceinline__ void load_b_rows(uint32_t b[4], const uint16_t* s, int n0, int k0, int lane) {
  ldsm_x4(b, s + (n0 + (lane & 7) + (lane >> 4) * 8) * kStride<HD> + k0 + ((lane >> 3) & 1) * 8);
}
// B operands of two n8 tiles, B(k, n) = s[k][n] (the tile's rows k0..k0+15 are B's rows).
template <int HD>
__device__ __forceinline__ void load_b_cols(uint32_t b[4], const uint16_t* s, int k0, int n0, int lane) {
  ldsm_x4_trans(b, s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * kStride<HD> + n0 + (lane >> 4) * 8);
}

// Two floats as one bf16 pair word (lo in the low half), rounded to nearest even.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// The A operand of a product with a (16 x 64) accumulator tile acc[8][4] as its left factor, for
// the 16 columns kk*16..kk*16+15: the accumulator layout of n-tiles 2kk, 2kk+1 is A's layout.
__device__ __forceinline__ void acc_as_a(uint32_t a[4], const float acc[8][4], int kk) {
  a[0] = pack_bf16(acc[2 * kk][0], acc[2 * kk][1]);
  a[1] = pack_bf16(acc[2 * kk][2], acc[2 * kk][3]);
  a[2] = pack_bf16(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
  a[3] = pack_bf16(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

// acc = A B^T for this warp's 16 rows of the shared tile `a` (rows a0..a0+15) against the 64 rows
// of the shared tile `b`: a (16 x 64) score-shaped accumulator, zeroed first.
template <int HD>
__device__ __forceinline__ void score_tile(float acc[8][4], const uint16_t* a, int a0, const uint16_t* b, int lane) {
#pragma unroll
  for (int n = 0; n < 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < HD / 16; kk++) {
    uint32_t af[4];
    load_a<HD>(af, a, a0, kk * 16, lane);
#pragma unroll
    for (int np = 0; np < 4; np++) {
      uint32_t bb[4];
      load_b_rows<HD>(bb, b, np * 16, kk * 16, lane);
      mma(acc[2 * np], af, bb);
      mma(acc[2 * np + 1], af, bb + 2);
    }
  }
}

// out += X B for a (16 x 64) accumulator X (rounded to bf16 as it enters the product) and the
// shared (64, HD) tile `b` read by columns: out is (16 x HD).
template <int HD>
__device__ __forceinline__ void value_product(float out[HD / 8][4], const float x[8][4], const uint16_t* b, int lane) {
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
    uint32_t a[4];
    acc_as_a(a, x, kk);
#pragma unroll
    for (int np = 0; np < HD / 16; np++) {
      uint32_t bb[4];
      load_b_cols<HD>(bb, b, kk * 16, np * 16, lane);
      mma(out[2 * np], a, bb);
      mma(out[2 * np + 1], a, bb + 2);
    }
  }
}

// Asynchronous copies (sm_80+): 16 bytes global -> shared without passing through registers;
// src_bytes 0 fills the 16 bytes with zeros and reads nothing. A thread's copies form groups
// (commit); wait<N> returns once at most N of its groups are still in flight.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Starts copying rows r0..r0+63 (columns col..col+HD-1) of a row-major bf16 matrix with `stride`
// elements per row into a shared tile; rows at or past T become zeros. The caller commits and
// waits (the kernels below load tile j+1 while they compute on tile j).
template <int HD>
__device__ void load_tile_async(uint16_t* s, const uint16_t* g, int64_t stride, int r0, int T) {
  constexpr int kChunks = HD / 8;
  for (int c = threadIdx.x; c < kTile * kChunks; c += kThreads) {
    const int r = c / kChunks, k = (c % kChunks) * 8;
    const bool valid = r0 + r < T;
    cp_async16(s + r * kStride<HD> + k, valid ? g + (r0 + r) * stride + k : g, valid);
  }
}

__device__ __forceinline__ float dot8_bf16(uint4 a, uint4 b) {
  const uint32_t x[4] = {a.x, a.y, a.z, a.w}, y[4] = {b.x, b.y, b.z, b.w};
  float d = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    d += __uint_as_float(x[i] << 16) * __uint_as_float(y[i] << 16);
    d += __uint_as_float(x[i] & 0xffff0000u) * __uint_as_float(y[i] & 0xffff0000u);
  }
  return d;
}

// For the query rows r0..r0+63 of head column `col`: sD[r] = dO_r . O_r and sL[r] = lse_r in
// base-2 units (+inf past T, so their P is 0); D also into d_row[r0 + r] (the dk/dv kernel reads
// it there). Two threads per row.
template <int HD>
__device__ void query_stats(float* sD, float* sL, float* d_row, const uint16_t* dout, const uint16_t* out,
                            const float* lse_row, int64_t out_row, int64_t col, int r0, int T) {
  const int r = threadIdx.x >> 1, half = threadIdx.x & 1;
  float d = 0.0f;
  if (r0 + r < T) {
    const int64_t off = (r0 + r) * out_row + col + half * (HD / 2);
#pragma unroll
    for (int k = 0; k < HD / 2; k += 8) {
      d += dot8_bf16(*reinterpret_cast<const uint4*>(dout + off + k),
                     *reinterpret_cast<const uint4*>(out + off + k));
    }
  }
  d += __shfl_xor_sync(0xffffffffu, d, 1);
  if (half == 0) {
    sD[r] = d;
    sL[r] = r0 + r < T ? lse_row[r0 + r] * kLog2e : INFINITY;
    if (r0 + r < T) d_row[r0 + r] = d;
  }
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(uint16_t* out, float* lse, const uint16_t* qkv, FlashShape sh) {
  extern __shared__ __align__(16) uint16_t smem[];
  // Q, then K and V twice: tile j is computed on while tile j + 1 is copied in.
  uint16_t* sQ = smem;
  uint16_t* sKV[2][2] = {{sQ + kTileElems<HD>, sQ + 2 * kTileElems<HD>},
                         {sQ + 3 * kTileElems<HD>, sQ + 4 * kTileElems<HD>}};
  const int ntiles = (sh.T + kTile - 1) / kTile;
  const int tile = ntiles - 1 - static_cast<int>(blockIdx.x);  // the longest rows first
  const int bh = blockIdx.y, b = bh / sh.NH, h = bh % sh.NH, kvh = h / (sh.NH / sh.KV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const uint16_t* rows = qkv + int64_t{b} * sh.T * sh.row;
  const uint16_t* krows = rows + (sh.NH + kvh) * HD;
  const uint16_t* vrows = rows + (sh.NH + sh.KV + kvh) * HD;
  const int q0 = tile * kTile;

  load_tile_async<HD>(sQ, rows + h * HD, sh.row, q0, sh.T);
  load_tile_async<HD>(sKV[0][0], krows, sh.row, 0, sh.T);
  load_tile_async<HD>(sKV[0][1], vrows, sh.row, 0, sh.T);
  cp_async_commit();
  uint32_t qf[HD / 16][4];

  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float sl2 = sh.scale * kLog2e;
  const int row0 = q0 + warp * 16 + g;  // this thread's rows: row0 and row0 + 8

  for (int j = 0; j <= tile; j++) {
    cp_async_wait<0>();
    __syncthreads();  // tile j is in; every warp is done with tile j - 1's buffers
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < HD / 16; kk++) load_a<HD>(qf[kk], sQ, warp * 16, kk * 16, lane);
    }
    if (j < tile) {
      load_tile_async<HD>(sKV[(j + 1) & 1][0], krows, sh.row, (j + 1) * kTile, sh.T);
      load_tile_async<HD>(sKV[(j + 1) & 1][1], vrows, sh.row, (j + 1) * kTile, sh.T);
      cp_async_commit();
    }
    const uint16_t* sK = sKV[j & 1][0];
    const uint16_t* sV = sKV[j & 1][1];

    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
      for (int np = 0; np < 4; np++) {
        uint32_t bb[4];
        load_b_rows<HD>(bb, sK, np * 16, kk * 16, lane);
        mma(s[2 * np], qf[kk], bb);
        mma(s[2 * np + 1], qf[kk], bb + 2);
      }
    }
    // Scores in base-2 units; keys after the row masked on the diagonal tile.
#pragma unroll
    for (int n = 0; n < 8; n++) {
#pragma unroll
      for (int c = 0; c < 4; c++) {
        float v = s[n][c] * sl2;
        if (j == tile) {
          const int key = j * kTile + n * 8 + 2 * tq + (c & 1);
          if (key > row0 + (c >> 1) * 8) v = -INFINITY;
        }
        s[n][c] = v;
      }
    }
    // Online softmax per row (the row is spread over the 4 threads of a quad).
#pragma unroll
    for (int r = 0; r < 2; r++) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < 8; n++) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[r], mx);
      const float base = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet
      const float corr = exp2f(m[r] - base);                 // 0 on the first tile
      l[r] *= corr;
#pragma unroll
      for (int n = 0; n < HD / 8; n++) {
        o[n][2 * r] *= corr;
        o[n][2 * r + 1] *= corr;
      }
#pragma unroll
      for (int n = 0; n < 8; n++) {
        s[n][2 * r] = exp2f(s[n][2 * r] - base);
        s[n][2 * r + 1] = exp2f(s[n][2 * r + 1] - base);
        l[r] += s[n][2 * r] + s[n][2 * r + 1];
      }
      m[r] = m_new;
    }
    value_product<HD>(o, s, sV, lane);  // O += P V (P rounded to bf16)
  }

#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int t = row0 + r * 8;
    if (t >= sh.T) continue;
    const float inv = 1.0f / l[r];
    uint16_t* orow = out + (int64_t{b} * sh.T + t) * sh.out_row + h * HD + 2 * tq;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
      *reinterpret_cast<uint32_t*>(orow + n * 8) = pack_bf16(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    }
    if (tq == 0) lse[int64_t{bh} * sh.T + t] = (m[r] + log2f(l[r])) * kLn2;
  }
}

// The backward kernels' shared memory: six bf16 tiles (the block's own two, and the two it walks,
// twice: one computed on while the next is copied in), then the query rows' statistics twice:
// kTile floats of D = rowsum(dO * O) and kTile of the lse, each.
constexpr int kBackwardTiles = 6;
constexpr int kBackwardStats = 4 * kTile;  // floats
template <int HD>
struct BackwardSmem {
  uint16_t* tile[kBackwardTiles];
  float* D[2];
  float* L[2];
  __device__ explicit BackwardSmem(uint16_t* smem) {
#pragma unroll
    for (int i = 0; i < kBackwardTiles; i++) tile[i] = smem + i * kTileElems<HD>;
    float* stats = reinterpret_cast<float*>(smem + kBackwardTiles * kTileElems<HD>);
    D[0] = stats, L[0] = stats + kTile, D[1] = stats + 2 * kTile, L[1] = stats + 3 * kTile;
  }
};

template <int HD>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dq_kernel(uint16_t* dqkv, float* dstat, const uint16_t* dout, const uint16_t* qkv,
                             const uint16_t* out, const float* lse, FlashShape sh) {
  extern __shared__ __align__(16) uint16_t smem[];
  const BackwardSmem<HD> sm(smem);  // this block's own tiles: Q, dO; the walked ones: K, V (twice)
  uint16_t *sQ = sm.tile[0], *sdO = sm.tile[1];
  uint16_t* sKV[2][2] = {{sm.tile[2], sm.tile[3]}, {sm.tile[4], sm.tile[5]}};
  float *sD = sm.D[0], *sL = sm.L[0];
  const int ntiles = (sh.T + kTile - 1) / kTile;
  const int tile = ntiles - 1 - static_cast<int>(blockIdx.x);
  const int bh = blockIdx.y, b = bh / sh.NH, h = bh % sh.NH, kvh = h / (sh.NH / sh.KV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const uint16_t* rows = qkv + int64_t{b} * sh.T * sh.row;
  const uint16_t* krows = rows + (sh.NH + kvh) * HD;
  const uint16_t* vrows = rows + (sh.NH + sh.KV + kvh) * HD;
  const uint16_t* orows = out + int64_t{b} * sh.T * sh.out_row;
  const uint16_t* drows = dout + int64_t{b} * sh.T * sh.out_row;
  const int q0 = tile * kTile;

  load_tile_async<HD>(sQ, rows + h * HD, sh.row, q0, sh.T);
  load_tile_async<HD>(sdO, drows + h * HD, sh.out_row, q0, sh.T);
  load_tile_async<HD>(sKV[0][0], krows, sh.row, 0, sh.T);
  load_tile_async<HD>(sKV[0][1], vrows, sh.row, 0, sh.T);
  cp_async_commit();
  query_stats<HD>(sD, sL, dstat + int64_t{bh} * sh.T, drows, orows, lse + int64_t{bh} * sh.T, sh.out_row, h * HD,
                  q0, sh.T);

  float dq[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  const float sl2 = sh.scale * kLog2e;
  const int lr0 = warp * 16 + g;  // this thread's rows in the tile: lr0 and lr0 + 8
  float D[2], L[2];

  for (int j = 0; j <= tile; j++) {
    cp_async_wait<0>();
    __syncthreads();  // tile j (and Q, dO, D, L) is in; every warp is done with tile j - 1's buffers
    if (j == 0) D[0] = sD[lr0], D[1] = sD[lr0 + 8], L[0] = sL[lr0], L[1] = sL[lr0 + 8];
    if (j < tile) {
      load_tile_async<HD>(sKV[(j + 1) & 1][0], krows, sh.row, (j + 1) * kTile, sh.T);
      load_tile_async<HD>(sKV[(j + 1) & 1][1], vrows, sh.row, (j + 1) * kTile, sh.T);
      cp_async_commit();
    }
    const uint16_t* sK = sKV[j & 1][0];
    const uint16_t* sV = sKV[j & 1][1];

    float s[8][4], dp[8][4];
    score_tile<HD>(s, sQ, warp * 16, sK, lane);    // S = Q K^T
    score_tile<HD>(dp, sdO, warp * 16, sV, lane);  // dP = dO V^T
    // dS = P (dP - D), P = exp(S scale - lse), keys after the row masked on the diagonal tile.
#pragma unroll
    for (int n = 0; n < 8; n++) {
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int r = c >> 1;
        float p = exp2f(s[n][c] * sl2 - L[r]);
        if (j == tile && j * kTile + n * 8 + 2 * tq + (c & 1) > q0 + lr0 + r * 8) p = 0.0f;
        s[n][c] = p * (dp[n][c] - D[r]);
      }
    }
    value_product<HD>(dq, s, sK, lane);  // dQ += dS K
  }

  uint16_t* dq_rows = dqkv + int64_t{b} * sh.T * sh.row;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int t = q0 + lr0 + r * 8;
    if (t >= sh.T) continue;
    uint16_t* p = dq_rows + t * sh.row + h * HD + 2 * tq;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
      *reinterpret_cast<uint32_t*>(p + n * 8) = pack_bf16(dq[n][2 * r] * sh.scale, dq[n][2 * r + 1] * sh.scale);
    }
  }
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    flash_backward_dkv_kernel(uint16_t* dqkv, const float* dstat, const uint16_t* dout, const uint16_t* qkv,
                              const float* lse, FlashShape sh) {
  extern __shared__ __align__(16) uint16_t smem[];
  const BackwardSmem<HD> sm(smem);  // this block's own tiles: K, V; the walked ones: Q, dO (twice)
  uint16_t *sK = sm.tile[0], *sV = sm.tile[1];
  uint16_t* sQdO[2][2] = {{sm.tile[2], sm.tile[3]}, {sm.tile[4], sm.tile[5]}};
  const int ntiles = (sh.T + kTile - 1) / kTile;
  const int j = static_cast<int>(blockIdx.x);  // key tile: the smallest (most work) first
  const int b = blockIdx.y / sh.KV, kvh = blockIdx.y % sh.KV, group = sh.NH / sh.KV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
  const uint16_t* rows = qkv + int64_t{b} * sh.T * sh.row;
  const uint16_t* drows = dout + int64_t{b} * sh.T * sh.out_row;
  const int k0 = j * kTile;
  // The walk: query tiles j..ntiles-1 of each query head of the group, step `it` in order.
  const int per_head = ntiles - j, steps = group * per_head;
  // A step's copies: its Q and dO tiles, and its rows' D (the dq kernel's, dstat) and lse, zeros
  // past T (4-byte copies: a row of T floats need not start 16-byte aligned).
  auto load_step = [&](int it) {
    const int h = kvh * group + it / per_head, i = j + it % per_head;
    load_tile_async<HD>(sQdO[it & 1][0], rows + h * HD, sh.row, i * kTile, sh.T);
    load_tile_async<HD>(sQdO[it & 1][1], drows + h * HD, sh.out_row, i * kTile, sh.T);
    const int64_t at = (int64_t{b} * sh.NH + h) * sh.T;
    const int r = threadIdx.x % kTile, t = i * kTile + r;
    const float* src = threadIdx.x < kTile ? dstat + at : lse + at;
    float* dst = threadIdx.x < kTile ? sm.D[it & 1] : sm.L[it & 1];
    if (threadIdx.x < 2 * kTile) cp_async4(dst + r, t < sh.T ? src + t : src, t < sh.T);
  };

  load_tile_async<HD>(sK, rows + (sh.NH + kvh) * HD, sh.row, k0, sh.T);
  load_tile_async<HD>(sV, rows + (sh.NH + sh.KV + kvh) * HD, sh.row, k0, sh.T);
  load_step(0);
  cp_async_commit();

  float dk[HD / 8][4], dv[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; n++) {
#pragma unroll
    for (int c = 0; c < 4; c++) dk[n][c] = dv[n][c] = 0.0f;
  }
  const float sl2 = sh.scale * kLog2e;
  const int key0 = k0 + warp * 16 + g;  // this thread's keys: key0 and key0 + 8

  for (int it = 0; it < steps; it++) {
    const int i = j + it % per_head;
    cp_async_wait<0>();
    __syncthreads();  // step it's Q, dO, D and lse are in; every warp is done with step it - 1's
    if (it + 1 < steps) {
      load_step(it + 1);
      cp_async_commit();
    }
    const uint16_t* sQ = sQdO[it & 1][0];
    const uint16_t* sdO = sQdO[it & 1][1];
    const float* sD = sm.D[it & 1];
    const float* sL = sm.L[it & 1];

    // S^T = K Q^T and dP^T = V dO^T: 16 keys (this warp's) x 64 queries.
    float st[8][4], dpt[8][4];
    score_tile<HD>(st, sK, warp * 16, sQ, lane);
    score_tile<HD>(dpt, sV, warp * 16, sdO, lane);
    // P^T and dS^T = P^T (dP^T - D); queries before the key masked on the diagonal tile.
#pragma unroll
    for (int n = 0; n < 8; n++) {
#pragma unroll
      for (int c = 0; c < 4; c++) {
        const int ql = n * 8 + 2 * tq + (c & 1);
        float p = exp2f(st[n][c] * sl2 - sL[ql] * kLog2e);
        if (i * kTile + ql >= sh.T || (i == j && key0 + (c >> 1) * 8 > i * kTile + ql)) p = 0.0f;
        st[n][c] = p;
        dpt[n][c] = p * (dpt[n][c] - sD[ql]);
      }
    }
    value_product<HD>(dv, st, sdO, lane);  // dV += P^T dO
    value_product<HD>(dk, dpt, sQ, lane);  // dK += dS^T Q
  }

  uint16_t* drows_out = dqkv + int64_t{b} * sh.T * sh.row;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int t = key0 + r * 8;
    if (t >= sh.T) continue;
    uint16_t* pk = drows_out + t * sh.row + (sh.NH + kvh) * HD + 2 * tq;
    uint16_t* pv = drows_out + t * sh.row + (sh.NH + sh.KV + kvh) * HD + 2 * tq;
#pragma unroll
    for (int n = 0; n < HD / 8; n++) {
      *reinterpret_cast<uint32_t*>(pk + n * 8) = pack_bf16(dk[n][2 * r] * sh.scale, dk[n][2 * r + 1] * sh.scale);
      *reinterpret_cast<uint32_t*>(pv + n * 8) = pack_bf16(dv[n][2 * r], dv[n][2 * r + 1]);
    }
  }
}

FlashShape make_shape(int B, int T, int NH, int KV, int hd, const char* what) {
  if (!flash_attention_supported(hd) || NH <= 0 || KV <= 0 || NH % KV != 0) {
    throw_cuda_error(what, "shape check", __FILE__, __LINE__, 0,
                     ("flash attention needs hd in {16, 32, 64, 80, 96, 128} and NH a multiple of "
                      "KV; got hd=" + std::to_string(hd) + " NH=" + std::to_string(NH) +
                      " KV=" + std::to_string(KV))
                         .c_str());
  }
  const int64_t row = int64_t{NH + 2 * KV} * hd;
  return FlashShape{B, T, NH, KV, row, int64_t{NH} * hd, 1.0f / std::sqrt(static_cast<float>(hd))};
}

template <typename Kernel>
void allow_smem(Kernel k, size_t bytes) {
  DS_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(bytes)));
}

template <int HD>
void forward_hd(uint16_t* out, float* lse, const uint16_t* qkv, const FlashShape& sh,
                cudaStream_t stream) {
  const size_t smem = 5 * kTileElems<HD> * sizeof(uint16_t);  // Q, and K and V twice
  allow_smem(flash_forward_kernel<HD>, smem);
  const dim3 grid((sh.T + kTile - 1) / kTile, sh.B * sh.NH);
  flash_forward_kernel<HD><<<grid, kThreads, smem, stream>>>(out, lse, qkv, sh);
  DS_CUDA_CHECK_LAUNCH("flash_forward_kernel");
}

template <int HD>
void backward_hd(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv, const uint16_t* out,
                 const float* lse, const FlashShape& sh, cudaStream_t stream) {
  const size_t smem = kBackwardTiles * kTileElems<HD> * sizeof(uint16_t) + kBackwardStats * sizeof(float);
  allow_smem(flash_backward_dq_kernel<HD>, smem);
  allow_smem(flash_backward_dkv_kernel<HD>, smem);
  const int ntiles = (sh.T + kTile - 1) / kTile;
  // D = rowsum(dO * O) of every query row: the dq kernel computes it and leaves it in the module's
  // reduction scratch for the dk/dv kernel, which runs next on the same stream.
  float* dstat = reduction_scratch(static_cast<size_t>(sh.B) * sh.NH * sh.T);
  flash_backward_dq_kernel<HD><<<dim3(ntiles, sh.B * sh.NH), kThreads, smem, stream>>>(
      dqkv, dstat, dout, qkv, out, lse, sh);
  DS_CUDA_CHECK_LAUNCH("flash_backward_dq_kernel");
  flash_backward_dkv_kernel<HD><<<dim3(ntiles, sh.B * sh.KV), kThreads, smem, stream>>>(
      dqkv, dstat, dout, qkv, lse, sh);
  DS_CUDA_CHECK_LAUNCH("flash_backward_dkv_kernel");
}


}  // namespace

bool flash_attention_supported(int hd) {
  return hd == 16 || hd == 32 || hd == 64 || hd == 80 || hd == 96 || hd == 128;
}

void set_attention_kernel(AttentionKernel k) { t_attention_kernel = k; }
AttentionKernel attention_kernel() { return t_attention_kernel; }

bool use_flash_attention(int hd, const void* a, const void* b, const void* c, const void* d) {
  return t_attention_kernel == AttentionKernel::kFlash && flash_attention_supported(hd) &&
         aligned16(a) && aligned16(b) && aligned16(c) && aligned16(d);
}

void flash_attention_forward_bf16(uint16_t* out, float* lse, const uint16_t* qkv, int B, int T,
                                  int NH, int KV, int hd, cudaStream_t stream) {
  const FlashShape sh = make_shape(B, T, NH, KV, hd, "flash_attention_forward_bf16");
  if (B <= 0 || T <= 0) return;
  switch (hd) {
    case 16: forward_hd<16>(out, lse, qkv, sh, stream); break;
    case 32: forward_hd<32>(out, lse, qkv, sh, stream); break;
    case 64: forward_hd<64>(out, lse, qkv, sh, stream); break;
    case 80: forward_hd<80>(out, lse, qkv, sh, stream); break;
    case 96: forward_hd<96>(out, lse, qkv, sh, stream); break;
    default: forward_hd<128>(out, lse, qkv, sh, stream); break;
  }
}

void flash_attention_backward_bf16(uint16_t* dqkv, const uint16_t* dout, const uint16_t* qkv,
                                   const uint16_t* out, const float* lse, int B, int T, int NH,
                                   int KV, int hd, cudaStream_t stream) {
  const FlashShape sh = make_shape(B, T, NH, KV, hd, "flash_attention_backward_bf16");
  if (B <= 0 || T <= 0) return;
  switch (hd) {
    case 16: backward_hd<16>(dqkv, dout, qkv, out, lse, sh, stream); break;
    case 32: backward_hd<32>(dqkv, dout, qkv, out, lse, sh, stream); break;
    case 64: backward_hd<64>(dqkv, dout, qkv, out, lse, sh, stream); break;
    case 80: backward_hd<80>(dqkv, dout, qkv, out, lse, sh, stream); break;
    case 96: backward_hd<96>(dqkv, dout, qkv, out, lse, sh, stream); break;
    default: backward_hd<128>(dqkv, dout, qkv, out, lse, sh, stream); break;
  }
}

}  // namespace ds::rt::cuda
