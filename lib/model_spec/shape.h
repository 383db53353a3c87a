// The models as shapes: every parameter tensor (each family's list: gpt2_spec.h, llama_spec.h,
// reached through its description, family.h), how tensor parallelism splits it, how the runtime
// lays the tensors out in one flat buffer, and the activation buffers the runtime keeps for a
// micro-batch. One source of truth shared by the runtime (which allocates exactly these) and the
// planner (which counts exactly these). Every family uses the same vocabulary of tensors, units
// and splits, so the parallel layouts, the plan and checkpoints serve them all.
//
// Deliberately pure: no allocation of model memory, no runtime types, no I/O. Sizes are element
// counts (fp32 elements unless a function says bytes).
//
// Legend: B = micro-batch, T = sequence length, C = channels (n_embd), NH = heads, L = layers,
// V = vocabulary, Vp = padded vocabulary, maxT = seq_len (rows of wpe), tp = tensor-parallel size;
// Llama: KV = kv heads, hd = head size (C / NH), I = intermediate_size (the SwiGLU width).
// Mixtral: E = num_local_experts (each a SwiGLU of width I), k = num_experts_per_tok.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ds::model_spec {

// LoRA (lib/model_spec/lora_spec.h): low-rank adapters y = W x + (alpha / r) B (A x) on chosen
// weight matrices, the base frozen. r = 0: none.
struct LoraShape {
  int r = 0;                // rank; 0: no adapters
  double alpha = 8.0;       // PEFT's lora_alpha
  double dropout = 0.0;     // on the adapter's input, training only
  uint64_t targets = 0;     // bit i set: the i-th entry of kLoraTargetable (lora_spec.h) is adapted
  bool on() const { return r > 0; }
  float scale() const { return static_cast<float>(alpha / r); }
};

enum class ModelFamily {
  kGpt2,   // pre-LayerNorm, learned positions, fused qkv with biases, 4C GELU MLP, tied lm_head
  kLlama,  // pre-RMSNorm, rotary positions, grouped-query attention, SwiGLU, no biases
  kMixtral,  // Llama's attention; every MLP a sparse mixture of E SwiGLU experts, top-k routed
};

struct ModelShape {
  int n_layer = 0;
  int n_head = 0;
  int n_embd = 0;
  int vocab_size = 0;         // V: real tokens
  int padded_vocab_size = 0;  // Vp >= V: rows of wte (llm.c pads to a multiple of 128)
  int seq_len = 0;            // maxT: rows of wpe, the longest sequence the model accepts
  ModelFamily family = ModelFamily::kGpt2;
  // Read by the families that have them (family.h; ignored by the others):
  int n_kv_head = 0;          // KV: 1 <= KV <= NH, NH % KV == 0 (KV == NH: multi-head)
  int intermediate_size = 0;  // I: the SwiGLU width
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;     // RMSNorm's epsilon
  bool tie_embeddings = false;  // lm_head is the token embedding (a family may always tie: GPT-2)
  // Mixture of experts (Mixtral): E experts per layer, each token routed to its top k.
  int num_local_experts = 0;       // E
  int num_experts_per_tok = 2;     // k <= E
  double router_aux_loss_coef = 0.02;  // the load-balancing loss's weight in the objective
  // LoRA adapters on the weight matrices it targets (the base frozen); none by default.
  LoraShape lora{};

  bool tied() const;  // the head reads the token embedding (tie_embeddings, or the family always ties)
  int head_dim() const { return n_embd / n_head; }

  // GPT-2 124M as llm.c has it (Vp = 50304).
  static ModelShape gpt2_124m();
  // Throws ds::invalid_argument naming the field and the rule when a value is impossible
  // (non-positive, C not divisible by NH, Vp < V; then the family's own rules, family.h).
  void validate() const;
  // Throws ds::invalid_argument when tensor parallelism of size tp cannot split this model
  // (NH and Vp, then the family's: the MLP width, KV), naming the numbers and the config keys.
  void validate_tp(int tp) const;
};

// How tensor parallelism (Megatron-style) splits a tensor across the tp group.
enum class TpSplit {
  kReplicated,  // every rank holds all of it
  kColumn,      // dim 0 (output features) split; qkv splits each of q, k, v by heads (groups = 3)
  kRow,         // dim 1 (input features) split; an all-reduce follows the matmul
  kVocab,       // dim 0 (vocabulary rows) split: vocabulary-parallel embedding and loss
};
const char* tp_split_name(TpSplit s);

