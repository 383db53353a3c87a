// PEFT adapter directories (peft_adapter.h). Reading trusts nothing: adapter_config.json is checked
// key by key (PEFT's own loader fills a missing key with LoraConfig's default, so only peft_type, r
// and target_modules are required here), then every tensor name of adapter_model.safetensors is
// parsed into its module and its half (A or B) before any value is read, so a stray tensor, a
// module with one half or a rank that disagrees with the config fails naming the tensor and never
// reaches the model. The safetensors layer (safetensors.h) has already checked the file itself.
//
// Writing builds the whole tensor list first and checks it, so a bad adapter writes nothing; each
// file is then written atomically, the tensors before the config, so a directory whose config
// exists holds the tensors that go with it.
#include "checkpoint/peft_adapter.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/atomic_file.h"
#include "common/error.h"

namespace ds::rt::ckpt {

namespace fs = std::filesystem;

namespace {

using PeftJson = nlohmann::ordered_json;

constexpr const char* kPeftConfigName = "adapter_config.json";
constexpr const char* kPeftWeightsName = "adapter_model.safetensors";
constexpr const char* kPeftPrefix = "base_model.model.";
constexpr double kPeftDefaultAlpha = 8;  // peft.LoraConfig's lora_alpha default

std::string peft_shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); i++) out += fmt::format("{}{}", i ? ", " : "", s[i]);
  return out + "]";
}

// ---- adapter_config.json ------------------------------------------------------------------

double peft_number(const std::string& path, const PeftJson& j, const char* key, double dflt, double lo, bool lo_open,
                   double hi) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  const PeftJson& v = j[key];
  const double d = v.is_number() ? v.get<double>() : NAN;
  if (!v.is_number() || !(lo_open ? d > lo : d >= lo) || !(d < hi)) {
    throw invalid_argument("{}: \"{}\": expected a number {} {}{}, got {}", path, key, lo_open ? ">" : ">=", lo,
                           std::isinf(hi) ? "" : fmt::format(" and < {}", hi), v.dump());
  }
  return d;
}

// A key PEFT can set to a feature dstrain does not run: refused unless it has its off value.
void refuse_peft_feature(const std::string& path, const PeftJson& j, const char* key, const char* what) {
  if (!j.contains(key)) return;
  const PeftJson& v = j[key];
  const bool off = v.is_null() || v == false || (v.is_object() && v.empty()) || (v.is_array() && v.empty()) ||
                   (std::string_view(key) == "bias" && v == "none");
  if (!off) throw invalid_argument("{}: \"{}\" is {}: {} (dstrain runs plain LoRA)", path, key, v.dump(), what);
}

PeftAdapterConfig parse_peft_config(const std::string& path, const std::string& text) {
  const PeftJson j = PeftJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) throw invalid_argument("{}: expected a JSON object", path);
  if (!j.contains("peft_type")) throw invalid_argument("{}: no \"peft_type\" (a LoRA adapter has \"LORA\")", path);
  if (j["peft_type"] != "LORA") {
    throw invalid_argument("{}: \"peft_type\" is {}: dstrain reads LoRA adapters (\"LORA\")", path,
                           j["peft_type"].dump());
  }
  PeftAdapterConfig c;
  if (!j.contains("r")) throw invalid_argument("{}: no \"r\" (the adapters' rank)", path);
  const PeftJson& r = j["r"];
  if (!r.is_number_integer() || r.get<int64_t>() < 1 || r.get<int64_t>() > (int64_t{1} << 30)) {
    throw invalid_argument("{}: \"r\": expected an integer >= 1, got {}", path, r.dump());
  }
  c.r = static_cast<int>(r.get<int64_t>());
  c.lora_alpha = peft_number(path, j, "lora_alpha", kPeftDefaultAlpha, 0, /*lo_open=*/true, INFINITY);
  c.lora_dropout = peft_number(path, j, "lora_dropout", 0, 0, /*lo_open=*/false, 1);
  const PeftJson* t = j.contains("target_modules") ? &j["target_modules"] : nullptr;
  if (t != nullptr && t->is_string() && !t->get<std::string>().empty()) {
    c.target_modules.push_back(t->get<std::string>());
  } else if (t != nullptr && t->is_array() && !t->empty()) {
    for (size_t i = 0; i < t->size(); i++) {
      if (!(*t)[i].is_string() || (*t)[i].get<std::string>().empty()) {
        throw invalid_argument("{}: \"target_modules\"[{}]: expected a module name, got {}", path, i,
                               (*t)[i].dump());
      }
      c.target_modules.push_back((*t)[i].get<std::string>());
    }
  } else {
    throw invalid_argument("{}: \"target_modules\": expected a non-empty list of module names, got {}", path,
                           t == nullptr ? "nothing" : t->dump());
  }
  if (j.contains("fan_in_fan_out") && !j["fan_in_fan_out"].is_null()) {
    if (!j["fan_in_fan_out"].is_boolean()) {
      throw invalid_argument("{}: \"fan_in_fan_out\": expected true or false, got {}", path,
                             j["fan_in_fan_out"].dump());
    }
    c.fan_in_fan_out = j["fan_in_fan_out"].get<bool>();
  }
  if (j.contains("base_model_name_or_path") && !j["base_model_name_or_path"].is_null()) {
    if (!j["base_model_name_or_path"].is_string()) {
      throw invalid_argument("{}: \"base_model_name_or_path\": expected a string, got {}", path,
                             j["base_model_name_or_path"].dump());
    }
    c.base_model_name_or_path = j["base_model_name_or_path"].get<std::string>();
  }
  refuse_peft_feature(path, j, "use_dora", "DoRA adds a magnitude vector");
  refuse_peft_feature(path, j, "use_rslora", "rsLoRA scales by alpha / sqrt(r)");
  refuse_peft_feature(path, j, "bias", "the adapter trains biases");
  refuse_peft_feature(path, j, "modules_to_save", "the adapter holds whole modules");
  refuse_peft_feature(path, j, "rank_pattern", "modules have their own ranks");
  refuse_peft_feature(path, j, "alpha_pattern", "modules have their own alphas");
  return c;
}

