// The entry points of the CUDA module, libdstrain_cuda.so (core/cuda_module.h): its ABI number and
// the tables the rest of dstrain calls it through. The module is built with hidden visibility
// and its static dependencies' symbols excluded, so these (and ds_cuda_make_nccl_comm, in
// comm/nccl_comm.cpp) are all it exports.
#include "core/cuda_memory_table.h"
#include "core/cuda_module.h"
#include "kernels/cuda/memory.h"
#include "kernels/cuda_kernel_table.h"

#define DS_CUDA_EXPORT extern "C" __attribute__((visibility("default")))

namespace ds::rt::cuda {

void*& current_stream() {
  thread_local void* stream = nullptr;
  return stream;
}

}  // namespace ds::rt::cuda

DS_CUDA_EXPORT int ds_cuda_module_abi() { return ds::rt::kCudaModuleAbi; }

DS_CUDA_EXPORT const ds::rt::CudaMemoryTable* ds_cuda_memory_table() {
  namespace cuda = ds::rt::cuda;
  static const ds::rt::CudaMemoryTable table = {
      &cuda::device_alloc,        &cuda::device_free,   &cuda::pinned_alloc,
      &cuda::pinned_free,         &cuda::memset_zero_async, &cuda::copy_to_device,
      &cuda::copy_to_host,        &cuda::copy_on_device,    &cuda::set_device,
      &cuda::device_cache_stats,  &cuda::device_empty_cache, &ds::rt::cuda_query_accelerators,
  };
  return &table;
}

DS_CUDA_EXPORT const ds::rt::kern::CudaKernelTable* ds_cuda_kernel_table() {
  namespace cuda = ds::rt::cuda;
  static const ds::rt::kern::CudaKernelTable table = [] {
    ds::rt::kern::CudaKernelTable t{};
#define DS_CUDA_TABLE_FILL(name) t.name = &cuda::name;
    DS_CUDA_KERNEL_ENTRIES(DS_CUDA_TABLE_FILL)
#undef DS_CUDA_TABLE_FILL
    using ds::rt::bf16;
#define DS_CUDA_TABLE_FILL(name) t.bf16.name = &cuda::typed::name<bf16>;
#define DS_CUDA_TABLE_FILL_G(name) t.bf16.name = &cuda::typed::name<bf16, bf16>;
    DS_CUDA_TYPED_S_ENTRIES(DS_CUDA_TABLE_FILL)
    DS_CUDA_TYPED_SG_ENTRIES(DS_CUDA_TABLE_FILL_G)
#undef DS_CUDA_TABLE_FILL_G
#define DS_CUDA_TABLE_FILL_G(name) t.bf16_fp32_grads.name = &cuda::typed::name<bf16, float>;
    DS_CUDA_TYPED_SG_ENTRIES(DS_CUDA_TABLE_FILL_G)
#undef DS_CUDA_TABLE_FILL_G
#undef DS_CUDA_TABLE_FILL
    return t;
  }();
  return &table;
}
