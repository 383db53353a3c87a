// The one decoder: embedding -> blocks -> final norm -> head, over flat buffers, for every model
// family. A family (model_spec/family.h) supplies only what differs: its norm (LayerNorm or
// RMSNorm), its positions (a learned position embedding, or RoPE applied to q and k), its
// attention's kv heads (multi-head is grouped-query with KV = NH), its MLP (GELU or SwiGLU),
// biases or not, a tied or untied head; its tensors and activation buffers come from its lists.
//   GPT-2:  x += attproj(attn(qkv(LN(x)))) ; x += fcproj(gelu(fc(LN(x))))   (biases, wpe, tied)
//   Llama:  x += o(attn(rope(qkv(RMS(x))))) ; x += down(silu(gate(RMS(x))) * up(RMS(x)))
//           (no biases, RoPE in the rotate_half convention, GQA, tied or untied lm_head)
//
// One Decoder holds one part of the model (model_spec::ModelPart: a pipeline stage's layers, a
// tensor-parallel shard): its parameters in ONE flat allocation and its gradients in another, laid
// out by model_spec::param_layout, and the shared scratch of its pieces. Activations of each
// in-flight micro-batch live in a DecoderActivations (one flat allocation each), sized by the
// family's model_spec activation list: the runtime allocates exactly what the planner counts.
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
// Loss masks (SFT, data/sft.h): a target of cpu::kIgnoreTarget (-1) has loss 0 and no gradient;
// the head still returns (sum of losses) / (B*T), and with set_loss_divisor(d) (model.h) each
// counted token's gradient is grad_scale / d instead of grad_scale / (B*T).
//
// The per-layer math keeps memory down, as llm.c's does and more: attention keeps only its output
// and per-row log-sum-exp (backward recomputes the scores); the attention and MLP projections
// write straight into the residual buffers (res2, out); q and k are stored after RoPE; the head
// computes logits a chunk of rows at a time and, when training, runs the loss's backward on each
// chunk at once, so (B*T, Vp) logits never exist.
//
// Activation checkpointing (recompute): each layer keeps only its output; its backward first
// recomputes the layer's forward (same kernels, same order: bit-identical gradients).
//
// Storage (ModelOptions::dtype, grad_dtype): parameters and activations are stored in the storage
// type (fp32, or bf16/fp16 for mixed precision: 2 bytes an element), parameter gradients in the
// gradient type (the storage type, or fp32); the kernels compute in fp32 (kernels/typed.h).
// Statistics stay fp32 whatever the storage (norm mean/rstd, attention lse and scratch, the RoPE
// tables, the losses, the vocab-parallel loss statistics): model_spec::ActBuffer::fp32 says which.
// Devices: model.h (ModelOptions::device). With Device::kCuda every buffer is device memory (the
// RoPE tables are computed on the host and uploaded once), each piece opens a kern::DeviceScope,
// token ids are validated on the host and uploaded (2*B*T int32, tag workspace), the losses come
// back to average them; att_scratch is 0 floats (the CUDA attention needs none).
// Not here: collectives (see hooks.h), the optimizer and its fp32 master weights, data.
// Tensor parallelism (part.tp > 1): Megatron's layout, the model calling the tp hooks where the
// group must communicate: column-parallel qkv (by heads; kv heads split too) and MLP-up, row-
// parallel projections, vocabulary-parallel embedding and loss (no rank holds full-vocabulary
// logits).
// Context parallelism (ModelOptions::cp > 1): the part holds T = seq/cp positions of each sequence
// (layout::cp_position_runs); RoPE tables and wpe rows are those of the global positions, and the
// attention is the cp hooks' (hooks.h: cp_attention_*). Sequence parallelism
// (ModelOptions::sequence_parallel): the residual stream, the norms and their outputs hold this tp
// rank's B*T/tp rows; the column-parallel matmuls read them all-gathered (sp_gather) and the
// row-parallel ones reduce-scatter into them (hooks.h: tp_all_gather, tp_reduce_scatter), and
// the norms' weight gradients are summed over tp (tp_sum_partial_grads).
// Mixture of experts (MlpKind::kMoe, Mixtral): the MLP is the router and E SwiGLU experts over
// all B*T rows (gathered under sequence parallelism; every tp rank routes alike). The router
// picks k experts per row (kern moe_router_forward); the B*T*k slots are sorted by expert, gathered
// into expert order, and each expert's contiguous rows run one matmul per weight (gate|up, down;
// an expert with no rows is skipped); the outputs are combined back by the routing weights. Tensor
// parallelism shards every expert as the dense MLP (w1/w3 by columns, w2 by rows: the combined
// output is a partial sum reduced like the dense down-projection). The load-balancing loss
// (RouterStats) is accumulated over the layers' forwards in the Activations; its gradient,
// router_aux_loss_coef * grad_scale * E * counts_e / rows^2 on every row's probability of e, is
// added in each layer's backward. Backward: d(weight of slot) = <G, act> with G = dY @ w2 the
// unweighted gradient of the expert's activation (summed over tp), then w * G is the
// activation's gradient and the weighted dY gives w2's; no per-slot output is kept.
// Document-aware packing (ModelOptions::document_token): find_documents (from embed_forward, or a
// later pipeline stage's own call) turns the micro-batch's input tokens into each row's document
// start (the micro-batch's doc_start, in the model's memory) and each document's run of rows; the
// attention takes the starts (kern attention_gqa_doc_*), RoPE and wpe are applied one document
// at a time from position 0, and the loss is unchanged. A window without a document token runs
// bit for bit as without packing.
// LoRA (ModelShape::lora, model_spec/lora_spec.h): the adapters of each layer are a unit of their
// own (kAdapters) after every other unit; the base before them is frozen: the model's own buffer
// whatever the ownership options (they apply to the adapters), never handed to the hooks, with no
// gradient buffer (grads() holds the adapters' only), its weight gradients and the embedding's
// backward never computed. After each adapted matmul its output columns get
// (alpha/r) B (A dropout(x)) (lora_forward), and its backward adds the adapters' share of the
// input gradient and accumulates their gradients (lora_backward). Dropout masks are counter-based,
// keyed by the micro-batch, the layer and the adapter, so a backward or a recompute draws them
// again; set_training(false) turns dropout off.
// Thread safety: one thread drives a Decoder at a time.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/allocator.h"
#include "core/typed_ptr.h"
#include "model/hooks.h"
#include "model/model.h"
#include "model_spec/family.h"
#include "model_spec/shape.h"

