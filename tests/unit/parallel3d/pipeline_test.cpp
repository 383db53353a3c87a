// Pipeline parallelism end to end with ranks as threads: pp = 2 and pp = 4, tp = 2 x pp = 2, and
// with a data-parallel axis (pp = 2 x dp = 2, tp = 2 x pp = 2 x dp = 2: the grid of topology.h,
// each dp rank running its own micro-batches, gradients summed over the dp group after the
// schedule as ZeRO stage 0 does) run m micro-batches through PipelineStage::run_schedule (1F1B and
// GPipe) and give the same per-micro-batch losses and the same gradients (every tensor of every
// stage, wte after the tied all-reduce) as one process running the whole model over the same
// dp x m micro-batches, within 1e-5 relative. Activation checkpointing inside the stages gives
// bit-identical results. PipelineStage::evaluate (forward only) gives the same losses.
#include "model_spec/gpt2_spec.h"
#include "layout/partition.h"
#include "model/gpt2.h"
#include "parallel/pipeline_stage.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/error.h"
#include "parallel/tensor_parallel.h"
#include "layout/topology.h"
#include "unit/parallel3d/rank_threads.h"

namespace ds::rt::parallel {
namespace {

namespace ms = ds::model_spec;

constexpr int kB = 2, kT = 8;
const ms::ModelShape kShape{4, 2, 16, 40, 48, 8};

std::vector<int32_t> tokens(int mb, int salt) {
  std::mt19937 rng(static_cast<unsigned>(100 * mb + salt));
  std::vector<int32_t> t(kB * kT);
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<unsigned>(kShape.vocab_size));
  return t;
}

struct Reference {
  std::vector<float> losses;
  std::unique_ptr<Allocator> alloc = std::make_unique<Allocator>();
  std::unique_ptr<Gpt2> model;
};

Reference reference(int m) {
  Reference ref;
  omp_set_num_threads(1);
  ref.model =
      std::make_unique<Gpt2>(kShape, ms::ModelPart::whole(kShape), Gpt2Options{kB, kT}, *ref.alloc);
  ref.model->init_weights(3);
  ref.model->zero_grads();
  auto a = ref.model->make_activations();
  for (int i = 0; i < m; ++i) {
    const auto in = tokens(i, 1), tg = tokens(i, 2);
    ref.losses.push_back(ref.model->forward_backward(a, in.data(), tg.data(), 1.0f / m));
  }
  return ref;
}

struct RankOut {
  int dp_rank = 0;
  std::vector<float> losses;
  std::vector<float> eval_losses;  // PipelineStage::evaluate over the same micro-batches
  std::vector<float> grads;
  ms::ParamLayout layout;
  ms::ModelPart part;
  int activations = 0;
};

// grad_group: the gradients flow back over a second group of the same ranks (as GPU runs do).
std::vector<RankOut> run_pipeline(int tp, int pp, int dp, int m, PipelineSchedule kind,
                                  bool recompute, bool grad_group = false) {
  const int world_size = tp * pp * dp;
  const layout::Topology topo(world_size, tp, dp, pp);
  std::vector<RankOut> out(static_cast<size_t>(world_size));
  // Data-parallel rank d runs global micro-batches d * m .. d * m + m - 1.
  std::vector<std::vector<int32_t>> in(dp * m), tg(dp * m);
  for (int i = 0; i < dp * m; ++i) {
    in[i] = tokens(i, 1);
    tg[i] = tokens(i, 2);
  }
  ds::test::run_ranks(world_size, [&](int r, comm::CommPtr world) {
    const layout::Coord c = topo.coord_of(r);
    auto tp_group = world->new_group(topo.group_of(r, layout::Axis::kTp),
                                     "tp" + std::to_string(topo.group_index(r, layout::Axis::kTp)));
    const auto pp_ranks = topo.group_of(r, layout::Axis::kPp);
    auto pp_group =
        world->new_group(pp_ranks, "pp" + std::to_string(topo.group_index(r, layout::Axis::kPp)));
    auto dp_group = world->new_group(topo.group_of(r, layout::Axis::kDp),
                                     "dp" + std::to_string(topo.group_index(r, layout::Axis::kDp)));
    comm::CommPtr grads;
    if (grad_group) {
      grads = world->new_group(pp_ranks, "ppgrad" + std::to_string(topo.group_index(r, layout::Axis::kPp)));
    }
    comm::CommPtr tied;
    if (pp > 1 && (c.pp == 0 || c.pp == pp - 1)) {
      tied = world->new_group({pp_ranks.front(), pp_ranks.back()},
                              "tied" + std::to_string(topo.group_index(r, layout::Axis::kPp)));
    }
    const auto part = layout::partition_stages(kShape, pp, layout::StageSplit::kUniform, tp, c.tp)[c.pp];
    TensorParallelHooks hooks(tp_group);
    Allocator alloc;
    Gpt2Options opt{kB, kT};
    opt.recompute = recompute;
    Gpt2 model(kShape, part, opt, alloc, &hooks);
    model.init_weights(3);
    model.zero_grads();
    PipelineStage stage(model, pp_group, tied, grads);
    std::vector<MicroBatch> mbs;
    for (int i = c.dp * m; i < (c.dp + 1) * m; ++i) mbs.push_back({in[i].data(), tg[i].data()});
    RunOptions ro;
    ro.grad_scale = 1.0f / static_cast<float>(dp * m);
    const auto res = stage.run_schedule(stage_events(kind, pp, c.pp, m), mbs, ro);
    dp_group->all_reduce(model.grads().f32(), static_cast<size_t>(model.num_params()),
                         comm::DataType::kFloat32, comm::ReduceOp::kSum);
    auto& o = out[static_cast<size_t>(r)];
    o.losses = res.losses;
    o.eval_losses = stage.evaluate(mbs).losses;
    o.activations = res.activations_allocated;
    o.grads.assign(model.grads().f32(), model.grads().f32() + model.num_params());
    o.layout = model.layout();
    o.part = part;
    o.dp_rank = c.dp;
  });
  return out;
}

void expect_matches(const Reference& ref, const std::vector<RankOut>& out, int pp, int m) {
  const auto all = ms::gpt2_params(kShape);
  for (size_t r = 0; r < out.size(); ++r) {
    const auto& o = out[r];
    SCOPED_TRACE(::testing::Message()
                 << "rank " << r << " dp " << o.dp_rank << " layers [" << o.part.layer_begin << ", "
                 << o.part.layer_end << ") tp_rank " << o.part.tp_rank);
    if (o.part.has_head) {
      ASSERT_EQ(static_cast<int>(o.losses.size()), m);
      for (int i = 0; i < m; ++i) {
        const float want = ref.losses[static_cast<size_t>(o.dp_rank * m + i)];
        EXPECT_NEAR(o.losses[i], want, 1e-5 * std::fabs(want)) << "mb " << i;
      }
      // Forward-only evaluation after the step (weights unchanged): the same losses.
      ASSERT_EQ(static_cast<int>(o.eval_losses.size()), m);
      for (int i = 0; i < m; ++i) EXPECT_EQ(o.eval_losses[i], o.losses[i]) << "eval mb " << i;
    } else {
      EXPECT_TRUE(o.losses.empty());
      EXPECT_TRUE(o.eval_losses.empty());
    }
    int64_t checked = 0;
    for (const auto& ts : o.layout.tensors) {
      const auto& t = all[static_cast<size_t>(ts.id)];
      const float* gfull = ref.model->grad(ts.id, ts.layer).f32();
      for (int64_t i = 0; i < ts.numel; ++i) {
        const float want = gfull[ms::full_index(t, o.part.tp, o.part.tp_rank, i)];
        ASSERT_NEAR(o.grads[ts.offset + i], want, 1e-7 + 1e-5 * std::fabs(want))
            << t.name << " layer " << ts.layer << " element " << i;
        ++checked;
      }
    }
    EXPECT_EQ(checked, static_cast<int64_t>(o.grads.size()));
  }
  (void)pp;
}

struct Case {
  int tp, pp, dp, m;
  PipelineSchedule kind;
};

class PipelineRun : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineRun, MatchesTheSingleProcessModel) {
  const Case c = GetParam();
  const auto ref = reference(c.dp * c.m);
  const auto out = run_pipeline(c.tp, c.pp, c.dp, c.m, c.kind, false);
  expect_matches(ref, out, c.pp, c.m);
  for (const auto& o : out) {
    const int stage = o.part.layer_begin / (kShape.n_layer / c.pp);
    const int peak = c.kind == PipelineSchedule::kGPipe ? c.m : std::min(c.pp - stage, c.m);
    EXPECT_EQ(o.activations, peak) << "stage " << stage;
  }
  // Activation checkpointing inside the stages: bit-identical losses and gradients.
  const auto ck = run_pipeline(c.tp, c.pp, c.dp, c.m, c.kind, true);
  for (size_t r = 0; r < out.size(); ++r) {
    EXPECT_EQ(ck[r].losses, out[r].losses) << "rank " << r;
    EXPECT_EQ(ck[r].grads, out[r].grads) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, PipelineRun,
    ::testing::Values(Case{1, 2, 1, 4, PipelineSchedule::k1F1B}, Case{1, 2, 1, 3, PipelineSchedule::kGPipe},
                      Case{1, 4, 1, 5, PipelineSchedule::k1F1B}, Case{1, 4, 1, 2, PipelineSchedule::k1F1B},
                      Case{2, 2, 1, 3, PipelineSchedule::k1F1B}, Case{1, 1, 1, 2, PipelineSchedule::k1F1B},
                      Case{1, 2, 2, 3, PipelineSchedule::k1F1B}, Case{2, 2, 2, 2, PipelineSchedule::k1F1B},
                      Case{2, 1, 2, 2, PipelineSchedule::kGPipe}),
    [](const ::testing::TestParamInfo<Case>& i) {
      return "tp" + std::to_string(i.param.tp) + "_pp" + std::to_string(i.param.pp) + "_dp" +
             std::to_string(i.param.dp) + "_m" + std::to_string(i.param.m) + "_" +
             schedule_name(i.param.kind);
    });

// The backward direction over a group of its own (what GPU runs use, so NCCL's per-group stream
// never queues a gradient receive behind an activation send): the same bits.
TEST(PipelineStage, AGradientGroupOfItsOwnGivesTheSameBits) {
  for (const auto kind : {PipelineSchedule::k1F1B, PipelineSchedule::kGPipe}) {
    const auto one = run_pipeline(1, 4, 1, 5, kind, false);
    const auto two = run_pipeline(1, 4, 1, 5, kind, false, true);
    for (size_t r = 0; r < one.size(); ++r) {
      EXPECT_EQ(two[r].losses, one[r].losses) << "rank " << r;
      EXPECT_EQ(two[r].grads, one[r].grads) << "rank " << r;
    }
  }
}

TEST(PipelineStage, WrongPartOrTiedGroupIsAnError) {
  ds::test::run_ranks(2, [](int r, comm::CommPtr world) {
    Allocator alloc;
    // Stage r holding the whole model (embedding and head): refused on both ranks.
    Gpt2 whole(kShape, ms::ModelPart::whole(kShape), Gpt2Options{kB, kT}, alloc);
    EXPECT_THROW(PipelineStage(whole, world, nullptr), ds::Error);
    // The right part without the tied group it needs.
    const auto part = layout::partition_stages(kShape, 2, layout::StageSplit::kUniform)[r];
    Gpt2 m(kShape, part, Gpt2Options{kB, kT}, alloc);
    EXPECT_THROW(PipelineStage(m, world, nullptr), ds::Error);
  });
}

}  // namespace
}  // namespace ds::rt::parallel
