// Device-side helpers shared by the .cu files: bf16 bit conversions identical to core/dtype.h
// (round to nearest even, NaN kept quiet), fp32/bf16 loads, stores and atomic adds through one
// overload set (so a kernel templated over the storage type reads ld(p) and writes st(p, v) for
// both), warp and block reductions, launch-size arithmetic. Only for nvcc.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/check.h"

namespace ds::rt::cuda {

// bf16 storage: the model's own 2-byte type (core/dtype.h), distinct from fp16 bits, so the
// kernels' templates take the dispatch's pointers as they are.
using Bf16 = ::ds::rt::bf16;

__device__ inline float bf16_bits_to_f32(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}
__device__ inline uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__device__ inline float ld(const float* p) { return *p; }
__device__ inline float ld(const Bf16* p) { return bf16_bits_to_f32(p->bits); }
__device__ inline void st(float* p, float v) { *p = v; }
__device__ inline void st(Bf16* p, float v) { p->bits = f32_to_bf16_bits(v); }

// *p += v with one rounding of the sum, atomically. bf16: a compare-and-swap loop on the 16 bits
// that rounds with st()'s formula, so the rounding is core/dtype.h's by construction.
__device__ inline void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ inline void atomic_add(Bf16* p, float v) {
  auto* a = reinterpret_cast<unsigned short*>(p);
  unsigned short old = *a, assumed = 0;
  do {
    assumed = old;
    old = atomicCAS(a, assumed, f32_to_bf16_bits(bf16_bits_to_f32(assumed) + v));
  } while (old != assumed);
}

inline Bf16* as_bf16(uint16_t* p) { return reinterpret_cast<Bf16*>(p); }
inline const Bf16* as_bf16(const uint16_t* p) { return reinterpret_cast<const Bf16*>(p); }

// Sum over the 32 lanes; every lane gets the result.
__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reductions for blocks of a multiple of 32 threads (at most 1024). Every thread of
// the block must call them; every thread gets the result. `shared` holds 32 floats.
__device__ inline float block_sum(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // shared may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : 0.0f;
  return warp_sum(v);
}
__device__ inline float block_max(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < nwarps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

inline unsigned int blocks_for(int64_t n, int threads) {
  return static_cast<unsigned int>((n + threads - 1) / threads);
}

// Grid-stride loop bound for 1-D element kernels: enough blocks to fill an H200, no more.
inline unsigned int elementwise_blocks(int64_t n, int threads) {
  const int64_t want = (n + threads - 1) / threads;
  return static_cast<unsigned int>(want < 65536 ? (want > 0 ? want : 1) : 65536);
}

}  // namespace ds::rt::cuda
