// What accelerators this process can see. The only place outside runtime/kernels/cuda that knows
// whether CUDA was compiled in: with DSTRAIN_CUDA=OFF every query answers "none".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ds::rt {

struct GpuInfo {
  int index = 0;
  std::string name;
  uint64_t total_bytes = 0;
  int sm_major = 0, sm_minor = 0;
};

struct AcceleratorInfo {
  bool cuda_compiled = false;     // built with DSTRAIN_CUDA (AUTO found nvcc, or ON)
  std::string cuda_runtime;       // "13.0" or empty
  std::string cuda_driver;        // "13.0", or empty when no driver is loaded
  std::string nccl_version;       // "2.27.3" or empty
  std::string status;             // why no GPU is visible, when none is
  std::vector<GpuInfo> gpus;      // GPUs CUDA sees (respects CUDA_VISIBLE_DEVICES)
};

// Queries the CUDA runtime once; never throws (a machine without a driver reports no GPUs).
AcceleratorInfo query_accelerators();
// Number of GPUs CUDA sees; 0 without CUDA, driver or devices.
int gpu_count();

}  // namespace ds::rt
