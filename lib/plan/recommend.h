// The layout search behind `dstrain plan --recommend`: enumerate the layouts of a world (tensor,
// pipeline and data parallelism, ZeRO stage, micro-batch size at a fixed global batch,
// activation checkpointing, CPU offload), keep those whose planned peak (memory_model.h) fits
// the device, and rank them by an estimated step time.
//
// The step-time model is deliberately simple, a first-order guide rather than a simulator.
// With G the global batch (train_batch_size), T the sequence length, C the width, L the layers,
// Vp the padded vocabulary, m = gradient_accumulation_steps, b = micro-batch, pb = bytes per
// param/grad element, n = parameters of the rank's part:
//   compute  = G * T * f / (world * gpu_flops), f = (3 + r) * L * (24 C^2 + 4 T C) + 3 * 2 C Vp
//              FLOPs per token (forward + backward = 3 forwards; r = 1 with checkpointing,
//              which recomputes each layer's forward; Megatron-LM's count)
//   bubble   = compute * (pp - 1) / m                         (1F1B and GPipe alike)
//   tp comm  = m * layers_per_stage * (4 + 2r) all-reduces of b*T*C*pb bytes, ring volume
//              2 (tp - 1)/tp, at the intra-node bandwidth (tp stays inside a node)
//   pp comm  = m * 2 * b*T*C*pb bytes (activation forward, gradient backward) per stage boundary
//   dp comm  = ring volume x n*pb: ZeRO-0/1: 2 (dp-1)/dp once per step; ZeRO-2: m (dp-1)/dp
//              (reduce-scatter per micro-batch) + (dp-1)/dp (all-gather after the step);
//              ZeRO-3: m (2 + r + 1)(dp-1)/dp (gather forward, [gather recompute,] gather
//              backward, reduce-scatter); at the inter-node bandwidth when the dp group spans
//              nodes (tp * dp > gpus_per_node), else intra-node
//   offload  = 2 * n/dp * pb / pcie_bandwidth + n/dp / cpu_adam_rate
//   overhead = m * ceil(L / pp) * layer_overhead   (kernel launches and synchronisation per layer
//              per micro-batch, forward and backward: what makes many small micro-batches slower
//              than few large ones at the same FLOPs)
//   step     = compute + bubble + tp comm + pp comm + dp comm + offload + overhead
//              (no overlap of communication with compute assumed)
// Pure; no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model_spec/gpt2_spec.h"
#include "plan/memory_model.h"

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

struct StepTime {
  double compute = 0, bubble = 0, tp_comm = 0, pp_comm = 0, dp_comm = 0, offload = 0, overhead = 0;
  double total() const { return compute + bubble + tp_comm + pp_comm + dp_comm + offload + overhead; }
};

StepTime estimate_step_time(const model_spec::Gpt2Shape& s, const Layout& l, const Hardware& hw);

struct Candidate {
  Layout layout;
  int64_t peak_bytes = 0;
  StepTime time;
  std::string reason;  // one line: why this one, what dominates
};

struct SearchResult {
  std::vector<Candidate> fits;  // sorted by estimated step time, fastest first
  int64_t considered = 0;       // layouts enumerated
  int64_t rejected_memory = 0;  // valid but over the device memory
  int64_t rejected_rule = 0;    // impossible (tp not dividing the heads, pp > layers, batch)
};

// Enumerates every layout of `world_size` ranks at the base layout's global batch
// (micro_batch * grad_accum * dp), keeping its precision, buckets, schedule and partition.
// Throws ds::Error (invalid argument) for world_size < 1 or device_bytes <= 0.
SearchResult recommend(const model_spec::Gpt2Shape& s, const Layout& base, int world_size,
                       int64_t device_bytes, const Hardware& hw);

// "tp 2 x pp 1 x dp 4, ZeRO-2, micro-batch 4 x 2 steps, checkpointing, offload optimizer"
std::string describe_layout(const Layout& l);

}  // namespace ds::plan
