// dstrain's lora section: low-rank adapters (PEFT's LoRA) on a frozen base model. Its keys are
// PEFT's LoraConfig's under shorter names (r, alpha = lora_alpha, dropout = lora_dropout,
// target_modules) with PEFT's defaults, plus init_from, an adapter directory to start from.
// target_modules is checked against model.type's family (model_spec/lora_targets.h): each name
// must select some of the family's linear layers and none that another name already selects (a
// duplicate, or "c_proj" beside "attn.c_proj"); "all-linear" is expanded to the family's names, as
// PEFT writes them into adapter_config.json. With init_from, r, alpha and target_modules may be
// absent: they are then read from the adapter's adapter_config.json here, so the plan sees the
// adapters too (a value given in both that differs is an error naming both). The file format's
// null for them means absent too, so the resolved config (to_json) reads back. The resolved
// section becomes model.shape.lora (model_spec/shape.h: LoraShape), which the model, the plan and
// checkpoints read.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "config/config_sections.h"
#include "model_spec/family.h"
#include "model_spec/lora_spec.h"
#include "model_spec/lora_targets.h"

namespace ds::config::detail {

namespace {

namespace ms = ds::model_spec;

constexpr double kPeftDefaultAlpha = 8;  // peft.LoraConfig's lora_alpha default

// Present and not null; a null key is declared known and counts as absent.
bool lora_key_given(Section& s, const std::string& key) {
  if (s.has(key) && !s.raw_is_null(key)) return true;
  s.raw(key);
  return false;
}

// Whether the model section names a family (a bad model.type is reported by the model reader;
// checking names against the default family would only add a confusing second message).
bool lora_family_known(const ReadContext& ctx, const JobConfig& cfg) {
  if (!cfg.has_model) return false;
  const Json& model = ctx.doc.value["model"];
  if (!model.contains("type")) return true;  // the default, gpt2
  const Json& t = model["type"];
  return t.is_string() && ms::find_family(t.get<std::string>()) != nullptr;
}

// target_modules: "all-linear" or a non-empty list of non-empty strings, as written.
bool read_lora_target_list(ReadContext& ctx, Section& s, const ms::ModelShape& shape, LoraConfig& out) {
  const Json* v = s.raw("target_modules");
  const std::string where = s.child("target_modules");
  if (v->is_string() && v->get<std::string>() == ms::kLoraAllLinear) {
    out.target_modules = ms::lora_all_linear_names(shape);
    return false;  // expanded: nothing to check name by name
  }
  const std::string expect = fmt::format("a non-empty list of module names or \"{}\"", ms::kLoraAllLinear);
  if (v->is_string()) {
    ctx.error(where, fmt::format("expected {}, got {} (a list of one name is written [{}])", expect, show(*v),
                                 show(*v)));
    return false;
  }
  if (!v->is_array() || v->empty()) {
    ctx.error(where, fmt::format("expected {}, got {}", expect, show(*v)));
    return false;
  }
  bool ok = true;
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& e = (*v)[i];
    if (!e.is_string() || e.get<std::string>().empty()) {
      ctx.error(json_path_index(where, i), fmt::format("expected a module name (a non-empty string), got {}", show(e)));
      ok = false;
    } else if (e.get<std::string>() == ms::kLoraAllLinear) {
      ctx.error(json_path_index(where, i), fmt::format("\"{0}\" stands alone: write \"target_modules\": \"{0}\"",
                                                       ms::kLoraAllLinear));
      ok = false;
    } else {
      out.target_modules.push_back(e.get<std::string>());
    }
  }
  return ok;
}

// A module's path inside a block: "attn.c_proj" of "transformer.h.0.attn.c_proj".
std::string lora_in_block(const ms::ModelShape& shape, ms::ParamId id) {
  std::string p = ms::lora_module_path(shape, id, 0);
  for (int dots = 0; dots < 3; ++dots) p = p.substr(p.find('.') + 1);
  return p;
}

// Each name selects some of the family's modules, none selected by an earlier name.
void check_lora_targets(ReadContext& ctx, const std::string& where, const ms::ModelShape& shape,
                        const std::vector<std::string>& names) {
  std::map<ms::ParamId, size_t> first;  // tensor -> the name that selected it first
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string path = json_path_index(where, i);
    std::vector<ms::ParamId> ids;
    try {
      ids = ms::lora_target_params(shape, names[i]);
    } catch (const Error& e) {
      ctx.error(path, e.what());
      continue;
    }
    for (ms::ParamId id : ids) {
      auto [it, added] = first.emplace(id, i);
      if (added) continue;
      const size_t j = it->second;
      if (names[j] == names[i]) {
        ctx.error(path, fmt::format("\"{}\" is listed twice (first at target_modules[{}])", names[i], j));
      } else {
        ctx.error(path, fmt::format("\"{}\" selects {}, which target_modules[{}] \"{}\" already selects", names[i],
                                    lora_in_block(shape, id), j, names[j]));
      }
      break;
    }
  }
}

}  // namespace

