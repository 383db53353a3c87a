// GPT-2 (llm.c's): pre-LayerNorm, learned positions, fused qkv with biases, a 4C GELU MLP, the
// lm_head tied to the token embedding. Its lists and Hugging Face's GPT2LMHeadModel names, reached
// through its description (family.h); the contracts are shape.h's.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model_spec/family.h"
#include "model_spec/shape.h"

namespace ds::model_spec {

// wte (Vp,C) vocab, wpe (maxT,C); per layer ln1w, ln1b (C), qkvw (3C,C) and qkvb (3C) column
// (q, k, v split separately), attprojw (C,C) row, attprojb (C), ln2w, ln2b (C), fcw (4C,C) and
// fcb (4C) column, fcprojw (C,4C) row, fcprojb (C); lnfw, lnfb (C). llm.c's order and names.
std::vector<ParamTensor> gpt2_params(const ModelShape& s);
// Each layer keeps ln1 (B,T,C), ln1_mean, ln1_rstd (B,T), qkv (B,T,3C/tp), atty (B,T,C/tp),
// att_lse (B,NH/tp,T), res2 (B,T,C), ln2 (B,T,C), ln2_mean, ln2_rstd (B,T), fch (B,T,4C/tp),
// fch_gelu (B,T,4C/tp), out (B,T,C); per micro-batch input, and with the head lnf, lnf_mean,
// lnf_rstd, losses; shared dres, dln, dqkv, datty, dfch, att_scratch, logits and ce_stats.
std::vector<ActBuffer> gpt2_activations(const ModelShape& s, const ModelPart& part, const ActConfig& cfg);
// 4C must divide by tp (family.h's check_tp).
void check_gpt2_tp(const ModelShape& s, int tp, const RuleNames& names, RuleErrors& out);

// Offset of one tensor copy (layer -1 for global tensors) in llm.c's checkpoint order: tensor-
// major, each per-layer tensor stored as (L, ...) (wte, wpe, ln1w[0..L), ln1b[0..L), ...,
// lnfw, lnfb). For import/export between llm.c's files and the layer-major ParamLayout.
int64_t llmc_offset(const ModelShape& s, ParamId id, int layer);

// Hugging Face's GPT2LMHeadModel (family.h's HfFormat): the name of one tensor copy
// ("transformer.h.3.mlp.c_fc.weight"; lm_head.weight is the tied wte), one piece each.
std::string gpt2_hf_name(ParamId id, int layer, int piece = 0);
// Conv1D stores qkvw, attprojw, fcw and fcprojw as (in, out): c_attn (C, 3C), attn.c_proj (C, C),
// c_fc (C, 4C), mlp.c_proj (4C, C).
bool gpt2_hf_transposed(ParamId id);
// transformer.h.N.attn.bias and .attn.masked_bias: the causal mask older files saved as buffers.
bool gpt2_hf_ignored(std::string_view name);
// config.json's GPT2Config keys for this shape (vocab_size the real one, not padded).
std::vector<HfConfigKey> gpt2_hf_config(const ModelShape& s);
// What an import requires of config.json: model_type gpt2, n_embd, n_layer, n_head, vocab_size
// and layer_norm_epsilon 1e-5 present and equal, n_positions >= model.seq_len; where given,
// activation_function gelu_new, scale_attn_weights true, scale_attn_by_inverse_layer_idx false,
// tie_word_embeddings true.
std::vector<HfConfigCheck> gpt2_hf_checks(const ModelShape& s);

}  // namespace ds::model_spec