namespace ds::rt {

// Views of one layer's tensors (this tp rank's part) by role (model_spec::LayerRoles); a role the
// family lacks (biases, a RMSNorm's bias) is a null TypedPtr. Ql = NH hd/tp, QKVl = (NH+2KV) hd/tp,
// UPl = 4C/tp (GELU) or 2I/tp (SwiGLU's gate|up), Hl = 4C/tp or I/tp.
struct DecoderLayerWeights {
  TypedPtr norm1_w, norm1_b;  // (C)
  TypedPtr qkv_w, qkv_b;      // (QKVl, C), (QKVl)
  TypedPtr proj_w, proj_b;    // (C, Ql), (C)
  TypedPtr norm2_w, norm2_b;  // (C)
  TypedPtr up_w, up_b;        // (UPl, C), (UPl); MoE: the experts' w13 (E x 2Il, C)
  TypedPtr down_w, down_b;    // (C, Hl), (C); MoE: the experts' w2 (E x C, Il)
  TypedPtr router_w;          // MoE: (E, C)
  TypedPtr adapters{};        // LoRA: the layer's adapter unit (null without LoRA)
};

// One layer's activations (the family's model_spec list); with recompute every field but `out`
// points at the model's shared recompute buffers. A statistic the family's norm does not keep
// (RMSNorm's mean) stays null.
struct DecoderLayerActs {
  TypedPtr ln1;                                     // (B,T,C)
  float *ln1_mean = nullptr, *ln1_rstd = nullptr;   // (B,T)
  TypedPtr qkv;                                     // (B,T,QKVl) (q and k rotated with RoPE)
  TypedPtr atty;                                    // (B,T,Ql)
  float* att_lse = nullptr;                         // (B,NHl,T)
  TypedPtr res2;                                    // (B,T,C)
  TypedPtr ln2;                                     // (B,T,C)
  float *ln2_mean = nullptr, *ln2_rstd = nullptr;   // (B,T)
  TypedPtr mlp_h;                                   // (B,T,UPl): GPT-2's fch, Llama's gu; MoE (NK,2Il)
  TypedPtr mlp_act;                                 // (B,T,Hl): gelu(fch) / silu(gate) * up; MoE (NK,Il)
  float* router_probs = nullptr;                    // MoE: (B*T,E) softmax of the router
  int32_t* topk_idx = nullptr;                      // MoE: (B*T,k) the picked experts
  float* topk_w = nullptr;                          // MoE: (B*T,k) their renormalised weights
  TypedPtr moe_ex_x;                                // MoE, ep > 1: (R,C) the received rows, expert order
  int32_t* moe_ep_counts = nullptr;                 // MoE, ep > 1: (ep, E/ep) rows from each ep rank
  TypedPtr out;                                     // (B,T,C): the layer's output
};

class Decoder;

// Rows of a residual-stream buffer at consecutive positions: rows [row, row + length) hold
// positions [position, position + length).
struct PositionSegment {
  int64_t row;
  int position, length;
};

// The activations of one in-flight micro-batch of one Decoder (tag: activations). Movable.
// `input` and `losses` are the base's.
class DecoderActivations : public Activations {
 public:
  DecoderActivations() = default;
  std::vector<DecoderLayerActs> layers;  // indexed by layer - part.layer_begin
  TypedPtr lnf;                           // (B,T,C)
  float *lnf_mean = nullptr, *lnf_rstd = nullptr;  // (B,T)
  uint64_t lora_key = 0;  // LoRA's dropout: this micro-batch's masks (drawn again by its backward)
  // Document-aware packing: doc_start's memory (tag workspace, B*T int32), and each document's
  // rows as position segments (position 0 at its first row) over all B*T rows and over this
  // rank's rows of the residual stream (sequence parallelism).
  Buffer doc_buf;
  std::vector<PositionSegment> doc_segs, doc_local_segs;

