// The CUDA module's kernel table (kernels/cuda_kernel_table.h), on any machine where the module is
// built, GPU or not: the module loads (its ABI matches), and every entry the op list
// (kernels/ops.def) and the hand-written lists name is filled in each of the three typed tables.
// A kernel declared but not instantiated for one of the types would fail here, not on a GPU.
#include <gtest/gtest.h>

#include "core/cuda_memory_table.h"
#include "core/cuda_module.h"
#include "kernels/cuda_kernel_table.h"

namespace kern = ds::rt::kern;

namespace {

template <typename S, typename G>
int null_entries(const kern::CudaOps<S, G>& o) {
  int nulls = 0;
#define DS_KERNEL_OP(name, params, args) nulls += o.name == nullptr;
#define DS_KERNEL_OP_G(name, params, args) nulls += o.name == nullptr;
#include "kernels/ops.def"
#define DS_CHECK_ENTRY(name) nulls += o.name == nullptr;
  DS_CUDA_TYPED_ONLY_ENTRIES(DS_CHECK_ENTRY)
#undef DS_CHECK_ENTRY
  return nulls;
}

TEST(CudaKernelTable, EveryEntryOfEveryTypedTableIsFilled) {
  if (!ds::rt::cuda_module_built()) GTEST_SKIP() << "built without CUDA";
  const kern::CudaKernelTable& t = kern::cuda_kernels("the kernel table test");
  int nulls = 0;
#define DS_CHECK_ENTRY(name) nulls += t.name == nullptr;
  DS_CUDA_KERNEL_ENTRIES(DS_CHECK_ENTRY)
#undef DS_CHECK_ENTRY
  EXPECT_EQ(nulls, 0);
  EXPECT_EQ(null_entries(t.f32), 0);
  EXPECT_EQ(null_entries(t.bf16), 0);
  EXPECT_EQ(null_entries(t.bf16_fp32_grads), 0);
  // The typed tables are distinct instantiations: bf16 with fp32 gradients differs from bf16
  // only in the kernels that take G.
  EXPECT_NE(reinterpret_cast<const void*>(t.f32.matmul_forward), reinterpret_cast<const void*>(t.bf16.matmul_forward));
  EXPECT_EQ(t.bf16.matmul_forward, t.bf16_fp32_grads.matmul_forward);
  EXPECT_NE(reinterpret_cast<const void*>(t.bf16.matmul_backward),
            reinterpret_cast<const void*>(t.bf16_fp32_grads.matmul_backward));
}

// The memory table is filled positionally by the module (module_entry.cpp): an entry left out
// would be null, and the streams and graphs of training.cuda_graph come last.
TEST(CudaMemoryTable, EveryEntryIsFilled) {
  if (!ds::rt::cuda_module_built()) GTEST_SKIP() << "built without CUDA";
  const ds::rt::CudaMemoryTable& m = ds::rt::cuda_memory("the memory table test");
  const void* entries[] = {
      reinterpret_cast<const void*>(m.device_alloc),        reinterpret_cast<const void*>(m.device_free),
      reinterpret_cast<const void*>(m.pinned_alloc),        reinterpret_cast<const void*>(m.pinned_free),
      reinterpret_cast<const void*>(m.memset_zero_async),   reinterpret_cast<const void*>(m.copy_to_device),
      reinterpret_cast<const void*>(m.copy_to_host),        reinterpret_cast<const void*>(m.copy_on_device),
      reinterpret_cast<const void*>(m.copy_rows),
      reinterpret_cast<const void*>(m.set_device),          reinterpret_cast<const void*>(m.device_cache_stats),
      reinterpret_cast<const void*>(m.device_empty_cache),  reinterpret_cast<const void*>(m.query_accelerators),
      reinterpret_cast<const void*>(m.stream_create),       reinterpret_cast<const void*>(m.stream_destroy),
      reinterpret_cast<const void*>(m.graph_begin_capture), reinterpret_cast<const void*>(m.graph_end_capture),
      reinterpret_cast<const void*>(m.graph_abort_capture), reinterpret_cast<const void*>(m.graph_launch),
      reinterpret_cast<const void*>(m.graph_destroy)};
  static_assert(sizeof(entries) / sizeof(entries[0]) * sizeof(void*) == sizeof(ds::rt::CudaMemoryTable),
                "an entry of CudaMemoryTable is missing here");
  for (const void* e : entries) EXPECT_NE(e, nullptr);
}

}  // namespace
