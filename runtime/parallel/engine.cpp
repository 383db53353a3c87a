// Building a rank's parallel engine (engine.h): its groups, then the hook stack and the model.
//
// Two worlds on a GPU: the host world carries host vectors (the step's statistics, peaks,
// checkpoint barriers), which NCCL cannot; the model's buffers are device memory, which only
// NCCL moves without a copy. On the CPU the host world serves both.
#include "parallel/engine.h"

#include <fmt/format.h>

#include "common/env.h"
#include "common/error.h"
#include "layout/partition.h"

namespace ds::rt::parallel {

namespace ms = ds::model_spec;

namespace {

comm::CommPtr make_host_world(std::shared_ptr<store::Store> store, int rank, int world, Millis timeout) {
  // The world carries host vectors (loss, norm, peaks): it must be a host backend.
  if (auto b = env::get("DSTRAIN_COMM_BACKEND"); b && *b == "nccl") {
    throw Error(ErrorKind::kInvalidArgument,
                "DSTRAIN_COMM_BACKEND=nccl: dstrain train keeps its bookkeeping group on the host "
                "(shm or Gloo) and puts the model's groups on NCCL itself when training.device is "
                "\"cuda\"",
                "unset DSTRAIN_COMM_BACKEND (or set auto, shm or gloo)");
  }
  comm::CommOptions co;
  co.name = "world";
  co.timeout = timeout;
  return comm::make_world_comm(std::move(store), rank, world, co);
}

}  // namespace

Engine::Engine(const ms::ModelShape& shape, const EngineSpec& spec, std::shared_ptr<store::Store> store,
               Allocator& alloc)
    : spec_(spec), topo_(spec.world, spec.tp, spec.dp, spec.pp, spec.cp), coord_(topo_.coord_of(spec.rank)) {
  part_ = layout::partition_stages(shape, spec.pp, spec.split, spec.tp, coord_.tp)[static_cast<size_t>(coord_.pp)];
  if (spec.ep > 1) {
    part_.ep = spec.ep;
    part_.ep_rank = topo_.expert_rank(spec.rank, spec.ep);
  }
  if (spec.world > 1) {
    if (!store) throw invalid_usage("parallel engine: {} ranks but no store to meet through", spec.world);
    build_groups(std::move(store), spec.pp > 1 && shape.tied() && (part_.has_embedding || part_.has_head));
  }
  build_stack(shape, alloc);
}

Engine::~Engine() = default;

void Engine::build_groups(std::shared_ptr<store::Store> store, bool tied) {
  const int rank = spec_.rank;
  host_world_ = HostWorld(make_host_world(store, rank, spec_.world, spec_.comm_timeout));
  beacon_ = host_world_.comm()->start_progress_beacon();
  // The groups that move the model's buffers: on a GPU an NCCL world (device pointers) beside
  // the host world, on the CPU the host world itself.
  data_world_ = host_world_.comm();
  if (spec_.device == Device::kCuda) {
    comm::CommOptions no;
    no.name = "world_nccl";
    no.backend = comm::Backend::kNccl;
    no.cuda_device = spec_.cuda_device;
    no.timeout = spec_.comm_timeout;
    data_world_ = comm::make_world_comm(store, rank, spec_.world, no);
  }
  if (spec_.tp == 1 && spec_.pp == 1 && spec_.cp == 1 && spec_.ep == 1) {
    dp_ = data_world_;
    return;
  }
  // Every member creates its groups in the same order: tp, the gradients' (dp x cp), pp, cp, the
  // gradients' pp, the tied pair.
  auto group = [&](layout::Axis a) -> comm::CommPtr {
    if (topo_.size(a) == 1) return nullptr;
    return data_world_->new_group(topo_.group_of(rank, a),
                                  fmt::format("{}{}", layout::axis_name(a), topo_.group_index(rank, a)));
  };
  tp_ = group(layout::Axis::kTp);
  if (spec_.cp == 1) {
    dp_ = spec_.tp == 1 && spec_.pp == 1 ? data_world_ : group(layout::Axis::kDp);
  } else if (spec_.tp == 1 && spec_.pp == 1) {
    dp_ = data_world_;  // every rank holds the same parameters
  } else {
    dp_ = data_world_->new_group(topo_.gradient_group(rank), fmt::format("dpcp{}", coord_.pp * spec_.tp + coord_.tp));
  }
  pp_ = group(layout::Axis::kPp);
  cp_ = group(layout::Axis::kCp);
  if (spec_.ep > 1) {
    const auto ep = topo_.expert_group(rank, spec_.ep), edp = topo_.expert_data_group(rank, spec_.ep);
    ep_ = data_world_->new_group(ep, fmt::format("ep{}", ep.front()));
    if (edp.size() > 1) edp_ = data_world_->new_group(edp, fmt::format("edp{}", edp.front()));
  }
  const auto pp_ranks = topo_.group_of(rank, layout::Axis::kPp);
  const int pp_index = topo_.group_index(rank, layout::Axis::kPp);
  if (spec_.pp > 1 && spec_.device == Device::kCuda) {
    // NCCL: the gradients flowing back get a group (a stream) of their own (pipeline_stage.h).
    pp_grads_ = data_world_->new_group(pp_ranks, fmt::format("ppgrad{}", pp_index));
  }
  if (tied) tied_ = data_world_->new_group({pp_ranks.front(), pp_ranks.back()}, fmt::format("tied{}", pp_index));
}

void Engine::build_stack(const ms::ModelShape& shape, Allocator& alloc) {
  ZeroOptions zo = spec_.zero;
  zo.device = spec_.device;
  zo.param_dtype = spec_.model.dtype;
  zo.grad_dtype = spec_.model.grad_dtype;
  zo.tied_head = shape.tied();
  const ms::ParamLayout layout = ms::param_layout(shape, part_);
  const bool moe = ms::family_of(shape).mlp == ms::MlpKind::kMoe;
  const bool lora = shape.lora.on();
  ParallelHooks* bottom = nullptr;
  if (moe) {
    // Two regions: the dense one over the gradients' group, the experts over theirs (the whole
    // gradients' group without expert parallelism).
    zero_ = std::make_unique<ZeroEngine>(zo, dp_, ms::dense_region(layout), alloc);
    ZeroOptions ze = zo;
    ze.tied_head = false;
    expert_zero_ = std::make_unique<ZeroEngine>(ze, spec_.ep > 1 ? edp_ : dp_, ms::expert_region(layout), alloc);
    region_hooks_ = std::make_unique<RegionHooks>(zero_.get(), expert_zero_.get());
    bottom = region_hooks_.get();
  } else if (lora) {
    // LoRA: ZeRO over the adapters alone (the trainable region); the frozen base is the model's
    // own, replicated over dp, and never reaches the hooks (decoder.h).
    ZeroOptions za = zo;
    za.tied_head = false;
    zero_ = std::make_unique<ZeroEngine>(za, dp_, ms::adapter_region(layout), alloc);
    bottom = zero_.get();
  } else {
    zero_ = std::make_unique<ZeroEngine>(zo, dp_, layout, alloc);
    bottom = zero_.get();
  }
  ParallelHooks* below_tp = bottom;
  if (tied_ && !lora) {  // a frozen tied embedding has no gradients to share
    const auto wte = ms::find_param(ms::model_params(shape), ms::ParamId::kWte);
    tied_hooks_ = std::make_unique<TiedEmbeddingHooks>(bottom, ms::local_numel(wte, spec_.tp), alloc, spec_.device,
                                                       nullptr, spec_.model.grad_dtype);
    below_tp = tied_hooks_.get();
  }
  if (ep_) {
    ep_hooks_ = std::make_unique<ExpertParallelHooks>(ep_, below_tp);
    below_tp = ep_hooks_.get();
  }
  ParallelHooks* hooks = below_tp;
  if (tp_) {
    tp_hooks_ = std::make_unique<TensorParallelHooks>(tp_, below_tp);
    hooks = tp_hooks_.get();
  }
  if (cp_) {
    const ContextParallelShape cs{spec_.model.B, spec_.model.T, shape.n_head / spec_.tp, ms::kv_heads(shape) / spec_.tp,
                                  shape.head_dim(), spec_.cp_method, spec_.model.dtype, spec_.device};
    cp_hooks_ = std::make_unique<ContextParallelHooks>(cp_, cs, alloc, hooks);
    hooks = cp_hooks_.get();
  }
  ModelOptions mo = spec_.model;
  mo.T = spec_.model.T / spec_.cp;
  mo.cp = spec_.cp;
  mo.cp_rank = coord_.cp;
  mo.cp_method = spec_.cp_method;
  mo.own_params = zero_->model_owns_params();
  mo.own_grads = zero_->model_owns_grads();
  mo.device = spec_.device;
  model_ = make_model(shape, part_, mo, alloc, hooks);
  if (lora) {
    // The adapters: after the base in the model's parameters (when it holds them: not at ZeRO-3);
    // the model's gradients are the adapters' alone.
    zero_->attach(mo.own_params ? model_->params() + layout.adapter_begin : TypedPtr(), model_->grads());
  } else {
    zero_->attach(model_->params(), model_->grads());
  }
  if (expert_zero_) {
    auto at = [&](TypedPtr p) { return p ? p + layout.expert_begin : p; };
    expert_zero_->attach(at(model_->params()), at(model_->grads()));
  }
  if (spec_.pp > 1) {
    stage_ = std::make_unique<PipelineStage>(*model_, pp_, tied_, pp_grads_);
    events_ = stage_events(spec_.schedule, spec_.pp, coord_.pp, spec_.micro_batches);
  } else {
    acts_ = model_->new_activations();
  }
}

}  // namespace ds::rt::parallel
