// Loading a model for sampling and generating text (sampling.h).
#include "train/sampling.h"

#include <filesystem>

#include <fmt/format.h>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/hf_safetensors.h"
#include "checkpoint/llmc_format.h"
#include "checkpoint/part_reader.h"
#include "common/error.h"
#include "model_spec/family.h"
#include "data/tokenizer.h"
#include "kernels/dispatch.h"
#include "kernels/typed.h"
#include "model/model.h"
#include "train/initial_weights.h"
#include "train/lora_weights.h"
#include "train/run_config.h"

namespace ds::rt::train {

namespace fs = std::filesystem;
namespace ms = ds::model_spec;

namespace {

class ByteCodec final : public TextCodec {
 public:
  explicit ByteCodec(int vocab) : vocab_(vocab) {}
  std::string name() const override { return "byte-level"; }
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> out;
    for (size_t i = 0; i < text.size(); ++i) {
      const int b = static_cast<unsigned char>(text[i]);
      if (b >= vocab_) {
        throw invalid_argument("the prompt's byte {} (0x{:02x}) at offset {} is outside the model's byte-level "
                               "vocabulary of {}", b, b, i, vocab_);
      }
      out.push_back(b);
    }
    return out;
  }
  std::string decode(const std::vector<int32_t>& tokens) const override { return data::decode_bytes(tokens); }
  int32_t start_token() const override { return '\n' < vocab_ ? '\n' : 0; }

 private:
  int vocab_;
};

// One of data/tokenizer.h's tokenizers (GPT-2 BPE, SentencePiece, llm.c's decode-only file).
class TokenizerCodec final : public TextCodec {
 public:
  TokenizerCodec(std::unique_ptr<data::Tokenizer> tok, std::string from) : tok_(std::move(tok)), from_(std::move(from)) {}
  std::string name() const override { return from_; }
  std::vector<int32_t> encode(const std::string& text) const override {
    if (!tok_->can_encode()) {
      throw invalid_argument("the {} tokenizer decodes only: pass --tokenizer gpt2 --vocab DIR to give a prompt",
                             tok_->name());
    }
    const auto ids = tok_->encode(text);
    return {ids.begin(), ids.end()};
  }
  std::string decode(const std::vector<int32_t>& tokens) const override {
    const std::vector<uint32_t> ids(tokens.begin(), tokens.end());
    return tok_->decode(ids);
  }
  int32_t start_token() const override {
    const int64_t d = tok_->document_token();
    return d >= 0 ? static_cast<int32_t>(d) : 0;  // llm.c's file gives its EOT; no document token: 0
  }

 private:
  std::unique_ptr<data::Tokenizer> tok_;
  std::string from_;
};

// "<display name> (L=2 H=4 C=64 V=256 Vp=256 T=64)", with KV and I where the family has them.
std::string describe(const ms::ModelShape& s) {
  const ms::FamilyDescription& f = ms::family_of(s);
  const std::string kv = f.grouped_query ? fmt::format(" KV={}", s.n_kv_head) : std::string();
  const std::string mlp = f.mlp == ms::MlpKind::kSwiGlu ? fmt::format(" I={}", s.intermediate_size) : std::string();
  return fmt::format("{} (L={} H={}{}{} C={} V={} Vp={} T={}{})", f.display_name, s.n_layer, s.n_head, kv, mlp,
                     s.n_embd, s.vocab_size, s.padded_vocab_size, s.seq_len,
                     !f.head_always_tied && s.tie_embeddings ? " tied" : "");
}

bool same_model(const ms::ModelShape& a, const ms::ModelShape& b) {
  return describe(a) == describe(b) && a.rope_theta == b.rope_theta && a.norm_eps == b.norm_eps;
}

}  // namespace

std::unique_ptr<TextCodec> codec_for(int vocab_size, const data::TokenizerSpec* spec) {
  if (spec != nullptr && spec->kind != "byte") {
    auto tok = data::open_tokenizer(*spec);
    if (tok->vocab_size() > vocab_size) {
      throw invalid_argument("the {} tokenizer ({}) has {} ids, more than the model's vocabulary of {}", tok->name(),
                             spec->path, tok->vocab_size(), vocab_size);
    }
    return std::make_unique<TokenizerCodec>(std::move(tok), spec->kind + " " + spec->path);
  }
  // Byte-level: by default for a vocabulary of 256 or less; named, for any (bytes are ids < 256).
  if (vocab_size <= data::kByteVocabSize || spec != nullptr) return std::make_unique<ByteCodec>(vocab_size);
  throw Error(ErrorKind::kInvalidArgument,
              fmt::format("no tokenizer given for a vocabulary of {} tokens (byte-level covers {})", vocab_size,
                          data::kByteVocabSize),
              "pass the run's tokenizer: --tokenizer gpt2 --vocab DIR, --tokenizer sentencepiece --spm-model FILE "
              "or --tokenizer llmc --llmc-tokenizer gpt2_tokenizer.bin on the command line, or data.tokenizer "
              "{\"kind\", \"path\"} in the config");
}

