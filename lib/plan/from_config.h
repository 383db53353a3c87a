// From a validated job config (lib/config/job_config.h) to the memory model's inputs: the model
// spec's shape and the layout. The only file of the plan that knows the config's structs.
// Pure; throws ds::Error (invalid argument) naming the config key when the config cannot be
// planned (no model section, an unknown schedule or partition).
#pragma once

#include "config/job_config.h"
#include "model_spec/gpt2_spec.h"
#include "plan/memory_model.h"

namespace ds::plan {

struct PlanInput {
  model_spec::Gpt2Shape shape;
  Layout layout;
};

PlanInput plan_input_from_config(const config::JobConfig& c);

}  // namespace ds::plan
