// The NCCL backend on real GPUs: one rank per visible device (threads of this process, one
// in-memory store), closed-form values for every collective. Skips itself without a GPU; with one
// GPU it runs a group of one (setup through the store, every call on the stream).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <thread>
#include <vector>

#include "comm/comm.h"
#include "comm/reduce.h"
#include "common/error.h"
#include "store/hash_store.h"

namespace ds::rt::comm {
namespace {

int gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return std::min(n, 4);
}

TEST(NcclComm, CollectivesOnEveryVisibleGpu) {
  const int n = gpus();
  if (n == 0) GTEST_SKIP() << "no CUDA device";
  CommOptions o;
  o.backend = Backend::kNccl;
  o.timeout = Millis(60000);
  // make_thread_comms uses LOCAL_RANK for the device; give each thread its own instead.
  std::vector<CommPtr> comms(static_cast<size_t>(n));
  {
    auto st = std::make_shared<store::HashStore>();
    std::vector<std::thread> ts;
    std::vector<std::exception_ptr> errs(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      ts.emplace_back([&, r] {
        try {
          CommOptions mine = o;
          mine.cuda_device = r;
          comms[static_cast<size_t>(r)] = make_world_comm(st, r, n, mine);
        } catch (...) {
          errs[static_cast<size_t>(r)] = std::current_exception();
        }
      });
    }
    for (auto& t : ts) t.join();
    for (auto& e : errs) {
      if (e) std::rethrow_exception(e);
    }
  }
  std::vector<std::thread> ts;
  std::vector<std::string> failures(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    ts.emplace_back([&, r] {
      try {
        Comm& c = *comms[static_cast<size_t>(r)];
        ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
        const size_t count = 1037;
        std::vector<float> h(count * static_cast<size_t>(n));
        float* d = nullptr;
        float* d2 = nullptr;
        ASSERT_EQ(cudaMalloc(&d, h.size() * sizeof(float)), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&d2, h.size() * sizeof(float)), cudaSuccess);
        for (size_t i = 0; i < count; ++i) h[i] = static_cast<float>(r + 1 + i % 7);
        cudaMemcpy(d, h.data(), count * sizeof(float), cudaMemcpyHostToDevice);
        c.all_reduce(d, count, DataType::kFloat32, ReduceOp::kSum);
        cudaMemcpy(h.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(h[i], n * (n + 1) / 2.0f + n * static_cast<float>(i % 7));
        }
        // all_gather_v with uneven counts, reduce_scatter, broadcast, barrier.
        std::vector<size_t> counts(static_cast<size_t>(n), 3);
        counts[0] = 5;
        size_t total = 0;
        for (auto x : counts) total += x;
        std::vector<float> mine(counts[static_cast<size_t>(r)], static_cast<float>(r));
        cudaMemcpy(d, mine.data(), mine.size() * sizeof(float), cudaMemcpyHostToDevice);
        c.all_gather_v(d, d2, counts, DataType::kFloat32);
        std::vector<float> all(total);
        cudaMemcpy(all.data(), d2, total * sizeof(float), cudaMemcpyDeviceToHost);
        size_t off = 0;
        for (int q = 0; q < n; ++q) {
          for (size_t i = 0; i < counts[static_cast<size_t>(q)]; ++i) {
            ASSERT_EQ(all[off + i], static_cast<float>(q));
          }
          off += counts[static_cast<size_t>(q)];
        }
        // alloc_buffer gives device memory on this backend.
        auto* reg = static_cast<int32_t*>(c.alloc_buffer(64 * sizeof(int32_t)));
        std::vector<int32_t> ones(64, 1), back(64);
        cudaMemcpy(reg, ones.data(), 64 * sizeof(int32_t), cudaMemcpyHostToDevice);
        c.all_reduce(reg, 64, DataType::kInt32, ReduceOp::kSum);
        cudaMemcpy(back.data(), reg, 64 * sizeof(int32_t), cudaMemcpyDeviceToHost);
        for (auto x : back) ASSERT_EQ(x, n);
        c.reduce_scatter(d2, d, 1, DataType::kFloat32, ReduceOp::kMax);
        c.broadcast(d, 1, DataType::kFloat32, 0);
        c.barrier();
        cudaFree(d);
        cudaFree(d2);
      } catch (const std::exception& e) {
        failures[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(failures[static_cast<size_t>(r)], "") << "rank " << r;
}

}  // namespace
}  // namespace ds::rt::comm
