// The rules of a job config that span sections, internal to lib/config: precision (fp16 and bf16
// not both), the layout against the world size (data-parallel size = world / (tp x cp x pp),
// ZeRO-3 not with a pipeline), the batch triad against the data-parallel size, the model's shape
// against tensor_parallel.size, context_parallel and pipeline.stages, and evaluation against
// data.val. Each rule
// runs only on values that were themselves valid (SectionsValid), so one mistake gives one
// message. Rules record errors in the ReadContext and never throw.
#pragma once

#include "config/config_sections.h"

namespace ds::config::detail {

// Which values the section readers found valid, for the rules below.
struct SectionsValid {
  BatchKeys batch;
  bool zero_stage = true;
  bool pipeline_stages = true;
  bool tensor_parallel_size = true;
  bool context_parallel_size = true;
  bool expert_parallel_size = true;
  bool model = true;
  bool document_token = true;
};

// training.eval_interval > 0 with a data section needs data.val or training.eval_tasks. Runs right after the training
// section is read (its message comes before the scheduler's).
void check_eval_needs_val(ReadContext& ctx, const JobConfig& cfg, bool eval_interval_given);

// Every other cross-section rule, in this order: check_one_precision, resolve_data_parallel_size
// (sets cfg.data_parallel_size), check_zero3_without_pipeline, check_cuda_graph, resolve_batch_triad (sets the
// triad), check_model_against_layout.
void check_across_sections(ReadContext& ctx, const SectionsValid& valid, JobConfig& cfg);

void check_one_precision(ReadContext& ctx, const JobConfig& cfg);
// data.packing "document" needs data.document_token in the model's vocabulary and no context
// parallelism (yet); data.document_token is refused without it.
void check_packing(ReadContext& ctx, const SectionsValid& valid, const JobConfig& cfg);
// Returns whether the layout is whole (world_size divisible by tp x cp x pp, all valid).
bool resolve_data_parallel_size(ReadContext& ctx, const SectionsValid& valid, JobConfig& cfg);
void check_zero3_without_pipeline(ReadContext& ctx, const SectionsValid& valid,
                                  const JobConfig& cfg);
// training.cuda_graph needs training.device "cuda", one rank, no mixture of experts, no LoRA
// dropout and no document packing (the graph replays its capture's kernel arguments). Loss masks,
// known only from the data, are refused by the trainer.
void check_cuda_graph(ReadContext& ctx, const SectionsValid& valid, const JobConfig& cfg);
// As DeepSpeed's _set_batch_related_parameters + _batch_assertion, against
// cfg.data_parallel_size.
void resolve_batch_triad(ReadContext& ctx, const BatchKeys& batch, JobConfig& cfg);
// A warning saying what each "auto" of train_batch_size and gradient_accumulation_steps became.
void note_batch_autos(ReadContext& ctx, const BatchKeys& batch, const JobConfig& cfg);
// What train_batch_size and gradient_accumulation_steps "auto" became, as the notes say it (also
// set_auto_micro_batch()'s, once a pending micro-batch is picked).
std::string train_batch_size_auto_note(const JobConfig& cfg);
std::string accumulation_steps_auto_note(const JobConfig& cfg, bool train_batch_size_given);
void check_model_against_layout(ReadContext& ctx, const SectionsValid& valid,
                                const JobConfig& cfg);

}  // namespace ds::config::detail