// Which unit of the flat layout a tensor belongs to. Units are what ZeRO-3 gathers and what
// pipeline stages own: the token embedding (also the tied lm_head), the position embedding
// (GPT-2), one unit per layer, the final norm (with Llama's untied lm_head), and a mixture of
// experts' experts of each layer (their own unit: expert parallelism splits them and their own
// data-parallel group reduces them), and LoRA's adapters of each layer (their own unit, after
// everything else: the trainable region of a run whose base is frozen).
enum class UnitKind { kTokenEmbedding, kPositionEmbedding, kLayer, kFinalNorm, kExperts, kAdapters };

// Parameter tensors: GPT-2's in llm.c's order, then Llama's own. Llama shares kWte (its
// embed_tokens) and kLnfw (its final norm); its layer tensors and untied lm_head follow.
enum class ParamId {
  kWte, kWpe,
  kLn1w, kLn1b, kQkvw, kQkvb, kAttprojw, kAttprojb, kLn2w, kLn2b, kFcw, kFcb, kFcprojw, kFcprojb,
  kLnfw, kLnfb,
  // Llama (per layer: input_layernorm, q/k/v/o_proj, post_attention_layernorm, gate/up/down_proj)
  kAttnNorm, kWq, kWk, kWv, kWo, kMlpNorm, kWgate, kWup, kWdown,
  kLmHead,
  // Mixtral (per layer): the router (block_sparse_moe.gate, (E, C)) and the E experts' weights,
  // stacked: w13 (E x 2I, C) holds each expert's w1 (I rows) then its w3 (I rows); w2 (E x C, I).
  kRouter, kExpertW13, kExpertW2,
  // LoRA (per layer, UnitKind::kAdapters): A (r, in) and B (out, r) of each weight matrix a LoRA
  // may adapt (lora_spec.h: kLoraTargetable, in that order).
  kLoraAQkvw, kLoraBQkvw, kLoraAAttprojw, kLoraBAttprojw, kLoraAFcw, kLoraBFcw, kLoraAFcprojw, kLoraBFcprojw,
  kLoraAWq, kLoraBWq, kLoraAWk, kLoraBWk, kLoraAWv, kLoraBWv, kLoraAWo, kLoraBWo,
  kLoraAWgate, kLoraBWgate, kLoraAWup, kLoraBWup, kLoraAWdown, kLoraBWdown,
};
inline constexpr int kNumParamTensors = 51;
inline constexpr int kNumLayerTensors = 12;  // GPT-2's kLn1w .. kFcprojb

// kKaimingUniform: U(-1/sqrt(in), 1/sqrt(in)) with in = shape[1] (torch's kaiming_uniform_ with
// a = sqrt(5), as PEFT initialises a LoRA A).
enum class InitKind { kNormal, kNormalResidual, kZeros, kOnes, kKaimingUniform };

struct ParamTensor {
  ParamId id;
  std::string_view name;  // llm.c's name ("wte", "qkvw", ...); Llama: HF's ("q_proj", "norm", ...)
  UnitKind unit;
  bool per_layer;                // one copy per layer ((L, ...) in llm.c's checkpoint)
  std::vector<int64_t> shape;    // full shape of one copy (without the L dimension)
  TpSplit split;
  int split_groups;              // column splits: 3 for qkv (q, k, v split separately), else 1
  InitKind init;                 // normal std 0.02; residual: 0.02 / sqrt(2L)
  // Stacked experts: dim 0 is `experts` equal blocks, one per expert (0: a dense tensor). Only k
  // of them work on a token (FLOPs), and expert parallelism splits the blocks.
  int experts = 0;
  int64_t numel() const;         // elements of one full copy
};

// The tensors of this shape's family (its description's list, family.h).
std::vector<ParamTensor> model_params(const ModelShape& s);
// invalid_argument when `all` has no tensor `id`.
const ParamTensor& find_param(const std::vector<ParamTensor>& all, ParamId id);

