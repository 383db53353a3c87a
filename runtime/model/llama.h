// Llama forward and backward over flat buffers: Hugging Face's LlamaForCausalLM as runtime/
// pieces, behind the Model interface (model.h; gpt2.h states the pieces' shared contract).
//
// The architecture: token embedding (no position embedding); per layer
//   h = x + o_proj(attn(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1))),  n1 = RMSNorm(x)
//   out = h + down_proj(silu(gate_proj(n2)) * up_proj(n2)),              n2 = RMSNorm(h)
// with causal grouped-query attention (query head j reads kv head j / (NH/KV)) and rotary
// embeddings in the rotate_half convention; a final RMSNorm and an lm_head (the token embedding
// when tie_embeddings). No biases. Loss: mean token cross-entropy over the real vocabulary.
//
// Buffers are model_spec::llama_activations'; the q/k/v weights of a layer are adjacent in the
// flat layout, so one matmul computes a tp rank's (q | k | v) rows, and gate/up likewise. q and k
// are stored after RoPE (attention's backward gives their gradients there; the inverse rotation
// then takes them back). The RoPE tables are computed once for T positions (workspace, fp32).
// Attention keeps its output and log-sum-exp only (the backward recomputes the scores).
//
// Tensor parallelism (part.tp > 1): q/k/v column-split by heads (kv heads split too: n_kv_head
// must divide by tp), o_proj row-split, gate/up column-split, down_proj row-split, vocabulary-
// parallel embedding, lm_head and loss; the model calls the same tp hooks as GPT-2's.
// Storage as Gpt2's (gpt2.h): parameters and activations in the storage type (fp32, bf16, fp16),
// parameter gradients in the gradient type (the storage type or fp32); RMSNorm's rstd, attention's
// lse and scratch, the RoPE tables, the losses and the vocab-parallel loss statistics stay fp32.
// Devices as Gpt2's (model.h, ModelOptions::device): with Device::kCuda every buffer (the RoPE
// tables included, computed on the host and uploaded once) is device memory, each piece opens a
// kern::DeviceScope so the kernels are the CUDA twins (kernels/llama_typed.h; fp32 storage, or
// bf16 where the rest of the CUDA dispatch has it), token ids are validated on the host and
// uploaded (2*B*T int32, tag workspace), the losses come back to average them. att_scratch is
// 0 floats on CUDA (the CUDA attention needs none).
// Thread safety: one thread drives a Llama at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/typed_ptr.h"
#include "model/hooks.h"
#include "model/model.h"
#include "model_spec/gpt2_spec.h"

namespace ds::rt {

// One layer's tensors (this tp rank's part); Ql = NH hd/tp, QKVl = (NH+2KV) hd/tp, Il = I/tp.
struct LlamaLayerWeights {
  TypedPtr attn_norm;  // (C)
  TypedPtr wqkv;       // (QKVl, C): q_proj, k_proj, v_proj rows
  TypedPtr wo;         // (C, Ql)
  TypedPtr mlp_norm;   // (C)
  TypedPtr wgu;        // (2Il, C): gate_proj then up_proj rows
  TypedPtr wdown;      // (C, Il)
};

// One layer's activations (model_spec::llama_activations); with recompute all but `out` point at
// the model's shared recompute buffers.
struct LlamaLayerActs {
  TypedPtr ln1;              // (B,T,C)
  float* ln1_rstd = nullptr;  // (B,T)
  TypedPtr qkv;              // (B,T,QKVl), q and k rotated
  TypedPtr atty;             // (B,T,Ql)
  float* att_lse = nullptr;   // (B,NHl,T)
  TypedPtr res2;             // (B,T,C)
  TypedPtr ln2;              // (B,T,C)
  float* ln2_rstd = nullptr;  // (B,T)
  TypedPtr gu;               // (B,T,2Il)
  TypedPtr act;              // (B,T,Il)
  TypedPtr out;              // (B,T,C)
};

class LlamaActivations : public Activations {
 public:
  std::vector<LlamaLayerActs> layers;  // indexed by layer - part.layer_begin
  TypedPtr lnf;                        // (B,T,C)
  float* lnf_rstd = nullptr;           // (B,T)

