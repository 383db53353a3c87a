// The kernels over TypedPtr buffers (core/typed_ptr.h): what the model and the parallel engines
// call when the storage type is chosen at run time. Each function checks that its buffers'
// dtypes form a supported combination, switches once on them and calls the kern:: template
// (kernels/dispatch.h) with typed pointers; the CPU/CUDA routing is kern::'s.
//
// Storage types (core/dtype.h): parameters, activations and their gradients share the storage
// type S; parameter gradients have the gradient type G, which is S or fp32 (a model built with
// grad_accum_dtype fp32 under bf16). Statistics (LayerNorm mean/rstd, attention lse and scratch,
// losses, the vocab-parallel loss statistics) are always fp32 and passed as float*.
// An unsupported combination is a ds::Error (invalid usage) naming the kernel and the dtypes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "common/error.h"
#include "core/typed_ptr.h"
#include "kernels/dispatch.h"
#include "kernels/typed_call.h"

namespace ds::rt::kern::typed {

// ---- the op list (kernels/ops.def) ----------------------------------------------------------------

// typed::name(args...) takes the arguments of kern::name in order, with a TypedPtr (or nullptr)
// wherever the kernel takes an S or G buffer: it calls the instantiation whose buffer types are
// the TypedPtrs' dtypes (null ones fit any), and throws ds::Error (invalid usage) naming the
// kernel and the dtypes when none is.
#define DS_KERNEL_OP(name, params, args)                                                          \
  template <typename... A>                                                                        \
  inline void name(const A&... a) {                                                               \
    detail::call_storage(                                                                         \
        #name, [](auto s) { return &kern::name<typename decltype(s)::type>; }, a...);             \
  }
#define DS_KERNEL_OP_G(name, params, args)                                                        \
  template <typename... A>                                                                        \
  inline void name(const A&... a) {                                                               \
    detail::call_storage_grad(                                                                    \
        #name,                                                                                    \
        [](auto s, auto g) { return &kern::name<typename decltype(s)::type, typename decltype(g)::type>; }, \
        a...);                                                                                    \
  }
#include "kernels/ops.def"

// ---- the kernels outside the op list ------------------------------------------------------------

// DS_TYPED_CALL and DS_AS: kernels/typed_call.h.

inline int64_t crossentropy_forward(float* losses, TypedPtr logits, const int32_t* targets, int N, int V, int Vp) {
  int64_t bad = 0;
  [&] {
    DS_TYPED_CALL("crossentropy_forward", logits.dtype, logits.dtype,
                  bad = kern::crossentropy_forward(losses, DS_AS(S, logits), targets, N, V, Vp));
  }();
  return bad;
}
inline int64_t crossentropy_softmax_backward(float* losses, TypedPtr logits_to_dlogits, const int32_t* targets,
                                             float dloss, int N, int V, int Vp) {
  int64_t bad = 0;
  [&] {
    DS_TYPED_CALL("crossentropy_softmax_backward", logits_to_dlogits.dtype, logits_to_dlogits.dtype,
                  bad = kern::crossentropy_softmax_backward(losses, DS_AS(S, logits_to_dlogits), targets, dloss, N,
                                                            V, Vp));
  }();
  return bad;
}
// Byte moves of typed buffers (no conversion: both sides have the same dtype).
inline void fill_zero(TypedPtr p, int64_t n) { kern::fill_zero(p.data, p.bytes(n)); }
inline void copy(TypedPtr dst, TypedPtr src, int64_t n) {
  if (dst.dtype != src.dtype) {
    throw invalid_usage("kern::typed::copy of {} into {}: use a conversion", dtype_name(src.dtype),
                        dtype_name(dst.dtype));
  }
  kern::copy(dst.data, src.data, dst.bytes(n));
}

// dst (n elements of `dst`'s type) = src (n elements of `src`'s type) on the scope's device,
// rounded once (a copy when the types agree).
inline void convert(TypedPtr dst, TypedPtr src, int64_t n) {
  auto run = [&]<typename D>(D* d) {
    if (src.dtype == DType::kF32) return kern::convert(d, static_cast<const float*>(src.data), n);
    if (src.dtype == DType::kBF16) return kern::convert(d, static_cast<const bf16*>(src.data), n);
    return kern::convert(d, static_cast<const f16*>(src.data), n);
  };
  if (dst.dtype == DType::kF32) return run(static_cast<float*>(dst.data));
  if (dst.dtype == DType::kBF16) return run(static_cast<bf16*>(dst.data));
  run(static_cast<f16*>(dst.data));
}

// dst (n elements of its type, on the scope's device) from n fp32 values in host memory, rounded to
// the storage type; and the reverse. fp32 is a plain copy; 16-bit converts on the host (through a
// temporary host vector) and copies the 2-byte values.
inline void from_host_f32(TypedPtr dst, const float* host, int64_t n) {
  if (dst.dtype == DType::kF32) return kern::copy_from_host(dst.data, host, static_cast<size_t>(n) * sizeof(float));
  std::vector<uint16_t> tmp(static_cast<size_t>(n));
  if (dst.dtype == DType::kBF16) cpu::convert(reinterpret_cast<bf16*>(tmp.data()), host, n);
  if (dst.dtype == DType::kF16) cpu::convert(reinterpret_cast<f16*>(tmp.data()), host, n);
  kern::copy_from_host(dst.data, tmp.data(), dst.bytes(n));
}
inline void to_host_f32(float* host, TypedPtr src, int64_t n) {
  if (src.dtype == DType::kF32) return kern::copy_to_host(host, src.data, static_cast<size_t>(n) * sizeof(float));
  std::vector<uint16_t> tmp(static_cast<size_t>(n));
  kern::copy_to_host(tmp.data(), src.data, src.bytes(n));
  if (src.dtype == DType::kBF16) cpu::convert(host, reinterpret_cast<const bf16*>(tmp.data()), n);
  if (src.dtype == DType::kF16) cpu::convert(host, reinterpret_cast<const f16*>(tmp.data()), n);
}

// ---- the optimizer's passes (kernels/adamw_step.h) ----------------------------------------------

// Sum of squares of n gradients (double, on the host), read in their type.
inline double sum_of_squares(TypedPtr x, int64_t n) {
  if (x.dtype == DType::kF32) return kern::sum_of_squares(static_cast<const float*>(x.data), n);
  if (x.dtype == DType::kBF16) return kern::sum_of_squares(static_cast<const bf16*>(x.data), n);
  return kern::sum_of_squares(static_cast<const f16*>(x.data), n);
}
// The sums of squares of several spans, as sum_of_squares gives each (bit for bit), with one
// synchronisation per storage type among them inside a CUDA scope (kern::sums_of_squares).
inline std::vector<double> sums_of_squares(std::span<const std::pair<TypedPtr, int64_t>> spans) {
  std::vector<double> out(spans.size());
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<size_t> at;
    std::vector<const void*> xs;
    std::vector<int64_t> ns;
    for (size_t i = 0; i < spans.size(); ++i) {
      if (spans[i].first.dtype != t) continue;
      at.push_back(i);
      xs.push_back(spans[i].first.data);
      ns.push_back(spans[i].second);
    }
    if (at.empty()) continue;
    std::vector<double> sums(at.size());
    const int count = static_cast<int>(at.size());
    if (t == DType::kF32) kern::sums_of_squares(sums.data(), reinterpret_cast<const float* const*>(xs.data()), ns.data(), count);
    if (t == DType::kBF16) kern::sums_of_squares(sums.data(), reinterpret_cast<const bf16* const*>(xs.data()), ns.data(), count);
    if (t == DType::kF16) kern::sums_of_squares(sums.data(), reinterpret_cast<const f16* const*>(xs.data()), ns.data(), count);
    for (size_t k = 0; k < at.size(); ++k) out[at[k]] = sums[k];
  }
  return out;
}
// AdamW over the partition [begin, begin + count) of the fp32 `master` weights with the gradients
// `grads` (the gradient type); when `params_out` is not null and not the master itself, the
// updated weights are also written there in its storage type (rounded once, in the same pass).
inline void adamw_update_partition(const AdamWStep& s, float* master, TypedPtr grads, float* exp_avg,
                                   float* exp_avg_sq, int64_t begin, int64_t count,
                                   std::span<const DecayRange> decay, TypedPtr params_out) {
  const TypedPtr out = params_out && params_out.data != master ? params_out : TypedPtr();
  if (grads.dtype == DType::kF32 && (!out || out.dtype == DType::kF32)) {
    kern::adamw_update_partition(s, master, grads.f32(), exp_avg, exp_avg_sq, begin, count, decay);
    if (out) kern::copy(out.data, master, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  const DType od = out ? out.dtype : grads.dtype;
  DS_TYPED_CALL("adamw_update_partition", od, grads.dtype,
                kern::adamw_update_partition_mixed(s, master, DS_AS(G, grads), exp_avg, exp_avg_sq, begin, count,
                                                   decay, DS_AS(S, out)));
}
// dst (n elements of its type) = the fp32 values src on the same device, rounded.
inline void from_f32(TypedPtr dst, const float* src, int64_t n) { convert(dst, TypedPtr(src), n); }

}  // namespace ds::rt::kern::typed
