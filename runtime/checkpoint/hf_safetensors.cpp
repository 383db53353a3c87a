// Hugging Face weights <-> dstrain's layout, by the family's HfFormat. See hf_safetensors.h. A tp
// rank reads each whole tensor and keeps its rows or columns (model_spec::full_index), so any
// layout imports alone. Where the format says HF transposes a matrix (GPT-2's Conv1D), the whole
// tensor is read as HF's (in, out) and transposed into dstrain's (out, in) before the rank takes
// its share; an export transposes back.
#include "checkpoint/hf_safetensors.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/atomic_file.h"
#include "common/error.h"

namespace ds::rt::ckpt {

namespace ms = ds::model_spec;
namespace fs = std::filesystem;

namespace {

bool vocab_rows(ms::ParamId id) { return id == ms::ParamId::kWte || id == ms::ParamId::kLmHead; }

// The shape HF stores each of tensor t's `pieces` in: the real vocabulary's rows for the embedding
// and lm_head; a stacked tensor's rows divided among its pieces; (in, out) where HF transposes.
std::vector<int64_t> hf_shape(const ms::ModelShape& s, const ms::HfFormat& hf, const ms::ParamTensor& t, int pieces) {
  std::vector<int64_t> sh = t.shape;
  if (vocab_rows(t.id)) sh[0] = s.vocab_size;
  sh[0] /= pieces;
  if (ms::hf_transposed(hf, t.id)) std::swap(sh[0], sh[1]);
  return sh;
}

// (rows, cols) row-major `from` into (cols, rows) row-major `to`.
void transpose(const float* from, int64_t rows, int64_t cols, float* to) {
  for (int64_t r = 0; r < rows; r++) {
    for (int64_t c = 0; c < cols; c++) to[c * rows + r] = from[r * cols + c];
  }
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// The names one file uses: the format's, or without its base_prefix when the file is the base
// model's (no name starts with the prefix, and the embedding is there without it).
class FileNames {
 public:
  FileNames(const ms::HfFormat& hf, const SafetensorsSet& set) : hf_(hf) {
    if (hf.base_prefix == nullptr) return;
    const std::vector<std::string> names = set.names();
    if (std::any_of(names.begin(), names.end(), [&](const std::string& n) { return starts_with(n, hf.base_prefix); })) {
      return;
    }
    strip_ = hf.base_prefix;
    if (set.find(name(ms::ParamId::kWte, -1, 0)) == nullptr) strip_.clear();  // neither: name the full names
  }
  std::string name(ms::ParamId id, int layer, int piece) const {
    std::string n = hf_.tensor_name(id, layer, piece);
    if (!strip_.empty() && starts_with(n, strip_.c_str())) n.erase(0, strip_.size());
    return n;
  }

 private:
  const ms::HfFormat& hf_;
  std::string strip_;
};

void check_no_strangers(const SafetensorsSet& set, const ms::ModelShape& s, const std::vector<ms::ParamTensor>& all,
                        const ms::HfFormat& hf, const FileNames& names) {
  std::set<std::string> known;
  for (const auto& t : all) {
    for (int p = 0; p < ms::hf_pieces(hf, t.id, s); p++) {
      if (!t.per_layer) known.insert(names.name(t.id, -1, p));
      for (int l = 0; t.per_layer && l < s.n_layer; l++) known.insert(names.name(t.id, l, p));
    }
  }
  if (s.tied()) known.insert(names.name(ms::ParamId::kLmHead, -1, 0));  // HF may save the tied copy
  for (const auto& n : set.names()) {
    if (known.count(n) == 0 && (hf.ignored == nullptr || !hf.ignored(n))) {
      throw invalid_argument("{}: holds tensor '{}', which this model (model.type {}, {} layers{}) has no place for",
                             set.path(), n, ms::family_of(s).name, s.n_layer, s.tied() ? ", tied embeddings" : "");
    }
  }
}

// A tied model's file may hold the head too (older GPT-2 files do): then it must be the embedding.
void check_tied_head(const SafetensorsSet& set, const ms::ModelShape& s, const FileNames& names,
                     const std::vector<int64_t>& shape, const float* wte) {
  const std::string head = names.name(ms::ParamId::kLmHead, -1, 0);
  if (!s.tied() || set.find(head) == nullptr) return;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  set.read_f32(head, shape, v.data());
  for (int64_t i = 0; i < n; i++) {
    if (v[static_cast<size_t>(i)] != wte[i]) {
      const ms::FamilyDescription& f = ms::family_of(s);
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("{}: tensor '{}' differs from '{}' (row {}, column {}: {} against {}), but this {} "
                              "model ties its lm_head to the token embedding",
                              set.path(), head, names.name(ms::ParamId::kWte, -1, 0), i / shape[1], i % shape[1],
                              v[static_cast<size_t>(i)], wte[i], f.display_name),
                  f.head_always_tied ? std::string() : "set model.tie_embeddings false to train an untied head");
    }
  }
}

// The config.json beside the weights (in the directory, or beside the file): each of the format's
// import checks, naming the file and the key.
void check_config_json(const std::string& path, const ms::ModelShape& s, const ms::HfFormat& hf) {
  if (hf.import_checks == nullptr) return;
  std::error_code ec;
  const fs::path dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  const std::string cpath = (dir / "config.json").string();
  const ms::FamilyDescription& f = ms::family_of(s);
  if (!fs::exists(cpath, ec)) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}: no config.json beside the weights ({}): dstrain checks the model's sizes in it "
                            "against model.*",
                            path, cpath),
                fmt::format("copy the config.json of the Hugging Face {} directory the weights come from",
                            f.display_name));
  }
  const nlohmann::json j = nlohmann::json::parse(read_file(cpath, "Hugging Face config"), nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw invalid_argument("{}: expected a JSON object", cpath);
  for (const ms::HfConfigCheck& c : hf.import_checks(s)) {
    const nlohmann::json want = nlohmann::json::parse(c.json);
    if (!j.contains(c.key)) {
      if (!c.required) continue;
      throw invalid_argument("{}: no key \"{}\" (expected {}, from {})", cpath, c.key, want.dump(), c.model_key);
    }
    const nlohmann::json& got = j[c.key];
    if (c.at_least && !(got.is_number() && got.get<double>() >= want.get<double>())) {
      throw invalid_argument("{}: \"{}\" is {}, but {} is {}: it must be at least that", cpath, c.key, got.dump(),
                             c.model_key, want.dump());
    }
    if (!c.at_least && got != want) {
      throw invalid_argument("{}: \"{}\" is {}, but {} is {}", cpath, c.key, got.dump(), c.model_key, want.dump());
    }
  }
}

}  // namespace

