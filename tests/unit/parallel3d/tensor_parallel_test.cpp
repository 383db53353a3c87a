// Tensor parallelism through TensorParallelHooks over a real Comm (ranks as threads): tp = 2 runs
// forward + backward of the whole model (vocabulary-parallel embedding and loss included) and
// matches the unsharded model's loss and every gradient (each rank's shard against the matching
// elements of the full gradient). Also: the regions are the only tp communication (call counts),
// and inner hooks (ZeRO's place) still see every parameter/gradient call.
#include "model_spec/gpt2_spec.h"
#include "parallel/tensor_parallel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/error.h"
#include "model/gpt2.h"
#include "unit/parallel3d/rank_threads.h"

namespace ds::rt::parallel {
namespace {

namespace ms = ds::model_spec;

struct CountingHooks : ParallelHooks {
  int grads_ready_calls = 0, params_needed_calls = 0;
  TypedPtr params_needed(Unit, TypedPtr resident) override {
    ++params_needed_calls;
    return resident;
  }
  void grads_ready(Unit) override { ++grads_ready_calls; }
};

TEST(TensorParallelHooks, TwoRanksMatchTheUnshardedModel) {
  const ms::ModelShape s{2, 4, 16, 27, 32, 8};  // V = 27 of Vp = 32: padding on rank 1
  const int B = 2, T = 8, tp = 2;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; ++i) {
    in[i] = (i * 7 + 3) % s.vocab_size;
    tg[i] = (i * 11 + 5) % s.vocab_size;
  }
  Gpt2Options opt{B, T};
  opt.head_chunk_rows = 5;
  omp_set_num_threads(1);
  Allocator alloc;
  Gpt2 full(s, ms::ModelPart::whole(s), opt, alloc);
  full.init_weights(5);
  auto af = full.make_activations();
  full.zero_grads();
  const float loss_full = full.forward_backward(af, in.data(), tg.data(), 0.5f);

  std::vector<float> loss(tp);
  std::vector<std::vector<float>> grads(tp);
  std::vector<ms::ParamLayout> layouts(tp);
  std::vector<int64_t> fwd(tp), bwd(tp), lossc(tp);
  std::vector<int> ready(tp);
  ds::test::run_ranks(tp, [&](int r, comm::CommPtr world) {
    auto group = world->new_group({0, 1}, "tp0");
    CountingHooks inner;
    TensorParallelHooks hooks(group, &inner);
    Allocator a;
    Gpt2 m(s, ms::ModelPart{0, 2, true, true, tp, r}, opt, a, &hooks);
    m.init_weights(5);
    auto acts = m.make_activations();
    m.zero_grads();
    loss[r] = m.forward_backward(acts, in.data(), tg.data(), 0.5f);
    grads[r].assign(m.grads().f32(), m.grads().f32() + m.num_params());
    layouts[r] = m.layout();
    fwd[r] = hooks.regions().forward_calls();
    bwd[r] = hooks.regions().backward_calls();
    lossc[r] = hooks.regions().loss_calls();
    ready[r] = inner.grads_ready_calls;
  });
  const auto all = ms::gpt2_params(s);
  for (int r = 0; r < tp; ++r) {
    EXPECT_NEAR(loss[r], loss_full, 1e-5 * std::fabs(loss_full)) << "rank " << r;
    EXPECT_EQ(fwd[r], 1 + 2 * s.n_layer);    // embedding + two row-parallel matmuls per layer
    EXPECT_EQ(bwd[r], 2 * s.n_layer + 4);    // two column-parallel per layer + 4 head chunks
    EXPECT_EQ(lossc[r], 2 * 4);              // max and sums per head chunk (16 rows / 5)
    EXPECT_EQ(ready[r], 2 + s.n_layer + 1);  // wte, wpe, layers, lnf
    int64_t checked = 0;
    for (const auto& ts : layouts[r].tensors) {
      const auto& t = all[static_cast<size_t>(ts.id)];
      const float* gfull = full.grad(ts.id, ts.layer).f32();
      for (int64_t i = 0; i < ts.numel; ++i) {
        const float want = gfull[ms::full_index(t, tp, r, i)];
        ASSERT_NEAR(grads[r][ts.offset + i], want, 1e-6 + 1e-5 * std::fabs(want))
            << t.name << " layer " << ts.layer << " rank " << r << " " << i;
        ++checked;
      }
    }
    EXPECT_EQ(checked, static_cast<int64_t>(grads[r].size()));
  }
}

TEST(TensorParallelHooks, GroupOfOneIsTheSingleModel) {
  ds::test::run_ranks(1, [](int, comm::CommPtr world) {
    TensorParallelRegions regions(world);
    std::vector<float> v{1, 2, 3};
    regions.reduce_from_tp_forward(v.data(), 3);
    regions.copy_to_tp_backward(v.data(), 3);
    EXPECT_EQ(v, (std::vector<float>{1, 2, 3}));
    EXPECT_EQ(regions.bytes_reduced(), 0);
  });
  EXPECT_THROW(TensorParallelRegions(nullptr), ds::Error);
}

}  // namespace
}  // namespace ds::rt::parallel