namespace {
// A step directory, or a training.checkpoint_dir's latest.
std::string step_dir_of(const std::string& dir) {
  if (fs::exists(fs::path(dir) / "manifest.json")) return dir;
  if (!fs::exists(fs::path(dir) / "latest")) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{} is not a dstrain checkpoint: no manifest.json and no latest", dir),
                "pass a step directory (step_N) or a training.checkpoint_dir");
  }
  return *ckpt::latest_checkpoint(dir);
}
}  // namespace

config::JobConfig checkpoint_config(const std::string& dir_in) {
  const std::string dir = step_dir_of(dir_in);
  const auto m = ckpt::read_manifest(dir);
  const std::string where = dir + "/manifest.json";
  try {
    const auto old = ckpt::read_shard_layout(m, where, "parameters");
    return config::parse_job_config(m.at("config").dump(), where, old.world_size);
  } catch (const nlohmann::json::exception& e) {
    throw invalid_argument("{}: corrupt checkpoint manifest: {}", where, e.what());
  } catch (const config::ConfigError& e) {
    throw invalid_argument("{}: the manifest's config does not parse: {}", where, e.what());
  }
}

std::optional<data::TokenizerSpec> config_tokenizer(const config::JobConfig& cfg) {
  if (cfg.data.tokenizer_kind.empty()) return std::nullopt;
  return data::TokenizerSpec{cfg.data.tokenizer_kind, cfg.data.tokenizer_path};
}

SamplingModel load_config_model(const config::JobConfig& cfg) {
  const std::string& root = cfg.training.checkpoint_dir;
  if (!root.empty() && fs::exists(fs::path(root) / "latest")) return load_checkpoint_model(root);
  SamplingModel out;
  out.shape = lora_base_shape(cfg.model.shape);  // LoRA: the base (the adapters start at B = 0)
  const ms::ModelPart whole = ms::ModelPart::whole(out.shape);
  out.params.resize(static_cast<size_t>(ms::param_count(out.shape)));
  if (!cfg.model.init_from.empty()) {
    load_weights_file(cfg.model.init_from, out.shape, whole, out.params.data());
    out.source = fmt::format("{}'s model.init_from {}", cfg.path, cfg.model.init_from);
    return out;
  }
  ModelOptions o;  // the smallest model that holds the weights
  auto model = make_model(out.shape, whole, o, Allocator::process());
  model->init_weights(cfg.training.seed);
  kern::typed::to_host_f32(out.params.data(), model->params(), model->num_params());
  out.source = fmt::format("{}'s initial weights (seed {}, untrained: no checkpoint in training.checkpoint_dir, "
                           "no model.init_from)",
                           cfg.path, cfg.training.seed);
  return out;
}

