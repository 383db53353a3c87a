// The training choices that the config, the plan and the runtime share, one enum per concept,
// declared once: the precision of the model's values, the pipeline schedule, and how pipeline
// stages split the layers. Each has one name (what configs and messages spell) and one parser.
//
// Deliberately only the vocabulary: what each choice does is documented where it is done
// (runtime/train, layout/pipeline_schedule.h, layout/partition.h, lib/plan).
#pragma once

#include <optional>
#include <string_view>

namespace ds::layout {

// The storage precision of the parameters the model computes with (bf16.enabled / fp16.enabled).
enum class Precision { kFp32, kBf16, kFp16 };
const char* precision_name(Precision p);  // "fp32", "bf16", "fp16"
// The type the runtime stores values of precision `p` in (parameters, activations, gradients),
// shared so that the plan counts what the runtime allocates: `p` itself on the CPU; on a GPU
// (cuda) fp32 and bf16 as such, fp16 in fp32 buffers (there are no fp16 CUDA kernels).
Precision stored_precision(Precision p, bool cuda);

// The pipeline schedule (pipeline.schedule): "1f1b" or "gpipe".
enum class PipelineSchedule { k1F1B, kGPipe };
const char* schedule_name(PipelineSchedule s);
std::optional<PipelineSchedule> parse_schedule(std::string_view text);  // case-insensitive
// As parse_schedule, throwing invalid_argument that starts with `what` and lists the names.
PipelineSchedule parse_schedule_or_throw(std::string_view text, std::string_view what);

// How pipeline stages split the layers (pipeline.partition): "uniform" or "parameters".
enum class StageSplit {
  kUniform,     // L / pp layers each, the first L % pp stages one more
  kParameters,  // contiguous ranges minimising the largest stage's parameter count on one tp rank,
                // counting wte + wpe on the first stage and lnf + the tied wte on the last (as the
                // model parts hold them); ties go to the earliest boundary
};
const char* stage_split_name(StageSplit s);
std::optional<StageSplit> parse_stage_split(std::string_view text);  // case-insensitive
// As parse_stage_split, throwing invalid_argument that starts with `what` (a file and JSON path)
// and lists the valid names.
StageSplit parse_stage_split_or_throw(std::string_view text, std::string_view what);

}  // namespace ds::layout
