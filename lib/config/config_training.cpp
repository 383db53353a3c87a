// dstrain's data section (the llm.c token files to train and evaluate on: each a path, a glob or
// a list of them, or a weighted blend: a list of {"path", "weight"} objects) and training section
// (steps, seed, evaluation and logging intervals, checkpoints, the device), and DeepSpeed's
// checkpoint section, whose keys are all accepted with a warning: dstrain's checkpoint settings
// live in `training`. Relative paths resolve against the config file's directory. That
// eval_interval needs data.val is a rule across sections (config_validate.cpp).
#include <cmath>

#include <fmt/format.h>

#include "config/config_sections.h"

namespace ds::config::detail {

namespace {

const std::vector<std::string> kDsCheckpointIgnored = {
    "tag_validation", "load_universal", "use_node_local_storage", "parallel_write", "writer"};

// A path, a glob or a non-empty list of them, each resolved against the config's directory.
void get_paths(ReadContext& ctx, Section& s, const std::string& key, std::vector<std::string>& out,
               const std::string& config_path) {
  const Json* v = s.raw(key);
  if (v == nullptr || v->is_null()) return;
  const std::string where = s.child(key);
  auto one = [&](const Json& e, const std::string& path) {
    if (e.is_object()) {
      ctx.error(path, fmt::format("expected a token file path or glob like {} (a list is all paths, or all "
                                  "{{\"path\", \"weight\"}} objects), got {}",
                                  json_path_index(where, 0), show(e)));
      return;
    }
    if (!e.is_string() || e.get<std::string>().empty()) {
      ctx.error(path, fmt::format("expected a token file path or glob (a non-empty string), got {}",
                                  show(e)));
      return;
    }
    out.push_back(resolve_path(config_path, e.get<std::string>()));
  };
  if (v->is_array()) {
    if (v->empty()) ctx.error(where, "expected at least one token file path or glob, got []");
    for (size_t i = 0; i < v->size(); ++i) one((*v)[i], json_path_index(where, i));
  } else {
    one(*v, where);
  }
}

// A weighted blend: a non-empty list of {"path": GLOB, "weight": W}, W finite and >= 0, the
// weights summing to more than 0; each path resolved against the config's directory.
void get_blend(ReadContext& ctx, const Json& list, const std::string& where, std::vector<DataConfig::BlendSource>& out,
               const std::string& config_path) {
  bool weights_valid = true;
  double total = 0;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = json_path_index(where, i);
    const Json& e = list[i];
    if (!e.is_object()) {
      ctx.error(at, fmt::format("expected a {{\"path\": GLOB, \"weight\": W}} object like {} (a list is all "
                                "objects, or all paths), got {}",
                                json_path_index(where, 0), show(e)));
      weights_valid = false;
      continue;
    }
    Section el(ctx, &e, at);
    DataConfig::BlendSource src;
    const Json* path = el.raw("path");
    if (path == nullptr) {
      ctx.error(at, "missing required key \"path\" (the source's token file path or glob)");
    } else if (!path->is_string() || path->get<std::string>().empty()) {
      ctx.error(el.child("path"),
                fmt::format("expected a token file path or glob (a non-empty string), got {}", show(*path)));
    } else {
      src.path = resolve_path(config_path, path->get<std::string>());
    }
    const Json* weight = el.raw("weight");
    if (weight == nullptr) {
      ctx.error(at, "missing required key \"weight\" (the source's share, a number >= 0)");
      weights_valid = false;
    } else if (!weight->is_number() || !std::isfinite(weight->get<double>()) || weight->get<double>() < 0) {
      ctx.error(el.child("weight"), fmt::format("expected a finite number >= 0, got {}", show(*weight)));
      weights_valid = false;
    } else {
      src.weight = weight->get<double>();
      total += src.weight;
    }
    el.finish();
    out.push_back(std::move(src));
  }
  if (weights_valid && !(total > 0)) {
    ctx.error(where, fmt::format("the weights of the {} sources sum to 0; give at least one a positive weight",
                                 list.size()));
  }
}

// data.train or data.val: paths (get_paths) or, when the value is a list whose first element is an
// object, a blend (get_blend).
void get_sources(ReadContext& ctx, Section& s, const std::string& key, std::vector<std::string>& paths,
                 std::vector<DataConfig::BlendSource>& blend, const std::string& config_path) {
  const Json* v = s.raw(key);
  if (v != nullptr && v->is_array() && !v->empty() && v->front().is_object()) {
    get_blend(ctx, *v, s.child(key), blend, config_path);
  } else {
    get_paths(ctx, s, key, paths, config_path);
  }
}

Json paths_to_json(const std::vector<std::string>& paths) {
  if (paths.empty()) return nullptr;
  if (paths.size() == 1) return paths[0];
  return Json(paths);
}

// data.tokenizer: {"kind", "path"}; path required for every kind but byte.
void read_tokenizer(ReadContext& ctx, Section& data, JobConfig& cfg) {
  Section t = data.section("tokenizer", /*nullable=*/true);
  if (!t.present()) return;
  if (!t.has("kind")) ctx.error(t.path(), "missing \"kind\" (byte, gpt2, hf, sentencepiece or llmc)");
  t.get_choice("kind", cfg.data.tokenizer_kind, {"byte", "gpt2", "hf", "sentencepiece", "llmc"});
  t.get_path("path", cfg.data.tokenizer_path, cfg.path, /*nullable=*/true);
  t.finish();
  const std::string& k = cfg.data.tokenizer_kind;
  if (!k.empty() && k != "byte" && cfg.data.tokenizer_path.empty()) {
    ctx.error(t.child("path"), fmt::format("the {} tokenizer needs its files: {}", k,
                                           k == "gpt2"            ? "the vocabulary directory (vocab.json + merges.txt)"
                                           : k == "hf"            ? "tokenizer.json or its directory"
                                           : k == "sentencepiece" ? "the .model file"
                                                                  : "llm.c's gpt2_tokenizer.bin"));
  }
}

// training.eval_tasks: a list of {"task", "data", "limit"}.
void read_eval_tasks(ReadContext& ctx, Section& training, const std::string& config_path, TrainingConfig& out) {
  const Json* v = training.raw("eval_tasks");
  if (v == nullptr || v->is_null()) return;
  const std::string where = training.child("eval_tasks");
  if (!v->is_array()) {
    ctx.error(where, fmt::format("expected a list of {{\"task\", \"data\", \"limit\"}} objects, got {}", show(*v)));
    return;
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const std::string at = json_path_index(where, i);
    if (!(*v)[i].is_object()) {
      ctx.error(at, fmt::format("expected an object {{\"task\", \"data\", \"limit\"}}, got {}", show((*v)[i])));
      continue;
    }
    Section e(ctx, &(*v)[i], at);
    EvalTaskConfig t;
    if (!e.has("task")) ctx.error(at, "missing \"task\" (hellaswag or lambada)");
    if (!e.has("data")) ctx.error(at, "missing \"data\" (the task's jsonl file)");
    e.get_choice("task", t.task, {"hellaswag", "lambada"});
    e.get_path("data", t.data, config_path, /*nullable=*/false);
    e.get_int("limit", t.limit, 0, kI64Max);
    e.finish();
    out.eval_tasks.push_back(t);
  }
}

Json sources_to_json(const std::vector<std::string>& paths, const std::vector<DataConfig::BlendSource>& blend) {
  if (blend.empty()) return paths_to_json(paths);
  Json list = Json::array();
  for (const auto& b : blend) list.push_back(Json{{"path", b.path}, {"weight", b.weight}});
  return list;
}

}  // namespace

