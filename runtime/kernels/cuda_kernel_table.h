// The CUDA module's kernels (core/cuda_module.h), as one table of function pointers with the
// signatures of kernels/cuda/kernels.h: the ops of the one op list (kernels/ops.def) in three
// typed tables, and the entry points outside it. What the dispatch (kernels/dispatch.h), the
// CUDA tests and the GPU benchmark call. Code outside the module never calls cuda::name directly (it would
// not link: the definitions exist only in libdstrain_cuda.so); it calls cuda_kernels().name.
// CUDA-free, like kernels/cuda/kernels.h.
#pragma once

#include <type_traits>

#include "kernels/cuda/kernels.h"

namespace ds::rt::kern {

// The entry points of kernels/cuda/kernels.h outside the op list, by name.
#define DS_CUDA_KERNEL_ENTRIES(X)                                                                  \
  X(gemm) X(gemm_bf16) X(round_to_bf16_in_place) X(round_to_f16_in_place) X(convert_f32_to_bf16) \
  X(convert_bf16_to_f32) X(convert_f32_to_f16) X(convert_f16_to_f32) X(adamw_update)              \
  X(adamw_update_bf16_grads) X(sum_of_squares) X(set_matmul_math) X(matmul_math)                  \
  X(current_stream) X(flash_attention_supported) X(flash_attention_forward_bf16)                  \
  X(flash_attention_backward_bf16) X(set_attention_kernel) X(attention_kernel) X(attention_merge)       \
  X(moe_sort_slots) X(moe_gather_f32) X(loss_sum_to_slot) X(loss_slots_to_host) X(fill_f32)

// The typed kernels of kernels/cuda/kernels.h whose CPU form differs (not in the op list).
#define DS_CUDA_TYPED_ONLY_ENTRIES(X) \
  X(crossentropy_forward) X(crossentropy_softmax_backward) X(sum_of_squares_to_host) X(sums_of_squares_to_host)

// The module's typed kernels for storage S and parameter gradients G: every op of
// kernels/ops.def (the ops of S alone at S) and the CUDA-only typed ones above. The module has
// three: fp32 (float, float), bf16 (bf16, bf16) and bf16 with fp32 gradients (bf16, float).
template <typename S, typename G>
struct CudaOps {
#define DS_KERNEL_OP(name, params, args) decltype(&cuda::typed::name<S>) name;
#define DS_KERNEL_OP_G(name, params, args) decltype(&cuda::typed::name<S, G>) name;
#include "kernels/ops.def"
#define DS_CUDA_OPS_MEMBER(name) decltype(&cuda::typed::name<S>) name;
  DS_CUDA_TYPED_ONLY_ENTRIES(DS_CUDA_OPS_MEMBER)
#undef DS_CUDA_OPS_MEMBER
};

struct CudaKernelTable {
#define DS_CUDA_TABLE_MEMBER(name) decltype(&cuda::name) name;
  DS_CUDA_KERNEL_ENTRIES(DS_CUDA_TABLE_MEMBER)
#undef DS_CUDA_TABLE_MEMBER
  CudaOps<float, float> f32;
  CudaOps<::ds::rt::bf16, ::ds::rt::bf16> bf16;
  CudaOps<::ds::rt::bf16, float> bf16_fp32_grads;
};

// Whether the module has kernels for storage S with parameter gradients G, and their table.
template <typename S, typename G>
inline constexpr bool kCudaHasOps = (std::is_same_v<S, float> && std::is_same_v<G, float>) ||
                                    (std::is_same_v<S, ::ds::rt::bf16> &&
                                     (std::is_same_v<G, ::ds::rt::bf16> || std::is_same_v<G, float>));
template <typename S, typename G>
const CudaOps<S, G>& cuda_ops_of(const CudaKernelTable& t) {
  static_assert(kCudaHasOps<S, G>);
  if constexpr (std::is_same_v<S, float>) return t.f32;
  else if constexpr (std::is_same_v<G, float>) return t.bf16_fp32_grads;
  else return t.bf16;
}

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
