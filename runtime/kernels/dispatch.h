// Kernel dispatch: the only place that knows whether a buffer's kernels run on the CPU or on a
// CUDA device. The model calls kernels through this header (kern::name(...) with the CPU
// signatures of runtime/kernels/cpu/kernels.h); each call goes to cpu::name, or, while the calling
// thread is inside a kern::DeviceScope for Device::kCuda, to the CUDA module's twin
// (kernels/cuda_kernel_table.h, the signatures of kernels/cuda/kernels.h) on the scope's stream:
// the typed table of S and G (fp32, bf16, or bf16 with fp32 gradients). The wrappers of the op
// list (kernels/ops.def) are generated from it; the kernels whose CPU and CUDA forms differ are
// written out below them. fp16 storage has no CUDA kernel: inside a CUDA scope a kernel of f16
// buffers throws ds::Error (invalid usage) naming the kernel.
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

#include <algorithm>
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

// `rows` rows of `width` bytes from src (a row every spitch bytes) to dst (every dpitch bytes), not
// overlapping: on the CPU a memcpy per row; inside a CUDA scope one strided copy in stream order.
inline void copy_rows(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t rows) {
  if (on_cuda()) return cuda_memory().copy_rows(dst, dpitch, src, spitch, width, rows, kernel_context().stream);
  if (width == 0) return;
  for (size_t r = 0; r < rows; r++) {
    std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
  }
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
// ---- the op list (kernels/ops.def): kern::name(args) with the CPU template's signature -----------

// Inside a CUDA scope the module's twin of storage S and gradients G (cuda_kernel_table.h's
// CudaOps: fp32, bf16, or bf16 with fp32 gradients), on the scope's stream; fp16 (or any other
// combination) a throw naming the kernel. Otherwise the CPU template.
template <typename S, typename G>
const CudaOps<S, G>& cuda_ops() {
  return cuda_ops_of<S, G>(cuda_kernels());
}
#define DS_KERN_OP_BODY_(name, S_, G_, targs, args)                                    \
  if (on_cuda()) {                                                                   \
    if constexpr (kCudaHasOps<S_, G_>) {                                             \
      return cuda_ops<S_, G_>().name(DS_OP_UNPAREN args, cuda_stream());             \
    } else {                                                                         \
      no_cuda_kernel(#name, dtype_of<S_>);                                           \
    }                                                                                \
  }                                                                                  \
  return cpu::name<DS_OP_UNPAREN targs>(DS_OP_UNPAREN args);
#define DS_NOT_DEDUCED(T) std::type_identity_t<T>
#define DS_KERNEL_OP(name, params, args) \
  template <typename S>                  \
  inline void name params {              \
    DS_KERN_OP_BODY_(name, S, S, (S), args) \
  }
#define DS_KERNEL_OP_G(name, params, args)     \
  template <typename S, typename G>            \
  inline void name params {                    \
    DS_KERN_OP_BODY_(name, S, G, (S, G), args) \
  }
#include "kernels/ops.def"
#undef DS_KERN_OP_BODY_

// ---- the kernels outside the op list ------------------------------------------------------------

// Floats of attention scratch for storage of `storage_bytes` (cpu::attention_scratch_floats); 0
// inside a CUDA scope (the CUDA attention needs none).
inline size_t attention_scratch_floats(int T, int hs = 0, int storage_bytes = 4) {
  if (on_cuda()) return 0;
  return cpu::attention_scratch_floats(T, hs, storage_bytes);
}
// Ring attention's merge of a block's (out, lse) into the running ones (cpu::attention_merge).
inline void attention_merge(float* out, float* lse, const float* part, const float* part_lse, int B, int T, int NH,
                            int hd) {
  DS_KERN(attention_merge, out, lse, part, part_lse, B, T, NH, hd);
}
// The routed slots sorted by expert (cpu::moe_sort_slots); on a CUDA device the ids are not
// checked (the router wrote them).
inline void moe_sort_slots(int32_t* slots, int32_t* pos, int32_t* offsets, const int32_t* idx, int64_t NK, int E) {
  DS_KERN(moe_sort_slots, slots, pos, offsets, idx, NK, E);
}
// The per-token losses summed on a CUDA device without a synchronisation (cuda::loss_sum_to_slot:
// the thread's slots; slot < cuda::kLossSlots), and the slots brought back at once. CUDA only: a
// CPU caller sums on the host.
inline void loss_sum_to_slot(const float* losses, int64_t n, int slot) {
  if (!on_cuda()) throw invalid_usage("kern::loss_sum_to_slot outside a CUDA scope");
  cuda_kernels().loss_sum_to_slot(losses, n, slot, cuda_stream());
}
inline void loss_slots_to_host(double* out, int count) {
  if (!on_cuda()) throw invalid_usage("kern::loss_slots_to_host outside a CUDA scope");
  cuda_kernels().loss_slots_to_host(out, count, cuda_stream());
}
// x[i] = value for i < n, on this thread's device.
inline void fill_f32(float* x, float value, int64_t n) {
  if (on_cuda()) return cuda_kernels().fill_f32(x, value, n, cuda_stream());
  std::fill(x, x + n, value);
}
inline void moe_gather_f32(float* out, const float* in, const int32_t* idx, int64_t n) {
  DS_KERN(moe_gather_f32, out, in, idx, n);
}
// Inside a CUDA scope these two return 0 (the device does not count invalid targets: the caller
// validates them on the host first).
template <typename S>
inline int64_t crossentropy_forward(float* losses, const S* logits, const int32_t* targets, int N, int V,
                                    int Vp) {
  if (on_cuda()) {
    if constexpr (kCudaHasOps<S, S>) {
      cuda_ops<S, S>().crossentropy_forward(losses, logits, targets, N, V, Vp, nullptr, cuda_stream());
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
    if constexpr (kCudaHasOps<S, S>) {
      cuda_ops<S, S>().crossentropy_softmax_backward(losses, logits_to_dlogits, targets, dloss, N, V, Vp,
                                                     nullptr, cuda_stream());
    } else {
      no_cuda_kernel("crossentropy_softmax_backward", dtype_of<S>);
    }
    return 0;
  }
  return cpu::crossentropy_softmax_backward(losses, logits_to_dlogits, targets, dloss, N, V, Vp);
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
    if constexpr (kCudaHasOps<S, S>) return cuda_ops<S, S>().sum_of_squares_to_host(x, n, cuda_stream());
    else no_cuda_kernel("sum_of_squares", dtype_of<S>);
  }
  return cpu::sum_of_squares(x, n);
}
// out[i] = sum_of_squares(xs[i], ns[i]) for i < count, bit for bit; inside a CUDA scope with one
// synchronising copy for all of them instead of one per span.
template <typename S>
inline void sums_of_squares(double* out, const S* const* xs, const int64_t* ns, int count) {
  if (on_cuda()) {
    if constexpr (kCudaHasOps<S, S>) return cuda_ops<S, S>().sums_of_squares_to_host(out, xs, ns, count, cuda_stream());
    else no_cuda_kernel("sums_of_squares", dtype_of<S>);
  }
  for (int i = 0; i < count; ++i) out[i] = cpu::sum_of_squares(xs[i], ns[i]);
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

#undef DS_KERN

}  // namespace ds::rt::kern