bool read_data(ReadContext& ctx, Section& root, JobConfig& cfg) {
  Section s = root.section("data", /*nullable=*/true);
  cfg.has_data = s.present();
  if (!s.present()) return true;
  if (!s.has("train") || s.raw_is_null("train")) {
    s.raw("train");
    ctx.error(s.path(), "missing required key \"train\" (the training token file)");
  } else {
    get_sources(ctx, s, "train", cfg.data.train, cfg.data.train_blend, cfg.path);
  }
  get_sources(ctx, s, "val", cfg.data.val, cfg.data.val_blend, cfg.path);
  s.get_bool("shuffle", cfg.data.shuffle);
  std::string packing = "none";
  if (s.get_choice("packing", packing, {"none", "document"})) {
    cfg.data.packing = packing == "document" ? Packing::kDocument : Packing::kNone;
  }
  bool token_valid = true;
  if (s.raw_is_null("document_token")) {
    s.raw("document_token");  // null: not given (the resolved config writes it so)
  } else {
    token_valid = s.get_int("document_token", cfg.data.document_token, 0, kI32Max) || !s.has("document_token");
  }
  read_tokenizer(ctx, s, cfg);
  s.finish();
  return token_valid;
}

Json data_to_json(const JobConfig& cfg) {
  if (!cfg.has_data) return nullptr;
  return Json{{"train", sources_to_json(cfg.data.train, cfg.data.train_blend)},
              {"val", sources_to_json(cfg.data.val, cfg.data.val_blend)},
              {"shuffle", cfg.data.shuffle},
              {"packing", cfg.data.packing == Packing::kDocument ? "document" : "none"},
              {"document_token", cfg.data.document_token >= 0 ? Json(cfg.data.document_token) : Json(nullptr)},
              {"tokenizer", cfg.data.tokenizer_kind.empty()
                                ? Json(nullptr)
                                : Json{{"kind", cfg.data.tokenizer_kind},
                                       {"path", string_or_null(cfg.data.tokenizer_path)}}}};
}