bool is_hf_weights_path(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) || fs::path(path).extension() == ".safetensors";
}

const ms::HfFormat& hf_format(const ms::ModelShape& shape, const char* what) {
  const ms::FamilyDescription& f = ms::family_of(shape);
  if (f.hf == nullptr) {
    std::string with;
    for (const ms::FamilyDescription* g : ms::all_families()) {
      if (g->hf != nullptr) with += (with.empty() ? "" : ", ") + std::string(g->name);
    }
    throw invalid_argument("{}: model.type {} has no Hugging Face format in dstrain (the families with one: {})", what,
                           f.name, with);
  }
  return *f.hf;
}

void load_hf_safetensors(const std::string& path, const ms::ModelShape& shape, const ms::ModelPart& part,
                         float* params) {
  const ms::HfFormat& hf = hf_format(shape, "training.init_from");
  const SafetensorsSet set(path);
  check_config_json(path, shape, hf);
  const FileNames names(hf, set);
  const auto all = ms::model_params(shape);
  check_no_strangers(set, shape, all, hf, names);
  const ms::ParamLayout layout = ms::param_layout(shape, part);
  std::vector<float> full, stored;
  for (const auto& ts : layout.tensors) {
    const ms::ParamTensor& t = ms::find_param(all, ts.id);
    const int pieces = ms::hf_pieces(hf, ts.id, shape);
    const std::vector<int64_t> sh = hf_shape(shape, hf, t, pieces);
    full.assign(static_cast<size_t>(t.numel()), 0.0f);  // padded vocabulary rows stay 0
    for (int p = 0; p < pieces; p++) {
      const std::string name = names.name(ts.id, ts.layer, p);
      if (set.find(name) == nullptr) {
        throw Error(ErrorKind::kInvalidArgument, fmt::format("{}: no tensor '{}'", path, name),
                    ts.id == ms::ParamId::kLmHead ? fmt::format("a checkpoint without {} ties it to the embedding: "
                                                                "set model.tie_embeddings true",
                                                                name)
                                                  : "");
      }
      float* dst = full.data() + static_cast<size_t>(t.numel() / pieces * p);
      const std::vector<int64_t>& file_shape = set.find(name)->shape;
      if (t.unit == ms::UnitKind::kPositionEmbedding && file_shape.size() == 2 && file_shape[0] > sh[0] &&
          file_shape[1] == sh[1]) {  // a longer table (n_positions > model.seq_len): its first rows
        stored.resize(static_cast<size_t>(file_shape[0] * file_shape[1]));
        set.read_f32(name, file_shape, stored.data());
        std::copy_n(stored.begin(), sh[0] * sh[1], dst);
      } else if (ms::hf_transposed(hf, ts.id)) {
        stored.resize(static_cast<size_t>(sh[0] * sh[1]));
        set.read_f32(name, sh, stored.data());
        transpose(stored.data(), sh[0], sh[1], dst);
      } else {
        set.read_f32(name, sh, dst);
      }
    }
    if (ts.id == ms::ParamId::kWte) check_tied_head(set, shape, names, sh, full.data());
    for (int64_t i = 0; i < ts.numel; i++) {
      params[ts.offset + i] = full[static_cast<size_t>(ms::full_index(t, part.tp, part.tp_rank, i, part.ep, part.ep_rank))];
    }
  }
}

