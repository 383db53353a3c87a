// The reader and the writer of every config section, internal to lib/config. Each reader walks
// its section of the file into its struct (config_reader.h's Section getters: types, ranges,
// unknown keys, DeepSpeed keys accepted with a warning) and checks the rules that involve only
// that section; each writer is that section's part of JobConfig::to_json(). A reader's defining
// file also holds its writer:
//   config_top_level.cpp  the batch triad's keys, steps_per_print, gradient_clipping,
//                         wall_clock_breakdown, and the
//                         top-level DeepSpeed keys accepted without effect
//   config_precision.cpp  fp16, bf16 (and its old name bfloat16)
//   config_zero.cpp       zero_optimization with its offload sections and deprecated forms
//   config_optimizer.cpp  optimizer, scheduler
//   config_parallel.cpp   pipeline, tensor_parallel
//   config_model.cpp      model, activation_checkpointing
//   config_training.cpp   data, training, checkpoint
//   config_monitors.cpp   tensorboard, csv_monitor
//   config_lora.cpp       lora (after the model: its names depend on model.type)
//   config_validate.cpp   the rules across sections (batch triad against the world size, the
//                         model against the layout, ...): config_validate.h
// The order in which parse_job_config (job_config.cpp) calls the readers is the order of the
// messages; readers never throw, they record errors in the ReadContext.
#pragma once

#include <cstdint>
#include <string>

#include "config/config_reader.h"
#include "config/job_config.h"

namespace ds::config::detail {

// The batch triad's keys as the file gives them, resolved later against the data-parallel size.
struct BatchKeys {
  int64_t train_batch_size = 0, micro_batch_size = 0, accumulation_steps = 0;
  bool has_train_batch_size = false, has_micro_batch_size = false, has_accumulation_steps = false;
  bool valid = true;  // no key of the three was present and invalid
  // Given as "auto" (Hugging Face's placeholder): read as absent, so derived from the others.
  bool auto_train_batch_size = false, auto_accumulation_steps = false;
  // train_micro_batch_size_per_gpu "auto": picked by the planner (JobConfig::AutoMicroBatch).
  bool auto_micro_batch = false;
};

// --- top level ------------------------------------------------------------------------------
// "auto" for train_batch_size and gradient_accumulation_steps reads as absent (derived, as when
// missing); for gradient_clipping as 1.0, the Hugging Face Trainer's max_grad_norm default.
BatchKeys read_top_level(ReadContext& ctx, Section& root, JobConfig& cfg);
// After every section: the top-level DeepSpeed keys accepted without effect, then unknown keys.
void finish_top_level(Section& root);
void top_level_to_json(const JobConfig& cfg, Json& out);  // sets the six top-level scalars

// --- precision ------------------------------------------------------------------------------
void read_fp16(Section& root, Fp16Config& out);
Json fp16_to_json(const Fp16Config& c);
void read_bf16(ReadContext& ctx, Section& root, Bf16Config& out);
Json bf16_to_json(const Bf16Config& c);
// data_types.grad_accum_dtype and the top-level communication_data_type.
void read_gradient_types(Section& root, GradientTypesConfig& out);
void gradient_types_to_json(const JobConfig& c, Json& out);

// --- ZeRO -----------------------------------------------------------------------------------
// Returns whether zero_optimization.stage was valid (absent counts as valid).
bool read_zero(ReadContext& ctx, Section& root, ZeroConfig& out);
Json zero_to_json(const ZeroConfig& c);

// --- optimizer and scheduler ----------------------------------------------------------------
void read_optimizer(ReadContext& ctx, Section& root, OptimizerConfig& out);
Json optimizer_to_json(const OptimizerConfig& c);

// The scheduler is read in two steps: its type where the file's order puts it, its parameters
// once optimizer.lr and training.steps are known (they give two of the defaults).
struct SchedulerSection {
  Section section;
  bool type_valid = false;
};
SchedulerSection read_scheduler_type(ReadContext& ctx, Section& root, SchedulerConfig& out);
// steps_valid: training.steps was given and valid (cfg.training.steps then holds it).
void read_scheduler_params(ReadContext& ctx, SchedulerSection& sched, const JobConfig& cfg,
                           bool steps_valid, SchedulerConfig& out);
Json scheduler_to_json(const SchedulerConfig& c);  // null without a type

// --- pipeline and tensor parallelism --------------------------------------------------------
// Each returns whether the size (pipeline.stages, tensor_parallel.size) was valid.
bool read_pipeline(ReadContext& ctx, Section& root, PipelineConfig& out);
Json pipeline_to_json(const PipelineConfig& c);
bool read_tensor_parallel(ReadContext& ctx, Section& root, TensorParallelConfig& out);
Json tensor_parallel_to_json(const TensorParallelConfig& c);
// context_parallel {size, method}, or DeepSpeed's top-level sequence_parallel_size (Ulysses);
// returns whether the size was valid.
bool read_context_parallel(ReadContext& ctx, Section& root, ContextParallelConfig& out);
Json context_parallel_to_json(const ContextParallelConfig& c);
// expert_parallel {size}.
bool read_expert_parallel(Section& root, ExpertParallelConfig& out);
Json expert_parallel_to_json(const ExpertParallelConfig& c);

// --- model ----------------------------------------------------------------------------------
// Sets cfg.model and cfg.has_model; returns whether every shape key was present and valid (and
// consistent: padded_vocab_size >= vocab_size, n_embd divisible by n_head). Paths resolve
// against cfg.path.
bool read_model(ReadContext& ctx, Section& root, JobConfig& cfg);
Json model_to_json(const JobConfig& cfg);  // null without a model section
void read_activation_checkpointing(Section& root, ActivationCheckpointingConfig& out);
Json activation_checkpointing_to_json(const ActivationCheckpointingConfig& c);

// --- data, training, DeepSpeed's checkpoint section -----------------------------------------
// Sets cfg.data and cfg.has_data; paths resolve against cfg.path.
// Returns whether data.document_token, when given, was a valid value (the packing rule runs only then).
bool read_data(ReadContext& ctx, Section& root, JobConfig& cfg);
Json data_to_json(const JobConfig& cfg);  // null without a data section
struct TrainingRead {
  bool steps_valid = false;          // training.steps given and valid
  bool eval_interval_given = false;  // training.eval_interval given and valid
};
// Paths resolve against config_path.
TrainingRead read_training(ReadContext& ctx, Section& root, const std::string& config_path,
                           TrainingConfig& out);
Json training_to_json(const TrainingConfig& c);
void read_checkpoint(Section& root);
Json checkpoint_to_json(const CheckpointConfig& c);

// --- monitors: tensorboard, csv_monitor (config_monitors.cpp) -------------------------------
// `key` is the section's name; output_path resolves against config_path ("" = its directory).
void read_monitor(Section& root, const std::string& key, const std::string& config_path, MonitorConfig& out);
Json monitor_to_json(const MonitorConfig& c);

// --- lora (config_lora.cpp) ----------------------------------------------------------------
// Sets cfg.lora; after read_model (target_modules are checked against model.type's family).
// init_from resolves against cfg.path.
void read_lora(ReadContext& ctx, Section& root, JobConfig& cfg);
Json lora_to_json(const LoraConfig& c);  // null without a lora section

}  // namespace ds::config::detail
