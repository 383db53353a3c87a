// Context parallelism on GPUs (parallel/ring_attention.h, ulysses_attention.h with device
// buffers): each rank runs on its own GPU in a thread of this process, its cp group is NCCL's, and
// its rows of the output, lse and dqkv equal the CPU's unsplit grouped-query attention on the
// whole sequence. With one visible GPU the group has one rank (the device gathers, the merge, the
// block kernels and Ulysses' self-exchange run; no transfer); with two or more it has two.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "gpu/cuda_test_util.h"
#include "kernels/cpu/kernels.h"
#include "kernels/dispatch.h"
#include "parallel/ring_attention.h"
#include "parallel/ulysses_attention.h"
#include "store/hash_store.h"

namespace ds::rt::parallel {
namespace {

using ds::test::DeviceArray;

int cp_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return std::min(n, 2);
}

// One NCCL world of n ranks, rank r on GPU r, built in n threads; then fn(rank, comm) in n threads.
template <typename Fn>
void on_gpus(int n, Fn&& fn) {
  std::vector<comm::CommPtr> comms(static_cast<size_t>(n));
  std::vector<std::exception_ptr> errs(static_cast<size_t>(n));
  auto st = std::make_shared<store::HashStore>();
  auto run = [&](auto&& body) {
    std::vector<std::thread> ts;
    for (int r = 0; r < n; ++r) {
      ts.emplace_back([&, r] {
        try {
          if (cudaSetDevice(r) != cudaSuccess) throw std::runtime_error("cudaSetDevice");
          body(r);
        } catch (...) {
          errs[static_cast<size_t>(r)] = std::current_exception();
        }
      });
    }
    for (auto& t : ts) t.join();
    for (auto& e : errs) {
      if (e) std::rethrow_exception(e);
    }
  };
  run([&](int r) {
    comm::CommOptions o;
    o.backend = comm::Backend::kNccl;
    o.timeout = Millis(60000);
    o.cuda_device = r;
    o.name = "cp";
    comms[static_cast<size_t>(r)] = comm::make_world_comm(st, r, n, o);
  });
  run([&](int r) { fn(r, *comms[static_cast<size_t>(r)]); });
}

// The rows of the rank's chunks, in its order (chunk r, then chunk 2N-1-r), of a (B,T,w) buffer
// (or, with lse, of a (B,NH,T) buffer's last axis).
std::vector<float> ring_rows(const std::vector<float>& x, int outer, int T, int w, int r, int n, int C) {
  std::vector<float> out(static_cast<size_t>(outer) * 2 * C * w);
  for (int b = 0; b < outer; b++) {
    for (int k = 0; k < 2; k++) {
      const int p0 = ring_chunk_position(r, n, k, C);
      std::copy_n(x.begin() + (static_cast<int64_t>(b) * T + p0) * w, static_cast<int64_t>(C) * w,
                  out.begin() + (static_cast<int64_t>(b) * 2 * C + static_cast<int64_t>(k) * C) * w);
    }
  }
  return out;
}

struct Unsplit {
  std::vector<float> qkv, dout, out, lse, dqkv;
};
Unsplit unsplit(int B, int T, int NH, int KV, int hd, bool bf16_inputs) {
  const int w = (NH + 2 * KV) * hd, ow = NH * hd;
  Unsplit u;
  u.qkv = ds::test::random_floats(static_cast<size_t>(B) * T * w, 41);
  u.dout = ds::test::random_floats(static_cast<size_t>(B) * T * ow, 42);
  if (bf16_inputs) {  // what the device sees
    u.qkv = ds::test::from_bf16(ds::test::to_bf16(u.qkv));
    u.dout = ds::test::from_bf16(ds::test::to_bf16(u.dout));
  }
  u.out.resize(u.dout.size());
  u.lse.resize(static_cast<size_t>(B) * NH * T);
  u.dqkv.resize(u.qkv.size());
  std::vector<float> scratch(cpu::attention_scratch_floats(T, hd) * 4);
  cpu::attention_gqa_forward(u.out.data(), u.lse.data(), u.qkv.data(), scratch.data(), B, T, NH, KV, hd);
  cpu::attention_gqa_backward(u.dqkv.data(), u.dout.data(), u.qkv.data(), u.out.data(), u.lse.data(), scratch.data(),
                              B, T, NH, KV, hd);
  return u;
}

// Device buffers of storage S from host floats, and back.
template <typename S>
struct Dev {
  std::unique_ptr<DeviceArray<uint16_t>> b;
  std::unique_ptr<DeviceArray<float>> f;
  explicit Dev(const std::vector<float>& h) {
    if constexpr (std::is_same_v<S, float>) f = std::make_unique<DeviceArray<float>>(h);
    else b = std::make_unique<DeviceArray<uint16_t>>(ds::test::to_bf16(h));
  }
  S* get() const {
    if constexpr (std::is_same_v<S, float>) return f->get();
    else return b->bf();
  }
  std::vector<float> host() const {
    if constexpr (std::is_same_v<S, float>) return f->download();
    else return ds::test::from_bf16(b->download());
  }
};

template <typename S>
void ring_on_gpus(int n, double tol) {
  constexpr bool kBf16 = !std::is_same_v<S, float>;
  const int B = 2, NH = 4, KV = 2, hd = 32, C = 24, T = 2 * n * C, w = (NH + 2 * KV) * hd, ow = NH * hd;
  const Unsplit u = unsplit(B, T, NH, KV, hd, kBf16);
  on_gpus(n, [&](int r, comm::Comm& cp) {
    const kern::DeviceScope scope(Device::kCuda);
    RingAttention ring(cp, RingShape{B, C, NH, KV, hd}, static_cast<int>(sizeof(S)), Allocator::process(),
                       Device::kCuda);
    const Dev<S> qkv(ring_rows(u.qkv, B, T, w, r, n, C)), dout(ring_rows(u.dout, B, T, ow, r, n, C));
    const Dev<S> out(std::vector<float>(static_cast<size_t>(B) * 2 * C * ow)),
        dqkv(std::vector<float>(static_cast<size_t>(B) * 2 * C * w));
    DeviceArray<float> lse(static_cast<size_t>(B) * NH * 2 * C);
    ring.forward(out.get(), lse.get(), qkv.get());
    EXPECT_TRUE(ds::test::close(out.host(), ring_rows(u.out, B, T, ow, r, n, C), tol, tol)) << "rank " << r;
    EXPECT_TRUE(ds::test::close(lse.download(), ring_rows(u.lse, B * NH, T, 1, r, n, C), tol, tol)) << "rank " << r;
    ring.backward(dqkv.get(), dout.get(), qkv.get(), out.get(), lse.get());
    EXPECT_TRUE(ds::test::close(dqkv.host(), ring_rows(u.dqkv, B, T, w, r, n, C), 2 * tol, 2 * tol)) << "rank " << r;
  });
}

template <typename S>
void ulysses_on_gpus(int n, double tol) {
  constexpr bool kBf16 = !std::is_same_v<S, float>;
  const int B = 2, NH = 4, KV = 2, hd = 32, T = 48, Tl = T / n, w = (NH + 2 * KV) * hd, ow = NH * hd;
  const Unsplit u = unsplit(B, T, NH, KV, hd, kBf16);
  auto part = [&](const std::vector<float>& x, int width, int r) {  // rows [r Tl, (r+1) Tl) of each sequence
    std::vector<float> y(static_cast<size_t>(B) * Tl * width);
    for (int b = 0; b < B; b++) {
      std::copy_n(x.begin() + (static_cast<int64_t>(b) * T + static_cast<int64_t>(r) * Tl) * width,
                  static_cast<int64_t>(Tl) * width, y.begin() + static_cast<int64_t>(b) * Tl * width);
    }
    return y;
  };
  on_gpus(n, [&](int r, comm::Comm& cp) {
    const kern::DeviceScope scope(Device::kCuda);
    UlyssesAttention uly(cp, UlyssesShape{B, T, NH, KV, hd}, static_cast<int>(sizeof(S)), Allocator::process(),
                         Device::kCuda);
    const Dev<S> qkv(part(u.qkv, w, r)), dout(part(u.dout, ow, r));
    const Dev<S> out(std::vector<float>(static_cast<size_t>(B) * Tl * ow)),
        dqkv(std::vector<float>(static_cast<size_t>(B) * Tl * w));
    DeviceArray<float> lse(static_cast<size_t>(B) * (NH / n) * T);  // head-sharded
    uly.forward(out.get(), lse.get(), qkv.get());
    EXPECT_TRUE(ds::test::close(out.host(), part(u.out, ow, r), tol, tol)) << "rank " << r;
    uly.backward(dqkv.get(), dout.get(), qkv.get(), out.get(), lse.get());
    EXPECT_TRUE(ds::test::close(dqkv.host(), part(u.dqkv, w, r), 2 * tol, 2 * tol)) << "rank " << r;
  });
}

class ContextParallelCuda : public ds::test::CudaTest {};

TEST_F(ContextParallelCuda, RingEqualsTheUnsplitKernelFp32) { ring_on_gpus<float>(cp_gpus(), 1e-4); }
TEST_F(ContextParallelCuda, RingEqualsTheUnsplitKernelBf16) { ring_on_gpus<bf16>(cp_gpus(), 3e-2); }
TEST_F(ContextParallelCuda, UlyssesEqualsTheUnsplitKernelFp32) { ulysses_on_gpus<float>(cp_gpus(), 1e-4); }
TEST_F(ContextParallelCuda, UlyssesEqualsTheUnsplitKernelBf16) { ulysses_on_gpus<bf16>(cp_gpus(), 3e-2); }

}  // namespace
}  // namespace ds::rt::parallel