 private:
  friend class Decoder;
};

class Decoder : public Model {
 public:
  // Validates shape, part and options (invalid_argument naming the value); allocates parameters
  // (tag params), gradients (grads) and shared scratch (activations / workspace), all zeroed and
  // touched. `hooks` may be null (single process); it must outlive the model.
  Decoder(const model_spec::ModelShape& shape, const model_spec::ModelPart& part, const ModelOptions& options,
          Allocator& alloc, ParallelHooks* hooks = nullptr);

  const model_spec::ModelShape& shape() const override { return shape_; }
  const model_spec::ModelPart& part() const override { return part_; }
  const ModelOptions& options() const override { return opt_; }
  const model_spec::ParamLayout& layout() const override { return layout_; }
  const model_spec::FamilyDescription& family() const { return family_; }

  // null without own_params (LoRA: the frozen base, then the adapters unless ZeRO-3 serves them)
  TypedPtr params() override { return {params_.data(), opt_.dtype}; }
  // null without own_grads (LoRA: the adapters' gradients alone, from adapter_begin)
  TypedPtr grads() override { return {grads_.data(), opt_.grad_dtype}; }
  // View of one tensor in the flat parameter / gradient buffer (layer -1 for global tensors).
  // invalid_argument when this part does not hold it.
  TypedPtr param(model_spec::ParamId id, int layer = -1) override;
  TypedPtr grad(model_spec::ParamId id, int layer = -1) override;

  // The family's initialisation (model/init.h, model_spec's InitKind per tensor): each element's
  // value depends only on (seed, tensor, layer, element index in the full tensor), never on the
  // layout; with 16-bit storage the fp32 values are rounded to it.
  void init_weights(uint64_t seed) override;
  void zero_grads() override;
  void set_training(bool on) override { training_ = on; }

  // One micro-batch's activations (tag activations), zeroed.
  DecoderActivations make_activations();
  std::unique_ptr<Activations> new_activations() override;