// lora.init_from's adapter_config.json: what the config left out (r, alpha, target_modules) is
// taken from it; what both give must agree. False after an error.
static bool fill_from_adapter_config(ReadContext& ctx, Section& s, const ms::ModelShape& shape, LoraConfig& out,
                                     bool r_given, bool alpha_given, bool targets_given) {
  const std::string file = (std::filesystem::path(out.init_from) / "adapter_config.json").string();
  nlohmann::json j;
  try {
    std::ifstream in(file);
    if (!in) {
      ctx.error(s.child("init_from"), fmt::format("cannot read {} (a PEFT adapter directory holds "
                                                  "adapter_config.json and adapter_model.safetensors)", file));
      return false;
    }
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    ctx.error(s.child("init_from"), fmt::format("{} is not valid JSON: {}", file, e.what()));
    return false;
  }
  auto bad = [&](const char* key, const char* what) {
    ctx.error(s.child("init_from"), fmt::format("{}: \"{}\" must be {}", file, key, what));
    return false;
  };
  if (!j.is_object() || !j.contains("r") || !j["r"].is_number_integer() || j["r"].get<int64_t>() < 1) {
    return bad("r", "an integer >= 1");
  }
  const int r = static_cast<int>(j["r"].get<int64_t>());
  const double alpha = j.contains("lora_alpha") && j["lora_alpha"].is_number() ? j["lora_alpha"].get<double>() : 8.0;
  std::vector<std::string> targets;
  const auto& tm = j.contains("target_modules") ? j["target_modules"] : nlohmann::json();
  if (tm.is_string()) {
    targets.push_back(tm.get<std::string>());
  } else if (tm.is_array()) {
    for (const auto& t : tm) {
      if (!t.is_string()) return bad("target_modules", "a list of module names");
      targets.push_back(t.get<std::string>());
    }
  } else {
    return bad("target_modules", "a list of module names");
  }
  // PEFT may keep "all-linear" as written: the family's names, as the config expands it.
  if (targets.size() == 1 && targets[0] == ms::kLoraAllLinear) {
    try {
      targets = ms::lora_all_linear_names(shape);
    } catch (const Error& e) {
      ctx.error(s.child("init_from"), fmt::format("{}: target_modules \"all-linear\": {}", file, e.what()));
      return false;
    }
  }
  auto differs = [&](const char* key, const std::string& mine, const std::string& theirs, const char* file_key) {
    ctx.error(s.child(key), fmt::format("{} but the adapter {} has {} {}: remove {} to use the adapter's", mine, file,
                                        file_key, theirs, key));
  };
  if (!r_given) out.r = r;
  else if (out.r != r) differs("r", fmt::format("r is {}", out.r), std::to_string(r), "r");
  if (!alpha_given) out.alpha = alpha;
  else if (out.alpha != alpha) differs("alpha", fmt::format("alpha is {}", out.alpha), fmt::format("{}", alpha), "lora_alpha");
  if (!targets_given) {
    out.target_modules = targets;
  } else {
    auto sorted = [](std::vector<std::string> v) {
      std::sort(v.begin(), v.end());
      return v;
    };
    if (sorted(out.target_modules) != sorted(targets)) {
      differs("target_modules", fmt::format("target_modules is [{}]", fmt::join(out.target_modules, ", ")),
              fmt::format("[{}]", fmt::join(targets, ", ")), "target_modules");
    }
  }
  return true;
}

