// The cross-section rules (config_validate.h). The batch triad follows DeepSpeed's
// _set_batch_related_parameters: any two of train_batch_size, train_micro_batch_size_per_gpu and
// gradient_accumulation_steps give the third (one alone: accumulation 1), and all three must
// agree, train_batch_size == micro x accumulation x data-parallel size. Where DeepSpeed
// integer-divides and then fails its assertion, the message says which division was not exact.
#include <fmt/format.h>

#include "config/config_validate.h"
#include "model_spec/family.h"

namespace ds::config::detail {

namespace {

std::string top(std::string_view key) { return json_path_child("$", key); }

// All three given: they must agree.
void check_full_triad(ReadContext& ctx, const BatchKeys& b, int64_t dp) {
  const int64_t tbs = b.train_batch_size, mbs = b.micro_batch_size, gas = b.accumulation_steps;
  if (tbs != mbs * gas * dp) {
    ctx.error(top("train_batch_size"),
              fmt::format("{} != train_micro_batch_size_per_gpu x gradient_accumulation_steps "
                          "x data-parallel size = {} x {} x {} = {}",
                          tbs, mbs, gas, dp, mbs * gas * dp));
  }
}

// train_batch_size / (other x dp), or an error naming the key that cannot be derived.
int64_t derive_from_train_batch(ReadContext& ctx, int64_t tbs, int64_t other, int64_t dp,
                                const char* other_name, const char* derived_name) {
  if (tbs % (other * dp) != 0) {
    ctx.error(top("train_batch_size"),
              fmt::format("{} is not divisible by {} x data-parallel size = {} x {} = {}, so {} "
                          "cannot be derived",
                          tbs, other_name, other, dp, other * dp, derived_name));
    return 0;
  }
  return tbs / (other * dp);
}

}  // namespace

void check_eval_needs_val(ReadContext& ctx, const JobConfig& cfg, bool eval_interval_given) {
  const TrainingConfig& t = cfg.training;
  if (eval_interval_given && t.eval_interval > 0 && cfg.has_data && cfg.data.val.empty() && cfg.data.val_blend.empty() &&
      t.eval_tasks.empty()) {
    ctx.error(json_path_child(top("training"), "eval_interval"),
              fmt::format("eval_interval {} needs data.val (a validation token file) or training.eval_tasks",
                          t.eval_interval));
  }
}

void check_one_precision(ReadContext& ctx, const JobConfig& cfg) {
  if (cfg.fp16.enabled && cfg.bf16.enabled) {
    ctx.error(top("bf16"), "fp16 and bf16 cannot both be enabled (as in DeepSpeed)");
    return;
  }
  // Gradients live in one buffer type: what they accumulate in is what they travel in.
  const auto& g = cfg.gradient_types;
  if (g.grad_accum_dtype && g.communication_data_type && *g.grad_accum_dtype != *g.communication_data_type) {
    ctx.error(top("communication_data_type"),
              fmt::format("{} differs from data_types.grad_accum_dtype {}: dstrain accumulates and reduces gradients "
                          "in one type; give one of the two, or the same value",
                          layout::precision_name(*g.communication_data_type), layout::precision_name(*g.grad_accum_dtype)));
    return;
  }
  const layout::Precision grad = cfg.gradient_dtype(), storage = cfg.precision();
  if (grad != storage && grad != layout::Precision::kFp32) {
    ctx.error(g.grad_accum_dtype ? json_path_child(top("data_types"), "grad_accum_dtype") : top("communication_data_type"),
              fmt::format("{} gradients with {} storage: gradients are kept in the storage type or in fp32",
                          layout::precision_name(grad), layout::precision_name(storage)));
  }
}

bool resolve_data_parallel_size(ReadContext& ctx, const SectionsValid& valid, JobConfig& cfg) {
  if (!(valid.pipeline_stages && valid.tensor_parallel_size && valid.context_parallel_size)) return false;
  const int tp = cfg.tensor_parallel.size, pp = cfg.pipeline.stages, cp = cfg.context_parallel.size;
  if (cfg.world_size % (tp * pp * cp) != 0) {
    if (cp > 1) {
      ctx.error(top("context_parallel"),
                fmt::format("world size {} is not divisible by tensor_parallel.size x context_parallel.size x "
                            "pipeline.stages = {} x {} x {} = {} (the data-parallel size must be a whole number)",
                            cfg.world_size, tp, cp, pp, tp * cp * pp));
      return false;
    }
    ctx.error(tp > 1 ? top("tensor_parallel") : top("pipeline"),
              fmt::format("world size {} is not divisible by tensor_parallel.size x "
                          "pipeline.stages = {} x {} = {} (the data-parallel size must be a "
                          "whole number)",
                          cfg.world_size, tp, pp, tp * pp));
    return false;
  }
  cfg.data_parallel_size = cfg.world_size / (tp * pp * cp);
  if (cfg.tensor_parallel.sequence_parallel && tp == 1) {
    ctx.error(json_path_child(top("tensor_parallel"), "sequence_parallel"),
              "sequence parallelism splits the activations over the tensor-parallel ranks: it needs "
              "tensor_parallel.size > 1 (it is 1)");
  }
  return true;
}

void check_zero3_without_pipeline(ReadContext& ctx, const SectionsValid& valid,
                                  const JobConfig& cfg) {
  const int pp = cfg.pipeline.stages;
  if (valid.zero_stage && valid.pipeline_stages && cfg.zero.stage == 3 && pp > 1) {
    ctx.error(top("zero_optimization"),
              fmt::format("ZeRO stage 3 cannot be combined with pipeline parallelism "
                          "(pipeline.stages = {}), as in DeepSpeed; use stage 0-2 or "
                          "pipeline.stages 1",
                          pp));
  }
}

namespace {

// train_micro_batch_size_per_gpu "auto": derived when the other two are numbers, else pending
// with the placeholder 1 (JobConfig::AutoMicroBatch) and the keys not given derived from it.
void resolve_auto_micro_batch_triad(ReadContext& ctx, const BatchKeys& b, JobConfig& cfg) {
  const int64_t dp = cfg.data_parallel_size;
  int64_t tbs = b.train_batch_size, mbs = 1, gas = b.accumulation_steps;
  const bool has_tbs = b.has_train_batch_size, has_gas = b.has_accumulation_steps;
  JobConfig::AutoMicroBatch& a = cfg.auto_micro_batch;
  a.train_batch_size_fixed = has_tbs;
  a.accumulation_steps_fixed = has_gas;
  a.auto_train_batch_size = b.auto_train_batch_size;
  a.auto_accumulation_steps = b.auto_accumulation_steps;
  a.where_micro_batch = ctx.where(top("train_micro_batch_size_per_gpu"));
  a.where_train_batch_size = ctx.where(top("train_batch_size"));
  a.where_accumulation_steps = ctx.where(top("gradient_accumulation_steps"));
  if (has_tbs && has_gas) {
    mbs = derive_from_train_batch(ctx, tbs, gas, dp, "gradient_accumulation_steps",
                                  "train_micro_batch_size_per_gpu");
  } else {
    if (has_tbs && tbs % dp != 0) {
      ctx.error(top("train_batch_size"),
                fmt::format("{} is not divisible by the data-parallel size {}, so no "
                            "train_micro_batch_size_per_gpu (\"auto\") divides a rank's share",
                            tbs, dp));
      return;
    }
    a.pending = true;
    if (!has_gas) gas = has_tbs ? tbs / dp : 1;
    if (!has_tbs) tbs = mbs * gas * dp;
  }
  cfg.train_batch_size = tbs;
  cfg.train_micro_batch_size_per_gpu = mbs;
  cfg.gradient_accumulation_steps = gas;
}

}  // namespace

std::string train_batch_size_auto_note(const JobConfig& cfg) {
  return fmt::format("\"auto\" -> {}: train_micro_batch_size_per_gpu x gradient_accumulation_steps x "
                     "data-parallel size = {} x {} x {}",
                     cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu,
                     cfg.gradient_accumulation_steps, cfg.data_parallel_size);
}

std::string accumulation_steps_auto_note(const JobConfig& cfg, bool train_batch_size_given) {
  return train_batch_size_given
             ? fmt::format("\"auto\" -> {}: train_batch_size / (train_micro_batch_size_per_gpu "
                           "x data-parallel size) = {} / ({} x {})",
                           cfg.gradient_accumulation_steps, cfg.train_batch_size,
                           cfg.train_micro_batch_size_per_gpu, cfg.data_parallel_size)
             : fmt::format("\"auto\" -> {}: without train_batch_size, one micro-batch per "
                           "step (as when absent)",
                           cfg.gradient_accumulation_steps);
}

void resolve_batch_triad(ReadContext& ctx, const BatchKeys& b, JobConfig& cfg) {
  if (b.auto_micro_batch) {
    resolve_auto_micro_batch_triad(ctx, b, cfg);
    return;
  }
  const int64_t dp = cfg.data_parallel_size;
  int64_t tbs = b.train_batch_size, mbs = b.micro_batch_size, gas = b.accumulation_steps;
  const bool has_tbs = b.has_train_batch_size, has_mbs = b.has_micro_batch_size,
             has_gas = b.has_accumulation_steps;
  if (has_tbs && has_mbs && has_gas) {
    check_full_triad(ctx, b, dp);
  } else if (has_tbs && has_mbs) {
    gas = derive_from_train_batch(ctx, tbs, mbs, dp, "train_micro_batch_size_per_gpu",
                                  "gradient_accumulation_steps");
  } else if (has_tbs && has_gas) {
    mbs = derive_from_train_batch(ctx, tbs, gas, dp, "gradient_accumulation_steps",
                                  "train_micro_batch_size_per_gpu");
  } else if (has_mbs && has_gas) {
    tbs = mbs * gas * dp;
  } else if (has_tbs) {
    gas = 1;
    if (tbs % dp != 0) {
      ctx.error(top("train_batch_size"),
                fmt::format("{} is not divisible by the data-parallel size {}, so "
                            "train_micro_batch_size_per_gpu cannot be derived "
                            "(gradient_accumulation_steps defaults to 1)",
                            tbs, dp));
    } else {
      mbs = tbs / dp;
    }
  } else if (has_mbs) {
    gas = 1;
    tbs = mbs * dp;
  } else {
    ctx.error("$", "either train_batch_size or train_micro_batch_size_per_gpu must be given "
                   "(as in DeepSpeed)");
  }
  cfg.train_batch_size = tbs;
  cfg.train_micro_batch_size_per_gpu = mbs;
  cfg.gradient_accumulation_steps = gas;
}

void note_batch_autos(ReadContext& ctx, const BatchKeys& b, const JobConfig& cfg) {
  // A pending micro-batch: set_auto_micro_batch() says what the triad's "auto"s became.
  if (cfg.auto_micro_batch.pending) return;
  if (b.auto_micro_batch && cfg.train_micro_batch_size_per_gpu > 0) {
    ctx.warn(top("train_micro_batch_size_per_gpu"),
             fmt::format("\"auto\" -> {}: train_batch_size / (gradient_accumulation_steps x "
                         "data-parallel size) = {} / ({} x {})",
                         cfg.train_micro_batch_size_per_gpu, cfg.train_batch_size,
                         cfg.gradient_accumulation_steps, cfg.data_parallel_size));
  }
  if (b.auto_train_batch_size) ctx.warn(top("train_batch_size"), train_batch_size_auto_note(cfg));
  if (b.auto_accumulation_steps) {
    ctx.warn(top("gradient_accumulation_steps"),
             accumulation_steps_auto_note(cfg, b.has_train_batch_size));
  }
}

void check_model_against_layout(ReadContext& ctx, const SectionsValid& valid,
                                const JobConfig& cfg) {
  const model_spec::ModelShape& m = cfg.model.shape;
  const int tp = cfg.tensor_parallel.size, pp = cfg.pipeline.stages;
  const std::string mp = top("model");
  if (valid.tensor_parallel_size && tp > 1) {
    if (m.n_head % tp != 0) {
      ctx.error(json_path_child(mp, "n_head"),
                fmt::format("n_head ({}) must be divisible by tensor_parallel.size ({})",
                            m.n_head, tp));
    }
    // The family's own (model_spec/family.h): the MLP width, the kv heads.
    for (const model_spec::RuleError& e : model_spec::family_tp_rule_errors(m, tp, model_spec::kConfigRuleNames)) {
      ctx.error(json_path_child(mp, e.key), e.message);
    }
    if (m.padded_vocab_size % tp != 0) {
      ctx.error(json_path_child(mp, "padded_vocab_size"),
                fmt::format("padded_vocab_size ({}) must be divisible by tensor_parallel.size "
                            "({}); set model.padded_vocab_size to a multiple of {}",
                            m.padded_vocab_size, tp, tp));
    }
  }
  const int cp = cfg.context_parallel.size;
  if (valid.context_parallel_size && cp > 1) {
    const layout::CpMethod method = cfg.context_parallel.method;
    if (auto why = layout::cp_sequence_rule(m.seq_len, cp, method)) {
      ctx.error(json_path_child(mp, "seq_len"), fmt::format("{} (context_parallel.method \"{}\")", *why,
                                                            layout::cp_method_name(method)));
    }
    const bool tp_whole = tp == 1 || (m.n_head % tp == 0 && model_spec::kv_heads(m) % tp == 0);
    if (tp_whole) {
      if (auto why = layout::cp_heads_rule(m.n_head, model_spec::kv_heads(m), tp, cp, method)) {
        const bool kv = why->rfind("n_kv_head", 0) == 0;
        ctx.error(json_path_child(mp, kv ? "n_kv_head" : "n_head"), why->substr(why->find(':') + 2));
      }
    }
  }
  if (valid.pipeline_stages && pp > m.n_layer) {
    ctx.error(json_path_child(top("pipeline"), "stages"),
              fmt::format("pipeline.stages ({}) must not exceed model.n_layer ({})", pp,
                          m.n_layer));
  }
}

// expert_parallel.size: a mixture-of-experts model whose experts it divides, carved from the
// dp x cp ranks it divides.
void check_expert_parallel(ReadContext& ctx, const SectionsValid& valid, const JobConfig& cfg, bool layout_whole) {
  const int ep = cfg.expert_parallel.size;
  if (!valid.expert_parallel_size || ep == 1) return;
  const auto path = json_path_child(top("expert_parallel"), "size");
  if (cfg.has_model && valid.model) {
    const model_spec::ModelShape& m = cfg.model.shape;
    if (model_spec::family_of(m).mlp != model_spec::MlpKind::kMoe) {
      ctx.error(path, fmt::format("expert parallelism splits a mixture of experts' experts, but model.type \"{}\" has "
                                  "none (a mixture of experts: model.type \"mixtral\")",
                                  cfg.model.type));
      return;
    }
    if (m.num_local_experts % ep != 0) {
      ctx.error(path, fmt::format("expert_parallel.size {} must divide model.num_local_experts ({}): each rank holds "
                                  "the same number of experts",
                                  ep, m.num_local_experts));
    }
  }
  if (layout_whole && (cfg.data_parallel_size * cfg.context_parallel.size) % ep != 0) {
    ctx.error(path, fmt::format("expert_parallel.size {} must divide the data-parallel x context-parallel ranks "
                                "({} x {} = {}): the expert-parallel groups are carved out of them",
                                ep, cfg.data_parallel_size, cfg.context_parallel.size,
                                cfg.data_parallel_size * cfg.context_parallel.size));
  }
}

void check_packing(ReadContext& ctx, const SectionsValid& valid, const JobConfig& cfg) {
  if (!cfg.has_data || !valid.document_token) return;
  const auto data = top("data");
  const int64_t token = cfg.data.document_token;
  if (cfg.data.packing != Packing::kDocument) {
    if (token >= 0) {
      ctx.error(json_path_child(data, "document_token"),
                fmt::format("data.document_token ({}) is read only with data.packing \"document\" (packing is "
                            "\"none\"); set data.packing to \"document\" or remove the key",
                            token));
    }
    return;
  }
  if (token < 0) {
    ctx.error(json_path_child(data, "document_token"),
              "data.packing \"document\" needs data.document_token, the token that begins each document (GPT-2's "
              "<|endoftext|> is 50256, a SentencePiece model's BOS its id; `dstrain data inspect FILE` shows a "
              "file's first ids)");
  } else if (cfg.has_model && valid.model && token >= cfg.model.shape.vocab_size) {
    ctx.error(json_path_child(data, "document_token"),
              fmt::format("data.document_token {} is outside model.vocab_size ({}): need a token of the vocabulary",
                          token, cfg.model.shape.vocab_size));
  }
  if (valid.context_parallel_size && cfg.context_parallel.size > 1) {
    ctx.error(json_path_child(data, "packing"),
              fmt::format("data.packing \"document\" does not run with context_parallel.size {} yet (the ring and "
                          "Ulysses attentions have no document mask); set context_parallel.size to 1 or "
                          "data.packing to \"none\"",
                          cfg.context_parallel.size));
  }
}

// The 1-bit optimizers exchange the whole momentum over dp, so they need ZeRO stage 0 (as in
// DeepSpeed) and a dp group that is the whole gradient reduction (no context parallelism, no
// experts).
void check_optimizer_layout(ReadContext& ctx, const SectionsValid& valid, const JobConfig& cfg) {
  const OptimizerConfig& o = cfg.optimizer;
  const std::string type_path = json_path_child(top("optimizer"), "type");
  if (!o.onebit()) return;
  if (valid.zero_stage && cfg.zero.stage > 0) {
    ctx.error(json_path_child(top("zero_optimization"), "stage"),
              fmt::format("{} with ZeRO stage {}: the 1-bit optimizers exchange the whole momentum and run "
                          "without ZeRO, as in DeepSpeed (use stage 0)", o.type, cfg.zero.stage));
  }
  if (valid.context_parallel_size && cfg.context_parallel.size > 1) {
    ctx.error(type_path, fmt::format("\"{}\" with context_parallel.size {}: the compressed momentum "
                                     "exchange covers data parallelism only", o.type, cfg.context_parallel.size));
  }
  if (cfg.has_model && valid.model && cfg.model.shape.num_local_experts > 0) {
    ctx.error(type_path, fmt::format("\"{}\" with a mixture of experts: the compressed momentum exchange "
                                     "covers the dense parameters' data parallelism only", o.type));
  }
  if (cfg.lora.enabled) {
    ctx.error(type_path, fmt::format("\"{}\" with lora: not built (use AdamW for adapters)", o.type));
  }
}

// training.cuda_graph: the graph replays the micro-batches' kernels with the arguments and
// buffers of its capture, so everything a step changes on the host must stay out of them.
void check_cuda_graph(ReadContext& ctx, const SectionsValid& valid, const JobConfig& cfg) {
  if (!cfg.training.cuda_graph) return;
  const std::string path = json_path_child(top("training"), "cuda_graph");
  auto refuse = [&](const std::string& why) { ctx.error(path, "a CUDA graph of the step: " + why); };
  if (cfg.training.device != "cuda") {
    refuse(fmt::format("it needs training.device \"cuda\" (it is \"{}\")", cfg.training.device));
  }
  if (cfg.world_size > 1) {
    refuse(fmt::format("one rank only (the world has {}): with more, the micro-batch waits on collectives that "
                       "other ranks join, which no graph of one rank can hold",
                       cfg.world_size));
  }
  if (cfg.has_model && valid.model && cfg.model.shape.num_local_experts > 0) {
    refuse("not with a mixture of experts: its routing reads the experts' token counts on the host in every "
           "micro-batch");
  }
  if (cfg.lora.enabled && cfg.lora.dropout > 0) {
    refuse(fmt::format("not with lora.dropout {}: dropout's keys change every step", cfg.lora.dropout));
  }
  if (cfg.data.packing == Packing::kDocument) {
    refuse("not with data.packing \"document\": the document starts are found on the host from each "
           "micro-batch's tokens");
  }
}

void check_across_sections(ReadContext& ctx, const SectionsValid& valid, JobConfig& cfg) {
  check_optimizer_layout(ctx, valid, cfg);
  check_packing(ctx, valid, cfg);
  check_one_precision(ctx, cfg);
  const bool layout_whole = resolve_data_parallel_size(ctx, valid, cfg);
  check_expert_parallel(ctx, valid, cfg, layout_whole);
  check_zero3_without_pipeline(ctx, valid, cfg);
  check_cuda_graph(ctx, valid, cfg);
  if (valid.batch.valid && layout_whole) {
    resolve_batch_triad(ctx, valid.batch, cfg);
    note_batch_autos(ctx, valid.batch, cfg);
  }
  if (cfg.has_model && valid.model) check_model_against_layout(ctx, valid, cfg);
  if (valid.model && layout_whole && valid.batch.valid && cfg.train_micro_batch_size_per_gpu > 0 &&
      !cfg.auto_micro_batch.pending) {
    if (const int64_t tokens = sequence_parallel_remainder_tokens(cfg, cfg.train_micro_batch_size_per_gpu)) {
      ctx.error(json_path_child(top("tensor_parallel"), "sequence_parallel"),
                fmt::format("a rank's micro-batch of train_micro_batch_size_per_gpu x model.seq_len / "
                            "context_parallel.size = {} tokens is not divisible by tensor_parallel.size {} "
                            "(sequence parallelism gives each tp rank an equal share)",
                            tokens, cfg.tensor_parallel.size));
    }
  }
}

}  // namespace ds::config::detail
