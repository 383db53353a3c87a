// The JSON that `dstrain plan --json` prints, one function per mode, each with its shape. These
// shapes are the plan's machine-readable format: scripts and tests read them, so a key is never
// renamed or dropped without a note in docs/planning.md. Key order is part of the format
// (nlohmann::ordered_json). Bytes are integers (rounded where a formula gives fractions); layouts
// use the config's spellings ("cpu"/"none", "1f1b", "bf16").
//
// Not here: the numbers (model_state.h, activation_paper.h, memory_model.h, recommend.h) and the
// text output (apps/dstrain/cmd_plan.cpp). Pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/activation_paper.h"
#include "plan/from_config.h"
#include "plan/memory_model.h"
#include "plan/model_state.h"
#include "plan/recommend.h"

namespace ds::plan {

using Json = nlohmann::ordered_json;

// --formula paper --params P: {formula: "paper", params, world_size, zero_stage, k,
//   per_gpu: {params, grads, optimizer, total}}
Json paper_model_states_json(double params, int64_t world_size, int zero_stage,
                             const PaperModelStates& m);

// --formula deepspeed: {formula: "deepspeed", zero_stage, params, largest_layer_params,
//   num_nodes, gpus_per_node, additional_buffer_factor, estimate: E, all_options: [E...]}
//   with E = {options, per_cpu, per_gpu}
Json deepspeed_estimate_json(const DeepSpeedEstimateInput& in, const DeepSpeedEstimate& chosen,
                             const std::vector<DeepSpeedEstimate>& all);

// The paper activation view: {formula: "paper", source, s, b, h, a, t, layers, pp,
//   rows: [{name, formula, per_layer, first_stage (only with layers > 0)}]}
Json paper_activations_json(const KorthikantiView& v);

// {tp, pp, dp, zero_stage, micro_batch, gradient_accumulation_steps, activation_checkpointing,
//  offload_optimizer, offload_param, schedule, precision}
Json layout_json(const Layout& l);

// {rank, stage, dp_rank, tp_rank, layers: [begin, end), in_flight_micro_batches, params, grads,
//  optimizer, activations, comm, workspace, checkpoint, buffers, total, cpu}
Json rank_json(const RankMemory& r);

// Model mode: {ranks: [rank_json...], config, world_size, layout, model: {n_layer, n_head,
//   n_embd, vocab_size, padded_vocab_size, seq_len, params}, stage_layers: [bounds],
//   distinct: [{ranks: "0-3,8", stage, total}], peak: {rank, total},
//   device_bytes (null when unknown), verdict: {fits, margin, fixes} (null when unknown)}
// `in` is what the plan `p` was computed from; device_bytes 0 = unknown.
Json memory_plan_json(const std::string& config_path, const PlanInput& in, const MemoryPlan& p,
                      int64_t device_bytes);

// {gpu_flops, intra_node_bw, layer_overhead, inter_node_bw, pcie_bw, cpu_adam_rate,
//  gpus_per_node}
Json hardware_json(const Hardware& hw);

// --recommend: {config, world_size, device_bytes, global_batch, considered, fitting,
//   rejected_memory, rejected_rule, hardware, calibration: {source, measured}, tokens (with
//   --tokens), recommendations: [{layout, peak_bytes, step_seconds, step: {compute, bubble,
//   tp_comm, pp_comm, dp_comm, offload, overhead, recompute, dp_comm_total, optimizer,
//   shared_cores}, reason, predicted_ms, measured_ms (null unless --measure ran it),
//   runner_up_trades (what the next one trades against this one; absent on the last),
//   time_to_train_s (with --tokens)}]}, with the first `shown` fitting layouts. The step terms
// are step_time.h's StepTime (seconds); step_seconds = their total; dp_comm is the exposed part.
struct RecommendReport {
  std::string config_path;
  int world_size = 0;
  int64_t device_bytes = 0;
  int64_t global_batch = 0;
  int64_t seq_len = 0;
  Hardware hardware;
  std::string calibration_source = "built-in constants";
  bool calibrated = false;
  int64_t tokens = 0;                // --tokens: 0 = not given
  std::vector<double> measured_ms;   // --measure: by recommendation index; <= 0 = not measured
  size_t shown = 0;
};
Json recommend_json(const RecommendReport& report, const SearchResult& result);
// Seconds to train report.tokens tokens at c's step time (whole steps of global_batch x seq_len).
double time_to_train(const RecommendReport& report, const Candidate& c);

}  // namespace ds::plan
