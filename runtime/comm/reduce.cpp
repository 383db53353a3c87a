// Reductions over n sources, blocked so that the fp32 accumulator of one block stays in L1:
// acc = src0; acc = op(acc, src1); ...; out = round(acc). Each pass over a block is a simple loop
// GCC vectorizes at -O3 (this file's compile flags, runtime/comm/CMakeLists.txt). Memory traffic
// is one read of every source and one write of the output, which is what bounds it.
#include "comm/reduce.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "common/check.h"
#include "common/half.h"

namespace ds::rt::comm {

namespace {

// Storage type S, accumulator type A, and the conversions between them.
template <typename T>
struct Plain {
  using S = T;
  using A = T;
  static A load(S v) { return v; }
  static S store(A a) { return a; }
};
struct Bf16 {
  using S = uint16_t;
  using A = float;
  static A load(S v) { return bits_float(uint32_t{v} << 16); }
  static S store(A a) { return f32_to_bf16(a); }
};
struct Fp16 {
  using S = uint16_t;
  using A = float;
  static A load(S v) { return f16_to_f32(v); }
  static S store(A a) { return f32_to_f16(a); }
};

struct OpSum {
  template <typename A>
  static A apply(A a, A b) {
    if constexpr (std::is_integral_v<A>) {
      using U = std::make_unsigned_t<A>;
      return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};
struct OpMax {
  template <typename A>
  static A apply(A a, A b) { return b > a ? b : a; }
};
struct OpMin {
  template <typename A>
  static A apply(A a, A b) { return b < a ? b : a; }
};

constexpr size_t kBlock = 1024;

template <typename C, typename O>
void reduce_blocks(void* out_v, const void* const* srcs, int n, size_t count) {
  using S = typename C::S;
  using A = typename C::A;
  S* out = static_cast<S*>(out_v);
  A acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    const S* s0 = static_cast<const S*>(srcs[0]) + base;
    for (size_t i = 0; i < m; ++i) acc[i] = C::load(s0[i]);
    for (int k = 1; k < n; ++k) {
      const S* sk = static_cast<const S*>(srcs[k]) + base;
      for (size_t i = 0; i < m; ++i) acc[i] = O::apply(acc[i], C::load(sk[i]));
    }
    S* o = out + base;
    for (size_t i = 0; i < m; ++i) o[i] = C::store(acc[i]);
  }
}

template <typename C>
void reduce_codec(ReduceOp op, void* out, const void* const* srcs, int n, size_t count) {
  switch (op) {
    case ReduceOp::kSum: return reduce_blocks<C, OpSum>(out, srcs, n, count);
    case ReduceOp::kMax: return reduce_blocks<C, OpMax>(out, srcs, n, count);
    case ReduceOp::kMin: return reduce_blocks<C, OpMin>(out, srcs, n, count);
  }
  DS_CHECK(false, "unknown reduce op {}", static_cast<int>(op));
}

}  // namespace

#if defined(__x86_64__)
namespace {

// AVX2 and F16C (every AVX2 CPU has both): the fused kernels' instruction sets.
bool has_avx2_f16c() {
  static const bool yes = [] {
    // F16C is CPUID leaf 1, ECX bit 29 (clang 14's __builtin_cpu_supports does not know it).
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
    return __builtin_cpu_supports("avx2") && f16c;
  }();
  return yes;
}

// The scalar apply(a, b) is `b > a ? b : a` (max) and `b < a ? b : a` (min); MAXPS/MINPS return
// their second operand when the comparison is false (NaN, equal zeros), so max_ps(b, a) and
// min_ps(b, a) give the same bits as the scalar loop.
template <ReduceOp O>
__attribute__((target("avx2"))) inline __m256 apply8(__m256 a, __m256 b) {
  if constexpr (O == ReduceOp::kSum) return _mm256_add_ps(a, b);
  if constexpr (O == ReduceOp::kMax) return _mm256_max_ps(b, a);
  if constexpr (O == ReduceOp::kMin) return _mm256_min_ps(b, a);
}

// The scalar op struct of each ReduceOp (OpSum, OpMax, OpMin above).
template <ReduceOp O>
using OpOf = std::conditional_t<O == ReduceOp::kSum, OpSum, std::conditional_t<O == ReduceOp::kMax, OpMax, OpMin>>;

// Elements [lo, hi) as the scalar loop (reduce_blocks) does them: the heads and tails of the
// fused kernel. C is the storage codec (Plain<float>, Bf16): load to fp32, apply left to right,
// round once.
template <typename C, ReduceOp O>
void reduce_scalar(typename C::S* out, const typename C::S* const* s, int n, size_t lo, size_t hi) {
  for (size_t j = lo; j < hi; ++j) {
    float a = C::load(s[0][j]);
    for (int k = 1; k < n; ++k) a = OpOf<O>::apply(a, C::load(s[k][j]));
    out[j] = C::store(a);
  }
}

// 16 elements (one 64-byte line of fp32, half of one of bf16) in and out of two __m256.
struct F32x16 {
  using C = Plain<float>;
  __attribute__((target("avx2"))) static void load(const float* p, __m256& a, __m256& b) {
    a = _mm256_loadu_ps(p);
    b = _mm256_loadu_ps(p + 8);
  }
  template <bool kStream>
  __attribute__((target("avx2"))) static void store(float* p, __m256 a, __m256 b) {
    if constexpr (kStream) {
      _mm256_stream_ps(p, a);
      _mm256_stream_ps(p + 8, b);
    } else {
      _mm256_storeu_ps(p, a);
      _mm256_storeu_ps(p + 8, b);
    }
  }
};
struct Bf16x16 {
  using C = Bf16;
  __attribute__((target("avx2"))) static __m256 widen(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  // f32_to_bf16 (common/half.h) on 8 lanes: NaN keeps its payload's top and becomes quiet, the
  // rest round to nearest even; the result in the low 16 bits of each lane.
  __attribute__((target("avx2"))) static __m256i narrow(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb);
    const __m256i quiet = _mm256_or_si256(u, _mm256_set1_epi32(0x400000));
    return _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
  }
  __attribute__((target("avx2"))) static void load(const uint16_t* p, __m256& a, __m256& b) {
    a = widen(p);
    b = widen(p + 8);
  }
  template <bool kStream>
  __attribute__((target("avx2"))) static void store(uint16_t* p, __m256 a, __m256 b) {
    // packus works per 128-bit lane: a0-3 b0-3 a4-7 b4-7; the permute puts the quarters in order.
    const __m256i v = _mm256_permute4x64_epi64(_mm256_packus_epi32(narrow(a), narrow(b)), 0xd8);
    if constexpr (kStream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
    }
  }
};

// fp16 through F16C: the conversions are exact one way and round to nearest even the other, as
// f16_to_f32 / f32_to_f16 (common/half.h) do; only NaN differs (the hardware keeps the payload's
// top, quieted), so NaN lanes are stored as f32_to_f16 stores them: the sign and 0x7e00.
struct Fp16x16 {
  using C = Fp16;
  __attribute__((target("avx2,f16c"))) static void load(const uint16_t* p, __m256& a, __m256& b) {
    a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  }
  __attribute__((target("avx2,f16c"))) static __m128i narrow(__m256 x) {
    const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    // The 8 NaN masks packed to 16 bits, in lane order (packs per 128-bit half, then joined).
    const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
    const __m128i canon = _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(static_cast<int16_t>(0x8000))),
                                       _mm_set1_epi16(0x7e00));
    return _mm_blendv_epi8(h, canon, nan16);
  }
  template <bool kStream>
  __attribute__((target("avx2,f16c"))) static void store(uint16_t* p, __m256 a, __m256 b) {
    const __m256i v = _mm256_set_m128i(narrow(b), narrow(a));
    if constexpr (kStream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
    }
  }
};

// Over n sources, fused: 16 elements of every source are read and reduced in fp32 registers,
// left to right, rounded once and stored at once, so the sources stream in together and no
// intermediate block is written. Streaming stores (kStream) need `out` 32-byte aligned: the head
// before the first 64-byte boundary goes through the scalar loop.
template <typename V, ReduceOp O, bool kStream>
__attribute__((target("avx2,f16c"))) void reduce_avx2(typename V::C::S* out, const void* const* srcs, int n,
                                                 size_t count) {
  using S = typename V::C::S;
  const auto* const* s = reinterpret_cast<const S* const*>(srcs);
  size_t i = 0;
  if constexpr (kStream) {
    const size_t head = (64 - reinterpret_cast<uintptr_t>(out) % 64) % 64;
    // An element misaligned within its own size never reaches a 32-byte boundary: scalar throughout.
    i = head % sizeof(S) != 0 ? count : std::min(count, head / sizeof(S));
    reduce_scalar<typename V::C, O>(out, s, n, 0, i);
  }
  for (; i + 16 <= count; i += 16) {
    __m256 a0, a1, b0, b1;
    V::load(s[0] + i, a0, a1);
    for (int k = 1; k < n; ++k) {
      V::load(s[k] + i, b0, b1);
      a0 = apply8<O>(a0, b0);
      a1 = apply8<O>(a1, b1);
    }
    V::template store<kStream>(out + i, a0, a1);
  }
  reduce_scalar<typename V::C, O>(out, s, n, i, count);
  if constexpr (kStream) _mm_sfence();
}

// The fused kernel for fp32, bf16 and fp16 when the CPU has AVX2 and F16C; false when the caller
// must take the generic path.
template <bool kStream>
bool reduce_fused(DataType dtype, ReduceOp op, void* out, const void* const* srcs, int n, size_t count) {
  if (!has_avx2_f16c() || (dtype != DataType::kFloat32 && dtype != DataType::kBFloat16 && dtype != DataType::kFloat16)) {
    return false;
  }
  auto run = [&](auto v) {
    using V = decltype(v);
    auto* o = static_cast<typename V::C::S*>(out);
    switch (op) {
      case ReduceOp::kSum: reduce_avx2<V, ReduceOp::kSum, kStream>(o, srcs, n, count); return true;
      case ReduceOp::kMax: reduce_avx2<V, ReduceOp::kMax, kStream>(o, srcs, n, count); return true;
      case ReduceOp::kMin: reduce_avx2<V, ReduceOp::kMin, kStream>(o, srcs, n, count); return true;
    }
    return false;
  };
  if (dtype == DataType::kFloat16) return run(Fp16x16{});
  return dtype == DataType::kFloat32 ? run(F32x16{}) : run(Bf16x16{});
}

}  // namespace
#endif

