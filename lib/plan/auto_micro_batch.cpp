// The micro-batch "auto" pick: every candidate through the plan, then the fastest or the largest.
#include "plan/auto_micro_batch.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"
#include "plan/from_config.h"
#include "plan/memory_model.h"

namespace ds::plan {

namespace {

std::string mb_bytes(int64_t b) { return format_bytes(static_cast<double>(b)); }

std::string mb_ms(double s) { return fmt::format("{:.1f} ms", s * 1e3); }

// "; 16 needs 21.3 GiB" for the smallest candidate above `micro` that does not fit, or "".
std::string next_over(const std::vector<MicroBatchTrial>& trials, int64_t micro) {
  for (const auto& t : trials) {
    if (t.micro_batch > micro && !t.fits) return fmt::format("; {} needs {}", t.micro_batch, mb_bytes(t.peak_bytes));
  }
  return "";
}

}  // namespace

config::JobConfig config_at_micro_batch(const config::JobConfig& c, int64_t micro_batch) {
  config::JobConfig at = c;
  at.warnings.clear();
  config::set_auto_micro_batch(at, micro_batch, "");
  at.warnings.clear();
  return at;
}

AutoMicroBatchPick pick_micro_batch(const config::JobConfig& c, const AutoMicroBatchRequest& r) {
  if (!c.auto_micro_batch.pending) {
    throw invalid_argument("{}: train_micro_batch_size_per_gpu is not \"auto\"", c.path.empty() ? "config" : c.path);
  }
  if (!c.has_model) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}: \"auto\" is picked by the plan, which needs a model section (n_layer, n_head, "
                            "n_embd, vocab_size, seq_len)",
                            c.auto_micro_batch.where_micro_batch),
                "add the model section, or pass --set train_micro_batch_size_per_gpu=N");
  }
  if (r.memory_bytes <= 0) {
    throw invalid_argument("{}: \"auto\" needs the memory per rank (--gpu-mem)", c.auto_micro_batch.where_micro_batch);
  }
  AutoMicroBatchPick pick;
  const bool fixed_batch = c.auto_micro_batch.train_batch_size_fixed;
  for (int64_t m : config::auto_micro_batch_candidates(c)) {
    PlanInput in = plan_input_from_config(config_at_micro_batch(c, m));
    in.layout.num_threads = std::max(1, r.threads);
    MicroBatchTrial t;
    t.micro_batch = m;
    t.accumulation = in.layout.grad_accum;
    try {
      t.peak_bytes = plan_memory(in.shape, in.layout).peak_total();
    } catch (const Error&) {
      continue;  // a rule of the layout at this micro-batch: not a candidate
    }
    t.fits = t.peak_bytes <= r.memory_bytes;
    if (t.fits && r.calibration) {
      const StepTime st = step_time(in.shape, in.layout, *r.calibration,
                                    comm_types(in.layout.precision, in.grad_precision,
                                               in.layout.device == DeviceKind::kCuda));
      t.step_s = st.total();
      t.sequence_s = t.step_s / static_cast<double>(m * t.accumulation * in.layout.dp);
    }
    pick.trials.push_back(t);
  }
  const std::string limit = fmt::format("{} per rank, {}", mb_bytes(r.memory_bytes), r.memory_source);
  std::vector<const MicroBatchTrial*> fits;
  for (const auto& t : pick.trials) {
    if (t.fits) fits.push_back(&t);
  }
  if (fits.empty()) {
    const std::string source = c.path.empty() ? "<config>" : c.path;
    const std::string msg =
        pick.trials.empty()
            ? fmt::format("{}: \"auto\": no micro-batch is possible for this layout", c.auto_micro_batch.where_micro_batch)
            : fmt::format("{}: \"auto\": no micro-batch fits: the smallest, {}, needs {} per rank, over the {} the "
                          "plan sees ({}); give more memory (--gpu-mem), a higher ZeRO stage, activation "
                          "checkpointing or more ranks",
                          c.auto_micro_batch.where_micro_batch, pick.trials.front().micro_batch,
                          mb_bytes(pick.trials.front().peak_bytes), mb_bytes(r.memory_bytes), r.memory_source);
    throw config::ConfigError(source, {msg});
  }
  if (!r.calibration) {
    const MicroBatchTrial& best = *fits.back();
    pick.micro_batch = best.micro_batch;
    std::string over = next_over(pick.trials, best.micro_batch);
    if (over.empty()) {
      over = fixed_batch ? fmt::format("; the largest that divides train_batch_size / data-parallel size = {}",
                                       c.train_batch_size / c.data_parallel_size)
                         : fmt::format("; the largest candidate (powers of two up to {})", config::kMaxAutoMicroBatch);
    }
    pick.reason = fmt::format("largest that fits: {} (peak {} of {}){}", best.micro_batch, mb_bytes(best.peak_bytes),
                              limit, over);
    return pick;
  }
  // The fastest per sequence (per step at a fixed train_batch_size); ties: the smaller micro-batch.
  std::vector<const MicroBatchTrial*> order = fits;
  std::stable_sort(order.begin(), order.end(), [](const MicroBatchTrial* a, const MicroBatchTrial* b) {
    const double x = a->sequence_s, y = b->sequence_s;
    if (std::fabs(x - y) > 1e-9 * std::max(x, y)) return x < y;
    return a->micro_batch < b->micro_batch;
  });
  const MicroBatchTrial& best = *order.front();
  pick.micro_batch = best.micro_batch;
  auto at = [&](const MicroBatchTrial& t) {
    return fixed_batch ? fmt::format("{} at {}/step", t.micro_batch, mb_ms(t.step_s))
                       : fmt::format("{} at {}/step ({}/sequence)", t.micro_batch, mb_ms(t.step_s), mb_ms(t.sequence_s));
  };
  std::string others;
  for (size_t i = 1; i < order.size() && i < 3; ++i) others += (i == 1 ? "; then " : ", ") + at(*order[i]);
  pick.reason = fmt::format("fastest by the calibrated model ({}): {}, peak {} of {}{}{}", r.calibration->source,
                            at(best), mb_bytes(best.peak_bytes), limit, others,
                            next_over(pick.trials, fits.back()->micro_batch));
  return pick;
}

AutoMicroBatchPick resolve_auto_micro_batch(config::JobConfig& c, const AutoMicroBatchRequest& r) {
  AutoMicroBatchPick pick = pick_micro_batch(c, r);
  config::set_auto_micro_batch(c, pick.micro_batch, pick.reason);
  return pick;
}

}  // namespace ds::plan
