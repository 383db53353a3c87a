// Device-side helpers shared by the .cu files: bf16 bit conversions identical to core/dtype.h
// (round to nearest even, NaN kept quiet), fp32/bf16 loads, stores and atomic adds through one
// overload set (so a kernel templated over the storage type reads ld(p) and writes st(p, v) for
// both), warp and block reductions, launch-size arithmetic. Only for nvcc.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "kernels/cuda/check.h"

namespace ds::rt::cuda {

// bf16 storage: the model's own 2-byte type (core/dtype.h), distinct from fp16 bits, so the
// kernels' templates take the dispatch's pointers as they are.
using Bf16 = ::ds::rt::bf16;

// The storage (S) and storage-with-gradient (S, G) types every typed kernel is instantiated for
// (the three tables of kernels/cuda_kernel_table.h), as cpu/kernels.h's DS_FOR_EACH_STORAGE(_GRAD).
#define DS_CUDA_FOR_EACH_STORAGE(X) X(float) X(::ds::rt::bf16)
#define DS_CUDA_FOR_EACH_STORAGE_GRAD(X) X(float, float) X(::ds::rt::bf16, ::ds::rt::bf16) X(::ds::rt::bf16, float)

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

// 16-byte packs for the memory-bound kernels: 8 bf16 or 4 fp32 elements per load and store.
// ldv<kN>/stv<kN> read and write kN consecutive elements as floats (kN = 1: ld/st; kN = the
// pack: one 16-byte access, which needs a 16-byte aligned address). for_each_pack<kN> walks a
// flat range of n elements grid-stride, kN at a time, then the tail one at a time; kernels are
// instantiated with kN = PackOf<T>::kN where every pointer is aligned (aligned16, host side) and
// with kN = 1 otherwise. Both paths compute element for element the same thing.
template <typename T>
struct PackOf;
template <>
struct PackOf<float> {
  static constexpr int kN = 4;
};
template <>
struct PackOf<Bf16> {
  static constexpr int kN = 8;
};

__device__ inline void ld_pack(const float* p, float (&v)[4]) {
  const float4 q = *reinterpret_cast<const float4*>(p);
  v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
}
__device__ inline void ld_pack(const Bf16* p, float (&v)[8]) {
  const uint4 q = *reinterpret_cast<const uint4*>(p);
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int k = 0; k < 4; k++) {  // little-endian: the lower half is the earlier element
    v[2 * k] = __uint_as_float(w[k] << 16);
    v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}
__device__ inline void st_pack(float* p, const float (&v)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ inline void st_pack(Bf16* p, const float (&v)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; k++) {
    w[k] = static_cast<uint32_t>(f32_to_bf16_bits(v[2 * k])) |
           (static_cast<uint32_t>(f32_to_bf16_bits(v[2 * k + 1])) << 16);
  }
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

template <int kN, typename T>
__device__ inline void ldv(const T* p, float (&v)[kN]) {
  if constexpr (kN == 1) {
    v[0] = ld(p);
  } else {
    ld_pack(p, v);
  }
}
template <int kN, typename T>
__device__ inline void stv(T* p, const float (&v)[kN]) {
  if constexpr (kN == 1) {
    st(p, v[0]);
  } else {
    st_pack(p, v);
  }
}

template <int kN>
using PackWidth = std::integral_constant<int, kN>;

// body(PackWidth<k>{}, i) for every pack start i of [0, n): k = kN while whole packs remain, then
// k = 1 for the tail. Grid-stride over the whole grid.
template <int kN, typename Body>
__device__ inline void for_each_pack(int64_t n, Body body) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t packs = n / kN;
  for (int64_t p = first; p < packs; p += stride) body(PackWidth<kN>{}, p * kN);
  if constexpr (kN > 1) {
    for (int64_t i = packs * kN + first; i < n; i += stride) body(PackWidth<1>{}, i);
  }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
template <typename... P>
inline bool all_aligned16(const P*... p) {
  return (aligned16(p) && ...);
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
