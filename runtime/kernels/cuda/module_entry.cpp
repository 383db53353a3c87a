// The entry points of the CUDA module, libdstrain_cuda.so (core/cuda_module.h): its ABI number and
// the tables the rest of dstrain calls it through. The module is built with hidden visibility
// and its static dependencies' symbols excluded, so these (and ds_cuda_make_nccl_comm, in
// comm/nccl_comm.cpp) are all it exports.
#include "core/cuda_memory_table.h"
#include "core/cuda_module.h"
#include "kernels/cuda/graph.h"
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
      &cuda::copy_to_host,        &cuda::copy_on_device,    &cuda::copy_rows,         &cuda::set_device,
      &cuda::device_cache_stats,  &cuda::device_empty_cache, &ds::rt::cuda_query_accelerators,
      &cuda::stream_create,       &cuda::stream_destroy,      &cuda::graph_begin_capture,
      &cuda::graph_end_capture,   &cuda::graph_abort_capture, &cuda::graph_launch,
      &cuda::graph_destroy,
  };
  return &table;
}

namespace {

// The module's typed kernels of storage S and gradients G, from the op list.
template <typename S, typename G>
ds::rt::kern::CudaOps<S, G> typed_ops() {
  namespace cuda = ds::rt::cuda;
  ds::rt::kern::CudaOps<S, G> o{};
#define DS_KERNEL_OP(name, params, args) o.name = &cuda::typed::name<S>;
#define DS_KERNEL_OP_G(name, params, args) o.name = &cuda::typed::name<S, G>;
#include "kernels/ops.def"
#define DS_CUDA_OPS_FILL(name) o.name = &cuda::typed::name<S>;
  DS_CUDA_TYPED_ONLY_ENTRIES(DS_CUDA_OPS_FILL)
#undef DS_CUDA_OPS_FILL
  return o;
}

}  // namespace

DS_CUDA_EXPORT const ds::rt::kern::CudaKernelTable* ds_cuda_kernel_table() {
  namespace cuda = ds::rt::cuda;
  static const ds::rt::kern::CudaKernelTable table = [] {
    ds::rt::kern::CudaKernelTable t{};
#define DS_CUDA_TABLE_FILL(name) t.name = &cuda::name;
    DS_CUDA_KERNEL_ENTRIES(DS_CUDA_TABLE_FILL)
#undef DS_CUDA_TABLE_FILL
    using ds::rt::bf16;
    t.f32 = typed_ops<float, float>();
    t.bf16 = typed_ops<bf16, bf16>();
    t.bf16_fp32_grads = typed_ops<bf16, float>();
    return t;
  }();
  return &table;
}
