// The exports of a run's weights (weights_export.h).
#include "train/weights_export.h"

#include <vector>

#include "checkpoint/hf_safetensors.h"
#include "checkpoint/llmc_format.h"
#include "common/check.h"
#include "common/error.h"
#include "kernels/dispatch.h"
#include "layout/partition.h"
#include "kernels/typed.h"
#include "model_spec/family.h"
#include "train/lora_weights.h"

namespace ds::rt::train {

namespace ms = ds::model_spec;

namespace {

// Step 1: this rank's whole part as fp32 host values, region by region (a mixture of experts has
// the dense one and the experts', each gathered over its own engine's group).
std::vector<float> part_on_host(parallel::Engine& engine, const std::vector<OptimizerState*>& states, Allocator& alloc,
                                Device device) {
  Model& model = engine.model();
  std::vector<float> part(static_cast<size_t>(model.num_params()));
  if (model.shape().lora.on()) {
    // LoRA: the frozen base is the model's own, whole on every rank (in its storage type).
    const int64_t n = model.layout().adapter_begin;
    Buffer f = alloc.allocate(static_cast<size_t>(n) * sizeof(float), MemTag::kWorkspace, "export", device);
    kern::typed::convert(TypedPtr(f.as<float>()), model.params(), n);
    kern::copy_to_host(part.data(), f.as<float>(), static_cast<size_t>(n) * sizeof(float));
  }
  for (OptimizerState* st : states) {
    OptimizerState& state = *st;
    parallel::ZeroEngine& zero = state.zero();
    const int64_t base = state.region_begin(), n = zero.partition().total();
    float* out = part.data() + base;
    const bool fp32 = state.precision() == layout::Precision::kFp32;
    const bool full_on_rank = zero.stage() == 0 || (zero.stage() < 3 && fp32);
    if (full_on_rank && zero.dp_size() == 1) {
      kern::copy_to_host(out, fp32 ? model.params().f32() + base : state.master(), static_cast<size_t>(n) * sizeof(float));
      continue;
    }
    Buffer full = alloc.allocate(static_cast<size_t>(n) * sizeof(float), MemTag::kWorkspace, "export", device);
    const float* src = fp32 ? state.partition_params().f32() : state.partition_of(state.master());
    kern::copy(full.as<float>() + state.part_begin(), src, static_cast<size_t>(state.part_count()) * sizeof(float));
    zero.all_gather_partitions(full.as<float>());
    kern::copy_to_host(out, full.as<float>(), static_cast<size_t>(n) * sizeof(float));
  }
  return part;
}

// Step 2 on rank 0: part q's values into the whole model's layout.
void place_part(const ms::ModelShape& shape, const ms::ModelPart& mp, const ms::ParamLayout& whole,
                std::span<const float> values, std::vector<float>& model) {
  const auto all = ms::model_params(shape);
  const ms::ParamLayout lay = ms::param_layout(shape, mp);
  DS_CHECK(lay.total == static_cast<int64_t>(values.size()), "export: a part's size differs from its layout");
  for (const auto& ts : lay.tensors) {
    const ms::ParamTensor& t = ms::find_param(all, ts.id);
    const ms::TensorSlice* dst = whole.find_tensor(ts.id, ts.layer);
    DS_CHECK(dst != nullptr, "export: a part's tensor is not in the whole model");
    for (int64_t i = 0; i < ts.numel; ++i) {
      model[static_cast<size_t>(dst->offset + ms::full_index(t, mp.tp, mp.tp_rank, i, mp.ep, mp.ep_rank))] =
          values[static_cast<size_t>(ts.offset + i)];
    }
  }
}

}  // namespace

void write_whole_model(parallel::Engine& engine, const std::vector<OptimizerState*>& states, layout::StageSplit split,
                       Allocator& alloc, Device device, const std::function<void(const float*)>& write) {
  const kern::DeviceScope scope(device);
  const std::vector<float> part = part_on_host(engine, states, alloc, device);
  const ms::ModelShape& shape = engine.model().shape();
  const layout::Topology& topo = engine.topology();
  const int ep = engine.model().part().ep;
  auto& world = engine.host_world();
  if (topo.tp() * topo.pp() * ep == 1) {
    if (world.rank() == 0) write(part.data());
    return;
  }
  // One part of every (stage, tp rank, ep rank): the first ep ranks of each gradient group.
  auto place = [&](int q) { return topo.coord_of(q).dp * topo.cp() + topo.coord_of(q).cp; };
  const ms::ParamLayout whole = ms::param_layout(shape, ms::ModelPart::whole(shape));
  std::vector<float> model;
  if (world.rank() == 0) model.resize(static_cast<size_t>(whole.total));
  world.gather_to_root(
      part, [&](int q) { return place(q) < ep; },
      [&](int q, std::span<const float> values) {
        const layout::Coord c = topo.coord_of(q);
        auto mp = layout::partition_stages(shape, topo.pp(), split, topo.tp(), c.tp)[static_cast<size_t>(c.pp)];
        mp.ep = ep;
        mp.ep_rank = place(q) % ep;
        place_part(shape, mp, whole, values, model);
      },
      [&] { write(model.data()); });
}

void write_llmc_export(const std::string& path, parallel::Engine& engine, const std::vector<OptimizerState*>& states,
                       layout::StageSplit split, Allocator& alloc, Device device, bool bf16) {
  const ms::ModelShape& shape = engine.model().shape();
  const ms::FamilyDescription& family = ms::family_of(shape);
  if (!family.llmc_checkpoint) {
    throw invalid_argument("--export-llmc writes llm.c's format, which holds {} models; model.type {} exports with "
                           "--export-safetensors DIR",
                           ms::llmc_family().display_name, family.name);
  }
  write_whole_model(engine, states, split, alloc, device, [&](const float* whole) {
    if (!shape.lora.on()) return ckpt::save_llmc(path, shape, whole, bf16);
    ckpt::save_llmc(path, lora_base_shape(shape), merge_lora(shape, whole).data(), bf16);  // W + (alpha/r) B A
  });
}

void write_safetensors_export(const std::string& dir, parallel::Engine& engine, const std::vector<OptimizerState*>& states,
                              layout::StageSplit split, Allocator& alloc, Device device, ckpt::StDtype dtype) {
  const ms::ModelShape& shape = engine.model().shape();
  if (ms::family_of(shape).hf == nullptr) {
    throw invalid_argument("--export-safetensors writes a Hugging Face layout, which model.type {} has none of in "
                           "dstrain; it exports with --export-llmc",
                           ms::family_of(shape).name);
  }
  write_whole_model(engine, states, split, alloc, device, [&](const float* whole) {
    if (!shape.lora.on()) {
      ckpt::save_hf_safetensors(dir, shape, whole, dtype);
      return;
    }
    ckpt::save_hf_safetensors(dir, lora_base_shape(shape), merge_lora(shape, whole).data(), dtype);
  });
}

void write_adapter_export(const std::string& dir, parallel::Engine& engine, const std::vector<OptimizerState*>& states,
                          layout::StageSplit split, Allocator& alloc, Device device, ckpt::StDtype dtype,
                          const std::vector<std::string>& target_modules, const std::string& base_model) {
  const ms::ModelShape& shape = engine.model().shape();
  if (!shape.lora.on()) {
    throw Error(ErrorKind::kInvalidArgument, "--export-adapter writes LoRA adapters, and this run has none",
                "add a \"lora\" section to the config, or export the model with --export-safetensors");
  }
  write_whole_model(engine, states, split, alloc, device, [&](const float* whole) {
    ckpt::write_peft_adapter(dir, peft_adapter_of(shape, whole, target_modules, base_model), dtype);
  });
}

}  // namespace ds::rt::train
