// The device query: answered by the CUDA module (core/cuda_module.h) when a GPU may be present,
// so a machine without an NVIDIA driver never loads it.
#include "core/device.h"

#include <dirent.h>

#include <cstdlib>
#include <string>

#include "core/cuda_memory_table.h"
#include "core/cuda_module.h"

namespace ds::rt {

namespace {
// GPUs the NVIDIA driver lists (one directory per GPU under /proc/driver/nvidia/gpus), before
// CUDA_VISIBLE_DEVICES; -1 when the driver is not loaded.
int driver_gpu_count() {
  DIR* d = opendir("/proc/driver/nvidia/gpus");
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

// CUDA_VISIBLE_DEVICES narrows what the driver lists: "" hides every GPU, "0,2" shows two (CUDA
// stops at the first invalid entry; counting entries is the launcher's estimate, CUDA decides).
int visible_count(int driver) {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  if (v == nullptr) return driver;
  std::string s(v);
  if (s.empty()) return 0;
  int n = 1;
  for (char c : s) n += c == ',';
  return n < driver ? n : driver;
}
}  // namespace

AcceleratorInfo query_accelerators(ModuleUse use) {
  const int probe = driver_gpu_count();
  if (use == ModuleUse::kIfGpuPresent && probe <= 0) {
    AcceleratorInfo info;
    info.cuda_compiled = cuda_module_built();
    info.status = probe < 0 ? "no NVIDIA driver loaded (no /proc/driver/nvidia/gpus)" : "the NVIDIA driver lists no GPU";
    return info;
  }
  if (auto err = try_load_cuda_module()) {
    AcceleratorInfo info;
    info.cuda_compiled = cuda_module_built();
    info.status = *err;
    return info;
  }
  return cuda_memory("the device query").query_accelerators();
}

int gpu_count() {
  const int probe = driver_gpu_count();
  return probe <= 0 ? 0 : visible_count(probe);
}

}  // namespace ds::rt
