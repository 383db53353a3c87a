// What every family shares: shape rules, the flat layout, tensor-parallel splits, parameter
// counts and activation totals. See shape.h; each family's lists are in its own file.
#include "model_spec/shape.h"

#include <algorithm>

#include "common/error.h"
#include "model_spec/family.h"
#include "model_spec/lora_spec.h"

namespace ds::model_spec {

namespace {

void throw_first(const RuleErrors& errors) {
  if (!errors.empty()) throw invalid_argument("{}", errors.front().message);
}

}  // namespace

RuleErrors family_rule_errors(const ModelShape& s, const RuleNames& names) {
  RuleErrors out;
  const FamilyDescription& f = family_of(s);
  if (f.check != nullptr) f.check(s, names, out);
  return out;
}

RuleErrors family_tp_rule_errors(const ModelShape& s, int tp, const RuleNames& names) {
  RuleErrors out;
  const FamilyDescription& f = family_of(s);
  if (f.check_tp != nullptr) f.check_tp(s, tp, names, out);
  return out;
}

ModelShape ModelShape::gpt2_124m() { return ModelShape{12, 12, 768, 50257, 50304, 1024}; }

void ModelShape::validate() const {
  auto positive = [](int v, const char* name) {
    if (v <= 0) throw invalid_argument("model.{} must be positive, got {}", name, v);
  };
  positive(n_layer, "n_layer");
  positive(n_head, "n_head");
  positive(n_embd, "n_embd");
  positive(vocab_size, "vocab_size");
  positive(padded_vocab_size, "padded_vocab_size");
  positive(seq_len, "seq_len");
  if (n_embd % n_head != 0) {
    throw invalid_argument("model.n_embd ({}) must be divisible by model.n_head ({})", n_embd,
                           n_head);
  }
  if (padded_vocab_size < vocab_size) {
    throw invalid_argument("model.padded_vocab_size ({}) must be >= model.vocab_size ({})",
                           padded_vocab_size, vocab_size);
  }
  throw_first(family_rule_errors(*this));
}

bool ModelShape::tied() const { return family_of(*this).head_always_tied || tie_embeddings; }

void ModelShape::validate_tp(int tp) const {
  if (tp <= 0) throw invalid_argument("tensor-parallel size must be positive, got {}", tp);
  if (n_head % tp != 0) {
    throw invalid_argument("model.n_head ({}) must be divisible by the tensor-parallel size ({})",
                           n_head, tp);
  }
  throw_first(family_tp_rule_errors(*this, tp));
  if (padded_vocab_size % tp != 0) {
    throw invalid_argument(
        "model.padded_vocab_size ({}) must be divisible by the tensor-parallel size ({})",
        padded_vocab_size, tp);
  }
}

const char* tp_split_name(TpSplit s) {
  switch (s) {
    case TpSplit::kReplicated: return "replicated";
    case TpSplit::kColumn: return "column";
    case TpSplit::kRow: return "row";
    case TpSplit::kVocab: return "vocab";
  }
  return "?";
}

int64_t ParamTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<ParamTensor> model_params(const ModelShape& s) {
  std::vector<ParamTensor> v = family_of(s).params(s);
  if (s.lora.on()) {
    std::vector<ParamTensor> a = lora_params(s, v);
    v.insert(v.end(), a.begin(), a.end());
  }
  return v;
}

const ParamTensor& find_param(const std::vector<ParamTensor>& all, ParamId id) {
  for (const auto& t : all) {
    if (t.id == id) return t;
  }
  throw invalid_argument("parameter tensor #{} is not part of this model", static_cast<int>(id));
}

std::vector<int64_t> local_shape(const ParamTensor& t, int tp, int ep) {
  std::vector<int64_t> sh = t.shape;
  if (t.experts > 0) sh[0] /= ep;
  switch (t.split) {
    case TpSplit::kReplicated: break;
    case TpSplit::kColumn:
    case TpSplit::kVocab: sh[0] /= tp; break;
    case TpSplit::kRow: sh[1] /= tp; break;
  }
  return sh;
}

int64_t local_numel(const ParamTensor& t, int tp, int ep) {
  const int64_t n = t.experts > 0 ? t.numel() / ep : t.numel();
  return t.split == TpSplit::kReplicated ? n : n / tp;
}

namespace {
// One expert's tensor of a stacked expert tensor (one of its t.experts blocks of dim 0).
ParamTensor one_expert(const ParamTensor& t) {
  ParamTensor o = t;
  o.shape[0] /= t.experts;
  o.split_groups = std::max(1, t.split_groups / t.experts);
  o.experts = 0;
  return o;
}
}  // namespace

int64_t full_index(const ParamTensor& t, int tp, int tp_rank, int64_t local_index, int ep, int ep_rank) {
  if (t.experts > 0) {
    // This rank's experts are E/ep consecutive blocks; within one, one expert's tensor split by tp.
    const ParamTensor one = one_expert(t);
    const int64_t per_local = local_numel(one, tp), per_full = one.numel();
    const int64_t e = static_cast<int64_t>(ep_rank) * (t.experts / ep) + local_index / per_local;
    return e * per_full + full_index(one, tp, tp_rank, local_index % per_local);
  }
  if (t.split == TpSplit::kReplicated || tp == 1) return local_index;
  const int64_t rows = t.shape[0];
  const int64_t inner = t.numel() / rows;  // elements per row of the full tensor
  if (t.split == TpSplit::kRow) {
    const int64_t cols = t.shape[1], lcols = cols / tp;
    const int64_t r = local_index / lcols, c = local_index % lcols;
    return r * cols + tp_rank * lcols + c;
  }
  // Column / vocab: dim 0 split, within each of split_groups groups.
  const int64_t group_rows = rows / t.split_groups;
  const int64_t lgroup_rows = group_rows / tp;
  const int64_t lr = local_index / inner, c = local_index % inner;
  const int64_t g = lr / lgroup_rows, within = lr % lgroup_rows;
  const int64_t r = g * group_rows + tp_rank * lgroup_rows + within;
  return r * inner + c;
}

void ModelPart::validate(const ModelShape& s) const {
  if (layer_begin < 0 || layer_end > s.n_layer || layer_begin > layer_end) {
    throw invalid_argument("model part layers [{}, {}) must lie within [0, {}]", layer_begin,
                           layer_end, s.n_layer);
  }
  if (tp_rank < 0 || tp_rank >= tp) {
    throw invalid_argument("tensor-parallel rank {} must lie in [0, {})", tp_rank, tp);
  }
  if (ep_rank < 0 || ep_rank >= ep) throw invalid_argument("expert-parallel rank {} must lie in [0, {})", ep_rank, ep);
  if (ep > 1 && (s.num_local_experts <= 0 || s.num_local_experts % ep != 0)) {
    throw invalid_argument("expert-parallel size {} must divide model.num_local_experts ({})", ep, s.num_local_experts);
  }
  s.validate_tp(tp);
}

int64_t ParamLayout::offset_in_unit(ParamId id) const {
  return in_unit_offsets[static_cast<size_t>(id)];
}

const UnitSlice* ParamLayout::find_unit(UnitKind kind, int layer) const {
  for (const auto& u : units) {
    const bool per_layer = kind == UnitKind::kLayer || kind == UnitKind::kExperts || kind == UnitKind::kAdapters;
    if (u.kind == kind && (!per_layer || u.layer == layer)) return &u;
  }
  return nullptr;
}

const TensorSlice* ParamLayout::find_tensor(ParamId id, int layer) const {
  for (const auto& t : tensors) {
    if (t.id == id && t.layer == layer) return &t;
  }
  return nullptr;
}

ParamLayout param_layout(const ModelShape& s, const ModelPart& part) {
  const auto all = model_params(s);
  ParamLayout out;
  // Offsets inside each unit (identical for every layer).
  int64_t wte_end = 0, wpe_end = 0, layer_end = 0, lnf_end = 0, experts_end = 0, adapters_end = 0;
  for (const auto& t : all) {
    int64_t* cursor = nullptr;
    switch (t.unit) {
      case UnitKind::kTokenEmbedding: cursor = &wte_end; break;
      case UnitKind::kPositionEmbedding: cursor = &wpe_end; break;
      case UnitKind::kLayer: cursor = &layer_end; break;
      case UnitKind::kFinalNorm: cursor = &lnf_end; break;
      case UnitKind::kExperts: cursor = &experts_end; break;
      case UnitKind::kAdapters: cursor = &adapters_end; break;
    }
    out.in_unit_offsets[static_cast<size_t>(t.id)] = *cursor;
    *cursor += local_numel(t, part.tp, part.ep);
  }
  out.layer_numel = layer_end;
  auto add_unit = [&](UnitKind kind, int layer, int64_t numel) {
    if (numel == 0) return;  // a unit this family has no tensors in
    out.units.push_back(UnitSlice{kind, layer, out.total, numel});
    for (const auto& t : all) {
      if (t.unit != kind) continue;
      out.tensors.push_back(TensorSlice{t.id, layer,
                                        out.total + out.in_unit_offsets[static_cast<size_t>(t.id)],
                                        local_numel(t, part.tp, part.ep)});
    }
    out.total += numel;
  };
  // The tied wte lives in a part with the embedding or the head (a last stage keeps its copy).
  if (part.has_embedding || (part.has_head && s.tied())) add_unit(UnitKind::kTokenEmbedding, -1, wte_end);
  if (part.has_embedding) add_unit(UnitKind::kPositionEmbedding, -1, wpe_end);
  for (int l = part.layer_begin; l < part.layer_end; l++) add_unit(UnitKind::kLayer, l, layer_end);
  if (part.has_head) add_unit(UnitKind::kFinalNorm, -1, lnf_end);
  out.expert_begin = out.total;
  for (int l = part.layer_begin; l < part.layer_end; l++) add_unit(UnitKind::kExperts, l, experts_end);
  out.adapter_begin = out.total;
  for (int l = part.layer_begin; l < part.layer_end; l++) add_unit(UnitKind::kAdapters, l, adapters_end);
  return out;
}

namespace {
// The units and tensors of [lo, hi) of `l`, offsets from lo.
ParamLayout region(const ParamLayout& l, int64_t lo, int64_t hi) {
  ParamLayout out;
  out.in_unit_offsets = l.in_unit_offsets;
  for (const auto& u : l.units) {
    if (u.offset < lo || u.offset >= hi) continue;
    out.units.push_back(UnitSlice{u.kind, u.layer, u.offset - lo, u.numel});
    out.total += u.numel;
    if (u.kind == UnitKind::kLayer && out.layer_numel == 0) out.layer_numel = u.numel;
  }
  for (const auto& t : l.tensors) {
    if (t.offset < lo || t.offset >= hi) continue;
    out.tensors.push_back(TensorSlice{t.id, t.layer, t.offset - lo, t.numel});
  }
  out.expert_begin = out.adapter_begin = out.total;
  return out;
}
}  // namespace

ParamLayout dense_region(const ParamLayout& l) {
  ParamLayout d = region(l, 0, l.expert_begin);
  d.layer_numel = l.layer_numel;
  return d;
}
ParamLayout expert_region(const ParamLayout& l) {
  ParamLayout e = region(l, l.expert_begin, l.adapter_begin);
  e.layer_numel = 0;
  e.expert_begin = 0;
  return e;
}
ParamLayout adapter_region(const ParamLayout& l) {
  ParamLayout a = region(l, l.adapter_begin, l.total);
  a.layer_numel = 0;
  a.expert_begin = a.total;
  a.adapter_begin = 0;
  return a;
}

int64_t param_count(const ModelShape& s) { return part_param_count(s, ModelPart::whole(s)); }

int64_t active_param_count(const ModelShape& s) {
  int64_t n = 0;
  for (const auto& t : model_params(s)) {
    const int64_t copies = t.per_layer ? s.n_layer : 1;
    n += copies * (t.experts > 0 ? t.numel() / t.experts * s.num_experts_per_tok : t.numel());
  }
  return n;
}

int64_t layer_param_count(const ModelShape& s, int tp) {
  int64_t n = 0;
  for (const auto& t : model_params(s)) {
    if (t.per_layer) n += local_numel(t, tp);
  }
  return n;
}

int64_t layers_param_count(const ModelShape& s, int l0, int l1, int tp) {
  return static_cast<int64_t>(std::max(0, l1 - l0)) * layer_param_count(s, tp);
}

int64_t part_param_count(const ModelShape& s, const ModelPart& part) {
  return param_layout(s, part).total;
}

// ---- activations ---------------------------------------------------------------------------

int head_chunk_rows_default(const ModelShape& s, int B, int T, int tp) {
  // Equal chunks (a multiple of 16 rows) of at most ~kBudget logits each: big enough for sgemm
  // to amortise packing wte, small enough that (B*T, Vp) logits never exist.
  const int64_t kBudget = int64_t{32} << 20;
  const int64_t vloc = s.padded_vocab_size / tp;
  const int64_t BT = static_cast<int64_t>(B) * T;
  const int64_t max_rows = std::max<int64_t>(16, kBudget / vloc);
  const int64_t chunks = (BT + max_rows - 1) / max_rows;
  int64_t rows = (BT + chunks - 1) / chunks;
  rows = (rows + 15) / 16 * 16;
  return static_cast<int>(std::min(rows, BT));
}

std::vector<ActBuffer> model_activations(const ModelShape& s, const ModelPart& part, const ActConfig& cfg) {
  std::vector<ActBuffer> v = family_of(s).activations(s, part, cfg);
  if (s.lora.on() && part.layer_end > part.layer_begin) {
    // LoRA's scratch, one adapter at a time: A x and its gradient (B*T, r), B (A x) and the scaled
    // output gradient (B*T, widest local output), the input gradient's share (B*T, widest input).
    int64_t in = 0, out = 0;
    for (const auto& t : lora_params(s, family_of(s).params(s))) {
      const auto sh = local_shape(t, part.tp);
      if (is_lora_a(t.id)) in = std::max(in, sh[1]);
      else out = std::max(out, sh[0]);
    }
    const int64_t BT = static_cast<int64_t>(cfg.B) * cfg.T, r = s.lora.r;
    v.push_back({"lora_t", BT * r, ActScope::kShared, ActTag::kWorkspace});
    v.push_back({"lora_dt", BT * r, ActScope::kShared, ActTag::kWorkspace});
    v.push_back({"lora_u", BT * out, ActScope::kShared, ActTag::kWorkspace});
    v.push_back({"lora_dx", BT * in, ActScope::kShared, ActTag::kWorkspace});
    // With dropout the dropped input (B*T, widest input), made again in the backward.
    if (s.lora.dropout > 0) v.push_back({"lora_x", BT * in, ActScope::kShared, ActTag::kWorkspace});
  }
  return v;
}

ActTotals activation_totals(const ModelShape& s, const ModelPart& part, const ActConfig& cfg) {
  ActTotals t;
  const int64_t nl = part.layer_end - part.layer_begin;
  for (const auto& b : model_activations(s, part, cfg)) {
    const int64_t bytes = b.bytes(cfg.storage_bytes);
    switch (b.scope) {
      case ActScope::kPerLayer:
        t.per_layer += b.numel;
        t.per_layer_bytes += bytes;
        break;
      case ActScope::kPerMicroBatch:
        t.per_micro_batch += b.numel;
        t.per_micro_batch_bytes += bytes;
        break;
      case ActScope::kShared:
        (b.tag == ActTag::kActivations ? t.shared_activations : t.shared_workspace) += b.numel;
        (b.tag == ActTag::kActivations ? t.shared_activation_bytes : t.shared_workspace_bytes) += bytes;
        break;
    }
  }
  t.per_micro_batch += t.per_layer * nl;
  t.per_micro_batch_bytes += t.per_layer_bytes * nl;
  return t;
}

}  // namespace ds::model_spec
