// The parallel engine of one rank: its process groups and the model with its hook stack, built
// from the layout in one place. What it builds, in this order (every rank creates its groups in
// the same order, so every member's new_group calls match):
//   groups   the host world (shm or Gloo: the bookkeeping), on a GPU a second, NCCL world for the
//            model's buffers; from the model's world the tp group, the gradients' group (the
//            dp x cp ranks that hold the same parameters: the dp group without context
//            parallelism), the pp and cp groups of this rank (layout::Topology), on a GPU pipeline
//            a second pp group for the gradients flowing back (pipeline_stage.h), and the
//            {first, last} stage group of the tied embedding.
//   hooks    model -> ContextParallelHooks (cp > 1) -> TensorParallelHooks (tp > 1) ->
//            ExpertParallelHooks (ep > 1) -> TiedEmbeddingHooks (first and last stage of a
//            pipeline) -> ZeroEngine over the gradients' group (always; stage 0 with a group of 1
//            is plain local gradients); a mixture of experts: RegionHooks above two ZeroEngines,
//            the dense region's over the gradients' group, the experts' over the
//            expert-data-parallel group (expert_parallel.h); LoRA: one ZeroEngine over the
//            adapters' region only (model_spec/lora_spec.h), the frozen base outside every hook.
//   model    this rank's part (its pipeline stage's layers as its tp shard, its positions of each
//            sequence as its cp share), attached to ZeRO.
//   pipeline (pp > 1) the PipelineStage and this stage's event list for one step.
//
// Deliberately not here: the optimizer state, the data, the loop (runtime/train). Errors from
// the group set-up (a rank that never joins, ...) propagate as the Comm throws them.
// Destruction order is the reverse of construction: the stage, ZeRO (which waits its work), the
// hooks, the model, the groups.
#pragma once

#include <memory>
#include <vector>

#include "comm/comm.h"
#include "core/allocator.h"
#include "layout/choices.h"
#include "layout/topology.h"
#include "model/decoder.h"
#include "parallel/context_parallel.h"
#include "parallel/expert_parallel.h"
#include "parallel/host_world.h"
#include "layout/pipeline_schedule.h"
#include "parallel/pipeline_stage.h"
#include "parallel/tensor_parallel.h"
#include "parallel/zero.h"
#include "store/store.h"

namespace ds::rt::parallel {

struct EngineSpec {
  int rank = 0;
  int world = 1;
  int tp = 1, dp = 1, pp = 1;
  int cp = 1;  // context parallelism: each sequence split over cp ranks (layout/context_parallel.h)
  int ep = 1;  // expert parallelism: a mixture's experts split over ep ranks of the dp x cp ranks
  layout::CpMethod cp_method = layout::CpMethod::kRing;
  layout::StageSplit split = layout::StageSplit::kParameters;
  layout::PipelineSchedule schedule = layout::PipelineSchedule::k1F1B;
  int micro_batches = 1;  // per step (the pipeline schedule's m)
  Device device = Device::kCpu;
  int cuda_device = 0;  // the rank's GPU (LOCAL_RANK) when device is kCuda
  ZeroOptions zero;     // its device is set from `device`
  ModelOptions model;   // B, T (the whole sequence), recompute; ownership, device and cp are set here
  // How long a rank may show no progress while others wait for it (comm/beacon.h): every group's
  // CommOptions::timeout, and each rank publishes its progress beacon.
  Millis comm_timeout{60000};
};

class Engine {
 public:
  // `store`: the job's store (a generation prefix of it), or null for a single process.
  Engine(const model_spec::ModelShape& shape, const EngineSpec& spec, std::shared_ptr<store::Store> store,
         Allocator& alloc);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const layout::Topology& topology() const { return topo_; }
  const layout::Coord& coord() const { return coord_; }
  HostWorld& host_world() { return host_world_; }
  Model& model() { return *model_; }
  ZeroEngine& zero() { return *zero_; }  // the dense region's (the whole model without experts)
  // A mixture of experts: the expert region's engine (over the expert-data-parallel group); null
  // for a dense model. zeros(): every engine, the dense one first.
  ZeroEngine* expert_zero() { return expert_zero_.get(); }
  std::vector<ZeroEngine*> zeros() {
    std::vector<ZeroEngine*> z{zero_.get()};
    if (expert_zero_) z.push_back(expert_zero_.get());
    return z;
  }
  const ExpertParallelHooks* ep_hooks() const { return ep_hooks_.get(); }  // null unless ep > 1
  TiedEmbeddingHooks* tied_hooks() { return tied_hooks_.get(); }  // null unless first/last stage
  const ContextParallelHooks* cp_hooks() const { return cp_hooks_.get(); }  // null unless cp > 1
  PipelineStage* stage() { return stage_.get(); }                  // null without a pipeline
  const std::vector<Event>& events() const { return events_; }     // this stage's, one step
  Activations& activations() { return *acts_; }                    // without a pipeline only

 private:
  void build_groups(std::shared_ptr<store::Store> store, bool tied);
  void build_stack(const model_spec::ModelShape& shape, Allocator& alloc);

  EngineSpec spec_;
  layout::Topology topo_;
  layout::Coord coord_;
  model_spec::ModelPart part_;
  HostWorld host_world_;
  // The model's groups (null where the axis has size 1; dp is the model's world itself without
  // tensor and pipeline parallelism).
  comm::CommPtr data_world_, tp_, dp_, pp_, pp_grads_, tied_, cp_;  // dp_: the gradients' group (dp x cp)
  comm::CommPtr ep_, edp_;  // expert parallelism: the ep group, the expert-data-parallel group
  std::shared_ptr<void> beacon_;  // this rank's progress beacon (comm/beacon.h)
  std::unique_ptr<Model> model_;
  std::unique_ptr<TiedEmbeddingHooks> tied_hooks_;
  std::unique_ptr<TensorParallelHooks> tp_hooks_;
  std::unique_ptr<ContextParallelHooks> cp_hooks_;
  std::unique_ptr<ZeroEngine> zero_, expert_zero_;
  std::unique_ptr<RegionHooks> region_hooks_;
  std::unique_ptr<ExpertParallelHooks> ep_hooks_;
  std::unique_ptr<PipelineStage> stage_;
  std::vector<Event> events_;
  std::unique_ptr<Activations> acts_;
};

}  // namespace ds::rt::parallel
