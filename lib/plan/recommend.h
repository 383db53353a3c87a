// The layout search behind `dstrain plan --recommend`: enumerate the layouts of a world (tensor,
// pipeline and data parallelism, ZeRO stage, micro-batch size at a fixed global batch,
// activation checkpointing, CPU offload), keep those whose planned peak (memory_model.h) fits
// the device, and rank them by an estimated step time.
//
// The step time comes from plan/step_time.h: a calibrated machine (`dstrain plan --calibrate`,
// plan/calibration.h) or the built-in constants of Hardware below.
// Pure; no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model_spec/shape.h"
#include "plan/memory_model.h"
#include "plan/step_time.h"

namespace ds::plan {

// Documented defaults; every one is a `dstrain plan --recommend` flag.
struct Hardware {
  double gpu_flops = 125e12;        // achieved FLOP/s per GPU (A100 bf16 at ~40% of 312 TFLOP/s)
  double intra_node_bw = 150e9;     // bytes/s per GPU inside a node (NVLink)
  double inter_node_bw = 12.5e9;    // bytes/s per GPU across nodes (100 Gb/s)
  double pcie_bw = 16e9;            // bytes/s host <-> device (offload)
  double cpu_adam_rate = 1e9;       // parameters/s the CPU optimizer updates per rank
  double layer_overhead = 50e-6;    // seconds per layer per micro-batch (forward + backward)
  int gpus_per_node = 8;
};

// The machine the constants describe: no samples, so compute is FLOPs / gpu_flops plus
// layer_overhead per layer per micro-batch, and collectives are bytes over the bandwidths.
Calibration builtin_calibration(const Hardware& hw);

// step_time() on builtin_calibration(hw), communicating in the layout's precision.
StepTime estimate_step_time(const model_spec::ModelShape& s, const Layout& l, const Hardware& hw);

struct Candidate {
  Layout layout;
  int64_t peak_bytes = 0;
  StepTime time;
  std::string reason;  // one line: why this one, what bounds it
};

// What `b` trades against `a` (its runner-up): the terms that differ most, in ms, e.g.
// "+12.0% (+30.1 ms): compute +41.0 ms, data-parallel traffic -11.2 ms".
std::string compare_steps(const Candidate& a, const Candidate& b);

struct SearchResult {
  std::vector<Candidate> fits;  // sorted by estimated step time, fastest first
  int64_t considered = 0;       // layouts enumerated
  int64_t rejected_memory = 0;  // valid but over the device memory
  int64_t rejected_rule = 0;    // impossible (tp not dividing the heads, pp > layers, batch)
};

// Enumerates every layout of `world_size` ranks at the base layout's global batch
// (micro_batch * grad_accum * dp), keeping its precision, buckets, schedule and partition.
// Throws ds::Error (invalid argument) for world_size < 1 or device_bytes <= 0.
// `cal` is the machine, `types` what the collectives move.
SearchResult recommend(const model_spec::ModelShape& s, const Layout& base, int world_size,
                       int64_t device_bytes, const Calibration& cal, const CommTypes& types);

// "tp 2 x pp 1 x dp 4, ZeRO-2, micro-batch 4 x 2 steps, checkpointing, offload optimizer"
std::string describe_layout(const Layout& l);

}  // namespace ds::plan