  // ---- pieces ----
  // Model::find_documents.
  void find_documents(DecoderActivations& a, const int32_t* tokens);
  // tokens (B,T) in [0, V): invalid_argument naming the first bad position otherwise.
  void embed_forward(DecoderActivations& a, const int32_t* tokens);
  // Layers [l0, l1) within the part, in order, after the layer before l0 (or embed / input).
  void blocks_forward(DecoderActivations& a, int l0, int l1);
  // Final norm, logits, loss; no gradients. Returns the mean loss over B*T tokens.
  float head_forward(DecoderActivations& a, const int32_t* targets);
  // As head_forward, plus the head's backward: accumulates the final norm's and the head's
  // gradients of grad_scale * mean loss and sets d_stream() to the gradient of the last layer's
  // output.
  float head_forward_backward(DecoderActivations& a, const int32_t* targets, float grad_scale);
  // Model::head_forward_backward_deferred / take_losses.
  void head_forward_backward_deferred(DecoderActivations& a, const int32_t* targets, float grad_scale);
  std::vector<float> take_losses() override;
  void drop_kept_losses() override;
  void keep_replayed_losses(int n) override;
  // Layers [l1-1 .. l0] backwards: d_stream() holds d(out[l1-1]) and ends with d(input of l0).
  void blocks_backward(DecoderActivations& a, int l0, int l1);
  void embed_backward(DecoderActivations& a, const int32_t* tokens);

  // The residual stream's gradient between pieces (B,T,C): pipeline stages recv / send it.
  TypedPtr d_stream() override { return dres_; }
  // This part's output for a micro-batch (B,T,C): the last layer's out, or the input.
  TypedPtr output(DecoderActivations& a);
  TypedPtr output(Activations& a) override { return output(own(a)); }

  // ---- the whole part in one call (single stage: embedding, all layers, head) ----
  float forward(DecoderActivations& a, const int32_t* tokens, const int32_t* targets) {
    return Model::forward(a, tokens, targets);
  }
  float forward_backward(DecoderActivations& a, const int32_t* tokens, const int32_t* targets, float grad_scale) {
    return Model::forward_backward(a, tokens, targets, grad_scale);
  }
  using Model::forward;
  using Model::forward_backward;

  // The pieces on the engines' Activations (made by new_activations; invalid_usage otherwise).
  void find_documents(Activations& a, const int32_t* t) override { find_documents(own(a), t); }
  void embed_forward(Activations& a, const int32_t* t) override { embed_forward(own(a), t); }
  void blocks_forward(Activations& a, int l0, int l1) override { blocks_forward(own(a), l0, l1); }
  float head_forward(Activations& a, const int32_t* t) override { return head_forward(own(a), t); }
  float head_forward_backward(Activations& a, const int32_t* t, float s) override {
    return head_forward_backward(own(a), t, s);
  }
  void head_forward_backward_deferred(Activations& a, const int32_t* t, float s) override {
    head_forward_backward_deferred(own(a), t, s);
  }
  void blocks_backward(Activations& a, int l0, int l1) override { blocks_backward(own(a), l0, l1); }
  void embed_backward(Activations& a, const int32_t* t) override { embed_backward(own(a), t); }

