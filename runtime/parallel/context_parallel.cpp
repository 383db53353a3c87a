// Context parallelism's hooks (context_parallel.h).
#include "parallel/context_parallel.h"

#include <utility>

#include "common/error.h"

namespace ds::rt::parallel {

ContextParallelHooks::ContextParallelHooks(comm::CommPtr cp, const ContextParallelShape& shape, Allocator& alloc,
                                           ParallelHooks* inner)
    : ForwardingHooks(inner), cp_(std::move(cp)), sh_(shape) {
  const int n = cp_->size();
  if (auto why = layout::cp_sequence_rule(sh_.T, n, sh_.method)) throw invalid_argument("{}", *why);
  if (auto why = layout::cp_heads_rule(sh_.NH, sh_.KV, 1, n, sh_.method)) throw invalid_argument("{}", *why);
  const int sb = static_cast<int>(dtype_size(sh_.dtype));
  if (sh_.method == layout::CpMethod::kRing) {
    ring_ = std::make_unique<RingAttention>(*cp_, RingShape{sh_.B, sh_.T / (2 * n), sh_.NH, sh_.KV, sh_.hd}, sb, alloc,
                                            sh_.device);
  } else {
    ulysses_ = std::make_unique<UlyssesAttention>(*cp_, UlyssesShape{sh_.B, sh_.T, sh_.NH, sh_.KV, sh_.hd}, sb, alloc,
                                                  sh_.device);
  }
}

namespace {

// Calls fn with the buffers as typed host pointers of the storage type.
template <typename Fn>
void with_storage(DType t, Fn&& fn) {
  switch (t) {
    case DType::kF32: return fn(float{});
    case DType::kBF16: return fn(bf16{});
    case DType::kF16: return fn(f16{});
  }
}

}  // namespace

bool ContextParallelHooks::cp_attention_forward(TypedPtr out, float* lse, TypedPtr qkv) {
  with_storage(sh_.dtype, [&](auto tag) {
    using S = decltype(tag);
    S* o = static_cast<S*>(out.data);
    const S* x = static_cast<const S*>(qkv.data);
    if (ring_) ring_->forward(o, lse, x);
    else ulysses_->forward(o, lse, x);
  });
  return true;
}

bool ContextParallelHooks::cp_attention_backward(TypedPtr dqkv, TypedPtr dout, TypedPtr qkv, TypedPtr out,
                                                 const float* lse) {
  with_storage(sh_.dtype, [&](auto tag) {
    using S = decltype(tag);
    S* d = static_cast<S*>(dqkv.data);
    const S *dO = static_cast<const S*>(dout.data), *x = static_cast<const S*>(qkv.data),
            *o = static_cast<const S*>(out.data);
    if (ring_) ring_->backward(d, dO, x, o, lse);
    else ulysses_->backward(d, dO, x, o, lse);
  });
  return true;
}

}  // namespace ds::rt::parallel