 private:
  friend class Llama;
};

class Llama : public Model {
 public:
  // Validates shape (family llama), part and options (invalid_argument naming the value);
  // allocates parameters, gradients and shared scratch as Gpt2 does. `hooks` may be null.
  Llama(const model_spec::ModelShape& shape, const model_spec::ModelPart& part, const ModelOptions& options,
        Allocator& alloc, ParallelHooks* hooks = nullptr);

  const model_spec::ModelShape& shape() const override { return shape_; }
  const model_spec::ModelPart& part() const override { return part_; }
  const ModelOptions& options() const override { return opt_; }
  const model_spec::ParamLayout& layout() const override { return layout_; }
  TypedPtr params() override { return {params_.data(), opt_.dtype}; }
  TypedPtr grads() override { return {grads_.data(), opt_.grad_dtype}; }
  TypedPtr param(model_spec::ParamId id, int layer = -1) override;
  TypedPtr grad(model_spec::ParamId id, int layer = -1) override;
  // normal(0, 0.02) for every matrix (HF's initializer_range), 1 for the norms; layout-independent;
  // with 16-bit storage the fp32 values are rounded to it.
  void init_weights(uint64_t seed) override;
  void zero_grads() override;

  LlamaActivations make_activations();
  std::unique_ptr<Activations> new_activations() override;

  void embed_forward(Activations& a, const int32_t* tokens) override;
  void blocks_forward(Activations& a, int l0, int l1) override;
  float head_forward(Activations& a, const int32_t* targets) override;
  float head_forward_backward(Activations& a, const int32_t* targets, float grad_scale) override;
  void blocks_backward(Activations& a, int l0, int l1) override;
  void embed_backward(Activations& a, const int32_t* tokens) override;
  TypedPtr d_stream() override { return dres_; }
  TypedPtr output(Activations& a) override;

 private:
  static LlamaActivations& own(Activations& a);
  void allocate_shared();
  LlamaLayerWeights layer_weights(TypedPtr unit_base) const;
  TypedPtr unit_params(Unit u);
  TypedPtr unit_grads(Unit u);
  void layer_forward(LlamaLayerActs& a, TypedPtr x, const LlamaLayerWeights& w, bool full);
  void layer_backward(LlamaLayerActs& a, TypedPtr x, const LlamaLayerWeights& w, const LlamaLayerWeights& g);
  float head(LlamaActivations& a, const int32_t* targets, bool backward, float grad_scale);
  void upload_rope_tables();
  const int32_t* ids_for_kernels(const int32_t* host, int slot);
  void head_chunks(LlamaActivations& a, const int32_t* targets, TypedPtr w, TypedPtr gw, bool backward, float dloss);
  void check_layers(int l0, int l1, const char* what) const;
  void check_tokens(const int32_t* ids, const char* what) const;
  TypedPtr layer_input(LlamaActivations& a, int l);
  void place_buffer(const model_spec::ActBuffer& b, char*& cursor, LlamaLayerActs* layer, LlamaActivations* mb);

  model_spec::ModelShape shape_;
  model_spec::ModelPart part_;
  ModelOptions opt_;
  Allocator& alloc_;
  ParallelHooks* hooks_;
  model_spec::ParamLayout layout_;
  std::vector<model_spec::ActBuffer> act_list_;
  int head_rows_ = 0;
  int threads_ = 1;
  int C_ = 0, hd_ = 0, NHl_ = 0, KVl_ = 0, Il_ = 0, Vp_l_ = 0;
  Buffer params_, grads_;
  Buffer shared_act_, shared_ws_;
  Buffer dev_ids_;  // CUDA: (2, B, T) int32 token ids (inputs, targets) uploaded per call
  LlamaLayerActs recompute_{};
  TypedPtr dres_, dln_, dqkv_, datty_, dgu_, dact_, logits_;
  float *att_scratch_ = nullptr, *ce_stats_ = nullptr, *rope_cos_ = nullptr, *rope_sin_ = nullptr;
};

}  // namespace ds::rt
