// `dstrain plan`'s inputs, resolved from what the user gave: command-line values, a job config,
// a hostfile, the environment. Each function takes the values of the flags it resolves (parsed
// by apps/dstrain/cmd_plan.cpp, which keeps the flags themselves and the choice of mode) and
// returns what the plan's formulas take: the world, the model mode's PlanInput, the device
// memory, DeepSpeed's estimator inputs, the step-time model's hardware. Messages name the flags
// (`--world-size`, `--gpu-mem`, ...) because they are about what those flags said.
//
// Not here: the formulas (model_state.h, activation_paper.h, memory_model.h, recommend.h) and
// the output (plan_json.h; text in cmd_plan.cpp). Never asks the runtime: where the visible GPUs
// are needed, the caller passes a function that finds them. Errors are ds::Error (invalid
// argument) with a hint where one helps; no function here prints.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "plan/from_config.h"
#include "plan/model_state.h"
#include "plan/recommend.h"

namespace ds::plan {

// A positive count such as "7.5e9" or "2851000000" given to `flag`; throws naming the flag.
double parse_count_flag(const std::string& text, const char* flag);

// The ranks of the job and the GPUs per node.
struct PlanWorld {
  int world_size = 0;
  int gpus_per_node = 0;  // 0: unknown
};

// world_size: --world-size (0: not given), else the hostfile's slot count; a --world-size over
// the hostfile's slots is an error. gpus_per_node: --gpus-per-node (0: not given), else the
// hostfile's largest slot count. hostfile "" = none. Throws when neither gives a world size.
PlanWorld resolve_plan_world(int64_t world_size, const std::string& hostfile,
                             int64_t gpus_per_node);

// CPU threads per rank: `threads` (--threads) unless it is 0 (a negative count is passed on for
// plan_memory to reject), else OMP_NUM_THREADS when it is a positive integer (the runtime sizes
// its attention scratch by omp_get_max_threads()), else 1.
int resolve_threads_per_rank(int threads);

// The device memory per GPU the verdict is held to.
struct DeviceMemory {
  int64_t bytes = 0;   // 0: unknown (no --gpu-mem, no GPU found)
  std::string source;  // "--gpu-mem" or "smallest of N GPU(s) found"; "" when unknown
};
// gpu_mem: --gpu-mem ("80GiB", "40GB", "8e10"; "" = not given). Without it, the smallest of the
// sizes gpu_bytes_found() returns (one per visible GPU; called only then).
DeviceMemory resolve_device_memory(const std::string& gpu_mem,
                                   const std::function<std::vector<int64_t>()>& gpu_bytes_found);

// The generic mode's DeepSpeed-estimator flags, as given.
struct DeepSpeedFlags {
  int zero_stage = -1;                     // --zero-stage
  double params = 0;                       // --params, parsed
  std::string largest_layer_params;        // --largest-layer-params ("" = not given)
  int64_t world_size = 0;                  // --world-size (0 = not given)
  int64_t gpus_per_node = 0;               // --gpus-per-node (0 = not given)
  int64_t num_nodes = 0;                   // --num-nodes (0 = not given)
  std::string offload_optimizer = "none";  // --offload-optimizer: none | cpu
  std::string offload_param = "none";      // --offload-param: none | cpu
  int zero_init = 1;                       // --zero-init: 0 | 1
  double buffer_factor = 1.5;              // --buffer-factor
};
// Nodes and GPUs per node as given, or derived from the world size (one node when it is not
// split); throws when they contradict each other or cannot be derived.
DeepSpeedEstimateInput resolve_deepspeed_input(const DeepSpeedFlags& flags);

// The step-time model's flags, as given (rates in the flags' units).
struct HardwareFlags {
  Hardware base;             // cpu_adam_rate, layer_overhead (--cpu-adam-rate, --layer-overhead)
  double gpu_tflops = 125;   // --gpu-tflops
  double intra_gbps = 150;   // --intra-node-gbps
  double inter_gbps = 12.5;  // --inter-node-gbps
  double pcie_gbps = 16;     // --pcie-gbps
};
// The hardware in bytes/s and FLOP/s; gpus_per_node > 0 replaces the default. Throws when a
// rate is not positive.
Hardware resolve_hardware(const HardwareFlags& flags, int gpus_per_node);

}  // namespace ds::plan
