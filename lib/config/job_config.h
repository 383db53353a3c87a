// Job configs: DeepSpeed's JSON keys (train_batch_size, fp16, zero_optimization, optimizer,
// scheduler, ...) plus dstrain's own sections (model, data, training, pipeline,
// tensor_parallel), parsed into typed structs and validated against a world size.
//
// What validation guarantees for a returned JobConfig:
//   - every key had the right type and range; unknown keys were errors (with the closest known
//     key suggested) or, where DeepSpeed would ignore them, warnings (ParseOptions::strict);
//     DeepSpeed keys dstrain does not act on were accepted and listed in `warnings`; duplicate
//     keys were errors;
//   - the batch triad is resolved as DeepSpeed resolves it, against the data-parallel size
//     dp = world_size / (tensor_parallel.size * pipeline.stages):
//       train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp;
//   - model shapes are consistent with themselves and with tensor_parallel.size and
//     pipeline.stages (when a model section is present).
// It does NOT check that data or checkpoint files exist (the trainer does, when it opens them),
// and it does not require the training sections: a plain DeepSpeed config validates.
// require_training_sections() adds that requirement (what `dstrain train` needs).
//
// Relative paths (data.train, data.val, model.init_from, lora.init_from, training.checkpoint_dir)
// are resolved against the directory of the config file, lexically (no filesystem access): with
// the config at configs/x.json, "../data/kjv/train.bin" becomes "data/kjv/train.bin".
//
// All errors are collected: parse_job_config throws one ConfigError listing every fault, each
// as "file:line: $.json.path: what was expected, got what".
// Pure functions of their inputs; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "layout/choices.h"
#include "layout/context_parallel.h"
#include "model_spec/shape.h"