void read_lora(ReadContext& ctx, Section& root, JobConfig& cfg) {
  Section s = root.section("lora", /*nullable=*/true);
  LoraConfig& out = cfg.lora;
  out.enabled = s.present();
  if (!s.present()) return;
  const bool r_given = lora_key_given(s, "r");
  if (r_given) s.get_int("r", out.r, 1);
  const bool alpha_given = lora_key_given(s, "alpha");
  if (alpha_given) s.get_number("alpha", out.alpha, 0, kInf, /*lo_open=*/true);
  if (const Json* d = s.raw("dropout"); d != nullptr) {
    if (!d->is_number() || !(d->get<double>() >= 0 && d->get<double>() < 1)) {
      ctx.error(s.child("dropout"), fmt::format("expected a number >= 0 and < 1, got {}", show(*d)));
    } else {
      out.dropout = d->get<double>();
    }
  }
  const bool targets_given = lora_key_given(s, "target_modules");
  bool check_names = false;
  if (targets_given) check_names = read_lora_target_list(ctx, s, cfg.model.shape, out);
  s.get_path("init_from", out.init_from, cfg.path, /*nullable=*/true);
  for (const char* peft_key : {"lora_alpha", "lora_dropout"}) {  // PEFT's names, the likeliest slip
    if (!s.has(peft_key)) continue;
    s.raw(peft_key);
    ctx.error(s.child(peft_key), fmt::format("unknown key (PEFT's {} is \"{}\" here)", peft_key, peft_key + 5));
  }
  s.finish();

  const bool from_adapter = !out.init_from.empty();
  if (!from_adapter) {
    if (!r_given) ctx.error(s.path(), "missing required key \"r\" (the adapters' rank)");
    if (!targets_given) {
      ctx.error(s.path(), fmt::format("missing required key \"target_modules\" (a list of module names, or \"{}\")",
                                      ms::kLoraAllLinear));
    }
  }
  if (!alpha_given) out.alpha = from_adapter ? 0 : kPeftDefaultAlpha;
  if (!cfg.has_model) {
    ctx.error(s.path(), "LoRA needs a model section (the base model whose modules it adapts)");
    return;
  }
  if (check_names && lora_family_known(ctx, cfg)) {
    check_lora_targets(ctx, s.child("target_modules"), cfg.model.shape, out.target_modules);
  }
  const bool complete = r_given && alpha_given && targets_given;  // the runtime checks them against the file
  if (from_adapter && !complete && !fill_from_adapter_config(ctx, s, cfg.model.shape, out, r_given, alpha_given, targets_given)) {
    return;
  }
  if (!lora_family_known(ctx, cfg) || out.r < 1) return;
  // The model's view: its rank, scale, dropout and the tensors adapted.
  ms::LoraShape& l = cfg.model.shape.lora;
  l.r = out.r;
  l.alpha = out.alpha;
  l.dropout = out.dropout;
  l.targets = 0;
  for (const auto& name : out.target_modules) {
    try {
      for (ms::ParamId id : ms::lora_target_params(cfg.model.shape, name)) {
        l.targets |= uint64_t{1} << ms::lora_target_index(id);
      }
    } catch (const Error&) {
      // a name that selects nothing: check_lora_targets has named it at its index
    }
  }
}

Json lora_to_json(const LoraConfig& c) {
  if (!c.enabled) return nullptr;
  return Json{{"r", c.r > 0 ? Json(c.r) : Json(nullptr)},
              {"alpha", c.alpha > 0 ? Json(c.alpha) : Json(nullptr)},
              {"dropout", c.dropout},
              {"target_modules", c.target_modules.empty() ? Json(nullptr) : Json(c.target_modules)},
              {"init_from", string_or_null(c.init_from)}};
}

}  // namespace ds::config::detail