SamplingModel load_checkpoint_model(const std::string& dir_in) {
  const std::string dir = step_dir_of(dir_in);
  const auto m = ckpt::read_manifest(dir);
  const std::string where = dir + "/manifest.json";
  const auto old = ckpt::read_shard_layout(m, where, "parameters");
  SamplingModel out;
  try {
    const config::JobConfig run = config::parse_job_config(m.at("config").dump(), "", old.world_size);
    out.shape = run.model.shape;
    out.source = fmt::format("checkpoint {} (step {})", dir, m.at("step").get<int64_t>());
  } catch (const nlohmann::json::exception& e) {
    throw invalid_argument("{}: corrupt checkpoint manifest: {}", where, e.what());
  } catch (const config::ConfigError& e) {
    throw invalid_argument("{}: the manifest's config does not parse: {}", where, e.what());
  }
  if (old.num_params != ms::param_count(out.shape)) {
    throw invalid_argument("{}: holds {} parameters, but its config's model {} has {}", where, old.num_params,
                           describe(out.shape), ms::param_count(out.shape));
  }
  ckpt::PartTarget target{out.shape, ms::ModelPart::whole(out.shape), 1, 0, old.pipeline_partition};
  ckpt::PartReader reader(dir, old, target);
  const int64_t n = ms::param_count(out.shape);
  out.params.resize(static_cast<size_t>(n));
  // A LoRA run's checkpoint holds its adapters: the frozen base comes from the run's
  // model.init_from (else its seed, as training started), and the generator gets W + (alpha/r) B A.
  const bool lora = out.shape.lora.on();
  const int64_t first = lora ? ms::param_layout(out.shape, ms::ModelPart::whole(out.shape)).adapter_begin : 0;
  const std::string name = reader.has("master") ? "master" : "params";
  const std::string stored = reader.dtype_of(name);
  if (stored == "f32" || stored.empty()) {
    reader.read(name, 0, n - first, out.params.data() + first);
  } else {
    const DType t = stored == "bf16" ? DType::kBF16 : DType::kF16;
    std::vector<uint16_t> h(static_cast<size_t>(n - first));
    reader.read(name, t, 0, n - first, h.data());
    if (t == DType::kBF16) kern::convert_bf16_to_f32(out.params.data() + first, h.data(), n - first);
    else kern::convert_f16_to_f32(out.params.data() + first, h.data(), n - first);
  }
  if (lora) {
    const config::JobConfig run = config::parse_job_config(m.at("config").dump(), "", old.world_size);
    const ms::ModelShape base = lora_base_shape(out.shape);
    std::vector<float> w(static_cast<size_t>(first));
    const std::string& init = run.model.init_from;
    if (init.empty()) {
      throw invalid_argument("{}: a LoRA checkpoint holds the adapters only, and its run's base was random (no "
                             "model.init_from): export the merged model at the end of training "
                             "(--export-safetensors) to sample it",
                             where);
    }
    load_weights_file(init, base, ms::ModelPart::whole(base), w.data());
    std::copy(w.begin(), w.end(), out.params.begin());
    out.params = merge_lora(out.shape, out.params.data());
    out.shape = base;
    out.source += fmt::format(" (LoRA adapters merged into {})", init);
  }
  return out;
}

SamplingModel load_llmc_model(const std::string& path) {
  SamplingModel out;
  out.shape = ckpt::read_llmc_shape(path);
  out.params.resize(static_cast<size_t>(ms::param_count(out.shape)));
  ckpt::load_llmc(path, out.shape, ms::ModelPart::whole(out.shape), out.params.data());
  out.source = "llm.c file " + path;
  return out;
}

SamplingModel load_hf_model(const std::string& path, const config::JobConfig& cfg) {
  SamplingModel out;
  out.shape = lora_base_shape(cfg.model.shape);  // a LoRA run's merged export is the base model's shape
  out.params.resize(static_cast<size_t>(ms::param_count(out.shape)));
  ckpt::load_hf_safetensors(path, out.shape, ms::ModelPart::whole(out.shape), out.params.data());
  out.source = "Hugging Face safetensors " + path;
  return out;
}

void require_same_model(const SamplingModel& model, const config::JobConfig& cfg) {
  const ms::ModelShape want = lora_base_shape(cfg.model.shape);  // LoRA: sampled merged
  const ms::ModelShape& got = model.shape;
  if (!same_model(got, want)) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{} holds {}, but {}'s model is {}", model.source, describe(got), cfg.path, describe(want)),
                "sample with the config the checkpoint was trained with, or without --config");
  }
}

std::string generate_text(const ms::ModelShape& shape, const float* params, const TextCodec& codec,
                          const GenerateOptions& o) {
  std::vector<int32_t> tokens = o.prompt.empty() ? std::vector<int32_t>{codec.start_token()} : codec.encode(o.prompt);
  if (static_cast<int>(tokens.size()) > shape.seq_len) {
    throw invalid_argument("the prompt is {} tokens, more than the model's context of {} (model.seq_len)",
                           tokens.size(), shape.seq_len);
  }
  Generator gen(shape, params);
  std::mt19937_64 rng(o.seed);
  const float* logits = nullptr;
  for (int32_t t : tokens) logits = gen.feed(t);
  std::vector<int32_t> out;
  for (int i = 0; i < o.tokens; ++i) {
    const int32_t next = sample_token(logits, shape.vocab_size, o.sample, rng);
    out.push_back(next);
    if (gen.position() >= shape.seq_len) break;
    logits = gen.feed(next);
  }
  return o.prompt + codec.decode(out);
}

}  // namespace ds::rt::train