namespace ds::config {

// The model section: model.type names a registered family (model_spec/family.h), whose
// description says which keys beyond the common ones it reads (FamilyDescription::keys), how
// vocab_size is padded and limited, and its shape rules.
struct ModelConfig {
  std::string type = "gpt2";  // a family's name: model_spec::family_names()
  // Every size the section gives, resolved: n_layer, n_head, n_embd, vocab_size, seq_len,
  // padded_vocab_size (absent: vocab_size rounded up to the family's vocab_multiple; always >=
  // vocab_size and divisible by tensor_parallel.size), the family (shape.family, from type) and
  // its own keys (absent ones keep ModelShape's defaults or the family's resolve()).
  model_spec::ModelShape shape;
  // A file in a format the family has: llm.c's checkpoint, or a .safetensors file or a directory
  // with model.safetensors.index.json and its shards (Hugging Face's names); "" = random init.
  std::string init_from;
};

// The lora section: train low-rank adapters (PEFT's LoRA) on the target modules of a frozen base
// model. Names and defaults are PEFT's LoraConfig's (r, lora_alpha, lora_dropout, target_modules).
// With init_from, absent r, alpha and target_modules stay 0 / 0 / empty: the runtime takes them
// from the adapter's adapter_config.json (runtime/checkpoint/peft_adapter.h).
struct LoraConfig {
  bool enabled = false;  // the section is present
  int r = 0;             // the rank, >= 1; required unless init_from gives it (0 = from the adapter)
  // PEFT's lora_alpha (the update is scaled by alpha / r), > 0; default 8 (PEFT's), or 0 = from
  // the adapter when init_from is given and alpha is not.
  double alpha = 0;
  double dropout = 0.0;  // on the adapter's input, [0, 1)
  // The family's module names as written ("q_proj", "c_attn", "attn.c_proj";
  // model_spec/lora_targets.h), each valid and selecting tensors no other name selects;
  // "all-linear" is expanded to model_spec::lora_all_linear_names. Empty only with init_from (=
  // from the adapter).
  std::vector<std::string> target_modules;
  // A PEFT adapter directory (adapter_config.json, adapter_model.safetensors) to start from;
  // resolved like model.init_from; "" = fresh adapters (A random, B zero, as PEFT).
  std::string init_from;
};

// data.train / data.val: a path, a glob ("fineweb_train_*.bin") or a list of them, each resolved
// against the config's directory; the runtime expands the globs and reads the files in sorted
// order as one corpus (runtime/data/corpus.h). Or a weighted blend: a list of
// {"path": GLOB, "weight": W} objects, each source a corpus of its own, drawn by weight per window
// (runtime/data/blend.h); then train_blend / val_blend hold it and train / val are empty.
// data.packing: how documents packed back to back into a window see each other (docs/data.md).
// kNone: one causal sequence per window, positions 0..T-1 (the default). kDocument: Megatron's
// reset attention mask and position ids: each document attends to itself only and its positions
// count from its document token, which data.document_token names.
enum class Packing { kNone, kDocument };

struct DataConfig {
  // One source of a blend: a path or glob (resolved) and its weight (finite, >= 0; the weights of a
  // blend sum to more than 0).
  struct BlendSource {
    std::string path;
    double weight = 0;
  };
  // llm.c token files; train (or train_blend) is required when the data section is present.
  std::vector<std::string> train;
  std::vector<std::string> val;    // empty = none
  std::vector<BlendSource> train_blend, val_blend;  // empty = not a blend
  bool shuffle = false;
  Packing packing = Packing::kNone;
  // The token that begins each document (GPT-2: 50256, a SentencePiece model: its BOS): required
  // with packing "document", refused without it; -1 = not given.
  int64_t document_token = -1;
  // data.tokenizer: the tokenizer the data was prepared with, for text the run encodes or decodes
  // itself (training.eval_tasks, training.sample_interval): {"kind": byte | gpt2 | hf |
  // sentencepiece | llmc, "path": its files, as `dstrain data prepare` names them}. Absent: kind
  // "" (byte-level for a vocabulary of 256 or less, else an error where text is needed).
  std::string tokenizer_kind;
  std::string tokenizer_path;  // resolved against the config's directory; "" for byte
};

// training.eval_tasks[i]: a downstream task scored every eval_interval (runtime/train/task_eval.h).
struct EvalTaskConfig {
  std::string task;   // "hellaswag" | "lambada"
  std::string data;   // its jsonl file, resolved against the config's directory
  int64_t limit = 0;  // the first N items; 0 = all
};

struct TrainingConfig {
  int64_t steps = 0;  // optimizer steps; 0 = not given (require_training_sections() needs it)
  uint64_t seed = 1337;
  int eval_interval = 0;  // evaluate every N steps; 0 = no evaluation
  int eval_steps = 20;    // batches per evaluation
  int log_interval = 1;
  std::string checkpoint_dir;   // "" = no checkpoints
  int checkpoint_interval = 0;  // save every N steps; 0 = never (needs checkpoint_dir when > 0)
  int keep_last = 0;            // keep the N newest checkpoints; 0 = keep all
  // Checkpoints written by a background thread from a host staging buffer (tag "checkpoint"),
  // committed once every rank's shard is written; training goes on meanwhile
  // (runtime/train/async_checkpoint.h). Only meaningful with checkpoint_dir.
  bool checkpoint_async = false;
  std::string device = "cpu";   // "cpu" | "cuda" (dstrain extension)
  // Seconds a rank may show no progress while others wait for it in a collective before the job
  // fails naming it (runtime/comm/beacon.h); a slow rank that makes progress is waited for.
  double comm_timeout = 60;
  // The peak TFLOP/s of one rank's device, for MFU; 0 = the GPU table, or a matmul measured at
  // start-up on a CPU (runtime/train/throughput.h).
  double peak_tflops = 0;
  // Print a short sample of generated text every N steps (rank 0, as llm.c does); 0 = never.
  int sample_interval = 0;
  // Downstream tasks scored every eval_interval (docs/evaluation.md); empty = none.
  std::vector<EvalTaskConfig> eval_tasks;
  // training.skip_spikes (llm.c's outlier detector, runtime/train/spike_guard.h): a step whose loss
  // or gradient norm lies more than `threshold` standard deviations above the mean of the last
  // `window` updated steps is skipped, with no update. `true` takes the defaults; absent: off.
  struct SkipSpikes {
    bool enabled = false;
    double threshold = 5.0;
    int window = 128;
  } skip_spikes;
  // With wall_clock_breakdown: name a rank whose compute time per step is more than
  // straggler_slower_by (a fraction) above the ranks' median for straggler_steps steps in a row
  // (runtime/train/straggler.h).
  double straggler_slower_by = 0.2;
  int straggler_steps = 5;
  // What a GPU step synchronises on (docs/gpu.md, "What a step costs beyond the kernels"); each can
  // be turned off to measure it. sync_loss_once: the micro-batches' losses stay on the device
  // and come back in one copy per step (else one per micro-batch). sync_norm_once: the gradient
  // norm's per-range sums come back in one copy (else one per range). A CPU run gives the same
  // bits either way.
  bool sync_loss_once = true;
  bool sync_norm_once = true;
  // The forward and backward of a step's micro-batches captured once as a CUDA graph and
  // replayed each step (docs/gpu.md, "What a step costs beyond the kernels"). One GPU rank only,
  // and only where nothing in the micro-batch changes on the host from step to step:
  // config_validate.h's check_cuda_graph names what refuses it.
  bool cuda_graph = false;
};

struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0;  // 0 = dynamic loss scaling
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  double min_loss_scale = 1;
};

