// A fresh run's initial weights (initial_weights.h).
#include "train/initial_weights.h"

#include <vector>

#include <spdlog/spdlog.h>

#include "checkpoint/llmc_format.h"
#include "kernels/dispatch.h"
#include "layout/partition.h"
#include "model/init.h"

namespace ds::rt::train {

namespace ms = ds::model_spec;

namespace {

// Random initial values of global elements [begin, begin + count) of the part's flat layout.
void random_values(const Gpt2& model, uint64_t seed, float* dst, int64_t begin, int64_t count) {
  const auto all = ms::gpt2_params(model.shape());
  for (const auto& t : model.layout().tensors) {
    const auto r = layout::intersect(begin, begin + count, t.offset, t.offset + t.numel);
    if (r.size() <= 0) continue;
    init_tensor_values(dst + (r.lo - begin), ms::find_param(all, t.id), t.layer, model.shape().n_layer,
                       model.part().tp, model.part().tp_rank, seed, r.lo - t.offset, r.size());
  }
}

}  // namespace

void init_weights(parallel::Engine& engine, OptimizerState& state, const std::string& init_from, uint64_t seed,
                  Allocator& alloc) {
  Gpt2& model = engine.model();
  parallel::ZeroEngine& zero = engine.zero();
  const int64_t n = model.num_params();
  const size_t range_bytes = static_cast<size_t>(state.opt_count()) * sizeof(float);
  if (!init_from.empty()) {
    if (zero.stage() == 3) {
      Buffer full = alloc.allocate(static_cast<size_t>(n) * sizeof(float), MemTag::kWorkspace, "llm.c import");
      ckpt::load_llmc(init_from, model.shape(), model.part(), full.as<float>());
      kern::copy_from_host(zero.opt_params(), full.as<float>() + state.opt_begin(), range_bytes);
    } else {
      std::vector<float> h(static_cast<size_t>(n));
      ckpt::load_llmc(init_from, model.shape(), model.part(), h.data());
      kern::copy_from_host(model.params(), h.data(), h.size() * sizeof(float));
    }
    spdlog::info("initialised weights from llm.c checkpoint {}", init_from);
  } else if (zero.stage() == 3) {
    std::vector<float> h(static_cast<size_t>(state.opt_count()));
    random_values(model, seed, h.data(), state.opt_begin(), state.opt_count());
    kern::copy_from_host(zero.opt_params(), h.data(), range_bytes);
  } else {
    model.init_weights(seed);
  }
  state.init_master_from_model();
}

}  // namespace ds::rt::train