 private:
  static DecoderActivations& own(Activations& a);
  void allocate_shared();
  void upload_rope_tables();
  // x (its rows as `segs` say) += wpe at the rows' positions; dwpe += src's rows at them.
  void add_positions(TypedPtr x, TypedPtr wpe, const std::vector<PositionSegment>& segs);
  void add_positions_backward(TypedPtr dwpe, TypedPtr src, const int32_t* tokens,
                              const std::vector<PositionSegment>& segs);
  // Sequence parallelism: `local` (this rank's rows, C wide) all-gathered into sp_gather_, which
  // is returned; without it, `local` itself.
  TypedPtr gathered(TypedPtr local);
  // A row-parallel output or column-parallel input gradient `full` (B*T rows) summed over tp into
  // `local` (this rank's rows under sequence parallelism, else in place: local == full).
  void reduce_rows(TypedPtr local, TypedPtr full, bool forward);
  // The norms' weight gradients, computed from this rank's rows only: summed over tp.
  void sum_norm_grads(TypedPtr dw, TypedPtr db);
  // Lays buffer b out at `cursor` (bytes), advancing it: a layer's buffer into *layer, a
  // micro-batch's into *mb, a shared one into the model's members (layer = the recompute buffers).
  void place_buffer(const model_spec::ActBuffer& b, char*& cursor, DecoderLayerActs* layer, DecoderActivations* mb);
  // A layer's views: its layer unit's tensors from `unit_base`, a mixture's experts from `experts`
  // (the layer's kExperts unit; null for a dense family).
  DecoderLayerWeights layer_weights(TypedPtr unit_base, TypedPtr experts) const;
  // Elements of the flat layout the model's own parameter buffer holds: all, the frozen base alone
  // (LoRA under ZeRO-3), or none.
  int64_t params_held() const { return static_cast<int64_t>(params_.bytes() / dtype_size(opt_.dtype)); }
  TypedPtr unit_params(Unit u);
  TypedPtr unit_grads(Unit u);
  void check_layers(int l0, int l1, const char* what) const;
  // allow_ignore: -1 (a masked-out target) is allowed too.
  void check_tokens(const int32_t* ids, const char* what, bool allow_ignore = false) const;
  TypedPtr layer_input(DecoderActivations& a, int l);
  // Host token ids as the kernels need them: the host pointer on the CPU; on a CUDA device the
  // ids uploaded into slot 0 (tokens) or 1 (targets) of dev_ids_.
  const int32_t* ids_for_kernels(const int32_t* host, int slot);