// ---- tensor names -------------------------------------------------------------------------

struct PeftTensorName {
  std::string module;
  bool is_a = false;
};

// base_model.model.<module>.lora_{A,B}[.default].weight, or an error naming the tensor.
PeftTensorName parse_peft_tensor_name(const std::string& path, const std::string& name) {
  static const std::pair<const char*, bool> kSuffixes[] = {{".lora_A.weight", true},
                                                           {".lora_B.weight", false},
                                                           {".lora_A.default.weight", true},
                                                           {".lora_B.default.weight", false}};
  const std::string_view n(name);
  if (n.starts_with(kPeftPrefix)) {
    for (const auto& [suffix, is_a] : kSuffixes) {
      const std::string_view sfx(suffix);
      if (n.size() > std::string_view(kPeftPrefix).size() + sfx.size() && n.ends_with(sfx)) {
        const size_t begin = std::string_view(kPeftPrefix).size();
        return {name.substr(begin, n.size() - sfx.size() - begin), is_a};
      }
    }
  }
  throw invalid_argument("{}: tensor '{}' is not a LoRA weight: expected {}<module>.lora_A.weight or "
                         "{}<module>.lora_B.weight",
                         path, name, kPeftPrefix, kPeftPrefix);
}

}  // namespace

PeftAdapter read_peft_adapter(const std::string& dir) {
  const std::string cpath = (fs::path(dir) / kPeftConfigName).string();
  const std::string wpath = (fs::path(dir) / kPeftWeightsName).string();
  std::error_code ec;
  for (const std::string& p : {cpath, wpath}) {
    if (fs::exists(p, ec)) continue;
    std::string hint = "a PEFT adapter directory holds adapter_config.json and adapter_model.safetensors "
                       "(peft's save_pretrained writes both)";
    if (p == wpath && fs::exists(fs::path(dir) / "adapter_model.bin", ec)) {
      hint = "this adapter was saved as adapter_model.bin (a pickle): re-save it with "
             "save_pretrained(DIR, safe_serialization=True)";
    }
    throw Error(ErrorKind::kInvalidArgument, fmt::format("PEFT adapter {}: no file {}", dir, p), hint);
  }
  PeftAdapter ad;
  ad.config = parse_peft_config(cpath, read_file(cpath, "PEFT adapter config"));
  const int64_t r = ad.config.r;

  const SafetensorsFile file(wpath);
  struct Halves {
    const StTensorInfo* a = nullptr;
    const StTensorInfo* b = nullptr;
  };
  std::vector<std::string> order;
  std::map<std::string, Halves> halves;
  for (const StTensorInfo& t : file.tensors()) {  // data order
    const PeftTensorName pn = parse_peft_tensor_name(wpath, t.name);
    auto [it, added] = halves.emplace(pn.module, Halves{});
    if (added) order.push_back(pn.module);
    const StTensorInfo*& slot = pn.is_a ? it->second.a : it->second.b;
    if (slot != nullptr) {
      throw invalid_argument("{}: tensors '{}' and '{}' are both lora_{} of module {}", wpath, slot->name, t.name,
                             pn.is_a ? "A" : "B", pn.module);
    }
    slot = &t;
    // A is (r, in), B is (out, r): the rank is A's rows and B's columns.
    const bool two_d = t.shape.size() == 2;
    if (!two_d || t.shape[pn.is_a ? 0 : 1] != r) {
      throw invalid_argument("{}: tensor '{}' has shape {}, but {} has r = {}: lora_{} must be {}", wpath, t.name,
                             peft_shape_str(t.shape), cpath, r, pn.is_a ? "A" : "B",
                             pn.is_a ? fmt::format("({}, in)", r) : fmt::format("(out, {})", r));
    }
  }
  if (order.empty()) throw invalid_argument("{}: holds no LoRA weights", wpath);
  for (const std::string& m : order) {
    const Halves& h = halves[m];
    if (h.a == nullptr || h.b == nullptr) {
      throw invalid_argument("{}: module {} has {} but no {}{}.lora_{}.weight", wpath, m,
                             (h.a != nullptr ? h.a : h.b)->name, kPeftPrefix, m, h.a == nullptr ? "A" : "B");
    }
    PeftModuleWeights w;
    w.module = m;
    w.in = h.a->shape[1];
    w.out = h.b->shape[0];
    w.a.resize(static_cast<size_t>(r * w.in));
    w.b.resize(static_cast<size_t>(w.out * r));
    file.read_f32(h.a->name, h.a->shape, w.a.data());
    file.read_f32(h.b->name, h.b->shape, w.b.data());
    ad.modules.push_back(std::move(w));
  }
  return ad;
}