// The shape a tp rank holds of one copy of `t` (every rank holds the same amount); of a stacked
// expert tensor an ep rank holds E/ep of the experts (ep_rank's: experts [ep_rank E/ep, ...)),
// each split by tp as one expert's tensor is.
std::vector<int64_t> local_shape(const ParamTensor& t, int tp, int ep = 1);
int64_t local_numel(const ParamTensor& t, int tp, int ep = 1);
// Index (flat, row-major) in the full tensor of element `local_index` of the shard of tp rank
// `tp_rank` (and, for expert tensors, ep rank `ep_rank`). A shard can thus generate or load its
// part alone (init, checkpoints).
int64_t full_index(const ParamTensor& t, int tp, int tp_rank, int64_t local_index, int ep = 1, int ep_rank = 0);

// What one process holds of the model: a pipeline stage's layers and tensor-parallel shard.
struct ModelPart {
  int layer_begin = 0;
  int layer_end = 0;             // exclusive; [begin, end) of the model's layers
  bool has_embedding = true;     // first stage: wte and wpe, the encoder
  bool has_head = true;          // last stage: lnf and the (tied) wte, the loss
  int tp = 1;
  int tp_rank = 0;
  int ep = 1;       // expert parallelism: this part holds E/ep experts of each layer
  int ep_rank = 0;

  static ModelPart whole(const ModelShape& s) { return ModelPart{0, s.n_layer, true, true, 1, 0}; }
  void validate(const ModelShape& s) const;  // invalid_argument on a bad range or rank
};

// One unit's place in the flat parameter (and gradient) buffer of a part.
struct UnitSlice {
  UnitKind kind;
  int layer;        // for kLayer, else -1
  int64_t offset;   // elements from the start of the flat buffer
  int64_t numel;
};
// One tensor copy's place in the flat buffer.
struct TensorSlice {
  ParamId id;
  int layer;        // -1 for global tensors
  int64_t offset;
  int64_t numel;    // this tp rank's elements
};

// The flat layout: units in order wte, wpe, layers [begin, end), lnf, then the experts of layers
// [begin, end) (a mixture of experts: all the expert units last, so the dense and the expert
// parameters are two contiguous regions; absent units skipped), each
// unit contiguous, tensors inside a layer in llm.c's order. Layer-major (unlike llm.c's
// tensor-major checkpoint) so a layer is one slice for ZeRO-3 and pipeline stages. The tied token
// embedding lives in a part with the embedding or the head; an untied one (Llama) only with the
// embedding, the lm_head in the final-norm unit. Units without tensors (Llama's position
// embedding) do not appear. Llama's wq, wk, wv (and wgate, wup) are adjacent in a layer unit, so
// a tp rank's q/k/v rows form one ((NH+2KV)/tp*hd, C) matrix and its gate/up one (2I/tp, C).
struct ParamLayout {
  std::vector<UnitSlice> units;
  std::vector<TensorSlice> tensors;
  int64_t total = 0;
  int64_t layer_numel = 0;  // one layer unit (this tp rank)
  // Offset of a tensor inside its unit (the same for every layer).
  int64_t offset_in_unit(ParamId id) const;
  const UnitSlice* find_unit(UnitKind kind, int layer = -1) const;  // null when absent
  const TensorSlice* find_tensor(ParamId id, int layer = -1) const;  // null when absent
  std::array<int64_t, kNumParamTensors> in_unit_offsets{};
  // Where the expert units start (total when there are none): [0, expert_begin) is the dense region.
  int64_t expert_begin = 0;
  // Where the LoRA adapter units start (total when there are none): [adapter_begin, total) is the
  // trainable region of a run with a frozen base.
  int64_t adapter_begin = 0;
};
// The dense region's units and tensors alone (offsets as in `l`), or the expert region's
// (offsets from its start): each a layout of its own, for the engine that partitions it.
ParamLayout dense_region(const ParamLayout& l);
ParamLayout expert_region(const ParamLayout& l);
// LoRA: the adapters' units and tensors alone (offsets from adapter_begin).
ParamLayout adapter_region(const ParamLayout& l);
ParamLayout param_layout(const ModelShape& s, const ModelPart& part);

