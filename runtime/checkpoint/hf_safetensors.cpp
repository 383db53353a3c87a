// Hugging Face weights <-> dstrain's layout, by the family's HfFormat. See hf_safetensors.h. A tp
// rank reads each whole tensor and keeps its rows or columns (model_spec::full_index), so any
// layout imports alone.
#include "checkpoint/hf_safetensors.h"

#include <filesystem>
#include <set>
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
// and lm_head; a stacked tensor's rows divided among its pieces.
std::vector<int64_t> hf_shape(const ms::ModelShape& s, const ms::ParamTensor& t, int pieces) {
  std::vector<int64_t> sh = t.shape;
  if (vocab_rows(t.id)) sh[0] = s.vocab_size;
  sh[0] /= pieces;
  return sh;
}

void check_no_strangers(const SafetensorsSet& set, const ms::ModelShape& s, const std::vector<ms::ParamTensor>& all,
                        const ms::HfFormat& hf) {
  std::set<std::string> known;
  for (const auto& t : all) {
    for (int p = 0; p < ms::hf_pieces(hf, t.id, s); p++) {
      if (!t.per_layer) known.insert(hf.tensor_name(t.id, -1, p));
      for (int l = 0; t.per_layer && l < s.n_layer; l++) known.insert(hf.tensor_name(t.id, l, p));
    }
  }
  if (s.tied()) known.insert(hf.tensor_name(ms::ParamId::kLmHead, -1, 0));  // HF may save the tied copy
  for (const auto& n : set.names()) {
    if (known.count(n) == 0) {
      throw invalid_argument("{}: holds tensor '{}', which this model (model.type {}, {} layers{}) has no place for",
                             set.path(), n, ms::family_of(s).name, s.n_layer, s.tied() ? ", tied embeddings" : "");
    }
  }
}

}  // namespace

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
  const auto all = ms::model_params(shape);
  check_no_strangers(set, shape, all, hf);
  const ms::ParamLayout layout = ms::param_layout(shape, part);
  std::vector<float> full;
  for (const auto& ts : layout.tensors) {
    const ms::ParamTensor& t = ms::find_param(all, ts.id);
    const int pieces = ms::hf_pieces(hf, ts.id, shape);
    const std::vector<int64_t> sh = hf_shape(shape, t, pieces);
    full.assign(static_cast<size_t>(t.numel()), 0.0f);  // padded vocabulary rows stay 0
    for (int p = 0; p < pieces; p++) {
      const std::string name = hf.tensor_name(ts.id, ts.layer, p);
      if (set.find(name) == nullptr) {
        throw Error(ErrorKind::kInvalidArgument, fmt::format("{}: no tensor '{}'", path, name),
                    ts.id == ms::ParamId::kLmHead ? fmt::format("a checkpoint without {} ties it to the embedding: "
                                                                "set model.tie_embeddings true",
                                                                name)
                                                  : "");
      }
      set.read_f32(name, sh, full.data() + static_cast<size_t>(t.numel() / pieces * p));
    }
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
      StTensorOut o{hf.tensor_name(ts.id, ts.layer, p), dtype, hf_shape(shape, t, pieces), {}};
      int64_t n = 1;
      for (int64_t d : o.shape) n *= d;
      const float* from = whole + ts.offset + n * p;
      o.values.assign(from, from + n);  // the first vocab_size rows
      out.push_back(std::move(o));
    }
  }
  std::vector<std::string> files = write_safetensors_dir(dir, out, max_shard_bytes);
  write_file_atomic((fs::path(dir) / "config.json").string(), hf_config_json(shape, dtype));
  files.push_back("config.json");
  return files;
}

}  // namespace ds::rt::ckpt
