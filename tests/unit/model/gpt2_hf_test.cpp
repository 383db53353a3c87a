// GPT-2 in Hugging Face's GPT2LMHeadModel layout (checkpoint/hf_safetensors.h with the GPT-2
// family's HfFormat): one tiny model's weights written by tests/unit/model/make_gpt2_hf.py both as
// HF safetensors (Conv1D weights (in, out), an lm_head equal to wte, the old causal-mask buffers)
// and as an llm.c checkpoint, with what PyTorch computes from the HF file by GPT2LMHeadModel's
// forward (float64; tests/data/gpt2_hf.json). Checked here:
//   - the HF import equals the llm.c import value for value (the padded vocabulary's rows zero in
//     both), whole and as one tensor-parallel rank's share, and its loss and logits match the HF
//     forward (fp32 against float64: loss 1e-5 relative, logits 1e-5 absolute);
//   - export then import is bit-exact (one file, or shards with an index); the exported file
//     holds HF's names and shapes (the Conv1D weights (in, out), no lm_head, vocab_size rows)
//     with the source file's values, and a config.json GPT2LMHeadModel reads; a bf16 export
//     reads back as each value rounded once;
//   - a shorter model.seq_len than the file's n_positions reads wpe's first rows;
//   - GPT2Model's names (no "transformer." prefix) import the same;
//   - bad input is an invalid_argument naming the file and the tensor or key.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/hf_safetensors.h"
#include "checkpoint/llmc_format.h"
#include "checkpoint/safetensors.h"
#include "common/error.h"
#include "common/half.h"
#include "core/allocator.h"
#include "model/gpt2.h"
#include "model/generate.h"
#include "model_spec/gpt2_spec.h"

using namespace ds::rt;
namespace ms = ds::model_spec;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string data(const std::string& name) { return std::string(DS_SOURCE_DIR) + "/tests/data/" + name; }

