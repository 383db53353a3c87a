// Llama (Hugging Face's LlamaForCausalLM) as shapes: its tensors in HF's order, their tensor-
// parallel splits, its activation buffers and Hugging Face's names and config keys. See
// llama_spec.h; the contracts are shape.h's. Grouped-query attention shows as k_proj/v_proj of KV*hd rows (not NH*hd) and a qkv
// activation of (NH+2KV)*hd/tp columns; tensor parallelism splits the kv heads across ranks, so
// KV must divide by tp (there is no replication of kv heads).
#include <fmt/format.h>

#include <algorithm>

#include "common/error.h"
#include "model_spec/llama_spec.h"

namespace ds::model_spec {

void resolve_llama(ModelShape& s) {
  if (s.n_kv_head == 0) s.n_kv_head = s.n_head;
}

void check_llama(const ModelShape& s, const RuleNames& n, RuleErrors& out) {
  const char* p = n.key_prefix;
  if (s.n_kv_head <= 0 || s.n_kv_head > s.n_head || s.n_head % s.n_kv_head != 0) {
    out.push_back({"n_kv_head", fmt::format("{}n_kv_head ({}) must divide {}n_head ({})", p, s.n_kv_head, p, s.n_head)});
  }
  if (s.n_head > 0 && s.n_embd % s.n_head == 0 && s.head_dim() % 2 != 0) {
    out.push_back({"n_embd", fmt::format("the head size {}n_embd / {}n_head ({}) must be even for rotary embeddings",
                                         p, p, s.head_dim())});
  }
  if (s.intermediate_size <= 0) {
    out.push_back({"intermediate_size", fmt::format("{}intermediate_size must be positive, got {}", p,
                                                    s.intermediate_size)});
  }
  if (!(s.rope_theta > 0.0)) {
    out.push_back({"rope_theta", fmt::format("{}rope_theta must be positive, got {}", p, s.rope_theta)});
  }
  if (!(s.norm_eps > 0.0)) out.push_back({"norm_eps", fmt::format("{}norm_eps must be positive, got {}", p, s.norm_eps)});
}

void check_llama_tp(const ModelShape& s, int tp, const RuleNames& n, RuleErrors& out) {
  if (s.n_kv_head % tp != 0) {
    out.push_back({"n_kv_head", fmt::format("{}n_kv_head ({}) must be divisible by {} ({}): each rank holds whole "
                                            "kv heads (dstrain does not replicate them)",
                                            n.key_prefix, s.n_kv_head, n.tp, tp)});
  }
  if (s.intermediate_size % tp != 0) {
    out.push_back({"intermediate_size", fmt::format("{}intermediate_size ({}) must be divisible by {} ({})",
                                                    n.key_prefix, s.intermediate_size, n.tp, tp)});
  }
}

std::vector<ParamTensor> llama_params(const ModelShape& s) {
  const int64_t C = s.n_embd, Vp = s.padded_vocab_size, hd = s.head_dim();
  const int64_t Q = s.n_head * hd, KV = s.n_kv_head * hd, I = s.intermediate_size;
  using P = ParamId;
  using U = UnitKind;
  using S = TpSplit;
  using N = InitKind;
  std::vector<ParamTensor> v = {
      {P::kWte, "embed_tokens", U::kTokenEmbedding, false, {Vp, C}, S::kVocab, 1, N::kNormal},
      {P::kAttnNorm, "input_layernorm", U::kLayer, true, {C}, S::kReplicated, 1, N::kOnes},
      {P::kWq, "q_proj", U::kLayer, true, {Q, C}, S::kColumn, 1, N::kNormal},
      {P::kWk, "k_proj", U::kLayer, true, {KV, C}, S::kColumn, 1, N::kNormal},
      {P::kWv, "v_proj", U::kLayer, true, {KV, C}, S::kColumn, 1, N::kNormal},
      {P::kWo, "o_proj", U::kLayer, true, {C, Q}, S::kRow, 1, N::kNormal},
      {P::kMlpNorm, "post_attention_layernorm", U::kLayer, true, {C}, S::kReplicated, 1, N::kOnes},
      {P::kWgate, "gate_proj", U::kLayer, true, {I, C}, S::kColumn, 1, N::kNormal},
      {P::kWup, "up_proj", U::kLayer, true, {I, C}, S::kColumn, 1, N::kNormal},
      {P::kWdown, "down_proj", U::kLayer, true, {C, I}, S::kRow, 1, N::kNormal},
      {P::kLnfw, "norm", U::kFinalNorm, false, {C}, S::kReplicated, 1, N::kOnes},
  };
  if (!s.tie_embeddings) v.push_back({P::kLmHead, "lm_head", U::kFinalNorm, false, {Vp, C}, S::kVocab, 1, N::kNormal});
  return v;
}

std::string llama_hf_name(ParamId id, int layer, int /*piece*/) {
  const char* leaf = nullptr;
  const char* group = "";
  switch (id) {
    case ParamId::kWte: return "model.embed_tokens.weight";
    case ParamId::kLnfw: return "model.norm.weight";
    case ParamId::kLmHead: return "lm_head.weight";
    case ParamId::kAttnNorm: leaf = "input_layernorm"; break;
    case ParamId::kMlpNorm: leaf = "post_attention_layernorm"; break;
    case ParamId::kWq: group = "self_attn."; leaf = "q_proj"; break;
    case ParamId::kWk: group = "self_attn."; leaf = "k_proj"; break;
    case ParamId::kWv: group = "self_attn."; leaf = "v_proj"; break;
    case ParamId::kWo: group = "self_attn."; leaf = "o_proj"; break;
    case ParamId::kWgate: group = "mlp."; leaf = "gate_proj"; break;
    case ParamId::kWup: group = "mlp."; leaf = "up_proj"; break;
    case ParamId::kWdown: group = "mlp."; leaf = "down_proj"; break;
    default: throw invalid_usage("parameter tensor #{} has no Hugging Face Llama name", static_cast<int>(id));
  }
  return fmt::format("model.layers.{}.{}{}.weight", layer, group, leaf);
}

namespace {

void llama_head_buffers(std::vector<ActBuffer>& v, const ModelShape& s, const ModelPart& part, const ActConfig& cfg) {
  const int64_t BT = static_cast<int64_t>(cfg.B) * cfg.T, C = s.n_embd, tp = part.tp;
  const int64_t Rl = cfg.sequence_parallel ? BT / tp : BT;
  const ActScope mb = ActScope::kPerMicroBatch;
  v.push_back({"lnf", Rl * C, mb, ActTag::kActivations});
  v.push_back({"lnf_rstd", Rl, mb, ActTag::kActivations, true});
  v.push_back({"losses", BT, mb, ActTag::kActivations, true});
  const int rows = cfg.head_chunk_rows > 0 ? cfg.head_chunk_rows : head_chunk_rows_default(s, cfg.B, cfg.T, part.tp);
  v.push_back({"logits", static_cast<int64_t>(rows) * (s.padded_vocab_size / tp), ActScope::kShared,
               ActTag::kWorkspace});
  if (tp > 1) v.push_back({"ce_stats", 3 * static_cast<int64_t>(rows), ActScope::kShared, ActTag::kWorkspace, true});
}

}  // namespace

std::vector<ActBuffer> llama_activations(const ModelShape& s, const ModelPart& part, const ActConfig& cfg) {
  const int64_t BT = static_cast<int64_t>(cfg.B) * cfg.T;
  const int64_t C = s.n_embd, tp = part.tp, hd = s.head_dim();
  const int64_t Rl = cfg.sequence_parallel ? BT / tp : BT;  // rows of the residual stream held here
  const int64_t NHl = s.n_head / tp, KVl = s.n_kv_head / tp, Il = s.intermediate_size / tp;
  const int64_t QKVl = (NHl + 2 * KVl) * hd;
  const bool layers = part.layer_end > part.layer_begin;
  const ActScope inner = cfg.recompute ? ActScope::kShared : ActScope::kPerLayer;
  const ActTag act = ActTag::kActivations, ws = ActTag::kWorkspace;
  std::vector<ActBuffer> v;
  v.push_back({"input", Rl * C, ActScope::kPerMicroBatch, act});
  if (layers) {
    v.push_back({"ln1", Rl * C, inner, act});
    v.push_back({"ln1_rstd", Rl, inner, act, true});
    v.push_back({"qkv", BT * QKVl, inner, act});
    v.push_back({"atty", BT * NHl * hd, inner, act});
    v.push_back({"att_lse", BT * NHl, inner, act, true});
    v.push_back({"res2", Rl * C, inner, act});
    v.push_back({"ln2", Rl * C, inner, act});
    v.push_back({"ln2_rstd", Rl, inner, act, true});
    v.push_back({"gu", BT * 2 * Il, inner, act});
    v.push_back({"act", BT * Il, inner, act});
    v.push_back({"out", Rl * C, ActScope::kPerLayer, act});
  }
  if (part.has_head) llama_head_buffers(v, s, part, cfg);
  v.push_back({"dres", Rl * C, ActScope::kShared, ws});
  if (cfg.sequence_parallel) {
    v.push_back({"sp_gather", BT * C, ActScope::kShared, ws});
    v.push_back({"dln_sp", Rl * C, ActScope::kShared, ws});
  }
  if (layers || part.has_head) v.push_back({"dln", BT * C, ActScope::kShared, ws});
  if (layers) {
    v.push_back({"dqkv", BT * QKVl, ActScope::kShared, ws});
    v.push_back({"datty", BT * NHl * hd, ActScope::kShared, ws});
    v.push_back({"dgu", BT * 2 * Il, ActScope::kShared, ws});
    v.push_back({"dact", BT * Il, ActScope::kShared, ws});
    // Per thread two (T, T) score tiles; with 16-bit storage also 8 x T x hd for the fp32 copies of
    // the heads (runtime/kernels/cpu/attention_gqa.cpp: a kv head's k, v, dk, dv and a query head's
    // q, out, dout, dq), as GPT-2's attention has.
    const int64_t per_thread = 2 * static_cast<int64_t>(cfg.T) * cfg.T + (cfg.storage_bytes == 4 ? 0 : 8 * cfg.T * hd);
    v.push_back({"att_scratch", static_cast<int64_t>(std::max(0, cfg.num_threads)) * per_thread, ActScope::kShared,
                 ws, true});
    v.push_back({"rope_cos", static_cast<int64_t>(cfg.T) * (hd / 2), ActScope::kShared, ws, true});
    v.push_back({"rope_sin", static_cast<int64_t>(cfg.T) * (hd / 2), ActScope::kShared, ws, true});
  }
  return v;
}

std::vector<HfConfigKey> llama_hf_config(const ModelShape& s) {
  auto num = [](double v) { return fmt::format("{}", v); };
  return {
      {"hidden_size", num(s.n_embd)},
      {"intermediate_size", num(s.intermediate_size)},
      {"num_hidden_layers", num(s.n_layer)},
      {"num_attention_heads", num(s.n_head)},
      {"num_key_value_heads", num(s.n_kv_head)},
      {"head_dim", num(s.head_dim())},
      {"vocab_size", num(s.vocab_size)},
      {"max_position_embeddings", num(s.seq_len)},
      {"rms_norm_eps", num(s.norm_eps)},
      {"rope_theta", num(s.rope_theta)},
      {"tie_word_embeddings", s.tie_embeddings ? "true" : "false"},
      {"hidden_act", "\"silu\""},
      {"attention_bias", "false"},
      {"mlp_bias", "false"},
      {"initializer_range", "0.02"},
  };
}

}  // namespace ds::model_spec
