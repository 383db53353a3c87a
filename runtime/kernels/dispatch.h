// Kernel dispatch: the only place that knows whether a buffer's kernels run on the CPU or on a
// CUDA device. Today every entry forwards to the CPU kernels (runtime/kernels/cpu/kernels.h);
// the CUDA build will add `if (device == Device::kCuda) return cuda::name(..., stream);` here and
// nowhere else. The model calls kernels through this header.
#pragma once

#include "core/allocator.h"
#include "kernels/cpu/kernels.h"

namespace ds::rt::kern {

// The device the model's buffers live on. CPU only for now.
inline constexpr Device kDevice = Device::kCpu;

using cpu::add_bias;
using cpu::add_position;
using cpu::encoder_backward_vocab;
using cpu::encoder_forward_vocab;
using cpu::vocab_ce_finish;
using cpu::vocab_ce_max;
using cpu::vocab_ce_sums;
using cpu::attention_backward;
using cpu::attention_forward;
using cpu::attention_scratch_floats;
using cpu::convert_bf16_to_f32;
using cpu::convert_f16_to_f32;
using cpu::convert_f32_to_bf16;
using cpu::convert_f32_to_f16;
using cpu::crossentropy_forward;
using cpu::crossentropy_softmax_backward;
using cpu::encoder_backward;
using cpu::encoder_forward;
using cpu::gelu_backward;
using cpu::gelu_forward;
using cpu::gemm;
using cpu::layernorm_backward;
using cpu::layernorm_forward;
using cpu::matmul_backward;
using cpu::matmul_forward;
using cpu::residual_backward;
using cpu::residual_forward;

}  // namespace ds::rt::kern
