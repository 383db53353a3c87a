// GPT-2 as shapes: its 16 tensors in llm.c's order, llm.c's checkpoint offsets, its activation
// buffers, its tensor-parallel rule and Hugging Face's GPT2LMHeadModel names and config keys. See
// gpt2_spec.h.
#include "model_spec/gpt2_spec.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"

namespace ds::model_spec {

std::vector<ParamTensor> gpt2_params(const ModelShape& s) {
  const int64_t C = s.n_embd, Vp = s.padded_vocab_size, maxT = s.seq_len;
  using P = ParamId;
  using U = UnitKind;
  using S = TpSplit;
  using I = InitKind;
  return {
      {P::kWte, "wte", U::kTokenEmbedding, false, {Vp, C}, S::kVocab, 1, I::kNormal},
      {P::kWpe, "wpe", U::kPositionEmbedding, false, {maxT, C}, S::kReplicated, 1, I::kNormal},
      {P::kLn1w, "ln1w", U::kLayer, true, {C}, S::kReplicated, 1, I::kOnes},
      {P::kLn1b, "ln1b", U::kLayer, true, {C}, S::kReplicated, 1, I::kZeros},
      {P::kQkvw, "qkvw", U::kLayer, true, {3 * C, C}, S::kColumn, 3, I::kNormal},
      {P::kQkvb, "qkvb", U::kLayer, true, {3 * C}, S::kColumn, 3, I::kZeros},
      {P::kAttprojw, "attprojw", U::kLayer, true, {C, C}, S::kRow, 1, I::kNormalResidual},
      {P::kAttprojb, "attprojb", U::kLayer, true, {C}, S::kReplicated, 1, I::kZeros},
      {P::kLn2w, "ln2w", U::kLayer, true, {C}, S::kReplicated, 1, I::kOnes},
      {P::kLn2b, "ln2b", U::kLayer, true, {C}, S::kReplicated, 1, I::kZeros},
      {P::kFcw, "fcw", U::kLayer, true, {4 * C, C}, S::kColumn, 1, I::kNormal},
      {P::kFcb, "fcb", U::kLayer, true, {4 * C}, S::kColumn, 1, I::kZeros},
      {P::kFcprojw, "fcprojw", U::kLayer, true, {C, 4 * C}, S::kRow, 1, I::kNormalResidual},
      {P::kFcprojb, "fcprojb", U::kLayer, true, {C}, S::kReplicated, 1, I::kZeros},
      {P::kLnfw, "lnfw", U::kFinalNorm, false, {C}, S::kReplicated, 1, I::kOnes},
      {P::kLnfb, "lnfb", U::kFinalNorm, false, {C}, S::kReplicated, 1, I::kZeros},
  };
}

void check_gpt2_tp(const ModelShape& s, int tp, const RuleNames& n, RuleErrors& out) {
  if ((4LL * s.n_embd) % tp != 0) {
    out.push_back({"n_embd", fmt::format("4 x {}n_embd ({}) must be divisible by {} ({})", n.key_prefix,
                                         4LL * s.n_embd, n.tp, tp)});
  }
}

int64_t llmc_offset(const ModelShape& s, ParamId id, int layer) {
  if (s.family != ModelFamily::kGpt2) throw invalid_usage("llm.c's checkpoint order is GPT-2's; this model has none");
  int64_t off = 0;
  for (const auto& t : gpt2_params(s)) {
    if (t.id == id) return off + (t.per_layer ? static_cast<int64_t>(layer) * t.numel() : 0);
    off += t.numel() * (t.per_layer ? s.n_layer : 1);
  }
  return off;
}

std::string gpt2_hf_name(ParamId id, int layer, int /*piece*/) {
  const char* leaf = nullptr;
  switch (id) {
    case ParamId::kWte: return "transformer.wte.weight";
    case ParamId::kWpe: return "transformer.wpe.weight";
    case ParamId::kLnfw: return "transformer.ln_f.weight";
    case ParamId::kLnfb: return "transformer.ln_f.bias";
    case ParamId::kLmHead: return "lm_head.weight";
    case ParamId::kLn1w: leaf = "ln_1.weight"; break;
    case ParamId::kLn1b: leaf = "ln_1.bias"; break;
    case ParamId::kQkvw: leaf = "attn.c_attn.weight"; break;
    case ParamId::kQkvb: leaf = "attn.c_attn.bias"; break;
    case ParamId::kAttprojw: leaf = "attn.c_proj.weight"; break;
    case ParamId::kAttprojb: leaf = "attn.c_proj.bias"; break;
    case ParamId::kLn2w: leaf = "ln_2.weight"; break;
    case ParamId::kLn2b: leaf = "ln_2.bias"; break;
    case ParamId::kFcw: leaf = "mlp.c_fc.weight"; break;
    case ParamId::kFcb: leaf = "mlp.c_fc.bias"; break;
    case ParamId::kFcprojw: leaf = "mlp.c_proj.weight"; break;
    case ParamId::kFcprojb: leaf = "mlp.c_proj.bias"; break;
    default: throw invalid_usage("parameter tensor #{} has no Hugging Face GPT-2 name", static_cast<int>(id));
  }
  return fmt::format("transformer.h.{}.{}", layer, leaf);
}

bool gpt2_hf_transposed(ParamId id) {
  return id == ParamId::kQkvw || id == ParamId::kAttprojw || id == ParamId::kFcw || id == ParamId::kFcprojw;
}

bool gpt2_hf_ignored(std::string_view name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
}

std::vector<HfConfigKey> gpt2_hf_config(const ModelShape& s) {
  auto num = [](double v) { return fmt::format("{}", v); };
  return {
      {"n_embd", num(s.n_embd)},
      {"n_head", num(s.n_head)},
      {"n_layer", num(s.n_layer)},
      {"n_positions", num(s.seq_len)},
      {"n_ctx", num(s.seq_len)},
      {"vocab_size", num(s.vocab_size)},
      {"n_inner", "null"},  // 4 n_embd
      {"layer_norm_epsilon", "1e-05"},
      {"activation_function", "\"gelu_new\""},  // the tanh approximation, as llm.c's GELU
      {"scale_attn_weights", "true"},
      {"scale_attn_by_inverse_layer_idx", "false"},
      {"reorder_and_upcast_attn", "false"},
      {"tie_word_embeddings", "true"},
      {"initializer_range", "0.02"},
      {"use_cache", "true"},
  };
}

std::vector<HfConfigCheck> gpt2_hf_checks(const ModelShape& s) {
  auto num = [](double v) { return fmt::format("{}", v); };
  return {
      {"model_type", "\"gpt2\"", true, "model.type"},
      {"n_embd", num(s.n_embd), true, "model.n_embd"},
      {"n_layer", num(s.n_layer), true, "model.n_layer"},
      {"n_head", num(s.n_head), true, "model.n_head"},
      {"vocab_size", num(s.vocab_size), true, "model.vocab_size"},
      {"n_positions", num(s.seq_len), true, "model.seq_len", /*at_least=*/true},
      {"layer_norm_epsilon", "1e-05", true, "dstrain's LayerNorm epsilon"},
      {"activation_function", "\"gelu_new\"", false, "dstrain's GELU (the tanh approximation)"},
      {"scale_attn_weights", "true", false, "dstrain's attention (scores scaled by 1/sqrt(head size))"},
      {"scale_attn_by_inverse_layer_idx", "false", false, "dstrain's attention (no per-layer scaling)"},
      {"tie_word_embeddings", "true", false, "GPT-2's tied lm_head"},
  };
}

std::vector<ActBuffer> gpt2_activations(const ModelShape& s, const ModelPart& part,
                                        const ActConfig& cfg) {
  const int64_t BT = static_cast<int64_t>(cfg.B) * cfg.T;
  const int64_t C = s.n_embd, tp = part.tp;
  const int64_t Rl = cfg.sequence_parallel ? BT / tp : BT;  // rows of the residual stream held here
  const int64_t NHl = s.n_head / tp, C3l = 3 * C / tp, Cl = C / tp, C4l = 4 * C / tp;
  const bool layers = part.layer_end > part.layer_begin;
  const ActScope inner = cfg.recompute ? ActScope::kShared : ActScope::kPerLayer;
  const ActTag act = ActTag::kActivations, ws = ActTag::kWorkspace;
  std::vector<ActBuffer> v;
  v.push_back({"input", Rl * C, ActScope::kPerMicroBatch, act});
  if (layers) {
    v.push_back({"ln1", Rl * C, inner, act});
    v.push_back({"ln1_mean", Rl, inner, act, true});
    v.push_back({"ln1_rstd", Rl, inner, act, true});
    v.push_back({"qkv", BT * C3l, inner, act});
    v.push_back({"atty", BT * Cl, inner, act});
    v.push_back({"att_lse", BT * NHl, inner, act, true});
    v.push_back({"res2", Rl * C, inner, act});
    v.push_back({"ln2", Rl * C, inner, act});
    v.push_back({"ln2_mean", Rl, inner, act, true});
    v.push_back({"ln2_rstd", Rl, inner, act, true});
    v.push_back({"fch", BT * C4l, inner, act});
    v.push_back({"fch_gelu", BT * C4l, inner, act});
    v.push_back({"out", Rl * C, ActScope::kPerLayer, act});
  }
  if (part.has_head) {
    v.push_back({"lnf", Rl * C, ActScope::kPerMicroBatch, act});
    v.push_back({"lnf_mean", Rl, ActScope::kPerMicroBatch, act, true});
    v.push_back({"lnf_rstd", Rl, ActScope::kPerMicroBatch, act, true});
    v.push_back({"losses", BT, ActScope::kPerMicroBatch, act, true});
    const int rows = cfg.head_chunk_rows > 0 ? cfg.head_chunk_rows
                                             : head_chunk_rows_default(s, cfg.B, cfg.T, part.tp);
    v.push_back({"logits", static_cast<int64_t>(rows) * (s.padded_vocab_size / tp),
                 ActScope::kShared, ws});
    if (tp > 1) v.push_back({"ce_stats", 3 * static_cast<int64_t>(rows), ActScope::kShared, ws, true});
  }
  // Backward: the residual stream's gradient, flowing in place through the layers.
  v.push_back({"dres", Rl * C, ActScope::kShared, ws});
  if (cfg.sequence_parallel) {
    v.push_back({"sp_gather", BT * C, ActScope::kShared, ws});
    v.push_back({"dln_sp", Rl * C, ActScope::kShared, ws});
  }
  if (layers || part.has_head) v.push_back({"dln", BT * C, ActScope::kShared, ws});
  if (layers) {
    v.push_back({"dqkv", BT * C3l, ActScope::kShared, ws});
    v.push_back({"datty", BT * Cl, ActScope::kShared, ws});
    v.push_back({"dfch", BT * C4l, ActScope::kShared, ws});
    // Per thread two (T, T) score tiles; with 16-bit storage also one head's q, k, v, out, dout,
    // dq, dk, dv in fp32 (8 x T x hs), as runtime/kernels/cpu/attention.cpp converts them.
    const int64_t hs = s.n_embd / s.n_head;
    const int64_t per_thread = 2 * static_cast<int64_t>(cfg.T) * cfg.T + (cfg.storage_bytes == 4 ? 0 : 8 * cfg.T * hs);
    v.push_back({"att_scratch", static_cast<int64_t>(std::max(0, cfg.num_threads)) * per_thread,
                 ActScope::kShared, ws, true});
  }
  return v;
}

}  // namespace ds::model_spec
