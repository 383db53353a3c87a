// bf16 products on AVX512-BF16 (cpu/bf16_dot.h). The functions that use the instructions are
// compiled for them alone (target attributes) and reached only when available() says the
// processor has them, so the library still runs on any x86-64.
//
// gemm: 8 rows x 32 columns of C per tile in 16 zmm accumulators; per pair of k, two loads of B
// (32 words) and one broadcast word of A per row feed 16 vdpbf16ps. Columns past N are masked.
#include "kernels/cpu/bf16_dot.h"

#include <atomic>
#include <cstring>

#include "common/error.h"
#include "common/half.h"

#if defined(__x86_64__)
// GCC 12's AVX-512 headers start some conversions from _mm512_undefined_*(), which its
// -Wmaybe-uninitialized reports inside the header (clang has no such warning).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define DS_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#endif

namespace ds::rt::cpu::bf16_dot {

namespace {
std::atomic<bool> g_enabled{true};

// The portable loops, shared by the generic entry points and (inlined, for AVX-512) the
// processor-specific ones.
// Words of rows [r0, r1) and word columns [kp0, kp1) of X transposed into dst.
inline void transpose_words(uint32_t* dst, int64_t ldd, const uint16_t* x, int64_t ldx, int r0, int r1, int kp0,
                            int kp1) {
  for (int r = r0; r < r1; r++) {
    for (int kp = kp0; kp < kp1; kp++) {
      uint32_t w;
      std::memcpy(&w, x + r * ldx + 2 * kp, 4);
      dst[kp * ldd + r] = w;
    }
  }
}

inline void pair_rows(uint32_t* dst, int64_t ldd, const uint16_t* x, int64_t ldx, int rows, int cols) {
  for (int kp = 0; kp < rows / 2; kp++) {
    const uint16_t* lo = x + 2 * kp * ldx;
    const uint16_t* hi = lo + ldx;
    uint32_t* d = dst + kp * ldd;
    for (int c = 0; c < cols; c++) d[c] = static_cast<uint32_t>(lo[c]) | (static_cast<uint32_t>(hi[c]) << 16);
  }
}

#if defined(__x86_64__)
bool cpu_has_bf16_dot() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  return has;
}

// One tile: MR rows of A (from m-row pointer a) times the 32 columns of B at b (masks k0, k1).
template <int MR>
DS_BF16_TARGET void tile(int Kp, const uint32_t* a, int64_t sam, int64_t sak, const uint32_t* b, int64_t ldb,
                         __mmask16 k0, __mmask16 k1, float alpha, float beta, float* c, int64_t ldc) {
  // The row loops are unrolled so the accumulators stay in registers (GCC keeps a rolled loop's
  // arrays on the stack).
  __m512 acc0[MR], acc1[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++) acc0[r] = acc1[r] = _mm512_setzero_ps();
  for (int kp = 0; kp < Kp; kp++) {
    const uint32_t* bk = b + kp * ldb;
    const __m512bh b0 = (__m512bh)_mm512_maskz_loadu_epi32(k0, bk);
    const __m512bh b1 = (__m512bh)_mm512_maskz_loadu_epi32(k1, bk + 16);
    const uint32_t* ak = a + kp * sak;
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(reinterpret_cast<const alias_u32*>(ak)[r * sam]));
      acc0[r] = _mm512_dpbf16_ps(acc0[r], av, b0);
      acc1[r] = _mm512_dpbf16_ps(acc1[r], av, b1);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int r = 0; r < MR; r++) {
    float* cr = c + r * ldc;
    __m512 x0 = _mm512_mul_ps(va, acc0[r]), x1 = _mm512_mul_ps(va, acc1[r]);
    if (beta != 0.0f) {
      x0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(k0, cr), x0);
      x1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(k1, cr + 16), x1);
    }
    _mm512_mask_storeu_ps(cr, k0, x0);
    _mm512_mask_storeu_ps(cr + 16, k1, x1);
  }
}

using TileFn = void (*)(int, const uint32_t*, int64_t, int64_t, const uint32_t*, int64_t, __mmask16, __mmask16,
                        float, float, float*, int64_t);
constexpr int kMR = 8;
constexpr TileFn kTiles[kMR + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>, tile<5>, tile<6>, tile<7>, tile<8>};

__mmask16 cols_mask(int n) { return n >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << n) - 1u); }

DS_BF16_TARGET void gemm_avx512(int M, int N, int Kp, const uint32_t* A, int64_t sam, int64_t sak, const uint32_t* B,
                                int64_t ldb, float alpha, float beta, float* C, int64_t ldc) {
  for (int n0 = 0; n0 < N; n0 += 32) {
    const int nc = N - n0;
    const __mmask16 k0 = cols_mask(nc), k1 = nc > 16 ? cols_mask(nc - 16) : __mmask16{0};
    for (int m0 = 0; m0 < M; m0 += kMR) {
      const int mr = M - m0 < kMR ? M - m0 : kMR;
      kTiles[mr](Kp, A + m0 * sam, sam, sak, B + n0, ldb, k0, k1, alpha, beta, C + m0 * ldc + n0, ldc);
    }
  }
}

