// The training loop of one process: composes the model, the data loader, the optimizer (fp32
// master weights, AdamW), the LR schedule, loss scaling, clipping, evaluation, checkpoints and
// metrics. It is what `dstrain train` runs, alone or as one rank under `dstrain launch`.
//
// One optimizer step: zero the gradients; for each of the G accumulation micro-batches read this
// rank's window, run forward + backward with grad_scale = loss_scale / G (so the gradients are
// those of the mean loss over the global batch); then unscale, check for overflow (fp16), compute
// the global norm, clip, update with AdamW, copy the master weights back into the model's
// parameters (rounded to bf16/fp16 when enabled) and advance the LR schedule.
//
// Precision on CPU: kernels compute in fp32. With bf16 or fp16 the model's parameters hold values
// rounded to that type (stored in fp32 buffers), the optimizer keeps fp32 master weights (tag
// optimizer), and fp16 gradients are rounded to fp16 after accumulation, so an overflow shows as
// inf exactly as in a 16-bit buffer; the dynamic loss scaler then skips the step.
//
// Data parallelism (world size > 1 under `dstrain launch`): the trainer connects to the job's store
// (DSTRAIN_STORE), builds the world Comm and hands it to the ZeRO engine (runtime/parallel/zero.h),
// which owns every collective: gradient buckets, parameter gathers, the partitioned optimizer
// range. Each rank reads its own windows of the global batch (data/loader.h), scales its
// gradients by 1/(G x N), and the logged loss and grad norm are those of the whole global batch.
// Tensor and pipeline parallelism (tensor_parallel.size, pipeline.stages): the world is the grid
// of parallel/topology.h; each rank builds its tp, dp and pp groups (and the {first, last} stage
// group for the tied token embedding), holds its stage's layers as its tp shard
// (partition_stages), and stacks the hooks model -> TensorParallelHooks -> TiedEmbeddingHooks ->
// ZeroEngine over its dp group. With a pipeline a step is one run of the stage's schedule (1F1B
// or GPipe) over the G micro-batches, ZeRO seeing each backward event as a micro-batch; every
// rank reads the step's micro-batches (the first stage uses the inputs, the last the targets).
// The loss comes from tp rank 0 of the last stage; the gradient norm counts every element once
// (replicated tensors on tp rank 0, the tied wte on the first stage), summed over the world.
// Checkpoints: every rank writes its partition of params/master/exp_avg/exp_avg_sq of its part;
// the manifest records tp, pp, dp, the ZeRO stage and every rank's partition; loading re-
// partitions for any dp size and stage, with the same tp and pp (else a clear error).
// Not here: collectives themselves (the engine calls them; the trainer calls none).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "config/job_config.h"

namespace ds::rt::train {

struct TrainOptions {
  std::string init_from;        // llm.c checkpoint; overrides model.init_from
  std::string metrics_path;     // one JSON object per step ("" = none)
  // Rank 0's metrics also carry every rank's peak bytes per tag: peak_bytes_<tag>_rank<r>.
  bool metrics_all_ranks = false;
  bool resume = false;          // continue from training.checkpoint_dir/latest when present
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

  // Writes the model's weights as an llm.c checkpoint (dstrain train --export-llmc). Collective
  // (every rank calls it; rank 0 reassembles tensor/pipeline parts and writes).
  void export_llmc(const std::string& path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds::rt::train
