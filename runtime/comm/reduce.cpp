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

void reduce_n(DataType dtype, ReduceOp op, void* out, const void* const* srcs, int n,
              size_t count) {
  DS_CHECK(n >= 1, "reduce over {} sources", n);
  switch (dtype) {
    case DataType::kFloat32: return reduce_codec<Plain<float>>(op, out, srcs, n, count);
    case DataType::kBFloat16: return reduce_codec<Bf16>(op, out, srcs, n, count);
    case DataType::kFloat16: return reduce_codec<Fp16>(op, out, srcs, n, count);
    case DataType::kInt32: return reduce_codec<Plain<int32_t>>(op, out, srcs, n, count);
    case DataType::kInt64: return reduce_codec<Plain<int64_t>>(op, out, srcs, n, count);
    case DataType::kUInt8: return reduce_codec<Plain<uint8_t>>(op, out, srcs, n, count);
  }
  DS_CHECK(false, "unknown dtype {}", static_cast<int>(dtype));
}

void reduce_n_streaming(DataType dtype, ReduceOp op, void* out, const void* const* srcs, int n, size_t count) {
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
}  // namespace
#endif

void copy_streaming(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  // Head up to a 64-byte boundary of the destination; then four 4 KiB pages at a time, a line
  // of each in turn with the source prefetched (four read streams keep more misses in flight
  // than one: measured 1.3x over a one-stream loop here, on a par with glibc's own streaming
  // copy); then single lines; the tail copied.
  const size_t head = std::min(bytes, (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
  if (head) std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  constexpr size_t kPage = 4096;
  for (; bytes >= 4 * kPage; d += 4 * kPage, s += 4 * kPage, bytes -= 4 * kPage) {
    for (size_t o = 0; o < kPage; o += 64) {
      for (size_t k = 0; k < 4; ++k) {
        _mm_prefetch(reinterpret_cast<const char*>(s + k * kPage + o + 128), _MM_HINT_T0);
        stream_line(d + k * kPage + o, s + k * kPage + o);
      }
    }
  }
  for (; bytes >= 64; d += 64, s += 64, bytes -= 64) stream_line(d, s);
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
