#include "core/device.h"

namespace ds::rt {

#ifdef DSTRAIN_HAVE_CUDA
// Implemented in kernels/cuda/device_query.cu.
AcceleratorInfo cuda_query_accelerators();
#endif

AcceleratorInfo query_accelerators() {
#ifdef DSTRAIN_HAVE_CUDA
  return cuda_query_accelerators();
#else
  AcceleratorInfo info;
  info.status = "built without CUDA (DSTRAIN_CUDA=OFF or nvcc not found)";
  return info;
#endif
}

int gpu_count() { return static_cast<int>(query_accelerators().gpus.size()); }

}  // namespace ds::rt