std::string tmp_dir(const std::string& tag) {
  const std::string d = fs::temp_directory_path() / ("ds_gpt2hf_" + tag + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

json reference() {
  std::ifstream f(data("gpt2_hf.json"));
  return json::parse(f);
}

ms::ModelShape shape_of(const json& j) {
  const auto& js = j["shape"];
  ms::ModelShape s;
  s.n_layer = js["n_layer"];
  s.n_head = js["n_head"];
  s.n_embd = js["n_embd"];
  s.vocab_size = js["vocab_size"];
  s.padded_vocab_size = js["padded_vocab_size"];
  s.seq_len = js["seq_len"];
  return s;
}

std::vector<float> import_hf(const std::string& path, const ms::ModelShape& s,
                             const ms::ModelPart& part) {
  std::vector<float> v(static_cast<size_t>(ms::part_param_count(s, part)), -1.0f);
  ckpt::load_hf_safetensors(path, s, part, v.data());
  return v;
}
std::vector<float> import_hf(const std::string& path, const ms::ModelShape& s) {
  return import_hf(path, s, ms::ModelPart::whole(s));
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

float model_loss(const ms::ModelShape& s, const std::vector<float>& params, const json& ref) {
  const int B = ref["B"], T = ref["T"];
  const std::vector<int32_t> in = ref["tokens"].get<std::vector<int32_t>>();
  const std::vector<int32_t> tg = ref["targets"].get<std::vector<int32_t>>();
  Allocator alloc;
  Gpt2 m(s, ms::ModelPart::whole(s), Gpt2Options{B, T}, alloc);
  std::memcpy(m.params().f32(), params.data(), params.size() * sizeof(float));
  auto acts = m.make_activations();
  return m.forward(acts, in.data(), tg.data());
}

// Every tensor of the file at `src`, to edit and write elsewhere.
std::map<std::string, ckpt::StTensorOut> read_all(const std::string& src) {
  const ckpt::SafetensorsFile f(src);
  std::map<std::string, ckpt::StTensorOut> out;
  for (const auto& t : f.tensors()) {
    ckpt::StTensorOut o{t.name, ckpt::StDtype::kF32, t.shape, std::vector<float>(static_cast<size_t>(t.numel()))};
    f.read_f32(t.name, t.shape, o.values.data());
    out.emplace(t.name, std::move(o));
  }
  return out;
}

// The fixture's directory with its tensors and config.json edited, written to a fresh directory.
using Tensors = std::map<std::string, ckpt::StTensorOut>;
std::string edited(const std::string& tag, const std::function<void(Tensors&)>& tensors,
                   const std::function<void(json&)>& config = nullptr) {
  auto t = read_all(data("gpt2_hf/model.safetensors"));
  if (tensors) tensors(t);
  std::vector<ckpt::StTensorOut> out;
  for (auto& [name, o] : t) out.push_back(o);
  const std::string dir = tmp_dir(tag);
  ckpt::write_safetensors(dir + "/model.safetensors", out);
  std::ifstream f(data("gpt2_hf/config.json"));
  json c = json::parse(f);
  if (config) config(c);
  std::ofstream(dir + "/config.json") << c.dump(2);
  return dir;
}

// invalid_argument whose message holds every one of `parts`.
void expect_invalid(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming " << parts.front();
  } catch (const ds::Error& e) {
    EXPECT_EQ(e.kind(), ds::ErrorKind::kInvalidArgument) << e.what();
    for (const auto& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << "\nmissing: " << p;
    }
  }
}

}  // namespace

TEST(Gpt2Hf, ImportEqualsLlmcImportAndMatchesHfForward) {
  omp_set_num_threads(2);
  const json ref = reference();
  const ms::ModelShape s = shape_of(ref);
  ASSERT_GT(s.padded_vocab_size, s.vocab_size);  // the padded rows are exercised
  const std::vector<float> hf = import_hf(data("gpt2_hf"), s);
  std::vector<float> llmc(hf.size(), -2.0f);
  ckpt::load_llmc(data("gpt2_hf.bin"), s, ms::ModelPart::whole(s), llmc.data());
  EXPECT_TRUE(bit_equal(hf, llmc));
  // The same through the file's path rather than its directory.
  EXPECT_TRUE(bit_equal(import_hf(data("gpt2_hf/model.safetensors"), s), llmc));

  const float loss = model_loss(s, hf, ref);
  const double want = ref["loss"];
  EXPECT_NEAR(loss, want, 1e-5 * want);
  EXPECT_EQ(loss, model_loss(s, llmc, ref));

  // Every position's logits of sequence 0 from generation's forward.
  Generator gen(s, hf.data()), gen_llmc(s, llmc.data());
  const std::vector<double> logits = ref["logits0"].get<std::vector<double>>();
  const std::vector<int32_t> tokens = ref["tokens"].get<std::vector<int32_t>>();
  const int T = ref["T"];
  double worst = 0;
  for (int t = 0; t < T; t++) {
    const float* got = gen.feed(tokens[static_cast<size_t>(t)]);
    const float* got_llmc = gen_llmc.feed(tokens[static_cast<size_t>(t)]);
    for (int v = 0; v < s.vocab_size; v++) {
      const double w = logits[static_cast<size_t>(t * s.vocab_size + v)];
      worst = std::max(worst, std::fabs(got[v] - w));
      EXPECT_NEAR(got[v], w, 1e-5) << "position " << t << " token " << v;
      EXPECT_EQ(got[v], got_llmc[v]);
    }
  }
  RecordProperty("worst_logit_error", std::to_string(worst));
}

TEST(Gpt2Hf, TensorParallelRankImportsItsShare) {
  const ms::ModelShape s = shape_of(reference());
  for (int rank = 0; rank < 2; rank++) {
    ms::ModelPart part{1, 2, false, true, 2, rank};  // the last layer and the head, tp 2
    std::vector<float> llmc(static_cast<size_t>(ms::part_param_count(s, part)), -2.0f);
    ckpt::load_llmc(data("gpt2_hf.bin"), s, part, llmc.data());
    EXPECT_TRUE(bit_equal(import_hf(data("gpt2_hf"), s, part), llmc)) << "tp rank " << rank;
  }
}

TEST(Gpt2Hf, ExportRoundTripsInHfNamesAndShapes) {
  const ms::ModelShape s = shape_of(reference());
  const std::vector<float> w = import_hf(data("gpt2_hf"), s);
  const std::string dir = tmp_dir("export");
  const auto files = ckpt::save_hf_safetensors(dir, s, w.data(), ckpt::StDtype::kF32);
  EXPECT_EQ(files, (std::vector<std::string>{"model.safetensors", "config.json"}));
  EXPECT_TRUE(bit_equal(import_hf(dir, s), w));

  // HF's names and shapes, the source file's values: every tensor but the buffers and lm_head.
  const auto src = read_all(data("gpt2_hf/model.safetensors"));
  const ckpt::SafetensorsFile out(dir + "/model.safetensors");
  size_t expected = 0;
  for (const auto& [name, t] : src) {
    if (ms::gpt2_hf_ignored(name) || name == "lm_head.weight") {
      EXPECT_EQ(out.find(name), nullptr) << name;
      continue;
    }
    expected++;
    const ckpt::StTensorInfo* o = out.find(name);
    ASSERT_NE(o, nullptr) << name;
    EXPECT_EQ(o->shape, t.shape) << name;
    std::vector<float> v(static_cast<size_t>(o->numel()));
    out.read_f32(name, o->shape, v.data());
    EXPECT_TRUE(bit_equal(v, t.values)) << name;
  }
  EXPECT_EQ(out.tensors().size(), expected);
  EXPECT_EQ(out.find("transformer.h.1.attn.c_attn.weight")->shape, (std::vector<int64_t>{16, 48}));
  EXPECT_EQ(out.find("transformer.h.1.mlp.c_proj.weight")->shape, (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(out.find("transformer.wte.weight")->shape, (std::vector<int64_t>{30, 16}));  // vocab_size rows

  std::ifstream cf(dir + "/config.json");
  const json c = json::parse(cf);
  EXPECT_EQ(c["architectures"], json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(c["model_type"], "gpt2");
  EXPECT_EQ(c["n_embd"], 16);
  EXPECT_EQ(c["n_head"], 2);
  EXPECT_EQ(c["n_layer"], 2);
  EXPECT_EQ(c["n_positions"], 8);
  EXPECT_EQ(c["n_ctx"], 8);
  EXPECT_EQ(c["vocab_size"], 30);  // the real vocabulary, not the padded 32
  EXPECT_EQ(c["layer_norm_epsilon"], 1e-5);
  EXPECT_EQ(c["activation_function"], "gelu_new");
  EXPECT_EQ(c["tie_word_embeddings"], true);
  EXPECT_EQ(c["torch_dtype"], "float32");

  // Shards of at most 8 KiB with model.safetensors.index.json read back the same.
  const std::string sharded = tmp_dir("shards");
  const auto shard_files = ckpt::save_hf_safetensors(sharded, s, w.data(), ckpt::StDtype::kF32, 8192);
  EXPECT_GT(shard_files.size(), 3u);
  EXPECT_TRUE(fs::exists(sharded + "/model.safetensors.index.json"));
  EXPECT_TRUE(bit_equal(import_hf(sharded, s), w));

  // bf16: each value rounded to bf16 once, read back exactly.
  const std::string dir16 = tmp_dir("export16");
  ckpt::save_hf_safetensors(dir16, s, w.data(), ckpt::StDtype::kBF16);
  const std::vector<float> back = import_hf(dir16, s);
  ASSERT_EQ(back.size(), w.size());
  for (size_t i = 0; i < w.size(); i++) ASSERT_EQ(back[i], ds::bf16_to_f32(ds::f32_to_bf16(w[i]))) << i;
  std::ifstream cf16(dir16 + "/config.json");
  EXPECT_EQ(json::parse(cf16)["torch_dtype"], "bfloat16");
}

TEST(Gpt2Hf, BaseModelNamesWithoutThePrefixImportTheSame) {
  const ms::ModelShape s = shape_of(reference());
  const std::string dir = edited("base", [](auto& t) {
    std::map<std::string, ckpt::StTensorOut> base;
    for (auto& [name, o] : t) {
      if (name == "lm_head.weight") continue;  // GPT2Model has no head
      o.name = name.substr(std::string("transformer.").size());
      base.emplace(o.name, o);
    }
    t = base;
  });
  EXPECT_TRUE(bit_equal(import_hf(dir, s), import_hf(data("gpt2_hf"), s)));
}

TEST(Gpt2Hf, BadInputNamesTheFileAndTheTensorOrKey) {
  const ms::ModelShape s = shape_of(reference());
  // A missing tensor.
  std::string d = edited("missing", [](auto& t) { t.erase("transformer.h.1.mlp.c_fc.bias"); });
  expect_invalid([&] { import_hf(d, s); }, {d, "no tensor 'transformer.h.1.mlp.c_fc.bias'"});
  // c_attn stored (out, in), as if nobody transposed it: both shapes named.
  d = edited("untransposed", [](auto& t) {
    auto& o = t.at("transformer.h.0.attn.c_attn.weight");
    o.shape = {48, 16};
  });
  expect_invalid([&] { import_hf(d, s); }, {d, "transformer.h.0.attn.c_attn.weight", "[48, 16]", "[16, 48]"});
  // A tensor this model has no place for (a third layer).
  d = edited("stranger", [](auto& t) {
    ckpt::StTensorOut o = t.at("transformer.h.1.ln_1.weight");
    o.name = "transformer.h.2.ln_1.weight";
    t.emplace(o.name, o);
  });
  expect_invalid([&] { import_hf(d, s); }, {d, "transformer.h.2.ln_1.weight", "no place"});
  // An lm_head that is not the embedding.
  d = edited("head", [](auto& t) { t.at("lm_head.weight").values[17] += 1.0f; });
  expect_invalid([&] { import_hf(d, s); },
                 {d, "'lm_head.weight' differs from 'transformer.wte.weight'", "row 1, column 1"});
  // config.json: a key missing, a key that disagrees with the model, a GELU dstrain does not run.
  d = edited("nokey", nullptr, [](json& c) { c.erase("n_head"); });
  expect_invalid([&] { import_hf(d, s); }, {d + "/config.json", "no key \"n_head\"", "model.n_head"});
  d = edited("nhead", nullptr, [](json& c) { c["n_head"] = 4; });
  expect_invalid([&] { import_hf(d, s); }, {d + "/config.json", "\"n_head\" is 4", "model.n_head is 2"});
  d = edited("npos", nullptr, [](json& c) { c["n_positions"] = 4; });
  expect_invalid([&] { import_hf(d, s); }, {d + "/config.json", "\"n_positions\" is 4", "model.seq_len is 8",
                                            "at least"});
  d = edited("gelu", nullptr, [](json& c) { c["activation_function"] = "gelu"; });
  expect_invalid([&] { import_hf(d, s); }, {d + "/config.json", "\"activation_function\" is \"gelu\""});
  d = edited("noconfig", nullptr);
  fs::remove(d + "/config.json");
  expect_invalid([&] { import_hf(d, s); }, {d, "no config.json"});
  // The model's own shape disagreeing with the file's tensors (a wider model).
  ms::ModelShape wide = s;
  wide.n_embd = 32;
  d = edited("wide", nullptr, [](json& c) { c["n_embd"] = 32; });
  expect_invalid([&] { import_hf(d, wide); }, {d, "transformer.wte.weight", "[30, 16]", "[30, 32]"});
}

// A shorter context than the file's n_positions: wpe's first seq_len rows, every other tensor the same.
TEST(Gpt2Hf, AShorterContextReadsThePositionTablesFirstRows) {
  const ms::ModelShape s = shape_of(reference());
  ms::ModelShape short_s = s;
  short_s.seq_len = 5;
  const std::vector<float> full = import_hf(data("gpt2_hf"), s), part = import_hf(data("gpt2_hf"), short_s);
  const ms::ParamLayout lf = ms::param_layout(s, ms::ModelPart::whole(s));
  const ms::ParamLayout ls = ms::param_layout(short_s, ms::ModelPart::whole(short_s));
  ASSERT_EQ(lf.tensors.size(), ls.tensors.size());
  for (size_t i = 0; i < ls.tensors.size(); i++) {
    const ms::TensorSlice& a = lf.tensors[i];
    const ms::TensorSlice& b = ls.tensors[i];
    ASSERT_EQ(a.id, b.id);
    EXPECT_EQ(b.numel, a.id == ms::ParamId::kWpe ? 5 * s.n_embd : a.numel);
    for (int64_t k = 0; k < b.numel; k++) {
      ASSERT_EQ(part[static_cast<size_t>(b.offset + k)], full[static_cast<size_t>(a.offset + k)])
          << "tensor #" << static_cast<int>(a.id) << " layer " << a.layer << " element " << k;
    }
  }
}

TEST(Gpt2Hf, WeightsPathsTellSafetensorsFromLlmcFiles) {
  EXPECT_TRUE(ckpt::is_hf_weights_path(data("gpt2_hf")));
  EXPECT_TRUE(ckpt::is_hf_weights_path(data("gpt2_hf/model.safetensors")));
  EXPECT_FALSE(ckpt::is_hf_weights_path(data("gpt2_hf.bin")));
}
