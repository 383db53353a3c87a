// Kernel dispatch: the only place that knows whether a buffer's kernels run on the CPU or on a
// CUDA device. The model calls kernels through this header (kern::name(...) with the CPU
// signatures of runtime/kernels/cpu/kernels.h); each call goes to cpu::name, or, while the calling
// thread is inside a kern::DeviceScope for Device::kCuda, to the CUDA module's twin
// (kernels/cuda_kernel_table.h, the signatures of kernels/cuda/kernels.h) on the scope's stream:
// the fp32 entry points for S = float, the bf16 twins (cuda::typed, the table's .bf16 and
// .bf16_fp32_grads) for S = bf16 with G = bf16 or float. fp16 storage has no CUDA kernel: inside
// a CUDA scope a kernel of f16 buffers throws ds::Error (invalid usage) naming the kernel.
// The module is loaded by the first CUDA scope (core/cuda_module.h); a CPU run never loads it.
//
// Contract of the CUDA side (only inside a DeviceScope(kCuda)):
// - Every pointer passed must be device memory of the current device (Allocator with
//   Device::kCuda); calls are asynchronous on the scope's stream.
// - crossentropy_forward / crossentropy_softmax_backward return 0: invalid targets are not
//   counted on the device (the caller validates targets on the host, as Decoder::head does, before
//   uploading them); their losses are still NaN.
// - attention_scratch_floats(T) is 0 (the CUDA attention needs no scratch).
// - gemm threading knobs (set_gemm_threading, ...) are CPU-only and not forwarded.
// Without a scope (the default) everything is the CPU kernel.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <span>
#include <type_traits>

#include "common/error.h"
#include "core/allocator.h"
#include "core/cuda_memory_table.h"
#include "kernels/adamw_step.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda_kernel_table.h"