void write_peft_adapter(const std::string& dir, const PeftAdapter& adapter, StDtype dtype) {
  const PeftAdapterConfig& c = adapter.config;
  const std::string where = (fs::path(dir) / kPeftWeightsName).string();
  if (c.r < 1) throw invalid_argument("writing {}: r must be >= 1, got {}", where, c.r);
  std::vector<StTensorOut> tensors;
  std::set<std::string> seen;
  const int64_t r = c.r;
  for (const PeftModuleWeights& m : adapter.modules) {
    if (m.module.empty()) throw invalid_argument("writing {}: a module with an empty name", where);
    if (!seen.insert(m.module).second) throw invalid_argument("writing {}: module {} given twice", where, m.module);
    if (m.in < 1 || m.out < 1 || static_cast<int64_t>(m.a.size()) != r * m.in ||
        static_cast<int64_t>(m.b.size()) != m.out * r) {
      throw invalid_argument("writing {}: module {} (in {}, out {}, r {}) has {} A and {} B values; expected {} "
                             "and {}",
                             where, m.module, m.in, m.out, r, m.a.size(), m.b.size(), r * m.in, m.out * r);
    }
    tensors.push_back({kPeftPrefix + m.module + ".lora_A.weight", dtype, {r, m.in}, m.a});
    tensors.push_back({kPeftPrefix + m.module + ".lora_B.weight", dtype, {m.out, r}, m.b});
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw system_error("create directory {}: {}", dir, ec.message());
  write_safetensors(where, tensors, {{"format", "pt"}});

  auto number = [](double v) {
    return v == std::floor(v) && std::fabs(v) < 1e15 ? PeftJson(static_cast<int64_t>(v)) : PeftJson(v);
  };
  const PeftJson j{{"peft_type", "LORA"},
                   {"task_type", "CAUSAL_LM"},
                   {"r", c.r},
                   {"lora_alpha", number(c.lora_alpha)},
                   {"lora_dropout", c.lora_dropout},
                   {"target_modules", c.target_modules},
                   {"fan_in_fan_out", c.fan_in_fan_out},
                   {"bias", "none"},
                   {"inference_mode", true},
                   {"base_model_name_or_path",
                    c.base_model_name_or_path.empty() ? PeftJson(nullptr) : PeftJson(c.base_model_name_or_path)},
                   {"modules_to_save", nullptr},
                   {"init_lora_weights", true}};
  write_file_atomic((fs::path(dir) / kPeftConfigName).string(), j.dump(2) + "\n");
}

}  // namespace ds::rt::ckpt
