// A fresh run's initial weights, the same whatever the layout: from an llm.c checkpoint
// (model.init_from or --init-from), else random from training.seed (model/init.h, a function of
// each element's place in the whole model). Each rank fills what it holds: its part's
// parameters, or at ZeRO-3 only its partition of them. The optimizer's master copy and ZeRO's
// gathers follow (OptimizerState::init_master_from_model). Runs inside the model device's scope.
#pragma once

#include <cstdint>
#include <string>

#include "core/allocator.h"
#include "parallel/engine.h"
#include "train/optimizer_state.h"

namespace ds::rt::train {

// `init_from`: an llm.c checkpoint, or "" for random weights from `seed`.
void init_weights(parallel::Engine& engine, OptimizerState& state, const std::string& init_from, uint64_t seed,
                  Allocator& alloc);

}  // namespace ds::rt::train
