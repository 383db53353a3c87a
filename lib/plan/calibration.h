// The calibration file `dstrain plan --calibrate -o calib.json` writes and `dstrain plan
// --recommend --calibration calib.json` reads: what one machine (a node shape, a backend) was
// measured to do, as the step-time model (step_time.h) takes it. The measuring itself is the
// runtime's (runtime/train/calibration_rank.h; lib/plan never links it).
//
// Format (JSON object, keys in this order; seconds and bytes/s as numbers):
//   format: "dstrain-calibration", version: 1,
//   host: string, device: "cpu" | "cuda", backend: "shm" | "gloo" | "nccl",
//   nodes, ranks_per_node, cores (CPU cores of a node; 0 on GPUs), threads_per_rank: integers >= 0,
//   model: {type, n_layer, n_head, n_embd, vocab_size, padded_vocab_size, seq_len, and the family's
//          own keys (model_spec/family.h: integers and booleans required, numbers optional)}: the
//          shape measured (no type: model.type's default),
//   compute: [{tp, concurrency, micro_batch, precision ("fp32"|"bf16"|"fp16"), layer_fwd_s,
//              layer_bwd_s, embed_fwd_s, embed_bwd_s, head_s}]   (at least one),
//   collectives: [{op ("all_reduce"|"reduce_scatter"|"all_gather"|"send_recv"|"all_to_all"|
//                  "ring_exchange"; files without the last two price them by send_recv), group_size,
//                  concurrent_groups, across_nodes, latency_s, bus_bytes_per_s,
//                  points: [{bytes, seconds}]  (the measurements the fit came from)}],
//   optimizer_params_per_s, host_link_bytes_per_s (null when not measured: CPU runs),
//   cpu_adam_params_per_s, step_overhead_s.
// Reading validates every key: a missing file, bad JSON, a missing key or a value of the wrong
// type or range is a ds::Error (invalid argument) naming the file, the line and the JSON path
// ("calib.json:12: $.compute[2].layer_fwd_s: expected a number > 0, got -1").
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "plan/step_time.h"

namespace ds::plan {

// What the file says beyond the model's inputs (for the output and --json).
struct CalibrationMeta {
  std::string host;
  std::string device = "cpu";
  std::string backend = "shm";
  int nodes = 1;
};

struct CalibrationFile {
  Calibration cal;  // cal.source = the path, cal.measured = true
  CalibrationMeta meta;
};

// Reads and validates `path`; throws as above.
CalibrationFile read_calibration(const std::string& path);
// Validates already-parsed text (`source` names it in messages).
CalibrationFile parse_calibration(const std::string& text, const std::string& source);

// The file's JSON for `c` (the measured fields) and `meta`.
nlohmann::ordered_json calibration_json(const Calibration& c, const CalibrationMeta& meta);

// Least-squares latency + bus bytes / bandwidth through (bytes, seconds) points of one op and
// group size, in relative error (each point weighted 1 / seconds^2); latency clamped to >= 0, bandwidth to > 0. Needs at least one point.
CollectiveFit fit_collective(CollectiveOp op, int group_size, int concurrent_groups,
                             bool across_nodes, const std::vector<std::pair<double, double>>& points);

}  // namespace ds::plan
