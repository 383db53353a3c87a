// GPT-2 forward and backward over flat buffers (llm.c's model, as runtime/ pieces).
//
// One Gpt2 holds one part of the model (model_spec::ModelPart: a pipeline stage's layers, a tensor-
// parallel shard): its parameters in ONE flat allocation and its gradients in another, laid out
// by model_spec::param_layout, and the shared scratch of its pieces. Activations of each in-flight
// micro-batch live in a Gpt2Activations (one flat allocation each), sized by
// model_spec::gpt2_activations: the runtime allocates exactly what the planner counts.
//
// The pieces, callable separately so pipeline stages and ZeRO-3 can run ranges:
//   embed_forward -> blocks_forward(l0, l1) ... -> head_forward[_backward]
//   -> blocks_backward(l0, l1) (in reverse ranges) ... -> embed_backward
// The residual stream's gradient flows through d_stream() (B,T,C): head_forward_backward fills it
// with d(output of the last layer); blocks_backward(l0, l1) turns d(out[l1-1]) into d(input of
// l0); a pipeline stage receives into it before its backward and sends it after.
//
// Loss and gradients: head_* return the mean loss over the micro-batch's B*T tokens. The
// gradients computed are those of grad_scale * (that mean): with gradient accumulation over k
// equal micro-batches pass grad_scale = 1/k (times the fp16 loss scale) to get the mean over the
// global batch. Gradients ACCUMULATE into the gradient buffer; zero_grads() is separate.
//
// Activation checkpointing (recompute): each layer keeps only its output; its backward first
// recomputes the layer's forward (same kernels, same order: bit-identical gradients).
//
// Storage (Gpt2Options::dtype, grad_dtype): parameters and activations are stored in the storage
// type (fp32, or bf16/fp16 for mixed precision: 2 bytes an element), parameter gradients in the
// gradient type (the storage type, or fp32); the kernels compute in fp32 (kernels/typed.h).
// Statistics stay fp32 whatever the storage (LayerNorm mean/rstd, attention lse and scratch,
// the losses, the vocab-parallel loss statistics): model_spec::ActBuffer::fp32 says which.
// Buffers are therefore TypedPtr (core/typed_ptr.h); statistics are float*.
// Not here: collectives (see hooks.h), the optimizer and its fp32 master weights, data.
// Tensor parallelism (part.tp > 1): Megatron's layout, the model calling the tp hooks where the
// group must communicate: column-parallel qkv / MLP-up, row-parallel projections, vocabulary-
// parallel embedding and loss (no rank holds full-vocabulary logits).
// Thread safety: one thread drives a Gpt2 at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "core/allocator.h"
#include "core/typed_ptr.h"
#include "model/hooks.h"
#include "model/model.h"
#include "model_spec/gpt2_spec.h"

namespace ds::rt {

using Gpt2Options = ModelOptions;  // model.h

// Views of one layer's tensors (this tp rank's part), shapes with Cl = C/tp etc.
struct LayerWeights {
  TypedPtr ln1w, ln1b;          // (C)
  TypedPtr qkvw, qkvb;          // (3Cl, C), (3Cl)
  TypedPtr attprojw, attprojb;  // (C, Cl), (C)
  TypedPtr ln2w, ln2b;          // (C)
  TypedPtr fcw, fcb;            // (4Cl, C), (4Cl)
  TypedPtr fcprojw, fcprojb;    // (C, 4Cl), (C)
};

// One layer's activations (see model_spec::gpt2_activations). With recompute every field but
// `out` points at the model's shared recompute buffers.
struct LayerActs {
  TypedPtr ln1;                      // (B,T,C)
  float *ln1_mean, *ln1_rstd;        // (B,T), (B,T)
  TypedPtr qkv;                      // (B,T,3Cl)
  TypedPtr atty;                     // (B,T,Cl)
  float* att_lse;                    // (B,NHl,T)
  TypedPtr res2;                     // (B,T,C)
  TypedPtr ln2;                      // (B,T,C)
  float *ln2_mean, *ln2_rstd;        // (B,T), (B,T)
  TypedPtr fch, fch_gelu;            // (B,T,4Cl)
  TypedPtr out;                      // (B,T,C): the layer's output, the next layer's input
};

class Gpt2;

// The activations of one in-flight micro-batch of one Gpt2 (tag: activations). Movable. `input`
// and `losses` are the base's.
class Gpt2Activations : public Activations {
 public:
  Gpt2Activations() = default;
  std::vector<LayerActs> layers;     // indexed by layer - part.layer_begin
  TypedPtr lnf;                      // (B,T,C)
  float *lnf_mean = nullptr, *lnf_rstd = nullptr;  // (B,T), (B,T)

 private:
  friend class Gpt2;
};

class Gpt2 : public Model {
 public:
  // Validates shape, part and options (invalid_argument naming the value); allocates parameters
  // (tag params), gradients (grads) and shared scratch (activations / workspace), all zeroed and
  // touched. `hooks` may be null (single process); it must outlive the model.
  Gpt2(const model_spec::Gpt2Shape& shape, const model_spec::ModelPart& part,
       const Gpt2Options& options, Allocator& alloc, ParallelHooks* hooks = nullptr);

  const model_spec::Gpt2Shape& shape() const override { return shape_; }
  const model_spec::ModelPart& part() const override { return part_; }
  const Gpt2Options& options() const override { return opt_; }
  const model_spec::ParamLayout& layout() const override { return layout_; }

