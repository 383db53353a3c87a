// Names and parsers of the shared training choices (choices.h).
#include "layout/choices.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "common/error.h"

namespace ds::layout {

namespace {
std::string lower(std::string_view text) {
  std::string s(text);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}
}  // namespace

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kFp32: return "fp32";
    case Precision::kBf16: return "bf16";
    case Precision::kFp16: return "fp16";
  }
  return "?";
}

Precision stored_precision(Precision p, bool cuda) {
  return cuda && p == Precision::kFp16 ? Precision::kFp32 : p;
}

const char* schedule_name(PipelineSchedule s) { return s == PipelineSchedule::k1F1B ? "1f1b" : "gpipe"; }

std::optional<PipelineSchedule> parse_schedule(std::string_view text) {
  const std::string s = lower(text);
  if (s == "1f1b") return PipelineSchedule::k1F1B;
  if (s == "gpipe") return PipelineSchedule::kGPipe;
  return std::nullopt;
}

PipelineSchedule parse_schedule_or_throw(std::string_view text, std::string_view what) {
  if (auto s = parse_schedule(text)) return *s;
  throw invalid_argument("{}: unknown pipeline schedule '{}' (expected \"1f1b\" or \"gpipe\")", what, text);
}

const char* stage_split_name(StageSplit s) { return s == StageSplit::kUniform ? "uniform" : "parameters"; }

std::optional<StageSplit> parse_stage_split(std::string_view text) {
  const std::string s = lower(text);
  if (s == "uniform") return StageSplit::kUniform;
  if (s == "parameters") return StageSplit::kParameters;
  return std::nullopt;
}

StageSplit parse_stage_split_or_throw(std::string_view text, std::string_view what) {
  if (auto s = parse_stage_split(text)) return *s;
  throw invalid_argument("{}: unknown pipeline partition method '{}' (expected \"uniform\" or \"parameters\")",
                         what, text);
}

}  // namespace ds::layout