DS_BF16_TARGET void round_row_avx512(uint16_t* dst, const float* src, int n) {
  int j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + j));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + j), (__m256i)h);
  }
  for (; j < n; j++) reinterpret_cast<alias_u16*>(dst)[j] = ds::f32_to_bf16(src[j]);
}

DS_BF16_TARGET void pairs_from_rows_f32_avx512(float* x, int64_t ld, int r0, int r1, int cols) {
  for (int kp = r0 / 2; kp < r1 / 2; kp++) {
    const float* lo = x + 2 * kp * ld;
    const float* hi = lo + ld;
    alias_u32* w = reinterpret_cast<alias_u32*>(x + kp * ld);
    int j = 0;
    for (; j + 16 <= cols; j += 16) {
      const __m512i a = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(lo + j)));
      const __m512i b = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(hi + j)));
      _mm512_storeu_si512(w + j, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
    }
    for (; j < cols; j++) {
      const uint32_t a = ds::f32_to_bf16(lo[j]), b = ds::f32_to_bf16(hi[j]);
      w[j] = a | (b << 16);
    }
  }
}

// 16 x 16 blocks of words transposed in registers (32-bit, then 64-bit interleaves within the
// 128-bit lanes, then two rounds of lane shuffles); the edges word by word.
DS_BF16_TARGET void pairs_transposed_avx512(uint32_t* dst, int64_t ldd, const uint16_t* x, int64_t ldx, int rows,
                                            int cols) {
  const int wc = cols / 2, rb = rows / 16 * 16, cb = wc / 16 * 16;
  for (int r0 = 0; r0 < rb; r0 += 16) {
    for (int w0 = 0; w0 < cb; w0 += 16) {
      __m512i r[16], t[16], u[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(x + (r0 + i) * ldx + 2 * w0);
#pragma GCC unroll 8
      for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
      }
      // u[4i + j], lane L: word column 4L + j of rows 4i .. 4i+3.
#pragma GCC unroll 4
      for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
      }
#pragma GCC unroll 4
      for (int j = 0; j < 4; j++) {
        const __m512i p0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44), p1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xee);
        const __m512i q0 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44);
        const __m512i q1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xee);
        uint32_t* d = dst + static_cast<int64_t>(w0 + j) * ldd + r0;
        _mm512_storeu_si512(d, _mm512_shuffle_i32x4(p0, q0, 0x88));
        _mm512_storeu_si512(d + 4 * ldd, _mm512_shuffle_i32x4(p0, q0, 0xdd));
        _mm512_storeu_si512(d + 8 * ldd, _mm512_shuffle_i32x4(p1, q1, 0x88));
        _mm512_storeu_si512(d + 12 * ldd, _mm512_shuffle_i32x4(p1, q1, 0xdd));
      }
    }
  }
  transpose_words(dst, ldd, x, ldx, 0, rb, cb, wc);
  transpose_words(dst, ldd, x, ldx, rb, rows, 0, wc);
}

// The portable loop, compiled for AVX-512 (it vectorises as it is).
DS_BF16_TARGET void pair_rows_avx512(uint32_t* dst, int64_t ldd, const uint16_t* x, int64_t ldx, int rows,
                                     int cols) {
  pair_rows(dst, ldd, x, ldx, rows, cols);
}
#endif
}  // namespace

bool available() {
#if defined(__x86_64__)
  return g_enabled.load(std::memory_order_relaxed) && cpu_has_bf16_dot();
#else
  return false;
#endif
}

void set_enabled(bool on) { g_enabled.store(on); }

namespace {
void require_available(const char* what) {
  if (!available()) throw system_error("bf16_dot::{} called on a processor without AVX512-BF16 (available() is false)", what);
}
}  // namespace

void gemm(int M, int N, int Kp, const uint32_t* A, int64_t sam, int64_t sak, const uint32_t* B, int64_t ldb,
          float alpha, float beta, float* C, int64_t ldc) {
  require_available("gemm");
#if defined(__x86_64__)
  gemm_avx512(M, N, Kp, A, sam, sak, B, ldb, alpha, beta, C, ldc);
#endif
}

void pairs_transposed(uint32_t* dst, int64_t ldd, const uint16_t* x, int64_t ldx, int rows, int cols) {
#if defined(__x86_64__)
  if (cpu_has_bf16_dot()) return pairs_transposed_avx512(dst, ldd, x, ldx, rows, cols);
#endif
  transpose_words(dst, ldd, x, ldx, 0, rows, 0, cols / 2);
}

void pairs_from_rows(uint32_t* dst, int64_t ldd, const uint16_t* x, int64_t ldx, int rows, int cols) {
#if defined(__x86_64__)
  if (cpu_has_bf16_dot()) return pair_rows_avx512(dst, ldd, x, ldx, rows, cols);
#endif
  pair_rows(dst, ldd, x, ldx, rows, cols);
}

void pairs_from_rows_f32_inplace(float* x, int64_t ld, int r0, int r1, int cols) {
  require_available("pairs_from_rows_f32_inplace");
#if defined(__x86_64__)
  pairs_from_rows_f32_avx512(x, ld, r0, r1, cols);
#endif
}

void round_row(uint16_t* dst, const float* src, int n) {
  require_available("round_row");
#if defined(__x86_64__)
  round_row_avx512(dst, src, n);
#endif
}

}  // namespace ds::rt::cpu::bf16_dot