struct Bf16Config {
  bool enabled = false;
};

// How gradients accumulate over micro-batches (DeepSpeed's data_types.grad_accum_dtype) and travel
// in the reductions (its top-level communication_data_type); nullopt = not given. dstrain keeps
// the two alike (one gradient buffer type); JobConfig::gradient_dtype() resolves them.
struct GradientTypesConfig {
  std::optional<layout::Precision> grad_accum_dtype;
  std::optional<layout::Precision> communication_data_type;
};

struct OffloadConfig {
  std::string device = "none";  // "none" | "cpu" ("nvme" is rejected)
  bool pin_memory = false;
};

struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool overlap_comm = false;  // resolved: when absent, true for stage 3, false otherwise (DeepSpeed)
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = 500000000;     // elements
  int64_t allgather_bucket_size = 500000000;  // elements
  OffloadConfig offload_optimizer;            // resolved to "none" with ZeRO stage 0
  OffloadConfig offload_param;                // resolved to "none" below ZeRO stage 3
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_param_persistence_threshold = 100000;
  int64_t stage3_max_live_parameters = 1000000000;
};

struct OptimizerConfig {
  // "Adam" | "AdamW" | "Lamb" | "Adagrad" | "Lion" | "OneBitAdam" | "ZeroOneAdam" | "OneBitLamb"
  // (case-insensitive in the file, normalized; "OnebitAdam" and "OnebitLamb" too). DeepSpeed's
  // defaults per type (docs/configuration.md "Optimizers") fill what params leaves out.
  std::string type = "AdamW";
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  // Resolved: true = decoupled weight decay (AdamW). "AdamW" is always true; "Adam" is AdamW
  // unless params.adam_w_mode is false, as in DeepSpeed.
  bool adam_w_mode = true;
  // Lamb (FusedLamb): the update's bias correction, eps under the square root, the trust ratio's clamp.
  bool bias_correction = true;
  bool eps_inside_sqrt = false;
  double max_coeff = 10.0, min_coeff = 0.01;  // Lamb, OneBitLamb
  int64_t freeze_step = 100000;               // OneBitAdam, OneBitLamb: full-precision steps
  // ZeroOneAdam (0/1 Adam): the variance's update schedule and the local steps' intervals.
  int64_t var_freeze_step = 100000, var_update_scaler = 16, local_step_scaler = 32678, local_step_clipper = 16;
  // OneBitLamb: the frozen trust ratio's moving average and its correction factor's bounds.
  double coeff_beta = 0.9, factor_max = 4.0, factor_min = 0.5, factor_threshold = 0.1;

  // Adam or AdamW: the fused kernels on any device (the others run on the CPU).
  static bool is_adam(const std::string& t) { return t == "Adam" || t == "AdamW"; }
  // A 1-bit optimizer (OneBitAdam, ZeroOneAdam, OneBitLamb): compressed momentum exchange.
  static bool is_onebit(const std::string& t) { return t == "OneBitAdam" || t == "ZeroOneAdam" || t == "OneBitLamb"; }
  bool adam() const { return is_adam(type); }
  bool onebit() const { return is_onebit(type); }
};

struct SchedulerConfig {
  std::string type;  // "" (constant lr) | "WarmupLR" | "WarmupDecayLR" | "WarmupCosineLR"
  // DeepSpeed's parameter names (deepspeed/runtime/lr_schedules.py). Resolved defaults:
  double warmup_min_lr = 0;
  double warmup_max_lr = 0.001;  // WarmupLR: optimizer.lr when absent (current DeepSpeed)
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";  // "log" | "linear"
  int64_t total_num_steps = 0;      // Decay/Cosine: training.steps when absent
  double warmup_min_ratio = 0, cos_min_ratio = 0.0001;  // WarmupCosineLR
};

struct ActivationCheckpointingConfig {
  bool enabled = false;  // dstrain extension key; DeepSpeed's keys are accepted with a warning
  // With enabled: "full" recomputes each layer's forward in its backward, keeping only the
  // layer's output; "selective" (Korthikanti et al.) recomputes only attention's scores and
  // softmax, which dstrain's attention never stores (its backward recomputes them from q, k and
  // the kept log-sum-exp), so every other activation is kept and no layer is recomputed.
  std::string mode = "full";
  // Whether layers are recomputed in backward (the runtime's ModelOptions::recompute).
  bool full() const { return enabled && mode == "full"; }
};

