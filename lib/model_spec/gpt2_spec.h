// GPT-2 (llm.c's): pre-LayerNorm, learned positions, fused qkv with biases, a 4C GELU MLP, the
// lm_head tied to the token embedding. Its lists, reached through its description (family.h);
// the contracts are shape.h's.
#pragma once

#include <cstdint>
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

}  // namespace ds::model_spec
