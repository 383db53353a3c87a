// What accelerators this process can see. The full query goes through the CUDA module (loaded
// on demand, core/cuda_module.h); the GPU count does not: it reads what the NVIDIA driver lists,
// so the launcher and the agent never load CUDA to choose a default slot count.
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

enum class ModuleUse {
  kAlways,        // load the CUDA module to ask CUDA (dstrain report: versions even without a GPU)
  kIfGpuPresent,  // only when the NVIDIA driver lists a GPU (the plan reading GPU memory)
};
// Queries CUDA; never throws: a build without CUDA, a missing module or library, or a machine
// without a driver reports no GPUs and says why in `status`.
AcceleratorInfo query_accelerators(ModuleUse use = ModuleUse::kAlways);
// GPUs the NVIDIA driver lists, narrowed by CUDA_VISIBLE_DEVICES; 0 without a driver. Never
// loads the CUDA module.
int gpu_count();

}  // namespace ds::rt
