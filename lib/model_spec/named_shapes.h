// Model shapes known by a name: what the benchmarks run and what calibration measures when no
// config is given, so that no tool outside the model description spells a family's shape out.
// Each is a full ModelShape (family included); a config file is the way to any other shape.
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "model_spec/shape.h"

namespace ds::model_spec {

struct NamedShape {
  const char* name;  // "124m": what --model takes
  const char* what;  // "GPT-2 124M (llm.c's shape)": for help texts and reports
  ModelShape shape;
};

// Every named shape, in a fixed order: the GPU benchmark's models first.
std::span<const NamedShape> named_shapes();
// The shape called `name`; throws ds::invalid_argument naming `what_asks` and listing the names.
const NamedShape& named_shape(std::string_view name, std::string_view what_asks);
// "124m, 350m, ...": the names, for help texts.
std::string named_shape_names();

// The shape calibration measures without a config (`dstrain plan --calibrate`).
inline constexpr std::string_view kDefaultCalibrationShape = "124m";

}  // namespace ds::model_spec
