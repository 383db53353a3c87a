// fp32 <-> bf16 / fp16 array conversions (round to nearest even), parallel and vectorisable.
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

}  // namespace ds::rt::cpu
