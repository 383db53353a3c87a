// The CUDA module's Llama kernels (kernels/cuda/llama_kernels.h) as one table of function
// pointers, beside the GPT-2 table (kernels/cuda_kernel_table.h) and loaded the same way: the
// module exports ds_cuda_llama_kernel_table; kernels/llama_typed.h, the CUDA tests and nothing
// else call llama_cuda_kernels().name. CUDA-free, like the kernels' header.
#pragma once

#include "kernels/cuda/llama_kernels.h"

namespace ds::rt::kern {

// Every entry point of kernels/cuda/llama_kernels.h, by name.
// clang-format off
#define DS_CUDA_LLAMA_KERNEL_ENTRIES(X)                                                    \
  X(rmsnorm_forward) X(rmsnorm_backward) X(rmsnorm_forward_bf16) X(rmsnorm_backward_bf16)  \
  X(rmsnorm_backward_bf16_gbf16) X(rope_forward) X(rope_backward) X(rope_forward_bf16)     \
  X(rope_backward_bf16) X(swiglu_forward) X(swiglu_backward) X(swiglu_forward_bf16)        \
  X(swiglu_backward_bf16) X(attention_gqa_forward) X(attention_gqa_backward)               \
  X(attention_gqa_forward_bf16) X(attention_gqa_backward_bf16)
// clang-format on

struct LlamaCudaKernels {
#define DS_CUDA_LLAMA_TABLE_MEMBER(name) decltype(&cuda::name) name;
  DS_CUDA_LLAMA_KERNEL_ENTRIES(DS_CUDA_LLAMA_TABLE_MEMBER)
#undef DS_CUDA_LLAMA_TABLE_MEMBER
};

// The module's Llama table, loaded on first use; throws as core/cuda_module.h says, `purpose`
// naming what asked for CUDA.
const LlamaCudaKernels& llama_cuda_kernels(const char* purpose = "a Llama CUDA kernel");

}  // namespace ds::rt::kern

// Exported by the module.
extern "C" const ds::rt::kern::LlamaCudaKernels* ds_cuda_llama_kernel_table();
