// The run's reports besides the step figures (run_report.h).
#include "train/run_report.h"

#include <omp.h>

#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "layout/choices.h"
#include "model_spec/family.h"
#include "model_spec/shape.h"
#include "plan/from_config.h"
#include "train/run_config.h"

namespace ds::rt::train {

void record_memory_peaks(StepRecord& r, const MemStats& stats, parallel::HostWorld* all_ranks) {
  std::vector<int64_t> mine;
  for (int t = 0; t < kNumMemTags; ++t) {
    r.peak_bytes[mem_tag_name(static_cast<MemTag>(t))] = stats.peak[t];
    mine.push_back(stats.peak[t]);
  }
  r.peak_bytes["total"] = stats.peak_total;
  r.peak_bytes["pinned_host"] = stats.pinned_peak;  // offloaded state (GPU runs); not in total
  mine.push_back(stats.peak_total);
  mine.push_back(stats.pinned_peak);
  if (all_ranks == nullptr) return;
  constexpr int kFigures = kNumMemTags + 2;  // the tags, total, pinned_host
  const auto all = all_ranks->gather_int64(mine);
  for (int q = 0; q < all_ranks->size(); ++q) {
    for (int t = 0; t < kFigures; ++t) {
      const std::string tag =
          t < kNumMemTags ? mem_tag_name(static_cast<MemTag>(t)) : t == kNumMemTags ? "total" : "pinned_host";
      r.extra[fmt::format("peak_bytes_{}_rank{}", tag, q)] = all[static_cast<size_t>(q) * kFigures + static_cast<size_t>(t)];
    }
  }
}

void note_plan_beside_peaks(StepRecord& r, MetricsReporter& reporter, const config::JobConfig& cfg, int rank) {
  try {
    const auto planned = plan::predicted_rank_memory(cfg, rank, omp_get_max_threads());
    for (const auto& [tag, bytes] : plan::tag_bytes(planned)) r.extra["planned_bytes_" + tag] = bytes;
    std::string text = plan::describe_prediction(planned, r.peak_bytes);
    while (!text.empty() && text.back() == '\n') text.pop_back();
    reporter.note(text);
  } catch (const Error& e) {
    reporter.note(fmt::format("dstrain plan could not plan this run: {}", e.what()));
  }
}

std::string describe_training(const config::JobConfig& cfg, int zero_stage) {
  const auto shape = cfg.model.shape;
  const int tp = cfg.tensor_parallel.size, pp = cfg.pipeline.stages;
  return fmt::format(
      "training {} (L={} H={} C={} V={} T={}): {} parameters, micro-batch {} x {} tokens, "
      "{} accumulation step(s), data-parallel {} (ZeRO stage {}){}{}, {} steps, {} threads",
      model_spec::family_of(shape).display_name, shape.n_layer, shape.n_head, shape.n_embd, shape.vocab_size,
      shape.seq_len, model_spec::param_count(shape),
      cfg.train_micro_batch_size_per_gpu, shape.seq_len, cfg.gradient_accumulation_steps, cfg.data_parallel_size,
      zero_stage,
      tp * pp == 1 ? std::string()
                   : fmt::format(" x tensor-parallel {}{} x pipeline {} ({}, {} partition)", tp,
                                 cfg.tensor_parallel.sequence_parallel ? " (sequence-parallel)" : "", pp,
                                 layout::schedule_name(cfg.pipeline.schedule),
                                 layout::stage_split_name(cfg.pipeline.partition)),
      cfg.context_parallel.size == 1
          ? std::string()
          : fmt::format(" x context-parallel {} ({}: {} tokens of each sequence per rank)", cfg.context_parallel.size,
                        layout::cp_method_name(cfg.context_parallel.method), shape.seq_len / cfg.context_parallel.size),
      cfg.training.steps, omp_get_max_threads());
}

}  // namespace ds::rt::train