namespace {
// true / false, or {"threshold": K > 0, "window": N >= 2} (enabled).
void read_skip_spikes(ReadContext& ctx, Section& s, TrainingConfig::SkipSpikes& out) {
  const Json* v = s.raw("skip_spikes");
  if (v == nullptr || v->is_null()) return;
  if (v->is_boolean()) {
    out.enabled = v->get<bool>();
    return;
  }
  if (!v->is_object()) {
    ctx.error(s.child("skip_spikes"),
              fmt::format("expected true, false or {{\"threshold\": K, \"window\": N}}, got {}", show(*v)));
    return;
  }
  out.enabled = true;
  Section g = s.section("skip_spikes");
  g.get_bool("enabled", out.enabled);
  g.get_number("threshold", out.threshold, 0, kInf, /*lo_open=*/true);
  g.get_int("window", out.window, 2, 1000000);
  g.finish();
}
}  // namespace

TrainingRead read_training(ReadContext& ctx, Section& root, const std::string& config_path,
                           TrainingConfig& out) {
  TrainingRead read;
  Section s = root.section("training");
  if (!s.raw_is_null("steps")) {
    read.steps_valid = s.get_int("steps", out.steps, 1, kI64Max);
  } else {
    s.raw("steps");
  }
  s.get_u64("seed", out.seed);
  read.eval_interval_given = s.get_int("eval_interval", out.eval_interval, 0);
  s.get_int("eval_steps", out.eval_steps, 1);
  s.get_int("log_interval", out.log_interval, 1);
  s.get_path("checkpoint_dir", out.checkpoint_dir, config_path, /*nullable=*/true);
  bool ckpt_given = s.get_int("checkpoint_interval", out.checkpoint_interval, 0);
  s.get_int("keep_last", out.keep_last, 0);
  const bool async_given = s.get_bool("checkpoint_async", out.checkpoint_async);
  s.get_choice("device", out.device, {"cpu", "cuda"});
  s.get_number("comm_timeout", out.comm_timeout, 0, kInf, /*lo_open=*/true);
  s.get_number("peak_tflops", out.peak_tflops, 0);
  s.get_int("sample_interval", out.sample_interval, 0);
  read_eval_tasks(ctx, s, config_path, out);
  read_skip_spikes(ctx, s, out.skip_spikes);
  s.get_number("straggler_slower_by", out.straggler_slower_by, 0, kInf, /*lo_open=*/true);
  s.get_int("straggler_steps", out.straggler_steps, 1);
  s.get_bool("sync_loss_once", out.sync_loss_once);
  s.get_bool("sync_norm_once", out.sync_norm_once);
  s.get_bool("cuda_graph", out.cuda_graph);
  s.finish();
  if (!out.eval_tasks.empty() && out.eval_interval == 0) {
    ctx.error(s.child("eval_tasks"), "eval_tasks run every training.eval_interval steps: set eval_interval > 0");
  }
  if (async_given && out.checkpoint_async && out.checkpoint_dir.empty()) {
    ctx.warn(s.child("checkpoint_async"), "checkpoint_async does nothing without training.checkpoint_dir");
  }
  if (ckpt_given && out.checkpoint_interval > 0 && out.checkpoint_dir.empty()) {
    ctx.error(s.child("checkpoint_interval"),
              fmt::format("checkpoint_interval {} needs training.checkpoint_dir",
                          out.checkpoint_interval));
  }
  return read;
}

namespace {
Json eval_tasks_to_json(const std::vector<EvalTaskConfig>& tasks) {
  Json a = Json::array();
  for (const auto& t : tasks) a.push_back(Json{{"task", t.task}, {"data", t.data}, {"limit", t.limit}});
  return a;
}
}  // namespace

Json training_to_json(const TrainingConfig& c) {
  return Json{{"steps", c.steps > 0 ? Json(c.steps) : Json(nullptr)},
              {"seed", c.seed},
              {"eval_interval", c.eval_interval},
              {"eval_steps", c.eval_steps},
              {"log_interval", c.log_interval},
              {"checkpoint_dir", string_or_null(c.checkpoint_dir)},
              {"checkpoint_interval", c.checkpoint_interval},
              {"keep_last", c.keep_last},
              {"checkpoint_async", c.checkpoint_async},
              {"device", c.device},
              {"comm_timeout", c.comm_timeout},
              {"peak_tflops", c.peak_tflops},
              {"sample_interval", c.sample_interval},
              {"eval_tasks", eval_tasks_to_json(c.eval_tasks)},
              {"straggler_slower_by", c.straggler_slower_by},
              {"straggler_steps", c.straggler_steps},
              {"sync_loss_once", c.sync_loss_once},
              {"sync_norm_once", c.sync_norm_once},
              {"cuda_graph", c.cuda_graph},
              {"skip_spikes", c.skip_spikes.enabled ? Json{{"enabled", true},
                                                           {"threshold", c.skip_spikes.threshold},
                                                           {"window", c.skip_spikes.window}}
                                                    : Json(false)}};
}

void read_checkpoint(Section& root) {
  Section s = root.section("checkpoint");
  s.ignored(kDsCheckpointIgnored);
  s.finish();
}

Json checkpoint_to_json(const CheckpointConfig&) { return Json::object(); }

}  // namespace ds::config::detail
