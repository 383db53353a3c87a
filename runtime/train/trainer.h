// The training loop of one process: what `dstrain train` runs, alone or as one rank under
// `dstrain launch`. It composes pieces that each own one concern:
//   parallel::Engine (parallel/engine.h)   this rank's groups and the model with its hook stack
//                                          model -> tensor-parallel regions -> tied wte -> ZeRO
//   OptimizerState (optimizer_state.h)     fp32 master weights, AdamW's moments, the update
//   step math (step_math.h)                the global loss, norm and overflow; clip, skip, update
//   checkpoints (checkpointing.h)          save, and resume for any layout (resharding)
//   initial_weights.h, weights_export.h       initial values; the llm.c export
//   run_config.h                           the config translated into the pieces
//   data::BatchReader (one corpus, or a weighted blend), LrScheduler, LossScaler, MetricsReporter
//
// One optimizer step: zero the gradients; for each of the G accumulation micro-batches read this
// rank's window, run forward + backward with grad_scale = loss_scale / (G x dp) (so the gradients
// are those of the mean loss over the global batch; with a pipeline the stage's 1F1B or GPipe
// schedule runs the G micro-batches); then the step math: the loss and norm over the world,
// fp16's overflow check, the clip coefficient, AdamW on this rank's range, the master weights back
// into the model (rounded to bf16/fp16 when enabled), ZeRO's gathers, the LR schedule.
//
// Precision on CPU: kernels compute in fp32 (bf16 matmuls on oneDNN's bf16 kernels with fp32
// accumulation). With bf16 or fp16 the model's parameters, activations and their gradients are
// 2-byte buffers of that type, parameter gradients are in the config's gradient type (the storage
// type by default), the optimizer keeps fp32 master weights, m and v (tag optimizer), and an fp16
// overflow is a real inf in an fp16 buffer; the dynamic loss scaler then skips the step.
// On CUDA the same holds for bf16 (the dispatch's bf16 CUDA twins; GEMMs over bf16 with fp32
// accumulation); fp16 has no CUDA kernels and keeps fp32 buffers there (layout::stored_precision,
// run_config.cpp), with the loss scaler as on the CPU.
//
// Collectives: nothing in runtime/train calls a Comm. The engine's pieces (ZeRO, the pipeline
// stage, the tensor-parallel regions) own the model's collectives; the bookkeeping ones (the
// step's sums, the peaks, the order of a checkpoint's phases, the export's gather) are the host
// world's named operations (parallel/host_world.h), which the trainer asks for; an async
// checkpoint's writer thread has a twin host world of its own (train/async_checkpoint.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "config/job_config.h"

namespace ds::rt::train {

struct TrainOptions {
  std::string init_from;        // llm.c checkpoint or HF safetensors (initial_weights.h); overrides model.init_from
  std::string metrics_path;     // one JSON object per step ("" = none)
  // Rank 0's metrics also carry every rank's peak bytes per tag: peak_bytes_<tag>_rank<r>.
  bool metrics_all_ranks = false;
  bool resume = false;          // continue from training.checkpoint_dir/latest when present
  std::string resume_from;      // continue from this checkpoint directory ("" = latest with resume)
  int64_t max_steps = -1;       // stop after this step (e.g. to simulate an interruption); -1 = no
  // Test hook: after this step's backward, one gradient is set to +inf (checks overflow skips).
  int64_t inject_inf_at_step = -1;
  // Test hook: rank kill_rank SIGKILLs itself in step kill_at_step, after its first micro-batch's
  // backward (checks that a dead rank is named and nothing hangs).
  int64_t kill_at_step = -1;
  int kill_rank = -1;
};

struct TrainResult {
  int64_t first_step = 1;  // the first step this run executed (> 1 when resumed)
  int64_t last_step = 0;
  std::vector<double> losses;  // per executed step
  std::optional<double> last_val_loss;
  // A preemption signal reached some rank (common/preemption.h): every rank stopped after
  // last_step, and wrote a checkpoint of it when training.checkpoint_dir is set.
  bool preempted = false;
  bool checkpoint_written = false;
};

class Trainer {
 public:
  // Validates that the config has what training needs (model, data.train, training.steps), opens
  // the data (errors name the file), builds the model and optimizer state, and initialises the
  // weights (random from training.seed, or from an llm.c checkpoint, or from the latest
  // checkpoint with --resume).
  Trainer(const config::JobConfig& config, const TrainOptions& options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Runs the remaining steps. Returns what happened; throws ds::Error on failure.
  TrainResult run();
  // The step run() is at (the next one to train while between steps).
  int64_t step_in_progress() const;

  // Writes the model's weights as an llm.c checkpoint (dstrain train --export-llmc). Collective
  // (every rank calls it; rank 0 reassembles tensor/pipeline parts and writes).
  // `bf16`: llm.c's version 5 file (bf16 weights, as its GPU trainer writes), else version 3 (fp32).
  void export_llmc(const std::string& path, bool bf16 = false);
  // The weights as Hugging Face safetensors plus config.json (families with an HF format) in `dir` (--export-safetensors);
  // `dtype` "fp32", "bf16" or "fp16". Collective like export_llmc.
  void export_safetensors(const std::string& dir, const std::string& dtype = "fp32");
  // A LoRA run's adapters as PEFT's adapter_config.json and adapter_model.safetensors in `dir`
  // (--export-adapter; `dtype` as above). Collective like export_llmc. The two exports above
  // write the merged model W + (alpha/r) B A.
  void export_adapter(const std::string& dir, const std::string& dtype = "fp32");

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds::rt::train
