// Mixtral (Hugging Face's MixtralForCausalLM): Llama's attention (pre-RMSNorm, RoPE, grouped-query,
// no biases, an lm_head tied or not) with every MLP a sparse mixture of experts. A router
// (block_sparse_moe.gate, (E, C), no bias) scores each token; the softmax over the E experts
// (fp32) picks the top k, whose weights are renormalised to sum to 1; each picked expert is a
// SwiGLU w2(silu(w1 x) * w3 x) of width I, and the token's output is the weighted sum. No capacity
// limit: no token is dropped. Its lists, rules and Hugging Face names, reached through its
// description (family.h); the contracts are shape.h's.
#pragma once

#include <string>
#include <vector>

#include "model_spec/family.h"
#include "model_spec/shape.h"

namespace ds::model_spec {

// Llama's embed_tokens, per-layer norms and q/k/v/o_proj, norm and lm_head (llama_spec.h), and per
// layer the router (E, C) replicated and the stacked experts: w13 (E x 2I, C) column-parallel
// within each expert's w1 and w3 (split_groups 2E: a tp rank holds I/tp rows of each, so its
// expert e is one (2I/tp, C) gate|up matrix), w2 (E x C, I) row-parallel. All normal(0, 0.02).
std::vector<ParamTensor> mixtral_params(const ModelShape& s);
// Llama's buffers (llama_spec.h) with the dense MLP's gu, act, dgu and dact replaced by the
// mixture's, N = B*T rows, NK = N*k routed slots, Il = I/tp:
//   per layer  router_probs (N,E) fp32, topk_idx (N,k) int32, topk_w (N,k) fp32, moe_gu (NK,2Il)
//              (each slot's gate | up, slots sorted by expert), moe_act (NK,Il);
//   shared     router_logits (N,E), moe_slots / moe_pos (NK) int32 (the sort by expert and its
//              inverse), moe_offsets (E+1) int32, moe_xs (NK,C) (the slots' inputs; the
//              backward's input gradients), moe_ys (NK,C) (the experts' outputs; the backward's
//              output gradients), moe_dgu (NK,2Il), moe_dact (NK,Il), moe_dw (NK) fp32 and
//              moe_daux (E) fp32 (workspace).
// With expert parallelism (part.ep > 1, R = moe_expert_rows) the experts' rows are R: moe_gu and
// moe_act (R rows) and per layer moe_ex_x (R,C) (the received inputs in expert order) and
// moe_ep_counts (ep, E/ep) int32 (how many rows each ep rank sent each local expert); shared
// moe_recv (R,C) (rows in source order), moe_perm (2R) int32 (expert <-> source order),
// moe_fbuf (2 max(NK,R)) and moe_ex_w (R) fp32, moe_cnt_send (ep, E/ep) int32.
// A pipeline part also keeps router_wire (per micro-batch, 2 x (2E+2) doubles as fp32 pairs): the
// load-balancing statistics a stage passes on with the activations and their gradient.
// Dropless: every buffer holds all N*k slots whatever the routing, so the sizes do not depend on
// it (the worst case of one expert taking every token is the same bytes).
std::vector<ActBuffer> mixtral_activations(const ModelShape& s, const ModelPart& part, const ActConfig& cfg);
// Rows a part's experts may receive in one layer from N tokens a rank: the N k routed slots
// without expert parallelism; with it (ep > 1) every ep rank's tokens may all pick this rank's
// E/ep experts, each at most min(k, E/ep) times: ep N min(k, E/ep), the dropless worst case the
// buffers are sized for (the plan counts it).
int64_t moe_expert_rows(const ModelShape& s, const ModelPart& part, int64_t N);
// Llama's rules, then 1 <= num_experts_per_tok <= num_local_experts.
void check_mixtral(const ModelShape& s, const RuleNames& names, RuleErrors& out);
// HF's names: the router "model.layers.N.block_sparse_moe.gate.weight"; the stacked experts in
// pieces, "...block_sparse_moe.experts.E.w1.weight" / w3 (pieces 2E and 2E+1 of w13) and
// "...experts.E.w2.weight" (piece E of w2); the rest Llama's.
std::string mixtral_hf_name(ParamId id, int layer, int piece);
int mixtral_hf_pieces(ParamId id, const ModelShape& s);
// config.json's MixtralConfig keys for this shape.
std::vector<HfConfigKey> mixtral_hf_config(const ModelShape& s);

}  // namespace ds::model_spec
