// Element-wise reductions and the 16-bit float conversions the collectives need: plain loops
// over raw buffers, compiled with -O3 so that GCC vectorizes them, and for fp32, bf16 and fp16 a
// fused AVX2 (and F16C) kernel chosen at run time, bit for bit the loop's (reduce.cpp; which NaN
// survives when two meet follows the operands' order, as in the loop).
//
// Deliberately not: a kernel library. The runtime's compute kernels live in runtime/kernels;
// these exist so that runtime/comm depends on nothing but lib/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "comm/comm.h"

namespace ds::rt::comm {

// Where part i of n elements split `parts` ways begins: floor(n * i / parts), without overflowing
// n * i (the ring and scatter segments of the backends).
inline size_t seg_begin(size_t n, int parts, int i) {
  const size_t p = static_cast<size_t>(parts), k = static_cast<size_t>(i);
  return (n / p) * k + (n % p) * k / p;
}

// out[i] = op(srcs[0][i], srcs[1][i], ..., srcs[n-1][i]) for i < count, in the order of `srcs`
// (so every rank reducing the same sources in the same order gets the same bits).
// bf16/fp16 accumulate in fp32 and round once; integer sums wrap. `out` may be one of the
// sources (exactly, not partially overlapping). n >= 1.
void reduce_n(DataType dtype, ReduceOp op, void* out, const void* const* srcs, int n,
              size_t count);

// reduce_n into a large output nobody reads right away (a reduce_scatter's part of many MiB):
// the same values, written with streaming stores, so the output's lines are not read first.
// fp32, bf16 and fp16 on a CPU with AVX2 and F16C run one fused pass (16 elements of every source reduced in
// fp32 registers, rounded once and streamed out); other types reduce a few KiB at a time into a
// buffer in L1 and stream that out (copy_streaming). `out` may be one of the sources, as for
// reduce_n.
void reduce_n_streaming(DataType dtype, ReduceOp op, void* out, const void* const* srcs, int n, size_t count);

// inout[i] = op(inout[i], in[i]) (two sources; the Gloo ring's step).
void reduce_into(DataType dtype, ReduceOp op, void* inout, const void* in, size_t count);

// memcpy with non-temporal (streaming) stores on x86-64: the destination's cache lines are
// written without being read first and bypass the caches, which cuts the memory traffic of a
// large copy by a third (no read-for-ownership). For destinations far larger than the caches
// that nobody reads right away (a collective's output of many MiB); a plain memcpy elsewhere,
// and on other CPUs. glibc's memcpy only streams above 3/4 of the L3 it is told of (99 MiB on a
// VM that reports the host's 260 MiB L3), so it cannot be left to decide. Must not overlap.
void copy_streaming(void* dst, const void* src, size_t bytes);

}  // namespace ds::rt::comm
