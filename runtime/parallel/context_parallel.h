// Context parallelism as the model's ParallelHooks: the cp_attention_* hooks run the whole
// sequence's attention over the cp group (ring_attention.h or ulysses_attention.h, as
// context_parallel.method says); every other hook goes on to `inner` (ForwardingHooks: tensor
// parallelism, then ZeRO).
// The engine stacks it on top:
//   model -> ContextParallelHooks -> TensorParallelHooks -> TiedEmbeddingHooks -> ZeroEngine.
// What else context parallelism changes lives where it happens: the rank's positions in the model
// (ModelOptions::cp, layout/context_parallel.h), its rows of each micro-batch in the trainer, the
// gradients reduced over dp x cp in the engine's ZeRO group.
//
// Scratch: the attention's own, allocated once here (layout::cp_attention_scratch; tags workspace
// and comm) on the rank's device; the model keeps no attention scratch on a cp rank. On a GPU the
// cp group is NCCL's and the calls run inside the model's CUDA kern::DeviceScope.
#pragma once

#include <memory>

#include "comm/comm.h"
#include "core/allocator.h"
#include "layout/context_parallel.h"
#include "model/hooks.h"
#include "parallel/ring_attention.h"
#include "parallel/ulysses_attention.h"

namespace ds::rt::parallel {

// One rank's attention shape: B sequences of T tokens (the WHOLE sequence), this tp rank's heads.
struct ContextParallelShape {
  int B = 1, T = 1, NH = 1, KV = 1, hd = 1;
  layout::CpMethod method = layout::CpMethod::kRing;
  DType dtype = DType::kF32;  // the activations' storage type
  Device device = Device::kCpu;  // where the activations and the scratch live (kCuda: NCCL's group)
};

class ContextParallelHooks final : public ForwardingHooks {
 public:
  // `cp`: the context-parallel group (size > 1). Throws invalid_argument naming the rule when the
  // sequence or the heads do not divide (layout/context_parallel.h).
  ContextParallelHooks(comm::CommPtr cp, const ContextParallelShape& shape, Allocator& alloc,
                       ParallelHooks* inner = nullptr);

  // Seconds blocked on the cp group's transfers so far (the step clock's context_wait).
  double blocked_seconds() const { return ring_ ? ring_->blocked_seconds() : ulysses_->blocked_seconds(); }

  bool cp_attention_forward(TypedPtr out, float* lse, TypedPtr qkv) override;
  bool cp_attention_backward(TypedPtr dqkv, TypedPtr dout, TypedPtr qkv, TypedPtr out, const float* lse) override;

 private:
  comm::CommPtr cp_;
  ContextParallelShape sh_;
  std::unique_ptr<RingAttention> ring_;
  std::unique_ptr<UlyssesAttention> ulysses_;
};

}  // namespace ds::rt::parallel