void reduce_n(DataType dtype, ReduceOp op, void* out, const void* const* srcs, int n,
              size_t count) {
  DS_CHECK(n >= 1, "reduce over {} sources", n);
  switch (dtype) {
    case DataType::kFloat32:
#if defined(__x86_64__)
      if (reduce_fused<false>(dtype, op, out, srcs, n, count)) return;
#endif
      return reduce_codec<Plain<float>>(op, out, srcs, n, count);
    case DataType::kBFloat16:
#if defined(__x86_64__)
      if (reduce_fused<false>(dtype, op, out, srcs, n, count)) return;
#endif
      return reduce_codec<Bf16>(op, out, srcs, n, count);
    case DataType::kFloat16:
#if defined(__x86_64__)
      if (reduce_fused<false>(dtype, op, out, srcs, n, count)) return;
#endif
      return reduce_codec<Fp16>(op, out, srcs, n, count);
    case DataType::kInt32: return reduce_codec<Plain<int32_t>>(op, out, srcs, n, count);
    case DataType::kInt64: return reduce_codec<Plain<int64_t>>(op, out, srcs, n, count);
    case DataType::kUInt8: return reduce_codec<Plain<uint8_t>>(op, out, srcs, n, count);
  }
  DS_CHECK(false, "unknown dtype {}", static_cast<int>(dtype));
}

