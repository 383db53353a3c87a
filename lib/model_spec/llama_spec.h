// Llama (Hugging Face's LlamaForCausalLM): pre-RMSNorm, rotary positions, grouped-query
// attention, a SwiGLU MLP, no biases, an lm_head tied or not. Its lists, rules and Hugging Face
// names, reached through its description (family.h); the contracts are shape.h's.
#pragma once

#include <string>
#include <vector>

#include "model_spec/family.h"
#include "model_spec/shape.h"

namespace ds::model_spec {

// embed_tokens (Vp,C) vocab; per layer input_layernorm (C), q_proj (NH*hd,C), k_proj and
// v_proj (KV*hd,C) column (by heads), o_proj (C,NH*hd) row, post_attention_layernorm (C),
// gate_proj and up_proj (I,C) column, down_proj (C,I) row; norm (C); lm_head (Vp,C) vocab unless
// tied. All normal(0, 0.02) (HF's initializer_range), norms 1.
std::vector<ParamTensor> llama_params(const ModelShape& s);
// Each layer keeps ln1 (B,T,C), ln1_rstd (B,T), qkv (B,T,(NH+2KV)hd/tp) (q and k after RoPE),
// atty (B,T,NH hd/tp), att_lse (B,NH/tp,T), res2 (B,T,C), ln2 (B,T,C), ln2_rstd (B,T),
// gu (B,T,2I/tp) (gate | up), act (B,T,I/tp) (silu(gate) * up), out (B,T,C); per micro-batch
// input, and with the head lnf, lnf_rstd, losses; shared dres, dln, dqkv, datty, dgu, dact,
// att_scratch, the RoPE tables rope_cos and rope_sin (T, hd/2) (fp32, workspace), the head's
// logits and ce_stats.
std::vector<ActBuffer> llama_activations(const ModelShape& s, const ModelPart& part, const ActConfig& cfg);
// n_kv_head defaults to n_head (multi-head).
void resolve_llama(ModelShape& s);
// KV in [1, NH] dividing NH, an even head size, I, theta and eps positive (family.h's check).
void check_llama(const ModelShape& s, const RuleNames& names, RuleErrors& out);
// KV and I must divide by tp: each rank holds whole kv heads (family.h's check_tp).
void check_llama_tp(const ModelShape& s, int tp, const RuleNames& names, RuleErrors& out);
// Hugging Face's name of one tensor copy ("model.layers.3.mlp.up_proj.weight"); one piece each.
std::string llama_hf_name(ParamId id, int layer, int piece = 0);
// config.json's LlamaConfig keys for this shape.
std::vector<HfConfigKey> llama_hf_config(const ModelShape& s);

}  // namespace ds::model_spec
