// dstrain's model section (the shape: layers, heads, width, vocabulary, sequence length, and
// weights to start from; type "llama" adds n_kv_head, intermediate_size, rope_theta, norm_eps and
// tie_embeddings) and the activation_checkpointing section, whose one acted-on key is dstrain's
// `enabled` (DeepSpeed's own keys are accepted with a warning).
// Resolved here: padded_vocab_size defaults to vocab_size rounded up to a multiple of 128 for
// GPT-2, as llm.c pads 50257 to 50304, and to vocab_size for Llama (Hugging Face does not pad);
// n_kv_head defaults to n_head. Whether the shape divides over tensor_parallel.size and
// pipeline.stages is a rule across sections (config_validate.cpp).
#include <fmt/format.h>

#include "config/config_sections.h"

namespace ds::config::detail {

namespace {

const std::vector<std::string> kDsActivationCkptIgnored = {
    "partition_activations", "contiguous_memory_optimization", "cpu_checkpointing",
    "number_checkpoints", "synchronize_checkpoint_boundary", "profile"};

// Rounds up to a multiple of 128, as llm.c pads GPT-2's 50257 to 50304.
int64_t pad_vocab(int64_t v) { return (v + 127) / 128 * 128; }

bool check_llama_shape(ReadContext& ctx, const Section& s, ModelConfig& m) {
  if (m.n_kv_head == 0) m.n_kv_head = m.n_head;
  bool ok = true;
  if (m.n_kv_head > m.n_head || m.n_head % m.n_kv_head != 0) {
    ctx.error(s.child("n_kv_head"), fmt::format("n_kv_head ({}) must divide n_head ({})", m.n_kv_head, m.n_head));
    ok = false;
  }
  if (m.n_embd % m.n_head == 0 && (m.n_embd / m.n_head) % 2 != 0) {
    ctx.error(s.child("n_embd"), fmt::format("the head size n_embd / n_head ({}) must be even for rotary embeddings",
                                             m.n_embd / m.n_head));
    ok = false;
  }
  return ok;
}

// Llama's own keys: read for type llama, an error naming each for type gpt2.
bool read_llama_keys(ReadContext& ctx, Section& s, ModelConfig& m) {
  const char* keys[] = {"n_kv_head", "intermediate_size", "rope_theta", "norm_eps", "tie_embeddings"};
  if (m.type != "llama") {
    bool ok = true;
    for (const char* k : keys) {
      if (!s.has(k)) continue;
      s.raw(k);
      ctx.error(s.child(k), fmt::format("\"{}\" is a Llama key: it needs model.type \"llama\"", k));
      ok = false;
    }
    return ok;
  }
  bool ok = true;
  if (s.has("n_kv_head") && !s.get_int("n_kv_head", m.n_kv_head, 1, kI32Max)) ok = false;
  if (!s.has("intermediate_size")) {
    s.raw("intermediate_size");
    ctx.error(s.path(), "missing required key \"intermediate_size\" (model.type llama: the SwiGLU width)");
    ok = false;
  } else if (!s.get_int("intermediate_size", m.intermediate_size, 1, kI32Max)) {
    ok = false;
  }
  if (s.has("rope_theta") && !s.get_number("rope_theta", m.rope_theta, 0.0, kInf, true)) ok = false;
  if (s.has("norm_eps") && !s.get_number("norm_eps", m.norm_eps, 0.0, 1.0, true)) ok = false;
  s.get_bool("tie_embeddings", m.tie_embeddings);
  for (const char* k : keys) s.raw(k);
  return ok;
}

// Rules within the shape, once every key was valid; returns whether they hold.
bool check_model_shape(ReadContext& ctx, const Section& s, bool padded_given, ModelConfig& m) {
  bool ok = true;
  if (!padded_given) {
    m.padded_vocab_size = m.type == "llama" ? m.vocab_size : static_cast<int>(pad_vocab(m.vocab_size));
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
  if (m.type == "llama" && ok) ok = check_llama_shape(ctx, s, m);
  return ok;
}

}  // namespace

bool read_model(ReadContext& ctx, Section& root, JobConfig& cfg) {
  Section s = root.section("model", /*nullable=*/true);
  cfg.has_model = s.present();
  if (!s.present()) return true;
  bool ok = true;
  ModelConfig& m = cfg.model;
  auto required_int = [&](const char* key, int& out, int64_t lo, int64_t hi) {
    if (!s.has(key)) {
      s.raw(key);
      ctx.error(s.path(), fmt::format("missing required key \"{}\"", key));
      ok = false;
    } else if (!s.get_int(key, out, lo, hi)) {
      ok = false;
    }
  };
  s.get_choice("type", m.type, {"gpt2", "llama"});
  required_int("n_layer", m.n_layer, 1, kI32Max);
  required_int("n_head", m.n_head, 1, kI32Max);
  required_int("n_embd", m.n_embd, 1, kI32Max);
  // Token files hold uint16 ids, so training needs <= 65536; a Llama's larger vocabulary (Llama 3's
  // 128256) is accepted for dstrain plan, and dstrain train refuses it (data::TokenFile).
  required_int("vocab_size", m.vocab_size, 1, m.type == "llama" ? kI32Max : 65536);
  if (!read_llama_keys(ctx, s, m)) ok = false;
  required_int("seq_len", m.seq_len, 1, kI32Max);
  bool padded_given = s.has("padded_vocab_size");
  if (padded_given && !s.get_int("padded_vocab_size", m.padded_vocab_size, 1)) ok = false;
  if (!padded_given) s.raw("padded_vocab_size");
  s.get_path("init_from", m.init_from, cfg.path, /*nullable=*/true);
  s.finish();
  if (ok) ok = check_model_shape(ctx, s, padded_given, m);
  return ok;
}

Json model_to_json(const JobConfig& cfg) {
  if (!cfg.has_model) return nullptr;
  const ModelConfig& m = cfg.model;
  Json j{{"type", m.type},
         {"n_layer", m.n_layer},
         {"n_head", m.n_head},
         {"n_embd", m.n_embd},
         {"vocab_size", m.vocab_size},
         {"padded_vocab_size", m.padded_vocab_size},
         {"seq_len", m.seq_len},
         {"init_from", string_or_null(m.init_from)}};
  if (m.type == "llama") {
    j["n_kv_head"] = m.n_kv_head;
    j["intermediate_size"] = m.intermediate_size;
    j["rope_theta"] = m.rope_theta;
    j["norm_eps"] = m.norm_eps;
    j["tie_embeddings"] = m.tie_embeddings;
  }
  return j;
}

void read_activation_checkpointing(Section& root, ActivationCheckpointingConfig& out) {
  Section s = root.section("activation_checkpointing");
  s.get_bool("enabled", out.enabled);
  s.ignored(kDsActivationCkptIgnored);
  s.finish();
}

Json activation_checkpointing_to_json(const ActivationCheckpointingConfig& c) {
  return Json{{"enabled", c.enabled}};
}

}  // namespace ds::config::detail
