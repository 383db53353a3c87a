// Mixtral as shapes (mixtral_spec.h): Llama's lists with the MLP's tensors and buffers replaced by
// the mixture's.
#include "model_spec/mixtral_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <string_view>

#include "common/error.h"
#include "model_spec/llama_spec.h"

namespace ds::model_spec {

std::vector<ParamTensor> mixtral_params(const ModelShape& s) {
  const int64_t C = s.n_embd, E = s.num_local_experts, I = s.intermediate_size;
  std::vector<ParamTensor> v;
  for (ParamTensor& t : llama_params(s)) {
    if (t.id == ParamId::kWgate || t.id == ParamId::kWup || t.id == ParamId::kWdown) continue;
    v.push_back(t);
    if (t.id != ParamId::kMlpNorm) continue;
    using U = UnitKind;
    using S = TpSplit;
    using N = InitKind;
    v.push_back({ParamId::kRouter, "block_sparse_moe.gate", U::kLayer, true, {E, C}, S::kReplicated, 1, N::kNormal});
    v.push_back({ParamId::kExpertW13, "experts.w13", U::kExperts, true, {E * 2 * I, C}, S::kColumn,
                 static_cast<int>(2 * E), N::kNormal, static_cast<int>(E)});
    v.push_back({ParamId::kExpertW2, "experts.w2", U::kExperts, true, {E * C, I}, S::kRow, 1, N::kNormal,
                 static_cast<int>(E)});
  }
  return v;
}

std::vector<ActBuffer> mixtral_activations(const ModelShape& s, const ModelPart& part, const ActConfig& cfg) {
  const int64_t N = static_cast<int64_t>(cfg.B) * cfg.T, C = s.n_embd, E = s.num_local_experts;
  const int64_t NK = N * s.num_experts_per_tok, Il = s.intermediate_size / part.tp;
  const int64_t R = moe_expert_rows(s, part, N), NR = std::max(NK, R), ep = part.ep, El = E / ep;
  const bool layers = part.layer_end > part.layer_begin;
  const ActScope inner = cfg.recompute ? ActScope::kShared : ActScope::kPerLayer;
  const ActScope shared = ActScope::kShared;
  const ActTag act = ActTag::kActivations, ws = ActTag::kWorkspace;
  std::vector<ActBuffer> v;
  for (ActBuffer& b : llama_activations(s, part, cfg)) {
    const std::string_view n = b.name;
    if (n == "gu" || n == "act" || n == "dgu" || n == "dact") continue;
    v.push_back(std::move(b));
  }
  if (!part.has_embedding || !part.has_head) {
    // A pipeline stage passes the statistics on: (2E+2) doubles forward and backward.
    v.push_back({"router_wire", 2 * 2 * (2 * E + 2), ActScope::kPerMicroBatch, act, true});
  }
  if (!layers) return v;
  v.push_back({"router_probs", N * E, inner, act, true});
  v.push_back({"topk_idx", NK, inner, act, true});
  v.push_back({"topk_w", NK, inner, act, true});
  v.push_back({"moe_gu", R * 2 * Il, inner, act});
  v.push_back({"moe_act", R * Il, inner, act});
  if (ep > 1) {
    v.push_back({"moe_ex_x", R * C, inner, act});
    v.push_back({"moe_ep_counts", ep * El, ActScope::kPerLayer, act, true});
  }
  v.push_back({"router_logits", N * E, shared, ws});
  v.push_back({"moe_slots", NK, shared, ws, true});
  v.push_back({"moe_pos", NK, shared, ws, true});
  v.push_back({"moe_offsets", E + 1, shared, ws, true});
  v.push_back({"moe_xs", NK * C, shared, ws});
  v.push_back({"moe_ys", NR * C, shared, ws});
  v.push_back({"moe_dgu", R * 2 * Il, shared, ws});
  v.push_back({"moe_dact", R * Il, shared, ws});
  v.push_back({"moe_dw", NR, shared, ws, true});
  v.push_back({"moe_daux", E, shared, ws, true});
  if (ep > 1) {
    v.push_back({"moe_recv", R * C, shared, ws});
    v.push_back({"moe_perm", 2 * R, shared, ws, true});
    v.push_back({"moe_fbuf", 2 * NR, shared, ws, true});
    v.push_back({"moe_ex_w", R, shared, ws, true});
    v.push_back({"moe_cnt_send", ep * El, shared, ws, true});
  }
  return v;
}

int64_t moe_expert_rows(const ModelShape& s, const ModelPart& part, int64_t N) {
  const int64_t k = s.num_experts_per_tok;
  if (part.ep <= 1) return N * k;
  return part.ep * N * std::min<int64_t>(k, s.num_local_experts / part.ep);
}

void check_mixtral(const ModelShape& s, const RuleNames& n, RuleErrors& out) {
  check_llama(s, n, out);
  const char* p = n.key_prefix;
  if (s.num_local_experts <= 0) {
    out.push_back({"num_local_experts", fmt::format("{}num_local_experts must be positive, got {}", p,
                                                    s.num_local_experts)});
  } else if (s.num_experts_per_tok <= 0 || s.num_experts_per_tok > s.num_local_experts) {
    out.push_back({"num_experts_per_tok", fmt::format("{}num_experts_per_tok ({}) must lie in [1, {}num_local_experts "
                                                      "({})]: each token picks that many of the experts",
                                                      p, s.num_experts_per_tok, p, s.num_local_experts)});
  }
  if (!(s.router_aux_loss_coef >= 0.0)) {
    out.push_back({"router_aux_loss_coef", fmt::format("{}router_aux_loss_coef must be >= 0, got {}", p,
                                                       s.router_aux_loss_coef)});
  }
}

std::string mixtral_hf_name(ParamId id, int layer, int piece) {
  switch (id) {
    case ParamId::kRouter: return fmt::format("model.layers.{}.block_sparse_moe.gate.weight", layer);
    case ParamId::kExpertW13:
      return fmt::format("model.layers.{}.block_sparse_moe.experts.{}.{}.weight", layer, piece / 2,
                         piece % 2 == 0 ? "w1" : "w3");
    case ParamId::kExpertW2:
      return fmt::format("model.layers.{}.block_sparse_moe.experts.{}.w2.weight", layer, piece);
    default: return llama_hf_name(id, layer, piece);
  }
}

int mixtral_hf_pieces(ParamId id, const ModelShape& s) {
  if (id == ParamId::kExpertW13) return 2 * s.num_local_experts;
  if (id == ParamId::kExpertW2) return s.num_local_experts;
  return 1;
}

std::vector<HfConfigKey> mixtral_hf_config(const ModelShape& s) {
  auto num = [](double v) { return fmt::format("{}", v); };
  std::vector<HfConfigKey> v;
  for (HfConfigKey& k : llama_hf_config(s)) {
    if (k.key == "attention_bias" || k.key == "mlp_bias") continue;  // LlamaConfig's own
    v.push_back(std::move(k));
  }
  v.push_back({"num_local_experts", num(s.num_local_experts)});
  v.push_back({"num_experts_per_tok", num(s.num_experts_per_tok)});
  v.push_back({"router_aux_loss_coef", num(s.router_aux_loss_coef)});
  v.push_back({"output_router_logits", "false"});
  v.push_back({"sliding_window", "null"});
  return v;
}

}  // namespace ds::model_spec
