// The ZeRO paper's and DeepSpeed's model-state formulas. See model_state.h for the formulas
// themselves; this file only evaluates them and checks the arguments.
#include "plan/model_state.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace ds::plan {

namespace {

void check_positive(double v, const char* what) {
  if (!(v > 0) || !std::isfinite(v)) {
    throw invalid_argument("{} must be a positive number, got {}", what, v);
  }
}

// Python's int() on a non-negative float: truncation toward zero.
int64_t py_int(double v) { return static_cast<int64_t>(std::trunc(v)); }

}  // namespace

PaperModelStates zero_paper_model_states(double params, int64_t world_size, int stage, double k) {
  check_positive(params, "--params");
  if (world_size < 1) throw invalid_argument("--world-size must be at least 1, got {}", world_size);
  if (stage < 0 || stage > 3) throw invalid_argument("--zero-stage must be 0, 1, 2 or 3, got {}", stage);
  const double nd = static_cast<double>(world_size);
  PaperModelStates m;
  m.params = 2 * params;
  m.grads = 2 * params;
  m.optimizer = k * params;
  if (stage >= 1) m.optimizer /= nd;  // P_os: optimizer states partitioned
  if (stage >= 2) m.grads /= nd;      // P_g: gradients partitioned
  if (stage >= 3) m.params /= nd;     // P_p: parameters partitioned
  return m;
}

DeepSpeedEstimate deepspeed_model_states(const DeepSpeedEstimateInput& in) {
  if (in.stage != 2 && in.stage != 3) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("--formula deepspeed covers ZeRO stages 2 and 3 only, got --zero-stage {}",
                            in.stage),
                "DeepSpeed has estimators for ZeRO-2 (estimate_zero2_model_states_mem_needs) and "
                "ZeRO-3 (estimate_zero3_model_states_mem_needs); use --formula paper for stages 0 and 1");
  }
  check_positive(in.total_params, "--params");
  if (in.gpus_per_node < 1) throw invalid_argument("--gpus-per-node must be at least 1, got {}", in.gpus_per_node);
  if (in.num_nodes < 1) throw invalid_argument("--num-nodes must be at least 1, got {}", in.num_nodes);
  check_positive(in.additional_buffer_factor, "--buffer-factor");
  if (in.offload_param_cpu && in.stage != 3) {
    throw invalid_argument("--offload-param cpu needs ZeRO stage 3 (parameters are partitioned only "
                           "in stage 3), got --zero-stage {}",
                           in.stage);
  }
  if (in.offload_param_cpu && !in.offload_optimizer_cpu) {
    throw invalid_argument("--offload-param cpu needs --offload-optimizer cpu as well (DeepSpeed's "
                           "estimator has no parameter-only offload)");
  }
  if (in.stage == 3 && !(in.largest_layer_params > 0)) {
    throw Error(ErrorKind::kInvalidArgument,
                "--formula deepspeed with --zero-stage 3 needs --largest-layer-params",
                "the largest module's own parameter count: DeepSpeed gathers one layer at a time");
  }

  const double p = in.total_params;
  const double f = in.additional_buffer_factor;
  const double g = static_cast<double>(in.num_nodes * in.gpus_per_node);
  const double gpn = static_cast<double>(in.gpus_per_node);
  DeepSpeedEstimate e;
  const char* cpu = "cpu ";  // DeepSpeed formats the enum with width 4
  double cpu_mem = 0, gpu_mem = 0;
  if (in.stage == 2) {
    if (in.offload_optimizer_cpu) {
      gpu_mem = 2 * p;
      cpu_mem = p * std::max(4 * g, 16.0) * f;
    } else {
      gpu_mem = 2 * p + static_cast<double>(py_int(18 * p / g));
      cpu_mem = p * 4 * gpn * f;
    }
    e.options = fmt::format("offload_optimizer={}", in.offload_optimizer_cpu ? cpu : "none");
  } else {
    const double gpus_factor = 1.0 / static_cast<double>(in.num_nodes);
    const double largest = 4 * in.largest_layer_params;
    e.largest_layer_bytes = py_int(largest);
    if (in.offload_optimizer_cpu) {
      if (in.offload_param_cpu) {
        gpu_mem = largest;
        cpu_mem = in.zero_init ? p * 18 * gpus_factor * f
                               : p * std::max(4 * gpn, 18 * gpus_factor) * f;
      } else {
        gpu_mem = largest + static_cast<double>(py_int(2 * p / g));
        cpu_mem = in.zero_init ? p * 16 * gpus_factor * f
                               : p * std::max(4 * gpn, 16 * gpus_factor) * f;
      }
    } else {
      gpu_mem = largest + static_cast<double>(py_int(18 * p / g));
      cpu_mem = in.zero_init ? in.largest_layer_params * 4 * gpn * f : p * 4 * gpn * f;
    }
    e.options = fmt::format("offload_param={}, offload_optimizer={}, zero_init={}",
                            in.offload_param_cpu ? cpu : "none",
                            in.offload_optimizer_cpu ? cpu : "none", in.zero_init ? 1 : 0);
  }
  e.cpu_bytes = py_int(cpu_mem);
  e.gpu_bytes = py_int(gpu_mem);
  return e;
}

std::vector<DeepSpeedEstimate> deepspeed_model_states_all(const DeepSpeedEstimateInput& in) {
  std::vector<DeepSpeedEstimate> out;
  DeepSpeedEstimateInput v = in;
  if (in.stage == 2) {
    v.offload_param_cpu = false;
    for (bool off : {true, false}) {
      v.offload_optimizer_cpu = off;
      out.push_back(deepspeed_model_states(v));
    }
    return out;
  }
  for (bool off_opt : {true, false}) {
    for (bool off_param : {true, false}) {
      if (!off_opt && off_param) continue;
      for (bool zi : {true, false}) {
        v.offload_optimizer_cpu = off_opt;
        v.offload_param_cpu = off_param;
        v.zero_init = zi;
        out.push_back(deepspeed_model_states(v));
      }
    }
  }
  return out;
}

}  // namespace ds::plan
