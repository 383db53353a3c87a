// Element type conversions (round to nearest even), parallel and vectorisable: the uint16_t
// bit-pattern forms the CUDA comparison and llm.c export use, and the typed convert<D, S>.
#include <algorithm>

#include "core/dtype.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/vmath.h"

namespace ds::rt::cpu {

void convert_f32_to_bf16(uint16_t* out, const float* inp, int64_t N) {
#pragma omp parallel for schedule(static) if (N >= kParallelWork)
  for (int64_t i = 0; i < N; i++) out[i] = f32_to_bf16(inp[i]);
}

void convert_bf16_to_f32(float* out, const uint16_t* inp, int64_t N) {
#pragma omp parallel for schedule(static) if (N >= kParallelWork)
  for (int64_t i = 0; i < N; i++) out[i] = bf16_to_f32(inp[i]);
}

void convert_f32_to_f16(uint16_t* out, const float* inp, int64_t N) {
#pragma omp parallel for schedule(static) if (N >= kParallelWork)
  for (int64_t i = 0; i < N; i++) out[i] = f32_to_f16(inp[i]);
}

void convert_f16_to_f32(float* out, const uint16_t* inp, int64_t N) {
#pragma omp parallel for schedule(static) if (N >= kParallelWork)
  for (int64_t i = 0; i < N; i++) out[i] = f16_to_f32(inp[i]);
}

namespace {
template <typename D, typename S>
DS_SIMD_CLONES void convert_block(D* out, const S* inp, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = from_f32<D>(to_f32(inp[i]));
}
}  // namespace

template <typename D, typename S>
void convert(D* out, const S* inp, int64_t N) {
  constexpr int64_t kChunk = 16384;
  const int64_t nchunks = (N + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (N >= kParallelWork)
  for (int64_t c = 0; c < nchunks; c++) {
    const int64_t lo = c * kChunk;
    convert_block(out + lo, inp + lo, std::min(kChunk, N - lo));
  }
}

#define DS_INST_D(D, S) template void convert<D, S>(D*, const S*, int64_t);
#define DS_INST_FROM(S) DS_INST_D(float, S) DS_INST_D(::ds::rt::bf16, S) DS_INST_D(::ds::rt::f16, S)
DS_FOR_EACH_STORAGE(DS_INST_FROM)

}  // namespace ds::rt::cpu