  // The family's norm over B*T rows of C (LayerNorm: weight, bias, mean kept; RMSNorm: weight).
  void norm_forward(TypedPtr out, float* mean, float* rstd, TypedPtr x, TypedPtr w, TypedPtr b);
  void norm_backward(TypedPtr dx, TypedPtr dw, TypedPtr db, TypedPtr dout, TypedPtr x, TypedPtr w, const float* mean,
                     const float* rstd);
  // `stats`: where a MoE layer adds its router statistics (null: a recompute, which adds none).
  // `mb`: the micro-batch the layer belongs to (its document starts under packing).
  void layer_forward(DecoderLayerActs& a, TypedPtr x, const DecoderLayerWeights& w, bool full, RouterStats* stats,
                     const DecoderActivations& mb);
  // RoPE on q and k of a layer's qkv (B*T rows), forward or backward, at the rows' positions.
  void rope(TypedPtr qkv, const DecoderActivations& mb, bool backward);
  void layer_backward(DecoderLayerActs& a, TypedPtr x, const DecoderLayerWeights& w, const DecoderLayerWeights& g,
                      const DecoderActivations& mb);
  // The mixture of experts (see the header comment): forward from the MLP's input `x` (B*T rows,
  // gathered) into `y` (B*T rows, this tp rank's partial sum; skipped unless `full`), adding the
  // layer's statistics to *stats when not null; backward from `dy` (B*T rows, gathered) into
  // dln_ (this tp rank's part of d x, the router's share on tp rank 0 only).
  void moe_forward(DecoderLayerActs& a, TypedPtr x, const DecoderLayerWeights& w, TypedPtr y, bool full,
                   RouterStats* stats);
  void moe_backward(DecoderLayerActs& a, TypedPtr x, TypedPtr dy, const DecoderLayerWeights& w,
                    const DecoderLayerWeights& g, const RouterStats& stats, float grad_scale);
  // Sorts the layer's routed slots by expert (moe_slots_, moe_pos_) and returns each expert's
  // first sorted position (E+1, on the host).
  const std::vector<int32_t>& route(const DecoderLayerActs& a);
  // The router on the MLP's input x (B*T rows): its logits, probabilities, picks and weights into
  // `a`, the slots sorted (route), the layer's statistics added to *stats when not null. Returns
  // route's offsets.
  const std::vector<int32_t>& router_forward(DecoderLayerActs& a, TypedPtr x, const DecoderLayerWeights& w,
                                             RouterStats* stats);
  // Expert parallelism (part.ep > 1): the token side sorts its slots by expert as above; the rows
  // of each ep rank's experts go to it by all-to-all (counts first), arrive in source order
  // (moe_recv_) and are permuted into expert order (moe_ex_x); the experts' outputs (and in the
  // backward the input gradients and the routing weights' gradients) go back the same way.
  struct EpExchange {
    std::vector<int64_t> send_rows, recv_rows;  // per ep rank
    std::vector<int32_t> expert_off;            // E/ep + 1: each local expert's first row, expert order
    int64_t rows = 0;                           // R received
  };
  // From the sorted offsets (E+1) and the received counts (ep, E/ep): the exchange, with the
  // source <-> expert order permutations uploaded into moe_perm_ ([0, R): expert row i is source
  // row perm[i]; [Rmax, Rmax + R): the inverse).
  EpExchange ep_exchange(const std::vector<int32_t>& off, const std::vector<int32_t>& recv_counts);
  // Sends each ep rank the per-expert counts of its experts and returns what every rank sent this
  // one (into la.moe_ep_counts, and on the host).
  std::vector<int32_t> ep_counts(DecoderLayerActs& la, const std::vector<int32_t>& off);
  void moe_forward_ep(DecoderLayerActs& a, TypedPtr x, const DecoderLayerWeights& w, TypedPtr y, bool full,
                      RouterStats* stats);
  void moe_backward_ep(DecoderLayerActs& a, TypedPtr ln2, TypedPtr dy, const DecoderLayerWeights& w,
                       const DecoderLayerWeights& g, const RouterStats& stats, float grad_scale);
  // The router's backward (moe_dw_ holds d(routing weight) of each slot) and its share of d x
  // into dln_; shared by both paths.
  void router_backward(DecoderLayerActs& a, TypedPtr x, const DecoderLayerWeights& w, const DecoderLayerWeights& g,
                       const RouterStats& stats, float grad_scale);
  // LoRA (lora_spec.h): the adapters of one of a layer's four matmuls. y (B*T rows of ldy
  // columns; this tp rank's part, a row-parallel one's partial sum) += scale B (A x) for each
  // adapted tensor, at its columns. Backward: from dy (ldy columns) and the matmul's input x, the
  // adapters' gradients accumulate into `grads` (the unit's; the replicated factor's summed over
  // tp) and x's gradient share is added to dx (the base's, already written).
  enum LoraMatmul { kLoraQkv, kLoraProj, kLoraUp, kLoraDown, kLoraMatmuls };
  struct LoraSite {
    model_spec::ParamId a, b;
    int in = 0, out = 0, c0 = 0;  // A (r, in), B (out, r) local; the output columns [c0, c0 + out)
    bool a_partial = false;       // A's gradient is a per-tp-rank partial (a column-parallel base)
    int64_t col0 = 0, full_in = 0;  // this rank's first input column of the whole input's full_in (dropout)
  };
  // LoRA's dropout on site `s`'s input x into lora_x_ (returned), or x itself without dropout.
  TypedPtr lora_input(const LoraSite& s, int index, TypedPtr x);
  bool lora_dropout_on() const { return training_ && shape_.lora.dropout > 0; }
  void lora_forward(LoraMatmul m, TypedPtr y, int ldy, TypedPtr x, TypedPtr adapters);
  void lora_backward(LoraMatmul m, TypedPtr dy, int ldy, TypedPtr x, TypedPtr dx, TypedPtr adapters, TypedPtr grads);
  void init_lora_sites();
  // The hooks of a unit, except a frozen base's (LoRA), which the hooks never see: its parameters
  // are the model's own and it has no gradients.
  bool frozen(const Unit& u) const { return lora_ && u.kind != model_spec::UnitKind::kAdapters; }
  void params_done(Unit u) {
    if (!frozen(u)) hooks_->params_done(u);
  }
  void grads_ready(Unit u) {
    if (!frozen(u)) hooks_->grads_ready(u);
  }
  void head_chunks(DecoderActivations& a, const int32_t* targets, TypedPtr w, TypedPtr gw, bool backward, float dloss,
                   const int32_t* host_targets);
  // Activations::record_top: rows [r0, r0+rows) of target_is_top from this chunk's logits.
  void record_top_rows(DecoderActivations& a, const int32_t* host_targets, int r0, int rows);
  // What head does with the per-token losses: their mean returned (a copy back on a GPU), or
  // kept (summed into the deferred sums below, 0 returned).
  enum class HeadLoss { kReturn, kKeep };
  float head(DecoderActivations& a, const int32_t* targets, bool backward, float grad_scale,
             HeadLoss loss = HeadLoss::kReturn);
  // The kept sums (head_forward_backward_deferred): on the host, and on a GPU the count still in
  // the device's loss slots (brought back when take_losses runs or the slots are full).
  std::vector<double> kept_loss_sums_;
  int kept_on_device_ = 0;
  void bring_back_kept_losses();

