// bf16 products on the processor's bf16 dot-product instruction (AVX512-BF16's vdpbf16ps: 16
// fp32 lanes, each += a[2i] * b[2i] + a[2i+1] * b[2i+1], products exact, sums in fp32), for the
// small per-head products of the 16-bit attention, where a oneDNN primitive per (rows, keys)
// block would cost more to call than to run. Internal to runtime/kernels/cpu.
//
// Operands are 32-bit "pair words", two bf16 of consecutive k (the even k in the low half):
//   A (M x K): word (m, kp) at A[m * sam + kp * sak], holding A[m][2kp], A[m][2kp+1]. A bf16
//     row-major matrix with an even row stride is this layout as it is (sam = ld / 2, sak = 1);
//     pairs_from_rows() builds it for operands whose pairs run down the columns (sam = 1).
//   B (K x N): word (kp, n) at B[kp * ldb + n], holding B[2kp][n], B[2kp+1][n].
// K is even throughout (kp < K / 2); the callers use this path only then.
#pragma once

#include <cstdint>

namespace ds::rt::cpu::bf16_dot {

// A 32-bit load or store over memory written as bf16 or fp32 (the words alias it).
using alias_u32 = uint32_t __attribute__((__may_alias__));
using alias_u16 = uint16_t __attribute__((__may_alias__));

// True when this processor has AVX512-BF16 and the path is enabled (set_enabled; default on).
bool available();
// Tests turn the path off to compare it with the fp32-compute one on the same machine.
void set_enabled(bool on);

// C (M x N, row stride ldc) = alpha * A B + beta * C (beta 0: C is not read), K = 2 * Kp.
void gemm(int M, int N, int Kp, const uint32_t* A, int64_t sam, int64_t sak, const uint32_t* B, int64_t ldb,
          float alpha, float beta, float* C, int64_t ldc);

// B words from a bf16 matrix X (rows x cols, row stride ldx, even) read transposed, i.e. the
// operand X^T with K = cols: dst[kp * ldd + r] = the pair X[r][2kp], X[r][2kp+1]. cols even.
void pairs_transposed(uint32_t* dst, int64_t ldd, const uint16_t* x, int64_t ldx, int rows, int cols);
// Words pairing consecutive rows of a bf16 matrix X (rows x cols, row stride ldx): dst[kp * ldd + c]
// = X[2kp][c], X[2kp+1][c]. As B: the operand X with K = rows; as A (sam 1, sak ldd): X^T. rows even.
void pairs_from_rows(uint32_t* dst, int64_t ldd, const uint16_t* x, int64_t ldx, int rows, int cols);
// The same from fp32 rows, rounded to bf16, in place: word row kp is written over float row kp
// (words ld apart, like the floats), so rows [r0, r1) of X become word rows [r0/2, r1/2). Valid
// when the float rows below r0 / 2 ... r0 are no longer needed; r0, r1 even.
void pairs_from_rows_f32_inplace(float* x, int64_t ld, int r0, int r1, int cols);
// fp32 -> bf16 (round to nearest even) of n values; dst may be the start of src (in place).
void round_row(uint16_t* dst, const float* src, int n);

}  // namespace ds::rt::cpu::bf16_dot
