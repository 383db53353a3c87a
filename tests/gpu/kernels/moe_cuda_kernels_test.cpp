// The mixture of experts' CUDA kernels (kernels/cuda/moe.cu, through the module's one table)
// against their CPU twins (cpu/moe.cpp) on the same inputs: the router forward (picks equal,
// probabilities and weights within 1e-6, column sums within 1e-5) and backward (1e-5), the sort
// (bit-equal: both are stable), the gathers, combine, slot dots and row scaling, fp32 and bf16
// storage. Skips itself (reported as skipped) without a GPU. NOT RUN YET: no GPU was available
// where this was written; the first run on one is its first run.
#include <gtest/gtest.h>
#include <omp.h>

#include <cuda_runtime_api.h>

#include <vector>

#include "gpu/cuda_test_util.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda_kernel_table.h"

namespace ds::rt {
namespace {

using test::close;
using test::cu;
using test::DeviceArray;
using test::from_bf16;
using test::random_floats;
using test::to_bf16;

class MoeCudaKernels : public test::CudaStreamTest {
 protected:
  void SetUp() override {
    test::CudaStreamTest::SetUp();
    omp_set_num_threads(2);
  }
};

std::vector<int32_t> ints(const DeviceArray<int32_t>& a) { return a.download(); }

TEST_F(MoeCudaKernels, RouterForwardBackwardAndSort) {
  const int N = 300, E = 8, k = 2;
  const auto logits = random_floats(size_t(N) * E, 1, 2.0f), dw = random_floats(size_t(N) * k, 2),
             daux = random_floats(E, 3);
  std::vector<float> probs(size_t(N) * E), w(size_t(N) * k), sums(E), dl(size_t(N) * E);
  std::vector<int32_t> idx(size_t(N) * k), slots(idx.size()), pos(idx.size()), off(E + 1);
  cpu::moe_router_forward(probs.data(), idx.data(), w.data(), sums.data(), logits.data(), N, E, k);
  cpu::moe_router_backward(dl.data(), probs.data(), idx.data(), w.data(), dw.data(), daux.data(), N, E, k);
  cpu::moe_sort_slots(slots.data(), pos.data(), off.data(), idx.data(), int64_t(idx.size()), E);
  DeviceArray<float> gl(logits), gp(probs.size()), gw(w.size()), gs(E), gdw(dw), gda(daux), gdl(dl.size());
  DeviceArray<int32_t> gi(idx.size()), gslots(idx.size()), gpos(idx.size()), goff(E + 1);
  cu().f32.moe_router_forward(gp.get(), gi.get(), gw.get(), gs.get(), gl.get(), N, E, k, stream_);
  EXPECT_EQ(ints(gi), idx);
  EXPECT_TRUE(close(gp.download(), probs, 1e-6, 1e-7));
  EXPECT_TRUE(close(gw.download(), w, 1e-6, 1e-7));
  EXPECT_TRUE(close(gs.download(), sums, 1e-5, 1e-6));
  cu().f32.moe_router_backward(gdl.get(), gp.get(), gi.get(), gw.get(), gdw.get(), gda.get(), N, E, k, stream_);
  EXPECT_TRUE(close(gdl.download(), dl, 1e-5, 1e-6));
  cu().moe_sort_slots(gslots.get(), gpos.get(), goff.get(), gi.get(), int64_t(idx.size()), E, stream_);
  EXPECT_EQ(ints(gslots), slots);
  EXPECT_EQ(ints(gpos), pos);
  EXPECT_EQ(ints(goff), off);
}

TEST_F(MoeCudaKernels, RowMovesFp32AndBf16) {
  const int N = 50, k = 2, C = 96;
  const int64_t NK = int64_t(N) * k;
  const auto x = random_floats(size_t(N) * C, 4), w = random_floats(static_cast<size_t>(NK), 5);
  std::vector<int32_t> idx(static_cast<size_t>(NK)), slots(idx.size()), pos(idx.size()), off(5);
  for (size_t i = 0; i < idx.size(); i++) idx[i] = int32_t((i * 7 + i / 3) % 4);
  cpu::moe_sort_slots(slots.data(), pos.data(), off.data(), idx.data(), NK, 4);
  std::vector<float> rows(size_t(NK) * C), comb(size_t(N) * C), dots(static_cast<size_t>(NK)), scaled, g(static_cast<size_t>(NK));
  cpu::moe_gather_rows(rows.data(), x.data(), slots.data(), w.data(), NK, k, C);
  cpu::moe_combine(comb.data(), rows.data(), pos.data(), w.data(), N, k, C);
  cpu::moe_slot_dots(dots.data(), rows.data(), rows.data(), pos.data(), NK, C);
  scaled = rows;
  cpu::moe_scale_rows(scaled.data(), slots.data(), w.data(), NK, C);
  cpu::moe_gather_f32(g.data(), w.data(), slots.data(), NK);
  DeviceArray<float> gx(x), gw(w), grows(rows.size()), gcomb(comb.size()), gdots(dots.size()), gg(g.size());
  DeviceArray<int32_t> gslots(slots), gpos(pos);
  cu().f32.moe_gather_rows(grows.get(), gx.get(), gslots.get(), gw.get(), NK, k, C, stream_);
  EXPECT_TRUE(close(grows.download(), rows, 1e-6, 0));
  cu().f32.moe_combine(gcomb.get(), grows.get(), gpos.get(), gw.get(), N, k, C, stream_);
  EXPECT_TRUE(close(gcomb.download(), comb, 1e-6, 1e-7));
  cu().f32.moe_slot_dots(gdots.get(), grows.get(), grows.get(), gpos.get(), NK, C, stream_);
  EXPECT_TRUE(close(gdots.download(), dots, 1e-5, 1e-6));
  cu().f32.moe_scale_rows(grows.get(), gslots.get(), gw.get(), NK, C, stream_);
  EXPECT_TRUE(close(grows.download(), scaled, 1e-6, 0));
  cu().moe_gather_f32(gg.get(), gw.get(), gslots.get(), NK, stream_);
  EXPECT_EQ(gg.download(), g);
  // bf16 storage: the CPU template on the same bf16 inputs.
  auto xb = to_bf16(x);
  std::vector<uint16_t> rb(rows.size()), cb(comb.size());
  cpu::moe_gather_rows(reinterpret_cast<bf16*>(rb.data()), reinterpret_cast<const bf16*>(xb.data()), slots.data(),
                       w.data(), NK, k, C);
  cpu::moe_combine(reinterpret_cast<bf16*>(cb.data()), reinterpret_cast<const bf16*>(rb.data()), pos.data(), w.data(),
                   N, k, C);
  DeviceArray<uint16_t> gxb(xb), grb(rb.size()), gcb(cb.size());
  cu().bf16.moe_gather_rows(grb.bf(), gxb.bf(), gslots.get(), gw.get(), NK, k, C, stream_);
  EXPECT_TRUE(close(from_bf16(grb.download()), from_bf16(rb), 1e-2, 0));
  cu().bf16.moe_combine(gcb.bf(), grb.bf(), gpos.get(), gw.get(), N, k, C, stream_);
  EXPECT_TRUE(close(from_bf16(gcb.download()), from_bf16(cb), 2e-2, 1e-3));
}

}  // namespace
}  // namespace ds::rt
