// Pipelines composed with ZeRO stages 0-2 (ZeroEngine as the data-parallel hooks, ranks as
// threads): pp = 2 x dp = 2 and tp = 2 x pp = 2 x dp = 2, 1F1B over 3 micro-batches per dp rank,
// the hook stack model -> TensorParallelHooks -> TiedEmbeddingHooks (first/last stage) ->
// ZeroEngine, ZeRO's begin/end_micro_batch around each backward event, the tied wte sum handed
// to ZeRO after the schedule. Every rank's reduced gradient range (opt_grads) equals the single
// model's gradients over the same 2 x 3 micro-batches, within 1e-5 relative.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "model_spec/gpt2_spec.h"
#include "layout/partition.h"
#include "model/gpt2.h"
#include "parallel/pipeline_stage.h"
#include "parallel/tensor_parallel.h"
#include "layout/topology.h"
#include "parallel/zero.h"
#include "unit/parallel3d/rank_threads.h"

namespace ds::rt::parallel {
namespace {

namespace ms = ds::model_spec;

constexpr int kB = 2, kT = 8;
const ms::ModelShape kShape{4, 2, 16, 40, 48, 8};

std::vector<int32_t> toks(int mb, int salt) {
  std::mt19937 rng(static_cast<unsigned>(77 * mb + salt));
  std::vector<int32_t> t(kB * kT);
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<unsigned>(kShape.vocab_size));
  return t;
}

struct Case {
  int tp, pp, dp, zero_stage;
};

class PipelineZero : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineZero, ReducedGradientsMatchTheSingleModel) {
  const Case c = GetParam();
  const int m = 3, world_size = c.tp * c.pp * c.dp, total = c.dp * m;
  std::vector<std::vector<int32_t>> in(total), tg(total);
  for (int i = 0; i < total; ++i) {
    in[i] = toks(i, 1);
    tg[i] = toks(i, 2);
  }
  omp_set_num_threads(1);
  Allocator ref_alloc;
  Gpt2 ref(kShape, ms::ModelPart::whole(kShape), Gpt2Options{kB, kT}, ref_alloc);
  ref.init_weights(4);
  ref.zero_grads();
  auto ra = ref.make_activations();
  std::vector<float> ref_loss;
  for (int i = 0; i < total; ++i) {
    ref_loss.push_back(ref.forward_backward(ra, in[i].data(), tg[i].data(), 1.0f / total));
  }

  const layout::Topology topo(world_size, c.tp, c.dp, c.pp);
  const auto all = ms::gpt2_params(kShape);
  ds::test::run_ranks(world_size, [&](int r, comm::CommPtr world) {
    const layout::Coord co = topo.coord_of(r);
    auto group = [&](layout::Axis a, const char* name) {
      return world->new_group(topo.group_of(r, a), name + std::to_string(topo.group_index(r, a)));
    };
    auto tp_group = group(layout::Axis::kTp, "tp");
    auto dp_group = group(layout::Axis::kDp, "dp");
    auto pp_group = group(layout::Axis::kPp, "pp");
    const auto pp_ranks = topo.group_of(r, layout::Axis::kPp);
    const bool tied_stage = c.pp > 1 && (co.pp == 0 || co.pp == c.pp - 1);
    comm::CommPtr tied;
    if (tied_stage) {
      tied = world->new_group({pp_ranks.front(), pp_ranks.back()},
                              "tied" + std::to_string(topo.group_index(r, layout::Axis::kPp)));
    }
    const auto part = layout::partition_stages(kShape, c.pp, layout::StageSplit::kUniform, c.tp, co.tp)[co.pp];
    const auto layout = ms::param_layout(kShape, part);
    Allocator alloc;
    ZeroOptions zo;
    zo.stage = c.zero_stage;
    zo.reduce_bucket_size = 3000;  // several buckets per stage
    ZeroEngine zero(zo, dp_group, layout, alloc);
    std::unique_ptr<TiedEmbeddingHooks> tied_hooks;
    ParallelHooks* below_tp = &zero;
    if (tied_stage) {
      tied_hooks = std::make_unique<TiedEmbeddingHooks>(
          &zero, ms::local_numel(ms::find_param(all, ms::ParamId::kWte), c.tp), alloc);
      below_tp = tied_hooks.get();
    }
    TensorParallelHooks hooks(tp_group, below_tp);
    Gpt2Options mo{kB, kT};
    mo.own_grads = zero.model_owns_grads();
    Gpt2 model(kShape, part, mo, alloc, &hooks);
    zero.attach(model.params().f32(), model.grads().f32());
    model.init_weights(4);
    PipelineStage stage(model, pp_group, tied);

    zero.begin_step();
    if (tied_hooks) tied_hooks->zero();
    std::vector<MicroBatch> mbs;
    for (int i = co.dp * m; i < (co.dp + 1) * m; ++i) mbs.push_back({in[i].data(), tg[i].data()});
    RunOptions ro;
    ro.grad_scale = 1.0f / total;
    if (tied_hooks) ro.wte_grad = tied_hooks->wte_grad().f32();
    ro.before_event = [&](const Event& e) {
      if (e.kind == EventKind::kBackward) zero.begin_micro_batch(e.mb == m - 1, true);
    };
    ro.after_event = [&](const Event& e) {
      if (e.kind == EventKind::kBackward) zero.end_micro_batch();
    };
    const auto res = stage.run_schedule(stage_events(PipelineSchedule::k1F1B, c.pp, co.pp, m), mbs, ro);
    if (tied_hooks) {
      zero.begin_micro_batch(true, true);
      tied_hooks->hand_over();
      zero.end_micro_batch();
    }
    for (size_t i = 0; i < res.losses.size(); ++i) {
      const float want = ref_loss[co.dp * m + i];
      EXPECT_NEAR(res.losses[i], want, 1e-5 * std::fabs(want)) << "rank " << r << " mb " << i;
    }
    // opt_grads covers global elements [lo, hi) of this part's layout.
    const int64_t lo = zero.opt_begin(), hi = lo + zero.opt_count();
    const float* g = zero.opt_grads().f32();
    int64_t checked = 0;
    for (const auto& ts : layout.tensors) {
      const auto& t = all[static_cast<size_t>(ts.id)];
      const float* gfull = ref.grad(ts.id, ts.layer).f32();
      for (int64_t o = std::max(lo, ts.offset); o < std::min(hi, ts.offset + ts.numel); ++o) {
        const float want = gfull[ms::full_index(t, c.tp, co.tp, o - ts.offset)];
        ASSERT_NEAR(g[o - lo], want, 1e-7 + 1e-5 * std::fabs(want))
            << "rank " << r << " " << t.name << " layer " << ts.layer << " element "
            << o - ts.offset;
        ++checked;
      }
    }
    EXPECT_EQ(checked, hi - lo) << "rank " << r;
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, PipelineZero,
                         ::testing::Values(Case{1, 2, 2, 0}, Case{1, 2, 2, 1}, Case{1, 2, 2, 2},
                                           Case{2, 2, 2, 2}, Case{1, 4, 1, 2}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "tp" + std::to_string(i.param.tp) + "_pp" +
                                  std::to_string(i.param.pp) + "_dp" + std::to_string(i.param.dp) +
                                  "_zero" + std::to_string(i.param.zero_stage);
                         });

}  // namespace
}  // namespace ds::rt::parallel
