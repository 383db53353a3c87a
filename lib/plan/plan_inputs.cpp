// Resolution of `dstrain plan`'s inputs (plan_inputs.h). The rules are DeepSpeed's where it has
// them (nodes x GPUs per node for its estimators) and the launcher's otherwise (a hostfile's
// slots are the ranks, its largest slot count the GPUs per node).
#include "plan/plan_inputs.h"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"
#include "config/hostfile.h"
#include "config/job_config.h"

namespace ds::plan {

namespace {

bool parse_offload_flag(const std::string& s, const char* flag) {
  if (s == "none") return false;
  if (s == "cpu") return true;
  throw invalid_argument("{} expects 'none' or 'cpu', got '{}'", flag, s);
}

// Nodes x GPUs per node from what was given; 0 = not given.
void resolve_nodes(int64_t world_size, DeepSpeedEstimateInput& in) {
  if (in.gpus_per_node == 0 && in.num_nodes == 0) {
    if (world_size <= 0) {
      throw Error(ErrorKind::kInvalidArgument, "--formula deepspeed needs the GPUs",
                  "give --world-size N (one node), or --gpus-per-node G and --num-nodes M");
    }
    in.gpus_per_node = world_size;
    in.num_nodes = 1;
  } else if (in.gpus_per_node == 0) {
    if (world_size <= 0 || world_size % in.num_nodes != 0) {
      throw invalid_argument(
          "--num-nodes {} needs --gpus-per-node, or a --world-size divisible by it",
          in.num_nodes);
    }
    in.gpus_per_node = world_size / in.num_nodes;
  } else if (in.num_nodes == 0) {
    if (world_size > 0 && world_size % in.gpus_per_node != 0) {
      throw invalid_argument("--world-size {} is not a multiple of --gpus-per-node {}",
                             world_size, in.gpus_per_node);
    }
    in.num_nodes = world_size > 0 ? world_size / in.gpus_per_node : 1;
  }
  if (world_size > 0 && world_size != in.gpus_per_node * in.num_nodes) {
    throw invalid_argument("--world-size {} differs from --num-nodes {} x --gpus-per-node {}",
                           world_size, in.num_nodes, in.gpus_per_node);
  }
}

}  // namespace

double parse_count_flag(const std::string& text, const char* flag) {
  auto v = parse_bytes(text);  // accepts 7.5e9, 2851000000, ...
  if (!v || *v <= 0) {
    throw invalid_argument("{} expects a positive number like 7.5e9, got '{}'", flag, text);
  }
  return *v;
}

PlanWorld resolve_plan_world(int64_t world_size, const std::string& hostfile,
                             int64_t gpus_per_node) {
  PlanWorld w;
  w.world_size = static_cast<int>(world_size);
  if (!hostfile.empty()) {
    auto hf = config::load_hostfile(hostfile);
    int total = 0, most = 0;
    for (const auto& h : hf.hosts) {
      total += h.slots;
      most = std::max(most, h.slots);
    }
    if (w.world_size == 0) w.world_size = total;
    if (w.world_size > total) {
      throw invalid_argument("--world-size {} exceeds the {} slots of hostfile {}", w.world_size,
                             total, hostfile);
    }
    w.gpus_per_node = most;
  }
  if (gpus_per_node > 0) w.gpus_per_node = static_cast<int>(gpus_per_node);
  if (w.world_size <= 0) {
    throw Error(ErrorKind::kInvalidArgument, "dstrain plan --config needs the world size",
                "give --world-size N or --hostfile H");
  }
  return w;
}

int resolve_threads_per_rank(int threads) {
  if (threads != 0) return threads;
  const char* omp = std::getenv("OMP_NUM_THREADS");
  auto n = omp ? parse_int(omp) : std::nullopt;
  return n && *n > 0 ? static_cast<int>(*n) : 1;
}

DeviceMemory resolve_device_memory(const std::string& gpu_mem,
                                   const std::function<std::vector<int64_t>()>& gpu_bytes_found) {
  DeviceMemory d;
  if (!gpu_mem.empty()) {
    auto v = parse_bytes(gpu_mem);
    if (!v || *v <= 0) {
      throw invalid_argument("--gpu-mem expects a size like 80GiB, 40GB or 8e10, got '{}'",
                             gpu_mem);
    }
    d.source = "--gpu-mem";
    d.bytes = static_cast<int64_t>(*v);
    return d;
  }
  const std::vector<int64_t> gpus = gpu_bytes_found();
  for (int64_t b : gpus) {
    if (d.bytes == 0 || b < d.bytes) d.bytes = b;
  }
  if (d.bytes > 0) d.source = fmt::format("smallest of {} GPU(s) found", gpus.size());
  return d;
}

DeepSpeedEstimateInput resolve_deepspeed_input(const DeepSpeedFlags& f) {
  DeepSpeedEstimateInput in;
  in.stage = f.zero_stage;
  in.total_params = f.params;
  if (!f.largest_layer_params.empty()) {
    in.largest_layer_params = parse_count_flag(f.largest_layer_params, "--largest-layer-params");
  }
  in.gpus_per_node = f.gpus_per_node > 0 ? f.gpus_per_node : 0;
  in.num_nodes = f.num_nodes > 0 ? f.num_nodes : 0;
  resolve_nodes(f.world_size, in);
  in.offload_optimizer_cpu = parse_offload_flag(f.offload_optimizer, "--offload-optimizer");
  in.offload_param_cpu = parse_offload_flag(f.offload_param, "--offload-param");
  if (f.zero_init != 0 && f.zero_init != 1) {
    throw invalid_argument("--zero-init expects 0 or 1, got {}", f.zero_init);
  }
  in.zero_init = f.zero_init == 1;
  in.additional_buffer_factor = f.buffer_factor;
  return in;
}

Hardware resolve_hardware(const HardwareFlags& f, int gpus_per_node) {
  Hardware hw = f.base;
  hw.gpu_flops = f.gpu_tflops * 1e12;
  hw.intra_node_bw = f.intra_gbps * 1e9;
  hw.inter_node_bw = f.inter_gbps * 1e9;
  hw.pcie_bw = f.pcie_gbps * 1e9;
  if (gpus_per_node > 0) hw.gpus_per_node = gpus_per_node;
  if (!(hw.gpu_flops > 0 && hw.intra_node_bw > 0 && hw.inter_node_bw > 0 && hw.pcie_bw > 0)) {
    throw invalid_argument(
        "--gpu-tflops, --intra-node-gbps, --inter-node-gbps and --pcie-gbps must be positive");
  }
  return hw;
}

}  // namespace ds::plan
