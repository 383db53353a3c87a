// The CUDA module's kernels (core/cuda_module.h), as one table of function pointers with the
// signatures of kernels/cuda/kernels.h: what the dispatch (kernels/dispatch.h), the CUDA tests
// and the GPU benchmark call. Code outside the module never calls cuda::name directly (it would
// not link: the definitions exist only in libdstrain_cuda.so); it calls cuda_kernels().name.
// CUDA-free, like kernels/cuda/kernels.h.
#pragma once

#include "kernels/cuda/kernels.h"

namespace ds::rt::kern {

// Every entry point of kernels/cuda/kernels.h, by name.
#define DS_CUDA_KERNEL_ENTRIES(X)                                                                    \
  X(gemm) X(gemm_bf16) X(encoder_forward) X(encoder_backward) X(encoder_forward_vocab)                \
  X(encoder_backward_vocab) X(add_position) X(encoder_forward_bf16) X(encoder_backward_bf16)          \
  X(layernorm_forward) X(layernorm_backward) X(layernorm_forward_bf16) X(layernorm_backward_bf16)     \
  X(matmul_forward) X(matmul_backward) X(add_bias) X(add_in_place) X(round_to_bf16_in_place)          \
  X(round_to_f16_in_place) X(attention_scratch_floats) X(attention_forward) X(attention_backward)     \
  X(gelu_forward) X(gelu_backward) X(residual_forward) X(residual_backward) X(gelu_forward_bf16)      \
  X(gelu_backward_bf16) X(residual_forward_bf16) X(residual_backward_bf16) X(crossentropy_forward)    \
  X(crossentropy_softmax_backward) X(crossentropy_forward_bf16)                                      \
  X(crossentropy_softmax_backward_bf16) X(vocab_ce_max) X(vocab_ce_sums) X(vocab_ce_finish)           \
  X(convert_f32_to_bf16) X(convert_bf16_to_f32) X(convert_f32_to_f16) X(convert_f16_to_f32)          \
  X(adamw_update) X(adamw_update_bf16_grads) X(sum_of_squares) X(sum_of_squares_to_host)             \
  X(scale_in_place) X(set_matmul_math) X(matmul_math) X(current_stream)                            \
  X(flash_attention_supported) X(flash_attention_forward_bf16) X(flash_attention_backward_bf16)      \
  X(set_attention_kernel) X(attention_kernel) X(rmsnorm_forward) X(rmsnorm_backward) X(rope_forward)  \
  X(rope_backward) X(swiglu_forward) X(swiglu_backward) X(attention_gqa_forward)                      \
  X(attention_gqa_backward)

// The 16-bit storage twins (kernels/cuda/kernels.h, namespace typed), by name: the kernels of the
// storage type S alone, and those that also take the parameter-gradient type G.
#define DS_CUDA_TYPED_S_ENTRIES(X)                                                                \
  X(encoder_forward) X(encoder_forward_vocab) X(add_position) X(layernorm_forward)                \
  X(matmul_forward) X(add_bias) X(attention_forward) X(attention_backward) X(gelu_forward)        \
  X(gelu_backward) X(residual_forward) X(residual_backward) X(add_in_place)                       \
  X(crossentropy_forward) X(crossentropy_softmax_backward) X(vocab_ce_max) X(vocab_ce_sums)       \
  X(vocab_ce_finish) X(sum_of_squares_to_host) X(scale_in_place) X(rmsnorm_forward)              \
  X(rope_forward) X(rope_backward) X(swiglu_forward) X(swiglu_backward) X(attention_gqa_forward)  \
  X(attention_gqa_backward)
#define DS_CUDA_TYPED_SG_ENTRIES(X) \
  X(encoder_backward) X(encoder_backward_vocab) X(layernorm_backward) X(matmul_backward) X(rmsnorm_backward)

// S = bf16 with bf16 parameter gradients (every typed kernel).
struct CudaBf16Kernels {
#define DS_CUDA_TABLE_MEMBER(name) decltype(&cuda::typed::name<bf16>) name;
#define DS_CUDA_TABLE_MEMBER_G(name) decltype(&cuda::typed::name<bf16, bf16>) name;
  DS_CUDA_TYPED_S_ENTRIES(DS_CUDA_TABLE_MEMBER)
  DS_CUDA_TYPED_SG_ENTRIES(DS_CUDA_TABLE_MEMBER_G)
#undef DS_CUDA_TABLE_MEMBER
#undef DS_CUDA_TABLE_MEMBER_G
};
// S = bf16 with fp32 parameter gradients (grad_accum_dtype fp32): the kernels that take G; the
// others are CudaBf16Kernels'.
struct CudaBf16Fp32GradKernels {
#define DS_CUDA_TABLE_MEMBER_G(name) decltype(&cuda::typed::name<bf16, float>) name;
  DS_CUDA_TYPED_SG_ENTRIES(DS_CUDA_TABLE_MEMBER_G)
#undef DS_CUDA_TABLE_MEMBER_G
};

struct CudaKernelTable {
#define DS_CUDA_TABLE_MEMBER(name) decltype(&cuda::name) name;
  DS_CUDA_KERNEL_ENTRIES(DS_CUDA_TABLE_MEMBER)
#undef DS_CUDA_TABLE_MEMBER
  CudaBf16Kernels bf16;
  CudaBf16Fp32GradKernels bf16_fp32_grads;
};

// The module's table, loaded on first use; throws as core/cuda_module.h says, `purpose` naming
// what asked for CUDA.
const CudaKernelTable& cuda_kernels(const char* purpose = "a CUDA kernel");

// Sets this thread's CUDA attention kernel (cuda::AttentionKernel) for a scope and restores the
// previous one at its end.
class ScopedCudaAttentionKernel {
 public:
  explicit ScopedCudaAttentionKernel(cuda::AttentionKernel k) : prev_(cuda_kernels().attention_kernel()) {
    cuda_kernels().set_attention_kernel(k);
  }
  ~ScopedCudaAttentionKernel() { cuda_kernels().set_attention_kernel(prev_); }
  ScopedCudaAttentionKernel(const ScopedCudaAttentionKernel&) = delete;
  ScopedCudaAttentionKernel& operator=(const ScopedCudaAttentionKernel&) = delete;

 private:
  cuda::AttentionKernel prev_;
};

// Sets this thread's CUDA matmul math (cuda::MatmulMath) for a scope and restores the previous
// one at its end.
class ScopedCudaMatmulMath {
 public:
  explicit ScopedCudaMatmulMath(cuda::MatmulMath m) : prev_(cuda_kernels().matmul_math()) {
    cuda_kernels().set_matmul_math(m);
  }
  ~ScopedCudaMatmulMath() { cuda_kernels().set_matmul_math(prev_); }
  ScopedCudaMatmulMath(const ScopedCudaMatmulMath&) = delete;
  ScopedCudaMatmulMath& operator=(const ScopedCudaMatmulMath&) = delete;

 private:
  cuda::MatmulMath prev_;
};

}  // namespace ds::rt::kern

// Exported by the module.
extern "C" const ds::rt::kern::CudaKernelTable* ds_cuda_kernel_table();