namespace ds::rt::kern {

// The default device of the model's buffers (no DeviceScope): the CPU.
inline constexpr Device kDevice = Device::kCpu;

// Where this thread's kern:: calls run. stream is a cudaStream_t (nullptr = legacy default).
struct KernelContext {
  Device device = Device::kCpu;
  void* stream = nullptr;
};
inline KernelContext& kernel_context() {
  thread_local KernelContext c;
  return c;
}

// RAII: kern:: calls of this thread run on `device` (and `stream`) until the scope ends; scopes
// nest. A CUDA scope loads the CUDA module (throwing its error where it cannot be loaded) and
// makes `stream` the thread's current CUDA stream (cuda::current_stream), which the NCCL backend
// orders its collectives after; a CPU scope touches neither.
class DeviceScope {
 public:
  explicit DeviceScope(Device device, void* stream = nullptr) : saved_(kernel_context()) {
    if (device == Device::kCuda) {
      void*& current = cuda_kernels("kern::DeviceScope(Device::kCuda)").current_stream();
      cuda_stream_ = &current;
      saved_stream_ = current;
      current = stream;
    }
    kernel_context() = KernelContext{device, stream};
  }
  ~DeviceScope() {
    kernel_context() = saved_;
    if (cuda_stream_ != nullptr) *cuda_stream_ = saved_stream_;
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  KernelContext saved_;
  void** cuda_stream_ = nullptr;  // the module's current stream of this thread (CUDA scopes)
  void* saved_stream_ = nullptr;
};

inline bool on_cuda() { return kernel_context().device == Device::kCuda; }

// Memory moves of the model's buffers, routed like the kernels: on the CPU memset (in parallel when
// large, cpu::fill_zero) and memcpy;
// inside a CUDA scope stream-ordered CUDA copies (copy_to_host returns when the data is there,
// copy_from_host when the host source may be reused).
inline void fill_zero(void* p, size_t bytes) {
  if (on_cuda()) return cuda_memory().memset_zero_async(p, bytes, kernel_context().stream);
  cpu::fill_zero(p, bytes);
}
inline void copy_to_host(void* dst, const void* src, size_t bytes) {
  if (on_cuda()) return cuda_memory().copy_to_host(dst, src, bytes, kernel_context().stream);
  if (bytes > 0) std::memcpy(dst, src, bytes);
}
inline void copy_from_host(void* dst, const void* src, size_t bytes) {
  if (on_cuda()) return cuda_memory().copy_to_device(dst, src, bytes, kernel_context().stream);
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

// Buffer to buffer, non-overlapping: on the CPU a memcpy; inside a CUDA scope a copy in stream
// order whose direction CUDA infers (device memory, or pinned host memory on either side).
inline void copy(void* dst, const void* src, size_t bytes) {
  if (on_cuda()) return cuda_memory().copy_on_device(dst, src, bytes, kernel_context().stream);
  if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
}

inline cudaStream_t cuda_stream() { return static_cast<cudaStream_t>(kernel_context().stream); }
// DS_KERN(name, args...): the CUDA twin on this thread's stream inside a CUDA scope, else the CPU.
#define DS_KERN(name, ...)                                                \
  do {                                                                    \
    if (on_cuda()) return cuda_kernels().name(__VA_ARGS__, cuda_stream()); \
    return cpu::name(__VA_ARGS__);                                        \
  } while (0)

inline void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  DS_KERN(gemm, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
[[noreturn]] inline void no_cuda_kernel(const char* name, DType s) {
  throw invalid_usage("{}: no CUDA kernel for {} storage: CUDA runs fp32 or bf16 buffers (fp16 has no CUDA "
                      "kernels; fp16.enabled on a GPU keeps fp32 buffers), or run on the CPU",
                      name, dtype_name(s));
}
// DS_KERN_S(name, args...): the kernel `name` of storage S (a template parameter of the caller).
// Inside a CUDA scope: fp32 the module's fp32 entry point, bf16 its typed twin
// (cuda_kernels().bf16), fp16 a throw naming `name`; otherwise the CPU template.
// DS_KERN_SG(name, args...): the same for a kernel of storage S and parameter gradients G, whose
// bf16 twin with G = float is cuda_kernels().bf16_fp32_grads.
#define DS_KERN_CUDA_BRANCHES_(name, ...)                                                   \
  if constexpr (std::is_same_v<S, float>) {                                                 \
    return cuda_kernels().name(__VA_ARGS__, cuda_stream());                                 \
  } else if constexpr (std::is_same_v<S, bf16> && std::is_same_v<G_, bf16>) {              \
    return cuda_kernels().bf16.name(__VA_ARGS__, cuda_stream());                            \
  }
#define DS_KERN_S(name, ...)                                                                \
  do {                                                                                      \
    using G_ = S;                                                                           \
    if (on_cuda()) {                                                                        \
      DS_KERN_CUDA_BRANCHES_(name, __VA_ARGS__)                                             \
      else no_cuda_kernel(#name, dtype_of<S>);                                              \
    }                                                                                       \
    return cpu::name(__VA_ARGS__);                                                          \
  } while (0)
#define DS_KERN_SG(name, ...)                                                               \
  do {                                                                                      \
    using G_ = G;                                                                           \
    if (on_cuda()) {                                                                        \
      DS_KERN_CUDA_BRANCHES_(name, __VA_ARGS__)                                             \
      else if constexpr (std::is_same_v<S, bf16> && std::is_same_v<G, float>) {            \
        return cuda_kernels().bf16_fp32_grads.name(__VA_ARGS__, cuda_stream());             \
      } else {                                                                              \
        no_cuda_kernel(#name, dtype_of<S>);                                                 \
      }                                                                                     \
    }                                                                                       \
    return cpu::name(__VA_ARGS__);                                                          \
  } while (0)

template <typename S>
inline void encoder_forward(S* out, const int32_t* inp, const S* wte, const S* wpe, int B, int T, int C) {
  DS_KERN_S(encoder_forward, out, inp, wte, wpe, B, T, C);
}
template <typename S, typename G>
inline void encoder_backward(G* dwte, std::type_identity_t<G>* dwpe, const S* dout, const int32_t* inp, int B, int T, int C) {
  DS_KERN_SG(encoder_backward, dwte, dwpe, dout, inp, B, T, C);
}
template <typename S>
inline void encoder_forward_vocab(S* out, const int32_t* inp, const S* wte, int B, int T, int C, int v0,
                                  int Vl) {
  DS_KERN_S(encoder_forward_vocab, out, inp, wte, B, T, C, v0, Vl);
}
template <typename S, typename G>
inline void encoder_backward_vocab(G* dwte, const S* dout, const int32_t* inp, int B, int T, int C, int v0,
                                   int Vl) {
  DS_KERN_SG(encoder_backward_vocab, dwte, dout, inp, B, T, C, v0, Vl);
}
template <typename S>
inline void add_position(S* out, const S* wpe, int B, int T, int C) {
  DS_KERN_S(add_position, out, wpe, B, T, C);
}
template <typename S>
inline void layernorm_forward(S* out, float* mean, float* rstd, const S* inp, const S* weight, const S* bias,
                              int B, int T, int C) {
  DS_KERN_S(layernorm_forward, out, mean, rstd, inp, weight, bias, B, T, C);
}
template <typename S, typename G>
inline void layernorm_backward(S* dinp, G* dweight, std::type_identity_t<G>* dbias, const S* dout, const S* inp, const S* weight,
                               const float* mean, const float* rstd, int B, int T, int C) {
  DS_KERN_SG(layernorm_backward, dinp, dweight, dbias, dout, inp, weight, mean, rstd, B, T, C);
}
template <typename S>
inline void matmul_forward(S* out, const S* inp, const S* weight, const S* bias, int B, int T, int C, int OC) {
  DS_KERN_S(matmul_forward, out, inp, weight, bias, B, T, C, OC);
}
template <typename S, typename G>
inline void matmul_backward(std::type_identity_t<S>* dinp, G* dweight, std::type_identity_t<G>* dbias, const S* dout, const S* inp, const S* weight, int B,
                            int T, int C, int OC) {
  DS_KERN_SG(matmul_backward, dinp, dweight, dbias, dout, inp, weight, B, T, C, OC);
}
template <typename S>
inline void add_bias(S* out, const S* bias, int N, int OC) {
  DS_KERN_S(add_bias, out, bias, N, OC);
}
// Floats of attention scratch for storage of `storage_bytes` (cpu::attention_scratch_floats).
inline size_t attention_scratch_floats(int T, int hs = 0, int storage_bytes = 4) {
  if (on_cuda()) return 0;
  return cpu::attention_scratch_floats(T, hs, storage_bytes);
}
template <typename S>
inline void attention_forward(S* out, float* lse, const S* qkv, float* scratch, int B, int T, int C, int NH) {
  DS_KERN_S(attention_forward, out, lse, qkv, scratch, B, T, C, NH);
}
template <typename S>
inline void attention_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse,
                               float* scratch, int B, int T, int C, int NH) {
  DS_KERN_S(attention_backward, dqkv, dout, qkv, out, lse, scratch, B, T, C, NH);
}
template <typename S>
inline void attention_gqa_forward(S* out, float* lse, const S* qkv, float* scratch, int B, int T, int NH, int KV,
                                  int hd) {
  DS_KERN_S(attention_gqa_forward, out, lse, qkv, scratch, B, T, NH, KV, hd);
}
template <typename S>
inline void attention_gqa_backward(S* dqkv, const S* dout, const S* qkv, const S* out, const float* lse,
                                   float* scratch, int B, int T, int NH, int KV, int hd) {
  DS_KERN_S(attention_gqa_backward, dqkv, dout, qkv, out, lse, scratch, B, T, NH, KV, hd);
}
template <typename S>
inline void rmsnorm_forward(S* out, float* rstd, const S* inp, const S* weight, int64_t N, int C, float eps) {
  DS_KERN_S(rmsnorm_forward, out, rstd, inp, weight, N, C, eps);
}
template <typename S, typename G>
inline void rmsnorm_backward(S* dinp, G* dweight, const S* dout, const S* inp, const S* weight, const float* rstd,
                             int64_t N, int C) {
  DS_KERN_SG(rmsnorm_backward, dinp, dweight, dout, inp, weight, rstd, N, C);
}
template <typename S>
inline void rope_forward(S* x, const float* cos, const float* sin, int B, int T, int heads, int hd, int stride,
                         int offset) {
  DS_KERN_S(rope_forward, x, cos, sin, B, T, heads, hd, stride, offset);
}
template <typename S>
inline void rope_backward(S* dx, const float* cos, const float* sin, int B, int T, int heads, int hd, int stride,
                          int offset) {
  DS_KERN_S(rope_backward, dx, cos, sin, B, T, heads, hd, stride, offset);
}
template <typename S>
inline void swiglu_forward(S* out, const S* gu, int64_t N, int I) {
  DS_KERN_S(swiglu_forward, out, gu, N, I);
}
template <typename S>
inline void swiglu_backward(S* dgu, const S* dout, const S* gu, int64_t N, int I) {
  DS_KERN_S(swiglu_backward, dgu, dout, gu, N, I);
}
template <typename S>
inline void gelu_forward(S* out, const S* inp, int64_t N) {
  DS_KERN_S(gelu_forward, out, inp, N);
}
template <typename S>
inline void gelu_backward(S* dinp, const S* inp, const S* dout, int64_t N) {
  DS_KERN_S(gelu_backward, dinp, inp, dout, N);
}
template <typename S>
inline void residual_forward(S* out, const S* inp1, const S* inp2, int64_t N) {
  DS_KERN_S(residual_forward, out, inp1, inp2, N);
}
template <typename S>
inline void residual_backward(S* dinp1, S* dinp2, const S* dout, int64_t N) {
  DS_KERN_S(residual_backward, dinp1, dinp2, dout, N);
}
// Inside a CUDA scope these two return 0 (the device does not count invalid targets: the caller
// validates them on the host first).
template <typename S>
inline int64_t crossentropy_forward(float* losses, const S* logits, const int32_t* targets, int N, int V,
                                    int Vp) {
  if (on_cuda()) {
    const CudaKernelTable& k = cuda_kernels();
    if constexpr (std::is_same_v<S, float>) {
      k.crossentropy_forward(losses, logits, targets, N, V, Vp, nullptr, cuda_stream());
    } else if constexpr (std::is_same_v<S, bf16>) {
      k.bf16.crossentropy_forward(losses, logits, targets, N, V, Vp, nullptr, cuda_stream());
    } else {
      no_cuda_kernel("crossentropy_forward", dtype_of<S>);
    }
    return 0;
  }
  return cpu::crossentropy_forward(losses, logits, targets, N, V, Vp);
}
template <typename S>
inline int64_t crossentropy_softmax_backward(float* losses, S* logits_to_dlogits, const int32_t* targets,
                                             float dloss, int N, int V, int Vp) {
  if (on_cuda()) {
    const CudaKernelTable& k = cuda_kernels();
    if constexpr (std::is_same_v<S, float>) {
      k.crossentropy_softmax_backward(losses, logits_to_dlogits, targets, dloss, N, V, Vp, nullptr, cuda_stream());
    } else if constexpr (std::is_same_v<S, bf16>) {
      k.bf16.crossentropy_softmax_backward(losses, logits_to_dlogits, targets, dloss, N, V, Vp, nullptr,
                                           cuda_stream());
    } else {
      no_cuda_kernel("crossentropy_softmax_backward", dtype_of<S>);
    }
    return 0;
  }
  return cpu::crossentropy_softmax_backward(losses, logits_to_dlogits, targets, dloss, N, V, Vp);
}
template <typename S>
inline void vocab_ce_max(float* mx, const S* logits, int N, int Vl, int v0, int V) {
  DS_KERN_S(vocab_ce_max, mx, logits, N, Vl, v0, V);
}
template <typename S>
inline void vocab_ce_sums(float* sumexp, float* tlogit, const S* logits, const float* mx, const int32_t* targets,
                          int N, int Vl, int v0, int V) {
  DS_KERN_S(vocab_ce_sums, sumexp, tlogit, logits, mx, targets, N, Vl, v0, V);
}
template <typename S>
inline void vocab_ce_finish(float* losses, S* logits_to_dlogits, const float* mx, const float* sumexp,
                            const float* tlogit, const int32_t* targets, float dloss, int N, int Vl, int v0,
                            int V) {
  DS_KERN_S(vocab_ce_finish, losses, logits_to_dlogits, mx, sumexp, tlogit, targets, dloss, N, Vl, v0,
            V);
}
inline void convert_f32_to_bf16(uint16_t* out, const float* inp, int64_t N) {
  DS_KERN(convert_f32_to_bf16, out, inp, N);
}
inline void convert_bf16_to_f32(float* out, const uint16_t* inp, int64_t N) {
  DS_KERN(convert_bf16_to_f32, out, inp, N);
}
inline void convert_f32_to_f16(uint16_t* out, const float* inp, int64_t N) {
  DS_KERN(convert_f32_to_f16, out, inp, N);
}
inline void convert_f16_to_f32(float* out, const uint16_t* inp, int64_t N) {
  DS_KERN(convert_f16_to_f32, out, inp, N);
}

template <typename S>
inline void add_in_place(S* dst, const S* src, int64_t N) {
  DS_KERN_S(add_in_place, dst, src, N);
}
// dst (N, type D) = src (N, type S) rounded once (a copy when D == S); on CUDA the module's
// fp32 <-> bf16 / fp16 conversions.
template <typename D, typename S>
inline void convert(D* dst, const S* src, int64_t N) {
  if (on_cuda()) {
    const CudaKernelTable& k = cuda_kernels();
    auto u16 = [](auto* p) { return reinterpret_cast<uint16_t*>(const_cast<std::remove_const_t<std::remove_pointer_t<decltype(p)>>*>(p)); };
    if constexpr (std::is_same_v<D, S>) return copy(dst, src, static_cast<size_t>(N) * sizeof(S));
    else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, bf16>) return k.convert_f32_to_bf16(u16(dst), src, N, cuda_stream());
    else if constexpr (std::is_same_v<S, float> && std::is_same_v<D, f16>) return k.convert_f32_to_f16(u16(dst), src, N, cuda_stream());
    else if constexpr (std::is_same_v<D, float> && std::is_same_v<S, bf16>) return k.convert_bf16_to_f32(dst, u16(src), N, cuda_stream());
    else if constexpr (std::is_same_v<D, float> && std::is_same_v<S, f16>) return k.convert_f16_to_f32(dst, u16(src), N, cuda_stream());
    else no_cuda_kernel("convert", dtype_of<S>);
  }
  cpu::convert(dst, src, N);
}
inline void round_to_bf16_in_place(float* x, int64_t N) { DS_KERN(round_to_bf16_in_place, x, N); }
inline void round_to_f16_in_place(float* x, int64_t N) { DS_KERN(round_to_f16_in_place, x, N); }

// ---- the optimizer's passes over flat buffers (kernels/adamw_step.h) -----------------------------

// Sum of squares in double, on the host either way (inside a CUDA scope: deterministic device
// reduction, then a synchronising copy of the one double).
template <typename S>
inline double sum_of_squares(const S* x, int64_t n) {
  if (on_cuda()) {
    if constexpr (std::is_same_v<S, float>) return cuda_kernels().sum_of_squares_to_host(x, n, cuda_stream());
    else if constexpr (std::is_same_v<S, bf16>) return cuda_kernels().bf16.sum_of_squares_to_host(x, n, cuda_stream());
    else no_cuda_kernel("sum_of_squares", dtype_of<S>);
  }
  return cpu::sum_of_squares(x, n);
}
// x[i] *= coef, rounded once (cpu::scale_in_place); nothing to do when coef == 1.
template <typename S>
inline void scale_in_place(S* x, int64_t n, float coef) {
  DS_KERN_S(scale_in_place, x, n, coef);
}
// True when every element is finite (cpu::all_finite). Inside a CUDA scope: whether the device's
// double sum of squares is finite, which is the same predicate (a square of a finite fp32 or bf16
// value is below 2^256, so no sum of finitely many of them reaches double's range; an inf or a NaN
// makes it non-finite), at the cost of one synchronising copy.
template <typename S>
inline bool all_finite(const S* x, int64_t n) {
  if (on_cuda()) return std::isfinite(sum_of_squares(x, n));
  return cpu::all_finite(x, n);
}
// cpu::adamw_update_partition; inside a CUDA scope one fused kernel per run of equal decay.
inline void adamw_update_partition(const AdamWStep& s, float* params, const float* grads,
                                   float* exp_avg, float* exp_avg_sq, int64_t begin,
                                   int64_t count, std::span<const DecayRange> decay) {
  if (on_cuda()) {
    const CudaKernelTable& k = cuda_kernels();
    cpu::for_each_decay_run(begin, count, decay, [&](int64_t o, int64_t n, bool d) {
      k.adamw_update(s, params + o, grads + o, exp_avg + o, exp_avg_sq + o, n, d, nullptr,
                     cuda_stream());
    });
    return;
  }
  cpu::adamw_update_partition(s, params, grads, exp_avg, exp_avg_sq, begin, count, decay);
}
// cpu::adamw_update_partition_mixed (G gradients, rounded copy into S); inside a CUDA scope the
// module's fused kernel where it has the combination (fp32 or bf16 gradients, bf16 or no copy).
template <typename G, typename S>
inline void adamw_update_partition_mixed(const AdamWStep& s, float* params, const G* grads, float* exp_avg,
                                         float* exp_avg_sq, int64_t begin, int64_t count,
                                         std::span<const DecayRange> decay, S* params_out) {
  if (on_cuda()) {
    constexpr bool g_ok = std::is_same_v<G, float> || std::is_same_v<G, bf16>;
    constexpr bool s_ok = std::is_same_v<S, bf16>;
    if constexpr (g_ok && s_ok) {
      const CudaKernelTable& k = cuda_kernels();
      cpu::for_each_decay_run(begin, count, decay, [&](int64_t o, int64_t n, bool d) {
        uint16_t* out = params_out != nullptr ? reinterpret_cast<uint16_t*>(params_out + o) : nullptr;
        if constexpr (std::is_same_v<G, float>) {
          k.adamw_update(s, params + o, grads + o, exp_avg + o, exp_avg_sq + o, n, d, out, cuda_stream());
        } else {
          k.adamw_update_bf16_grads(s, params + o, reinterpret_cast<const uint16_t*>(grads + o), exp_avg + o,
                                    exp_avg_sq + o, n, d, out, cuda_stream());
        }
      });
      return;
    } else {
      no_cuda_kernel("adamw_update_partition_mixed", dtype_of<S>);
    }
  }
  cpu::adamw_update_partition_mixed(s, params, grads, exp_avg, exp_avg_sq, begin, count, decay, params_out);
}

#undef DS_KERN_SG
#undef DS_KERN_S
#undef DS_KERN_CUDA_BRANCHES_
#undef DS_KERN

}  // namespace ds::rt::kern
