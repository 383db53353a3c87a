// LoRA's adapter tensors (lora_spec.h).
#include "model_spec/lora_spec.h"

#include "common/error.h"
#include "model_spec/family.h"

namespace ds::model_spec {

int lora_target_index(ParamId base) {
  for (size_t i = 0; i < kLoraTargetable.size(); i++) {
    if (kLoraTargetable[i] == base) return static_cast<int>(i);
  }
  return -1;
}

namespace {
int checked_index(ParamId base) {
  const int i = lora_target_index(base);
  if (i < 0) throw invalid_argument("parameter tensor #{} cannot carry a LoRA adapter", static_cast<int>(base));
  return i;
}
}  // namespace

ParamId lora_a_id(ParamId base) {
  return static_cast<ParamId>(static_cast<int>(ParamId::kLoraAQkvw) + 2 * checked_index(base));
}
ParamId lora_b_id(ParamId base) { return static_cast<ParamId>(static_cast<int>(lora_a_id(base)) + 1); }

std::optional<ParamId> lora_base_of(ParamId adapter) {
  const int k = static_cast<int>(adapter) - static_cast<int>(ParamId::kLoraAQkvw);
  if (k < 0 || k >= 2 * static_cast<int>(kLoraTargetable.size())) return std::nullopt;
  return kLoraTargetable[static_cast<size_t>(k / 2)];
}

bool is_lora_a(ParamId adapter) {
  return lora_base_of(adapter) && (static_cast<int>(adapter) - static_cast<int>(ParamId::kLoraAQkvw)) % 2 == 0;
}

bool lora_targets(const LoraShape& l, ParamId base) {
  const int i = lora_target_index(base);
  return l.on() && i >= 0 && ((l.targets >> i) & 1u) != 0;
}

std::vector<ParamTensor> lora_params(const ModelShape& s, const std::vector<ParamTensor>& base) {
  std::vector<ParamTensor> out;
  if (!s.lora.on()) return out;
  const int64_t r = s.lora.r;
  for (const auto& t : base) {
    if (!lora_targets(s.lora, t.id)) continue;
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const bool column = t.split == TpSplit::kColumn;
    // The names are unique per tensor: checkpoints key on them.
    out.push_back({lora_a_id(t.id), "lora_A", UnitKind::kAdapters, true, {r, cols},
                   column ? TpSplit::kReplicated : t.split, 1, InitKind::kKaimingUniform});
    out.push_back({lora_b_id(t.id), "lora_B", UnitKind::kAdapters, true, {rows, r},
                   column ? TpSplit::kColumn : TpSplit::kReplicated, column ? t.split_groups : 1, InitKind::kZeros});
  }
  return out;
}

std::vector<ParamId> lora_layer_targets(const ModelShape& s) {
  std::vector<ParamId> out;
  for (const auto& t : family_of(s).params(s)) {
    if (t.per_layer && lora_targets(s.lora, t.id)) out.push_back(t.id);
  }
  return out;
}

}  // namespace ds::model_spec
