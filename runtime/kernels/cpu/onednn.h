// Matrix products on oneDNN (the primitive library PyTorch uses on CPUs): the backend of the
// matmul kernels (cpu/matmul.cpp). Internal to runtime/kernels/cpu.
//
// One call computes C (M,N) = A (M,K) B (K,N) [+ bias (N)] [+ C], A and B given by element
// strides (a transposed operand is just other strides), C by its row stride. A, B and the bias
// have one type `in`; C has type `out` (fp32 or `in`); arithmetic accumulates in fp32.
// - A primitive is created the first time a (shapes, strides, types, bias, accumulate) key is
//   seen and cached for the process, so a training step creates none after the first. Inside a
//   cpu::VariableMatmulRows scope the key leaves M and K open (oneDNN's run-time dimensions):
//   one primitive serves every row count.
// - bf16 runs oneDNN's bf16 kernels (AVX512-BF16 or AMX where the CPU has them). Where oneDNN
//   cannot create a 16-bit primitive (fp16 on CPUs without AVX512-FP16; bf16 without AVX-512),
//   the operands are converted to fp32 in a per-thread buffer (the one allocation the kernels
//   make, untagged, reused), the fp32 primitive runs, and C is rounded once. kernel_report()
//   says which ran.
// Thread-safety: calls from several threads at once are safe (the cache is locked, primitives
// are executed with per-thread streams).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace ds::rt::cpu::onednn {

struct Operand {
  const void* data;
  int64_t stride0;  // elements between rows
  int64_t stride1;  // elements between columns
};

// See the header comment. bias may be null; accumulate adds the product to C (beta = 1).
void matmul(DType in, Operand A, Operand B, const void* bias, DType out, void* C, int64_t ldc, int M,
            int N, int K, bool accumulate);

// Which matmul implementation runs (default kOneDnn). kOneDnnConvert forces the fp32 fallback
// for 16-bit inputs (tests and benches of the fallback); kOpenBlas runs fp32 products on
// OpenBLAS sgemm (16-bit inputs converted to fp32), for measurement against oneDNN.
enum class Backend { kOneDnn, kOneDnnConvert, kOpenBlas };
void set_backend(Backend b);
Backend backend();

// "fp32 matmul: brg:avx512_core; bf16 matmul: brg:avx512_core_bf16": each (input type ->
// implementation) pair used so far, in first-use order; "" before the first matmul.
std::string report();
// The linked library's version and commit.
std::string version();

}  // namespace ds::rt::cpu::onednn