std::string hf_config_json(const ms::ModelShape& s, StDtype dtype) {
  const ms::HfFormat& hf = hf_format(s, "config.json");
  const char* torch_dtype = dtype == StDtype::kBF16 ? "bfloat16" : dtype == StDtype::kF16 ? "float16" : "float32";
  nlohmann::ordered_json j{{"architectures", {hf.architecture}}, {"model_type", hf.model_type}};
  for (const ms::HfConfigKey& k : hf.config(s)) j[k.key] = nlohmann::ordered_json::parse(k.json);
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

std::vector<std::string> save_hf_safetensors(const std::string& dir, const ms::ModelShape& shape, const float* whole,
                                             StDtype dtype, uint64_t max_shard_bytes) {
  const ms::HfFormat& hf = hf_format(shape, "--export-safetensors");
  const auto all = ms::model_params(shape);
  const ms::ParamLayout layout = ms::param_layout(shape, ms::ModelPart::whole(shape));
  std::vector<StTensorOut> out;
  for (const auto& ts : layout.tensors) {
    const ms::ParamTensor& t = ms::find_param(all, ts.id);
    const int pieces = ms::hf_pieces(hf, ts.id, shape);
    for (int p = 0; p < pieces; p++) {
      StTensorOut o{hf.tensor_name(ts.id, ts.layer, p), dtype, hf_shape(shape, hf, t, pieces), {}};
      int64_t n = 1;
      for (int64_t d : o.shape) n *= d;
      const float* from = whole + ts.offset + n * p;
      if (ms::hf_transposed(hf, ts.id)) {  // dstrain's (out, in) = (shape[1], shape[0]) as HF's (in, out)
        o.values.resize(static_cast<size_t>(n));
        transpose(from, o.shape[1], o.shape[0], o.values.data());
      } else {
        o.values.assign(from, from + n);  // the first vocab_size rows
      }
      out.push_back(std::move(o));
    }
  }
  std::vector<std::string> files = write_safetensors_dir(dir, out, max_shard_bytes);
  write_file_atomic((fs::path(dir) / "config.json").string(), hf_config_json(shape, dtype));
  files.push_back("config.json");
  return files;
}

}  // namespace ds::rt::ckpt