void reduce_n_streaming(DataType dtype, ReduceOp op, void* out, const void* const* srcs, int n, size_t count) {
  DS_CHECK(n >= 1, "reduce over {} sources", n);
#if defined(__x86_64__)
  if (reduce_fused<true>(dtype, op, out, srcs, n, count)) return;
#endif
  constexpr size_t kBlockBytes = 16 << 10;  // half of a core's L1 data cache
  alignas(64) static thread_local uint8_t block[kBlockBytes];
  const size_t es = dtype_size(dtype), per = kBlockBytes / es;
  std::vector<const void*> at(static_cast<size_t>(n));
  for (size_t off = 0; off < count; off += per) {
    const size_t m = std::min(per, count - off);
    for (int i = 0; i < n; ++i) at[static_cast<size_t>(i)] = static_cast<const uint8_t*>(srcs[i]) + off * es;
    reduce_n(dtype, op, block, at.data(), n, m);
    copy_streaming(static_cast<uint8_t*>(out) + off * es, block, m * es);
  }
}

#if defined(__x86_64__)
namespace {
// One 64-byte line: unaligned loads, streaming stores (`d` is 64-byte aligned).
inline void stream_line(uint8_t* d, const uint8_t* s) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
  const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
  const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
  _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
  _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
}
__attribute__((target("avx2"))) void stream_lines_avx2(uint8_t* d, const uint8_t* s, size_t lines) {
  for (size_t i = 0; i < lines; ++i, d += 64, s += 64) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), b);
  }
}
}  // namespace
#endif

void copy_streaming(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  // Head up to a 64-byte boundary of the destination; then whole lines, one sequential stream
  // (AVX2 where the CPU has it); the tail copied. One stream without software prefetch beat the
  // four interleaved, prefetched page streams this used before: with both cores copying out of
  // each other's shared memory, 2.6-3.0 ms against 4.2-5.6 for 2 x 32 MiB (docs/parallelism.md).
  const size_t head = std::min(bytes, (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
  if (head) std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  const size_t lines = bytes / 64;
  if (has_avx2_f16c()) {
    stream_lines_avx2(d, s, lines);
  } else {
    for (size_t i = 0; i < lines; ++i) stream_line(d + i * 64, s + i * 64);
  }
  d += lines * 64;
  s += lines * 64;
  bytes -= lines * 64;
  if (bytes) std::memcpy(d, s, bytes);
  // Streaming stores are weakly ordered: make them visible before whatever publishes the data
  // (the release store of the next barrier).
  _mm_sfence();
#else
  std::memcpy(dst, src, bytes);
#endif
}

void reduce_into(DataType dtype, ReduceOp op, void* inout, const void* in, size_t count) {
  const void* srcs[2] = {inout, in};
  reduce_n(dtype, op, inout, srcs, 2, count);
}

}  // namespace ds::rt::comm
