// Column sums over many rows (a bias gradient, LayerNorm's and RMSNorm's weight gradients), spread
// over enough blocks to fill the GPU and still deterministic: pass 1 gives each block 32 columns of
// one chunk of rows and writes the chunk's K sums per column into a scratch buffer; pass 2 sums
// the chunks in order and hands the K totals to `finish` (which adds them into the gradients,
// rounding once). One block per 32 columns over all rows (what this replaced) left an H200 with
// 24 busy blocks for C = 768: 0.4 ms per call, 30% of the 124M bf16 step (docs/gpu.md).
//
// The scratch is the module's per (host thread, device) reduction buffer (reduction_scratch, in
// blas.cu beside cuBLAS's workspace), not counted by the tagged allocator; a thread's calls run on
// one stream at a time, so its passes never overlap. Only for nvcc.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/device_util.cuh"

namespace ds::rt::cuda {

// At least `floats` floats of device scratch for this host thread on the current device (grown,
// after a device synchronisation, when a call needs more than it holds).
float* reduction_scratch(size_t floats);

namespace column_sums {

constexpr int kRowsY = 8;  // block (32, kRowsY): 32 columns, kRowsY row strides

// Row chunks for `rows` x `C`: about 8 blocks per SM of an H200 (132 SMs), at least 64 rows each.
inline int chunks_for(int64_t rows, int C) {
  const int64_t col_blocks = (C + 31) / 32;
  int64_t chunks = (8 * 132 + col_blocks - 1) / col_blocks;
  chunks = std::min<int64_t>(chunks, (rows + 63) / 64);
  return static_cast<int>(std::max<int64_t>(chunks, 1));
}

// Term: `__device__ void operator()(int64_t r, int c, float (&acc)[K]) const` adds row r's terms.
template <int K, typename Term>
__global__ void partials_kernel(float* partials, int64_t rows, int C, int64_t rows_per_chunk, Term term) {
  __shared__ float part[K][kRowsY][32];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const int chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float acc[K];
#pragma unroll
  for (int k = 0; k < K; k++) acc[k] = 0.0f;
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowsY) term(r, c, acc);
  }
#pragma unroll
  for (int k = 0; k < K; k++) part[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
#pragma unroll
    for (int k = 0; k < K; k++) {
      float s = part[k][0][threadIdx.x];
      for (int y = 1; y < kRowsY; y++) s += part[k][y][threadIdx.x];
      partials[(int64_t{k} * gridDim.y + chunk) * C + c] = s;
    }
  }
}

// Finish: `__device__ void operator()(int c, const float (&sum)[K]) const`.
template <int K, typename Finish>
__global__ void finish_kernel(const float* partials, int chunks, int C, Finish finish) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s[K];
#pragma unroll
  for (int k = 0; k < K; k++) {
    s[k] = 0.0f;
    for (int ch = 0; ch < chunks; ch++) s[k] += partials[(int64_t{k} * chunks + ch) * C + c];
  }
  finish(c, s);
}

// Both passes on `stream`.
template <int K, typename Term, typename Finish>
void run(int64_t rows, int C, Term term, Finish finish, cudaStream_t stream) {
  if (rows <= 0 || C <= 0) return;
  const int chunks = chunks_for(rows, C);
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  float* partials = reduction_scratch(static_cast<size_t>(K) * chunks * C);
  partials_kernel<K><<<dim3(blocks_for(C, 32), chunks), dim3(32, kRowsY), 0, stream>>>(partials, rows, C,
                                                                                          rows_per_chunk, term);
  DS_CUDA_CHECK_LAUNCH("column_sums");
  finish_kernel<K><<<blocks_for(C, 256), 256, 0, stream>>>(partials, chunks, C, finish);
  DS_CUDA_CHECK_LAUNCH("column_sums");
}

}  // namespace column_sums

}  // namespace ds::rt::cuda