struct PipelineConfig {
  int stages = 1;
  layout::StageSplit partition = layout::StageSplit::kParameters;  // "uniform" | "parameters"
  layout::PipelineSchedule schedule = layout::PipelineSchedule::k1F1B;  // "1f1b" | "gpipe"
};

struct TensorParallelConfig {
  int size = 1;
  // Megatron's sequence parallelism: outside the tp regions the activations are split by rows
  // (tokens) over the tp group; needs size > 1.
  bool sequence_parallel = false;
};

// Context parallelism: the sequence of every micro-batch split over `size` ranks
// (layout/context_parallel.h). DeepSpeed's top-level sequence_parallel_size N reads as
// {size N, method ulysses}.
struct ContextParallelConfig {
  int size = 1;
  layout::CpMethod method = layout::CpMethod::kRing;  // "ring" | "ulysses"
};

// Expert parallelism (a mixture of experts): each layer's experts split over `size` ranks carved
// from the data-parallel x context-parallel ranks (layout/topology.h, Megatron's layout); the
// expert-data-parallel group (dp x cp / size ranks) reduces the experts' gradients.
struct ExpertParallelConfig {
  int size = 1;
};

// DeepSpeed's `tensorboard` and `csv_monitor` sections: rank 0 writes under output_path/job_name.
struct MonitorConfig {
  bool enabled = false;
  std::string output_path;  // resolved against the config's directory ("" there = that directory)
  std::string job_name = "DeepSpeedJobName";
};

struct CheckpointConfig {
  // DeepSpeed's checkpoint section (tag_validation, load_universal, ...): accepted with
  // warnings; dstrain's checkpoint settings live in `training`.
};

struct JobConfig {
  std::string path;
  int world_size = 1;          // what the batch triad was resolved against
  // world_size / (tensor_parallel.size * context_parallel.size * pipeline.stages): the ranks that
  // read different sequences (the batch triad counts them); gradients are reduced over dp x cp.
  int data_parallel_size = 1;
  int64_t train_batch_size = 0, train_micro_batch_size_per_gpu = 0,
          gradient_accumulation_steps = 0;  // resolved
  // train_micro_batch_size_per_gpu "auto" (docs/configuration.md, "auto"): the planner picks it
  // when the run starts (lib/plan/auto_micro_batch.h), and set_auto_micro_batch() fills it in.
  // Until then `pending` is true, the triad holds micro-batch 1 as a placeholder (the keys not
  // fixed by the file derived from it) and to_json() writes "auto" for the keys that follow from
  // the pick. With train_batch_size and gradient_accumulation_steps both numbers the micro-batch
  // is derived from them at parse time, as when absent, and nothing is pending.
  struct AutoMicroBatch {
    bool pending = false;
    bool train_batch_size_fixed = false;    // a number in the file: the pick divides train_batch_size / dp
    bool accumulation_steps_fixed = false;  // a number in the file: train_batch_size derives from the pick
    bool auto_train_batch_size = false, auto_accumulation_steps = false;  // "auto" in the file
    // "file:line: $.key" of the three keys, for the notes set_auto_micro_batch() adds.
    std::string where_micro_batch, where_train_batch_size, where_accumulation_steps;
  };
  AutoMicroBatch auto_micro_batch;
  int steps_per_print = 10;
  double gradient_clipping = 0;  // max global grad norm; 0 = off
  // Report where each step's time goes (forward, backward, reductions, optimizer, pipeline
  // waits) in the log line and --metrics (DeepSpeed's key).
  bool wall_clock_breakdown = false;
  Fp16Config fp16;
  Bf16Config bf16;
  // The storage precision these two sections choose (validation refuses both enabled).
  layout::Precision precision() const {
    return fp16.enabled ? layout::Precision::kFp16 : bf16.enabled ? layout::Precision::kBf16 : layout::Precision::kFp32;
  }
  GradientTypesConfig gradient_types;
  // The type gradients are stored, accumulated and reduced in: grad_accum_dtype or
  // communication_data_type when given (validation makes them agree and refuses a type other than
  // the storage type or fp32), else the storage type, as the ZeRO paper counts it.
  layout::Precision gradient_dtype() const {
    if (gradient_types.grad_accum_dtype) return *gradient_types.grad_accum_dtype;
    if (gradient_types.communication_data_type) return *gradient_types.communication_data_type;
    return precision();
  }
  ZeroConfig zero;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  ActivationCheckpointingConfig activation_checkpointing;
  PipelineConfig pipeline;
  TensorParallelConfig tensor_parallel;
  ContextParallelConfig context_parallel;
  ExpertParallelConfig expert_parallel;
  CheckpointConfig checkpoint;
  MonitorConfig tensorboard, csv_monitor;
  ModelConfig model;
  DataConfig data;
  TrainingConfig training;
  LoraConfig lora;
  bool has_model = false;  // the file had a model section
  bool has_data = false;   // the file had a data section
  // DeepSpeed keys accepted but not acted on, and other notes, one message each:
  // "file:line: $.json.path: ...".
  std::vector<std::string> warnings;