// Parameter counts (elements).
int64_t param_count(const ModelShape& s);                    // the whole model, unsharded
// The parameters one token works with: every dense tensor, and k of the E blocks of each stacked
// expert tensor (Mixtral-8x7B: 12.9B of 46.7B). param_count for a dense model.
int64_t active_param_count(const ModelShape& s);
int64_t layer_param_count(const ModelShape& s, int tp = 1);  // one layer on one tp rank
// Layers [l0, l1) on one tp rank.
int64_t layers_param_count(const ModelShape& s, int l0, int l1, int tp = 1);
// Everything a part holds (its layout's total).
int64_t part_param_count(const ModelShape& s, const ModelPart& part);

// ---- activations ---------------------------------------------------------------------------

enum class ActScope {
  kPerLayer,       // one per layer per in-flight micro-batch (kept from forward to backward)
  kPerMicroBatch,  // once per in-flight micro-batch (stage input, final LayerNorm, losses)
  kShared,         // once per process whatever the micro-batches in flight (scratch, recompute)
};
enum class ActTag { kActivations, kWorkspace };  // the allocator tag the runtime uses

struct ActBuffer {
  std::string name;     // "ln1", "qkv", ... (the runtime's view names)
  int64_t numel;        // elements
  ActScope scope;
  ActTag tag;
  // A statistic kept in fp32 whatever the storage type (LayerNorm mean/rstd, attention lse and
  // scratch, losses, the vocab-parallel loss statistics); every other buffer has the storage
  // type (ActConfig::storage_bytes per element).
  bool fp32 = false;
  int64_t bytes(int storage_bytes) const { return numel * (fp32 ? 4 : storage_bytes); }
};

struct ActConfig {
  int B = 1;
  int T = 1;
  bool recompute = false;     // activation checkpointing: keep only each layer's output
  int num_threads = 1;        // attention keeps 2 x (T, T) (+ 8 x T x hs at 16 bits) scratch per thread (0: none, CUDA)
  int head_chunk_rows = 0;    // rows of logits computed at once; 0: head_chunk_rows_default
  int storage_bytes = 4;      // bytes per element of the storage type (fp32 4; bf16, fp16 2)
  // Megatron's sequence parallelism (part.tp > 1): the residual stream, the norms and their
  // outputs hold B*T/tp rows (this tp rank's share); the gathered norm output (sp_gather) and the
  // reduce-scattered input gradient (dln_sp) are shared buffers.
  bool sequence_parallel = false;
};
// Rows of (rows, Vp/tp) logits the head computes at once by default: B*T split into equal chunks
// of at most ~32 Mi elements (128 MiB fp32) each, a multiple of 16 rows, never more than B*T.
int head_chunk_rows_default(const ModelShape& s, int B, int T, int tp = 1);

// THE list of activation buffers the runtime allocates for a part (and the planner counts): the
// family's list (gpt2_spec.h, llama_spec.h), in three scopes. Without recompute each layer keeps
// its norms' outputs and statistics, qkv, the attention output and its log-sum-exp, the MLP's
// hidden activations and its output; with recompute a layer keeps only `out` and the others exist
// once (kShared), refilled by recomputing the layer's forward in its backward. Per micro-batch:
// `input` (B,T,C) and, with the head, the final norm's output and statistics and the losses.
// Shared: the backward's gradient buffers, attention's per-thread scratch, the head's logits chunk
// (rows, Vp/tp), with tp > 1 the vocabulary-parallel loss's row statistics, and whatever tables
// the family's positions need (RoPE).
std::vector<ActBuffer> model_activations(const ModelShape& s, const ModelPart& part, const ActConfig& cfg);

struct ActTotals {
  int64_t per_layer = 0;       // elements for one layer
  int64_t per_micro_batch = 0; // elements for one micro-batch: per_layer x layers + per-mb ones
  int64_t shared_activations = 0;  // kShared buffers tagged activations
  int64_t shared_workspace = 0;    // kShared buffers tagged workspace
  // The same in bytes (ActBuffer::bytes with ActConfig::storage_bytes): what the runtime allocates.
  int64_t per_layer_bytes = 0, per_micro_batch_bytes = 0, shared_activation_bytes = 0, shared_workspace_bytes = 0;
};
ActTotals activation_totals(const ModelShape& s, const ModelPart& part, const ActConfig& cfg);

}  // namespace ds::model_spec
