// dstrain's model section (the shape: layers, heads, width, vocabulary, sequence length, the
// keys of model.type's family, and weights to start from) and the activation_checkpointing
// section, whose one acted-on key is dstrain's `enabled` (DeepSpeed's own keys are accepted with a
// warning).
// The family is data (model_spec/family.h): its description lists its own keys (read here into
// the shape, refused for the other families), how padded_vocab_size defaults (vocab_size rounded
// up to its vocab_multiple: llm.c pads 50257 to 50304) and the largest vocab_size it accepts, the
// defaults it resolves (n_kv_head = n_head) and its shape rules, reported at their keys. Whether
// the shape divides over tensor_parallel.size and pipeline.stages is a rule across sections
// (config_validate.cpp).
#include <fmt/format.h>

#include <algorithm>

#include "config/config_sections.h"
#include "model_spec/family.h"

namespace ds::config::detail {

namespace {

namespace ms = ds::model_spec;

const std::vector<std::string> kDsActivationCkptIgnored = {
    "partition_activations", "contiguous_memory_optimization", "cpu_checkpointing",
    "number_checkpoints", "synchronize_checkpoint_boundary", "profile"};

int64_t round_up(int64_t v, int64_t multiple) { return (v + multiple - 1) / multiple * multiple; }

std::vector<std::string> family_choices() {
  std::vector<std::string> names;
  for (const ms::FamilyDescription* f : ms::all_families()) names.emplace_back(f->name);
  return names;
}

// The families that list `key` among their own: "a Llama key: it needs model.type \"llama\"".
std::string key_owners(const std::string& key) {
  std::string display, types;
  for (const ms::FamilyDescription* f : ms::all_families()) {
    for (const ms::FamilyKey& k : f->keys) {
      if (key != k.key) continue;
      display += (display.empty() ? "" : " or ") + std::string(f->display_name);
      types += (types.empty() ? "" : " or ") + fmt::format("\"{}\"", f->name);
    }
  }
  return fmt::format("a {} key: it needs model.type {}", display, types);
}

bool read_family_key(Section& s, const ms::FamilyKey& k, ms::ModelShape& shape) {
  switch (k.kind) {
    case ms::FamilyKey::Kind::kInt:
      return s.get_int(k.key, shape.*k.int_field, static_cast<int64_t>(k.lo), static_cast<int64_t>(k.hi));
    case ms::FamilyKey::Kind::kNumber:
      return s.get_number(k.key, shape.*k.number_field, k.lo, k.hi, k.lo_open);
    case ms::FamilyKey::Kind::kBool:
      return s.get_bool(k.key, shape.*k.bool_field);
  }
  return false;
}

// Every family's own keys: read for the type's family (required ones must be there), an error
// naming the families that have it for any other.
bool read_family_keys(ReadContext& ctx, Section& s, const ms::FamilyDescription& family, ms::ModelShape& shape) {
  bool ok = true;
  std::vector<std::string> seen;
  for (const ms::FamilyDescription* f : ms::all_families()) {
    for (const ms::FamilyKey& k : f->keys) {
      if (std::find(seen.begin(), seen.end(), k.key) != seen.end()) continue;
      seen.emplace_back(k.key);
      const ms::FamilyKey* own = nullptr;
      for (const ms::FamilyKey& fk : family.keys) {
        if (std::string_view(fk.key) == k.key) own = &fk;
      }
      if (own == nullptr) {
        if (!s.has(k.key)) continue;
        s.raw(k.key);
        ctx.error(s.child(k.key), fmt::format("\"{}\" is {}", k.key, key_owners(k.key)));
        ok = false;
      } else if (!s.has(own->key)) {
        s.raw(own->key);
        if (own->required) {
          ctx.error(s.path(), fmt::format("missing required key \"{}\" (model.type {}: {})", own->key, family.name,
                                          own->what));
          ok = false;
        }
      } else if (!read_family_key(s, *own, shape)) {
        ok = false;
      }
    }
  }
  return ok;
}

// Rules within the shape, once every key was valid; returns whether they hold.
bool check_model_shape(ReadContext& ctx, const Section& s, bool padded_given, const ms::FamilyDescription& family,
                       ms::ModelShape& m) {
  bool ok = true;
  if (!padded_given) {
    m.padded_vocab_size = static_cast<int>(round_up(m.vocab_size, family.vocab_multiple));
  } else if (m.padded_vocab_size < m.vocab_size) {
    ctx.error(s.child("padded_vocab_size"), fmt::format("must be >= vocab_size ({}), got {}",
                                                        m.vocab_size, m.padded_vocab_size));
    ok = false;
  }
  if (m.n_embd % m.n_head != 0) {
    ctx.error(s.child("n_embd"), fmt::format("n_embd ({}) must be divisible by n_head ({})",
                                             m.n_embd, m.n_head));
    ok = false;
  }
  if (!ok) return false;
  if (family.resolve != nullptr) family.resolve(m);
  for (const ms::RuleError& e : ms::family_rule_errors(m, ms::kConfigRuleNames)) {
    ctx.error(s.child(e.key), e.message);
    ok = false;
  }
  return ok;
}

}  // namespace

bool read_model(ReadContext& ctx, Section& root, JobConfig& cfg) {
  Section s = root.section("model", /*nullable=*/true);
  cfg.has_model = s.present();
  if (!s.present()) return true;
  bool ok = true;
  ModelConfig& mc = cfg.model;
  ms::ModelShape& m = mc.shape;
  auto required_int = [&](const char* key, int& out, int64_t lo, int64_t hi) {
    if (!s.has(key)) {
      s.raw(key);
      ctx.error(s.path(), fmt::format("missing required key \"{}\"", key));
      ok = false;
    } else if (!s.get_int(key, out, lo, hi)) {
      ok = false;
    }
  };
  s.get_choice("type", mc.type, family_choices());  // a bad name is reported and leaves the default
  const ms::FamilyDescription* family = ms::find_family(mc.type);
  if (family == nullptr) family = ms::all_families().front();
  m.family = family->family;
  required_int("n_layer", m.n_layer, 1, kI32Max);
  required_int("n_head", m.n_head, 1, kI32Max);
  required_int("n_embd", m.n_embd, 1, kI32Max);
  required_int("vocab_size", m.vocab_size, 1, family->max_vocab_size);
  if (!read_family_keys(ctx, s, *family, m)) ok = false;
  required_int("seq_len", m.seq_len, 1, kI32Max);
  bool padded_given = s.has("padded_vocab_size");
  if (padded_given && !s.get_int("padded_vocab_size", m.padded_vocab_size, 1)) ok = false;
  if (!padded_given) s.raw("padded_vocab_size");
  s.get_path("init_from", mc.init_from, cfg.path, /*nullable=*/true);
  s.finish();
  if (ok) ok = check_model_shape(ctx, s, padded_given, *family, m);
  return ok;
}

Json model_to_json(const JobConfig& cfg) {
  if (!cfg.has_model) return nullptr;
  const ms::ModelShape& m = cfg.model.shape;
  Json j{{"type", cfg.model.type},
         {"n_layer", m.n_layer},
         {"n_head", m.n_head},
         {"n_embd", m.n_embd},
         {"vocab_size", m.vocab_size},
         {"padded_vocab_size", m.padded_vocab_size},
         {"seq_len", m.seq_len},
         {"init_from", string_or_null(cfg.model.init_from)}};
  for (const ms::FamilyKey& k : ms::family_of(m).keys) {
    switch (k.kind) {
      case ms::FamilyKey::Kind::kInt: j[k.key] = m.*k.int_field; break;
      case ms::FamilyKey::Kind::kNumber: j[k.key] = m.*k.number_field; break;
      case ms::FamilyKey::Kind::kBool: j[k.key] = m.*k.bool_field; break;
    }
  }
  return j;
}

void read_activation_checkpointing(Section& root, ActivationCheckpointingConfig& out) {
  Section s = root.section("activation_checkpointing");
  s.get_bool("enabled", out.enabled);
  s.get_choice("mode", out.mode, {"full", "selective"});
  s.ignored(kDsActivationCkptIgnored);
  s.finish();
}

Json activation_checkpointing_to_json(const ActivationCheckpointingConfig& c) {
  return Json{{"enabled", c.enabled}, {"mode", c.mode}};
}

}  // namespace ds::config::detail