  // Every key with its resolved value, in the file format: parse_job_config(to_json().dump(), "",
  // world_size) gives the same config (paths are already resolved, so re-parse with no base).
  // Unset optional values (no model section, no scheduler, no val file, ...) are null.
  nlohmann::ordered_json to_json() const;
};

// An invalid config: what() lists every fault, one per line; errors() has them separately.
class ConfigError : public Error {
 public:
  ConfigError(const std::string& source, std::vector<std::string> errors);
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  std::vector<std::string> errors_;
};

// How a config is read beyond its text: the command line's --strict and --set.
struct ParseOptions {
  // "KEY=VALUE" overrides (--set), applied in order to the file's JSON before it is validated:
  // KEY is a dotted path of object keys (optimizer.params.lr; objects on the way are created
  // when absent), VALUE is read as JSON when it parses as JSON (numbers, true, false, null,
  // objects, arrays, "quoted" strings), else as a string. A message about a value set here names
  // its JSON path and the --set that gave it; a KEY through a value that is not an object, an
  // empty KEY or a missing '=' is an error naming the --set.
  std::vector<std::string> sets;
  // Every unknown key is an error. Without it, an unknown key in a DeepSpeed section (the top
  // level, zero_optimization, optimizer, ...) is a warning, as DeepSpeed ignores it, unless a
  // known key is at most two edits away (a probable typo); in dstrain's own sections (model,
  // data, training, lora, context_parallel, expert_parallel) it is always an error.
  bool strict = false;
};

// Parses and validates `text` for `world_size` ranks; `path` names the file in messages and is
// the base for relative paths ("" : paths stay as written). Throws ConfigError (every fault) or
// ds::Error (invalid argument) for world_size < 1.
JobConfig parse_job_config(std::string_view text, const std::string& path, int world_size,
                           const ParseOptions& options = {});
// Reads and parses a file; a missing or unreadable file is an invalid-argument error naming it.
JobConfig load_job_config(const std::string& path, int world_size,
                          const ParseOptions& options = {});

// Throws ConfigError listing what `dstrain train` needs and the config lacks: a model section,
// data.train, training.steps.
void require_training_sections(const JobConfig& config);

// Fills in a pending train_micro_batch_size_per_gpu "auto" (JobConfig::AutoMicroBatch) with
// `micro_batch`: derives gradient_accumulation_steps (train_batch_size / (micro x dp)) when
// train_batch_size is a number, else train_batch_size (micro x accumulation x dp; accumulation 1
// unless the file gives it), and adds one note per "auto" of the triad to `warnings`:
//   "file:line: $.train_micro_batch_size_per_gpu: \"auto\" -> 8: <why>"
// then what train_batch_size and gradient_accumulation_steps "auto" became. Throws ConfigError
// when `micro_batch` breaks a rule of the triad or of sequence parallelism (the planner offers
// only values that keep them), ds::Error (internal) when nothing is pending.
void set_auto_micro_batch(JobConfig& config, int64_t micro_batch, const std::string& why);

// The micro-batch sizes a pending "auto" may become, ascending: every divisor of
// train_batch_size / dp when train_batch_size is a number, else the powers of two from 1 to
// kMaxAutoMicroBatch; without those that break sequence parallelism's rule (micro x seq_len / cp
// divisible by tensor_parallel.size).
// With sequence parallelism, the tokens a rank holds per micro-batch (micro x seq_len / cp) must
// split evenly over tensor_parallel.size: 0 when `micro` keeps that rule (or there is no sequence
// parallelism), else that token count.
int64_t sequence_parallel_remainder_tokens(const JobConfig& config, int64_t micro);

inline constexpr int64_t kMaxAutoMicroBatch = 1024;
std::vector<int64_t> auto_micro_batch_candidates(const JobConfig& config);

// Applies `sets` (ParseOptions::sets, "KEY=VALUE") to a config's JSON as parse_job_config does,
// for a caller that writes a config for another run (`dstrain plan --measure`). Throws
// ConfigError naming each malformed flag.
void apply_sets(nlohmann::ordered_json& root, const std::vector<std::string>& sets);

}  // namespace ds::config
