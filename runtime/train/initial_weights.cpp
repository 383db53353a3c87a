// A fresh run's initial weights (initial_weights.h): the fp32 values of this rank's optimizer
// range (the whole part at ZeRO-0, its partition from ZeRO-1) go to the optimizer state, which
// rounds them into the model's storage and lets ZeRO gather the rest.
#include "train/initial_weights.h"

#include <algorithm>
#include <vector>

#include <spdlog/spdlog.h>

#include "checkpoint/hf_safetensors.h"
#include "checkpoint/llmc_format.h"
#include "kernels/dispatch.h"
#include "layout/partition.h"
#include "model/init.h"

namespace ds::rt::train {

namespace ms = ds::model_spec;

namespace {

// Random initial values of global elements [begin, begin + count) of the part's flat layout.
void random_values(Model& model, uint64_t seed, float* dst, int64_t begin, int64_t count) {
  const auto all = ms::model_params(model.shape());
  for (const auto& t : model.layout().tensors) {
    const auto r = layout::intersect(begin, begin + count, t.offset, t.offset + t.numel);
    if (r.size() <= 0) continue;
    init_tensor_values(dst + (r.lo - begin), ms::find_param(all, t.id), t.layer, model.shape().n_layer,
                       model.part().tp, model.part().tp_rank, seed, r.lo - t.offset, r.size(), model.part().ep,
                       model.part().ep_rank);
  }
}

}  // namespace

void load_weights_file(const std::string& path, const ms::ModelShape& shape, const ms::ModelPart& part, float* dst) {
  // Hugging Face's safetensors when the path names them (a directory or a .safetensors file) or
  // the family has no other format, else llm.c's file (GPT-2's own). load_hf_safetensors names the
  // families with an HF format when this one has none.
  const ms::FamilyDescription& family = ms::family_of(shape);
  if (family.llmc_checkpoint && !(family.hf != nullptr && ckpt::is_hf_weights_path(path))) {
    ckpt::load_llmc(path, shape, part, dst);
    spdlog::info("weights from llm.c checkpoint {}", path);
  } else {
    ckpt::load_hf_safetensors(path, shape, part, dst);
    spdlog::info("weights from Hugging Face safetensors {}", path);
  }
}

void init_weights(parallel::Engine& engine, OptimizerState& state, const std::string& init_from, uint64_t seed,
                  Allocator& alloc) {
  Model& model = engine.model();
  const int64_t begin = state.region_begin() + state.opt_begin(), count = state.opt_count();
  // The fp32 values of the optimizer range, on the host.
  std::vector<float> values(static_cast<size_t>(count));
  if (!init_from.empty()) {
    std::vector<float> whole(static_cast<size_t>(model.num_params()));
    load_weights_file(init_from, model.shape(), model.part(), whole.data());
    std::copy_n(whole.begin() + begin, count, values.begin());
  } else {
    random_values(model, seed, values.data(), begin, count);
  }
  // Onto the model's device (a plain host buffer on the CPU), then into the state.
  if (model.options().device == Device::kCpu) {
    state.init_from_f32(values.data());
    return;
  }
  Buffer dev = alloc.allocate(values.size() * sizeof(float), MemTag::kWorkspace, "initial weights",
                              model.options().device);
  kern::copy_from_host(dev.data(), values.data(), values.size() * sizeof(float));
  state.init_from_f32(dev.as<float>());
}

}  // namespace ds::rt::train
