// Reading a metrics file: each line parsed on its own (so an error names its line), the plotted
// fields of each record kept in a map from step to record, a later record of a step replacing
// the earlier one whole (a resumed run's steps replace the first attempt's, val_loss included),
// then the map turned into one series per field in step order.
#include "plot/metrics_file.h"

#include <cerrno>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/strings.h"

namespace ds::plot {

namespace {

const char* kHint =
    "a metrics file holds one JSON object per line, as `dstrain train --metrics FILE` writes";

Error bad_line(const std::string& path, int64_t line, const std::string& what) {
  return Error(ErrorKind::kInvalidArgument, fmt::format("{}:{}: {}", path, line, what), kHint);
}

// A value as it appears in the file, shortened for a message.
std::string shown(const nlohmann::json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

bool is_rank_copy(const std::string& name) {
  const auto at = name.rfind("_rank");
  if (at == std::string::npos) return false;
  return parse_int(std::string_view(name).substr(at + 5)).has_value();
}

}  // namespace

bool is_plotted_field(const std::string& name) {
  if (name == "loss" || name == "val_loss" || name == "lr" || name == "tokens_per_s") return true;
  if (starts_with(name, "eval_") && !is_rank_copy(name)) return true;  // training.eval_tasks' scores
  return starts_with(name, "peak_bytes_") && name.size() > 11 && !is_rank_copy(name);
}

MetricsRun read_metrics_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("cannot read metrics file {}: {}", path, errno_string(errno)),
                "give the file `dstrain train --metrics FILE` wrote");
  }
  std::map<int64_t, std::map<std::string, double>> records;
  std::string text;
  int64_t line_no = 0;
  while (std::getline(in, text)) {
    ++line_no;
    if (trim(text).empty()) continue;
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) throw bad_line(path, line_no, "not a JSON object");
    auto step = j.find("step");
    if (step == j.end()) throw bad_line(path, line_no, "the record has no \"step\"");
    if (!step->is_number_integer() || step->get<int64_t>() < 0) {
      throw bad_line(path, line_no,
                     fmt::format("\"step\" must be a non-negative integer, got {}", shown(*step)));
    }
    std::map<std::string, double> fields;
    for (const auto& [key, value] : j.items()) {
      if (!is_plotted_field(key) || value.is_null()) continue;
      if (!value.is_number()) {
        throw bad_line(path, line_no,
                       fmt::format("\"{}\" must be a number, got {}", key, shown(value)));
      }
      fields[key] = value.get<double>();
    }
    records[step->get<int64_t>()] = std::move(fields);
  }
  if (in.bad()) throw system_error("cannot read metrics file {}: {}", path, errno_string(errno));
  if (records.empty()) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}: no metrics records (the file is empty)", path),
                "plot a run after its first step");
  }
  MetricsRun run;
  run.path = path;
  run.label = std::filesystem::path(path).stem().string();
  for (const auto& [step, fields] : records) {
    for (const auto& [key, value] : fields) {
      auto& s = run.series[key];
      s.steps.push_back(step);
      s.values.push_back(value);
    }
  }
  return run;
}

}  // namespace ds::plot