  model_spec::ModelShape shape_;
  model_spec::ModelPart part_;
  ModelOptions opt_;
  const model_spec::FamilyDescription& family_;
  Allocator& alloc_;
  ParallelHooks* hooks_;
  model_spec::ParamLayout layout_;
  std::vector<model_spec::ActBuffer> act_list_;
  std::vector<layout::PositionRun> runs_;  // this rank's positions (one run without context parallelism)
  std::vector<PositionSegment> full_segs_, local_segs_;  // all B*T rows; the residual stream's rows
  bool sp_ = false;         // sequence parallelism
  int64_t Rl_ = 0;          // rows of the residual stream held here: B*T, or B*T/tp with sp_
  TypedPtr sp_gather_, dln_sp_;  // sp_: (B*T, C) gathered rows; (Rl, C) reduce-scattered dln
  bool layer_norm_ = true, rope_ = false, swiglu_ = false, moe_ = false;
  bool packing_ = false;  // ModelOptions::document_token >= 0
  std::array<bool, model_spec::kNumParamTensors> expert_param_{};  // in the kExperts units
  int E_ = 0, k_ = 0;  // MoE: experts, experts per token
  TypedPtr router_logits_, moe_xs_, moe_ys_;  // MoE scratch (mixtral_spec.h)
  int32_t *moe_slots_ = nullptr, *moe_pos_ = nullptr, *moe_offsets_ = nullptr;
  float *moe_dw_ = nullptr, *moe_daux_ = nullptr;
  std::vector<int32_t> moe_offsets_host_;
  int ep_ = 1, El_ = 0;   // expert parallelism: ep ranks, E/ep local experts
  int64_t Rmax_ = 0;      // rows the local experts may receive (mixtral_spec.h: moe_expert_rows)
  TypedPtr moe_recv_;     // (Rmax, C) rows in source order
  int32_t *moe_perm_ = nullptr, *moe_cnt_send_ = nullptr;
  float *moe_fbuf_ = nullptr, *moe_ex_w_ = nullptr;
  std::vector<float> moe_host_e_;  // E floats: the prob sums back, the aux gradient up
  int head_rows_ = 0;
  int threads_ = 1;  // OpenMP threads the attention scratch was sized for
  int C_ = 0, hd_ = 0, NHl_ = 0, KVl_ = 0, Hl_ = 0, Vp_l_ = 0;
  float norm_eps_ = 1e-5f;
  Buffer params_, grads_;
  Buffer shared_act_, shared_ws_;
  Buffer dev_ids_;  // (2, B, T) int32 on a CUDA device; empty on the CPU
  DecoderLayerActs recompute_{};  // shared recompute buffers (recompute only)
  TypedPtr dres_, dln_, dqkv_, datty_, dmlp_h_, dmlp_act_, logits_;
  bool lora_ = false;  // LoRA: the base is frozen, the adapters train
  int lora_r_ = 0;
  float lora_scale_ = 0;
  std::array<std::vector<LoraSite>, kLoraMatmuls> lora_sites_;
  TypedPtr lora_t_, lora_dt_, lora_u_, lora_dx_;  // (B*T, r) x2, (B*T, out), (B*T, in)
  TypedPtr lora_x_;             // (B*T, in): the dropped input (dropout only)
  bool training_ = true;        // set_training: dropout on
  uint64_t lora_mb_count_ = 0;  // micro-batches forwarded: each draws its own dropout masks
  uint64_t lora_key_ = 0;       // the dropout key of the layer being run (its micro-batch's, its index)
  float *att_scratch_ = nullptr, *ce_stats_ = nullptr, *rope_cos_ = nullptr, *rope_sin_ = nullptr;
};

}  // namespace ds::rt
