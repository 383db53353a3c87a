// A LoRA run's weights (lora_weights.h).
#include "train/lora_weights.h"

#include <algorithm>
#include <map>

#include <spdlog/spdlog.h>

#include "checkpoint/hf_safetensors.h"
#include "checkpoint/llmc_format.h"
#include "common/error.h"
#include "kernels/dispatch.h"
#include "kernels/typed.h"
#include "model/init.h"
#include "model_spec/family.h"
#include "model_spec/lora_spec.h"
#include "model_spec/lora_targets.h"
#include "train/initial_weights.h"

namespace ds::rt::train {

namespace ms = ds::model_spec;

ms::ModelShape lora_base_shape(const ms::ModelShape& shape) {
  ms::ModelShape base = shape;
  base.lora = ms::LoraShape{};
  return base;
}

namespace {

// fp32 host values into a typed buffer on the model's device.
void upload_f32(Model& model, TypedPtr dst, const std::vector<float>& values, Allocator& alloc) {
  if (model.options().device == Device::kCpu) {
    kern::typed::from_f32(dst, values.data(), static_cast<int64_t>(values.size()));
    return;
  }
  Buffer dev = alloc.allocate(values.size() * sizeof(float), MemTag::kWorkspace, "initial weights",
                              model.options().device);
  kern::copy_from_host(dev.data(), values.data(), values.size() * sizeof(float));
  kern::typed::from_f32(dst, dev.as<float>(), static_cast<int64_t>(values.size()));
}

}  // namespace

void init_lora_base(parallel::Engine& engine, const std::string& init_from, uint64_t seed, Allocator& alloc) {
  Model& model = engine.model();
  const ms::ModelShape base = lora_base_shape(model.shape());
  const ms::ParamLayout layout = ms::param_layout(base, model.part());
  DS_CHECK(layout.total == model.layout().adapter_begin, "the base's layout is the LoRA layout's base region");
  std::vector<float> values(static_cast<size_t>(layout.total));
  if (!init_from.empty()) {
    load_weights_file(init_from, base, model.part(), values.data());
    spdlog::info("LoRA: the frozen base from {}", init_from);
  } else {
    const auto all = ms::model_params(base);
    const ms::ModelPart& p = model.part();
    for (const auto& t : layout.tensors) {
      init_tensor_values(values.data() + t.offset, ms::find_param(all, t.id), t.layer, base.n_layer, p.tp, p.tp_rank,
                         seed, 0, t.numel, p.ep, p.ep_rank);
    }
  }
  upload_f32(model, model.params(), values, alloc);
}

void init_lora_adapters(parallel::Engine& engine, OptimizerState& state, const std::string& adapter_dir, uint64_t seed,
                        Allocator& alloc) {
  if (adapter_dir.empty()) return init_weights(engine, state, "", seed, alloc);
  Model& model = engine.model();
  const ms::ModelShape& shape = model.shape();
  const ms::ModelPart& part = model.part();
  const ckpt::PeftAdapter adapter = ckpt::read_peft_adapter(adapter_dir);
  const std::string where = adapter_dir + "/adapter_model.safetensors";
  if (adapter.config.r != shape.lora.r) {
    throw invalid_argument("{}/adapter_config.json: r is {} but the run's lora.r is {}", adapter_dir, adapter.config.r,
                           shape.lora.r);
  }
  std::map<std::string, const ckpt::PeftModuleWeights*> by_module;
  for (const auto& m : adapter.modules) by_module[m.module] = &m;
  // This rank's optimizer range of the adapters' region, filled tensor by tensor.
  const int64_t region = model.layout().adapter_begin;
  const int64_t begin = region + state.opt_begin(), count = state.opt_count();
  std::vector<float> values(static_cast<size_t>(count));
  const auto all = ms::model_params(shape);
  size_t used = 0;
  for (const auto& ts : model.layout().tensors) {
    const auto base = ms::lora_base_of(ts.id);
    if (!base) continue;
    const ms::ParamTensor& t = ms::find_param(all, ts.id);
    const std::string module = ms::lora_module_path(shape, *base, ts.layer);
    const auto it = by_module.find(module);
    if (it == by_module.end()) {
      throw invalid_argument("{}: no adapter for {} (base_model.model.{}.lora_A.weight), which lora.target_modules "
                             "adapts",
                             where, module, module);
    }
    const ckpt::PeftModuleWeights& m = *it->second;
    const bool a = ms::is_lora_a(ts.id);
    const int64_t rows = t.shape[0], cols = t.shape[1];
    const int64_t frows = a ? shape.lora.r : m.out, fcols = a ? m.in : shape.lora.r;
    if (rows != frows || cols != fcols) {
      throw invalid_argument("{}: base_model.model.{}.{}.weight is ({}, {}) but the model's is ({}, {})", where, module,
                             a ? "lora_A" : "lora_B", frows, fcols, rows, cols);
    }
    const std::vector<float>& full = a ? m.a : m.b;
    for (int64_t i = 0; i < ts.numel; ++i) {
      const int64_t g = ts.offset + i;
      if (g < begin || g >= begin + count) continue;
      values[static_cast<size_t>(g - begin)] =
          full[static_cast<size_t>(ms::full_index(t, part.tp, part.tp_rank, i, part.ep, part.ep_rank))];
    }
    ++used;
  }
  // Every module of the file belongs to the run (a pipeline stage sees its own layers only).
  if (part.layer_begin == 0 && part.layer_end == shape.n_layer) {
    for (const auto& m : adapter.modules) {
      bool known = false;
      for (const auto& ts : model.layout().tensors) {
        const auto base = ms::lora_base_of(ts.id);
        if (base && ms::lora_module_path(shape, *base, ts.layer) == m.module) known = true;
      }
      if (!known) {
        throw invalid_argument("{}: the adapter adapts {}, which this run's model and lora.target_modules do not",
                               where, m.module);
      }
    }
  }
  spdlog::info("LoRA: {} adapter tensors from {}", used, adapter_dir);
  if (model.options().device == Device::kCpu) return state.init_from_f32(values.data());
  Buffer dev = alloc.allocate(values.size() * sizeof(float), MemTag::kWorkspace, "initial weights",
                              model.options().device);
  kern::copy_from_host(dev.data(), values.data(), values.size() * sizeof(float));
  state.init_from_f32(dev.as<float>());
}

std::vector<float> merge_lora(const ms::ModelShape& shape, const float* whole) {
  const ms::ModelPart all_of = ms::ModelPart::whole(shape);
  const ms::ParamLayout lay = ms::param_layout(shape, all_of);
  std::vector<float> out(whole, whole + lay.adapter_begin);
  const double scale = shape.lora.alpha / shape.lora.r;
  const int64_t r = shape.lora.r;
  for (const auto& ts : lay.tensors) {
    const auto b = ms::lora_base_of(ts.id);
    if (!b || !ms::is_lora_a(ts.id)) continue;
    const ms::TensorSlice* w = lay.find_tensor(*b, ts.layer);
    const ms::TensorSlice* B = lay.find_tensor(ms::lora_b_id(*b), ts.layer);
    DS_CHECK(w != nullptr && B != nullptr, "an adapter without its base or B");
    const int64_t in = ts.numel / r, outd = B->numel / r;
    const float* A = whole + ts.offset;
    const float* Bv = whole + B->offset;
    float* W = out.data() + w->offset;
    for (int64_t o = 0; o < outd; ++o) {
      for (int64_t i = 0; i < in; ++i) {
        double acc = 0;
        for (int64_t k = 0; k < r; ++k) acc += static_cast<double>(Bv[o * r + k]) * A[k * in + i];
        W[o * in + i] = static_cast<float>(W[o * in + i] + scale * acc);
      }
    }
  }
  return out;
}

ckpt::PeftAdapter peft_adapter_of(const ms::ModelShape& shape, const float* whole,
                                  const std::vector<std::string>& target_modules, const std::string& base_model) {
  ckpt::PeftAdapter p;
  p.config.r = shape.lora.r;
  p.config.lora_alpha = shape.lora.alpha;
  p.config.lora_dropout = shape.lora.dropout;
  p.config.target_modules = target_modules;
  // GPT-2's Conv1D stores (in, out): PEFT flags it so the merge transposes.
  p.config.fan_in_fan_out = ms::family_of(shape).family == ms::ModelFamily::kGpt2;
  p.config.base_model_name_or_path = base_model;
  const ms::ParamLayout lay = ms::param_layout(shape, ms::ModelPart::whole(shape));
  const int64_t r = shape.lora.r;
  for (const auto& ts : lay.tensors) {
    const auto b = ms::lora_base_of(ts.id);
    if (!b || !ms::is_lora_a(ts.id)) continue;
    const ms::TensorSlice* B = lay.find_tensor(ms::lora_b_id(*b), ts.layer);
    ckpt::PeftModuleWeights m;
    m.module = ms::lora_module_path(shape, *b, ts.layer);
    m.in = ts.numel / r;
    m.out = B->numel / r;
    m.a.assign(whole + ts.offset, whole + ts.offset + ts.numel);
    m.b.assign(whole + B->offset, whole + B->offset + B->numel);
    p.modules.push_back(std::move(m));
  }
  return p;
}

}  // namespace ds::rt::train
