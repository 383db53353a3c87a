// Generic model-state memory formulas: bytes per GPU for parameters, gradients and optimizer
// states, from a parameter count alone (no model config). Two accountings, kept apart on purpose
// so users can compare with the numbers they already know:
//   - the ZeRO paper's (Rajbhandari et al. 2019, "ZeRO: Memory Optimizations Toward Training
//     Trillion Parameter Models", section 5.1 / Figure 1): fp16 params (2 B), fp16 grads (2 B),
//     K = 12 B of fp32 optimizer state (master weights, Adam momentum and variance) per parameter;
//   - DeepSpeed's estimators, estimate_zero2_model_states_mem_needs (deepspeed/runtime/zero/
//     stage_1_and_2.py) and estimate_zero3_model_states_mem_needs (deepspeed/runtime/zero/
//     stage3.py), reproduced exactly, integer truncations included.
// This is not the model-mode planner (memory_model.h), which counts the tensors the runtime
// allocates; these are closed-form rules of thumb. Pure functions, no I/O, thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ds::plan {

// --- ZeRO paper -------------------------------------------------------------------------------
// Per-GPU model-state bytes for P parameters on Nd data-parallel ranks, with Psi = P, K = 12:
//   stage 0 (baseline):  (2 + 2 + K) * Psi
//   stage 1 (P_os):      2*Psi + 2*Psi + K*Psi/Nd
//   stage 2 (P_os+g):    2*Psi + (2 + K)*Psi/Nd
//   stage 3 (P_os+g+p):  (2 + 2 + K)*Psi/Nd
// Paper check (Figure 1): Psi = 7.5e9, Nd = 64 -> 120, 31.4, 16.6, 1.88 GB (1 GB = 1e9 bytes).
struct PaperModelStates {
  double params = 0;     // bytes of fp16 parameters on one GPU
  double grads = 0;      // bytes of fp16 gradients on one GPU
  double optimizer = 0;  // bytes of fp32 optimizer state (K per parameter) on one GPU
  double total() const { return params + grads + optimizer; }
};

constexpr double kZeroPaperK = 12.0;

// Throws ds::Error (invalid argument) for params <= 0, world_size < 1, stage outside 0..3.
PaperModelStates zero_paper_model_states(double params, int64_t world_size, int stage,
                                         double k = kZeroPaperK);

// --- DeepSpeed's estimators -------------------------------------------------------------------
// Inputs mirror the Python functions' arguments. total_gpus = num_nodes * gpus_per_node.
struct DeepSpeedEstimateInput {
  int stage = 3;                       // 2 or 3: DeepSpeed has estimators for these only
  double total_params = 0;
  double largest_layer_params = 0;     // ZeRO-3 only: the largest module's own parameters
  int64_t gpus_per_node = 1;
  int64_t num_nodes = 1;
  bool offload_optimizer_cpu = false;  // DeepSpeed's cpu_offload
  bool offload_param_cpu = false;      // DeepSpeed's cpu_offload_params (ZeRO-3, needs optimizer offload)
  bool zero_init = true;               // ZeRO-3 only: deepspeed.zero.Init used to build the model
  double additional_buffer_factor = 1.5;
};

// Bytes, as the Python functions return them (int()-truncated).
struct DeepSpeedEstimate {
  int64_t cpu_bytes = 0;        // per node (DeepSpeed's "per CPU")
  int64_t gpu_bytes = 0;        // per GPU
  int64_t largest_layer_bytes = 0;  // ZeRO-3: 4 * largest_layer_params; 0 for ZeRO-2
  std::string options;          // "offload_param=none, offload_optimizer=none, zero_init=1"
};

// ZeRO-2, estimate_zero2_model_states_mem_needs (current DeepSpeed):
//   G = num_nodes * gpus_per_node
//   offload optimizer:  gpu = 2P;                  cpu = P * max(4G, 16) * f
//   no offload:         gpu = 2P + int(18P / G);   cpu = P * 4 * gpus_per_node * f
//   (18 = 2 fp16 grads + 4 fp32 grads + 4 fp32 params + 8 Adam momentum and variance)
// ZeRO-3, estimate_zero3_model_states_mem_needs, with L = 4 * largest_layer_params, n = 1/num_nodes:
//   offload optimizer + params: gpu = L;                   cpu = P * 18n * f (zero_init)
//                                                          or P * max(4*gpus_per_node, 18n) * f
//   offload optimizer only:     gpu = L + int(2P / G);     cpu = P * 16n * f (zero_init)
//                                                          or P * max(4*gpus_per_node, 16n) * f
//   no offload:                 gpu = L + int(18P / G);    cpu = largest_layer_params * 4 * gpus_per_node * f (zero_init)
//                                                          or P * 4 * gpus_per_node * f
// f = additional_buffer_factor (1.5). Throws ds::Error for stage outside {2,3}, offload_param
// without offload_optimizer or with ZeRO-2, non-positive counts.
DeepSpeedEstimate deepspeed_model_states(const DeepSpeedEstimateInput& in);

// Every option combination DeepSpeed's *_all_cold function prints, in its order
// (ZeRO-2: optimizer offload cpu, none; ZeRO-3: (param cpu, optim cpu), (none, cpu), (none, none),
// each with zero_init 1 then 0).
std::vector<DeepSpeedEstimate> deepspeed_model_states_all(const DeepSpeedEstimateInput& in);

}  // namespace ds::plan