  int64_t num_params() const { return layout_.total; }
  DType dtype() const { return opt_.dtype; }
  DType grad_dtype() const { return opt_.grad_dtype; }
  TypedPtr params() override { return {params_.data(), opt_.dtype}; }     // null without own_params
  TypedPtr grads() override { return {grads_.data(), opt_.grad_dtype}; }  // null without own_grads
  // View of one tensor in the flat parameter / gradient buffer (layer -1 for global tensors).
  // invalid_argument when this part does not hold it.
  TypedPtr param(model_spec::ParamId id, int layer = -1) override;
  TypedPtr grad(model_spec::ParamId id, int layer = -1) override;

  // GPT-2's initialisation (model/init.cpp): normal(0, 0.02), residual projections 0.02/sqrt(2L),
  // biases 0, LayerNorm weights 1. Each element's value depends only on (seed, tensor, layer,
  // element index in the full tensor), never on the layout; with 16-bit storage the fp32 values
  // are rounded to it.
  void init_weights(uint64_t seed) override;
  void zero_grads() override;

  // One micro-batch's activations (tag activations), zeroed.
  Gpt2Activations make_activations();
  std::unique_ptr<Activations> new_activations() override;

  // ---- pieces ----
  // tokens (B,T) in [0, V): invalid_argument naming the first bad position otherwise.
  void embed_forward(Gpt2Activations& a, const int32_t* tokens);
  // Layers [l0, l1) within the part, in order, after the layer before l0 (or embed / input).
  void blocks_forward(Gpt2Activations& a, int l0, int l1);
  // Final LayerNorm, logits, loss; no gradients. Returns the mean loss over B*T tokens.
  float head_forward(Gpt2Activations& a, const int32_t* targets);
  // As head_forward, plus the head's backward: accumulates lnf and wte gradients of
  // grad_scale * mean loss and sets d_stream() to the gradient of the last layer's output.
  float head_forward_backward(Gpt2Activations& a, const int32_t* targets, float grad_scale);
  // Layers [l1-1 .. l0] backwards: d_stream() holds d(out[l1-1]) and ends with d(input of l0).
  void blocks_backward(Gpt2Activations& a, int l0, int l1);
  void embed_backward(Gpt2Activations& a, const int32_t* tokens);

  // The residual stream's gradient between pieces (B,T,C): pipeline stages recv / send it.
  TypedPtr d_stream() override { return dres_; }
  // This part's output for a micro-batch (B,T,C): the last layer's out, or the input.
  TypedPtr output(Gpt2Activations& a);
  TypedPtr output(Activations& a) override { return output(own(a)); }

  // ---- the whole part in one call (single stage: embedding, all layers, head) ----
  float forward(Gpt2Activations& a, const int32_t* tokens, const int32_t* targets);
  float forward_backward(Gpt2Activations& a, const int32_t* tokens, const int32_t* targets,
                         float grad_scale);
  using Model::forward;
  using Model::forward_backward;

  // The pieces on the engines' Activations (made by new_activations; invalid_usage otherwise).
  void embed_forward(Activations& a, const int32_t* t) override { embed_forward(own(a), t); }
  void blocks_forward(Activations& a, int l0, int l1) override { blocks_forward(own(a), l0, l1); }
  float head_forward(Activations& a, const int32_t* t) override { return head_forward(own(a), t); }
  float head_forward_backward(Activations& a, const int32_t* t, float s) override {
    return head_forward_backward(own(a), t, s);
  }
  void blocks_backward(Activations& a, int l0, int l1) override { blocks_backward(own(a), l0, l1); }
  void embed_backward(Activations& a, const int32_t* t) override { embed_backward(own(a), t); }

 private:
  static Gpt2Activations& own(Activations& a);
  LayerWeights layer_weights(TypedPtr unit_base) const;
  TypedPtr unit_params(Unit u);
  TypedPtr unit_grads(Unit u);
  void layer_forward(LayerActs& a, TypedPtr x, const LayerWeights& w, bool full);
  float head(Gpt2Activations& a, const int32_t* targets, bool backward, float grad_scale);
  void check_layers(int l0, int l1, const char* what) const;
  TypedPtr layer_input(Gpt2Activations& a, int l);
  // Lays the named buffers of one scope out from `cursor` (bytes), advancing it.
  void place_buffer(const model_spec::ActBuffer& b, char*& cursor, TypedPtr* typed, float** stat) const;
  // Host token ids as the kernels need them: the host pointer on the CPU; on a CUDA device the
  // ids uploaded into slot 0 (tokens) or 1 (targets) of dev_ids_.
  const int32_t* ids_for_kernels(const int32_t* host, int slot);

  model_spec::Gpt2Shape shape_;
  model_spec::ModelPart part_;
  Gpt2Options opt_;
  Allocator& alloc_;
  ParallelHooks* hooks_;
  model_spec::ParamLayout layout_;
  std::vector<model_spec::ActBuffer> act_list_;
  int head_rows_ = 0;
  int threads_ = 1;  // OpenMP threads the attention scratch was sized for
  int C_, Cl_, NHl_, Vp_l_;
  Buffer params_, grads_;
  Buffer shared_act_, shared_ws_;
  Buffer dev_ids_;  // (2, B, T) int32 on a CUDA device; empty on the CPU
  LayerActs recompute_{};  // shared recompute buffers (recompute only)
  TypedPtr dres_, dln_, dqkv_, datty_, dfch_, logits_;
  float *att_scratch_ = nullptr, *ce_stats_ = nullptr;
};

}  // namespace ds::rt
