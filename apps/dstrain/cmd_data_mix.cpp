// `dstrain data mix --config FILE [--windows N] [--json]`: the mix a config's training blend
// (data.train as a list of {"path", "weight"}) gives over its first N windows: each source's
// weight as a share of the weights, and the share of the windows the blend's draw (runtime/data/
// blend.h, seeded by training.seed) gives it. Only the config is read: the draw needs no token
// file, so none is opened (nor needs to exist). A config that is not a blend has one source of
// weight 1 and share 1.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common/error.h"
#include "config/job_config.h"
#include "data/blend.h"

namespace ds::cli {

namespace {

struct DataMixOptions {
  std::string config;
  int64_t windows = 10000;
  int world_size = 0;  // 0 = the config's tensor x pipeline x context-parallel size
  bool json = false;
};

// The smallest world the config's model-parallel sizes allow (the draw does not depend on it; the
// config only has to validate). 1 when the file does not parse: load_job_config then says why.
int model_parallel_world(const std::string& path) {
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return 1;
  auto size = [&](const char* section, const char* key) -> int {
    auto s = j.find(section);
    if (s == j.end() || !s->is_object()) return 1;
    auto v = s->find(key);
    return v != s->end() && v->is_number_integer() && v->get<int>() > 0 ? v->get<int>() : 1;
  };
  return size("tensor_parallel", "size") * size("pipeline", "stages") *
         size("context_parallel", "size");
}

int run_data_mix(const DataMixOptions& o) {
  if (o.windows < 1)
    throw invalid_argument("data mix: --windows must be at least 1, got {}", o.windows);
  const int world = o.world_size > 0 ? o.world_size : model_parallel_world(o.config);
  const config::JobConfig cfg = config::load_job_config(o.config, world);
  if (!cfg.has_data) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("data mix: {}: $.data.train: missing", o.config),
                "give the config a data section with data.train");
  }
  struct Row {
    std::string path;
    double weight = 0, share = 0;
  };
  std::vector<Row> rows;
  if (cfg.data.train_blend.empty()) {
    std::string paths;
    for (const auto& p : cfg.data.train) paths += (paths.empty() ? "" : ", ") + p;
    rows.push_back({paths, 1.0, 1.0});
  } else {
    std::vector<double> weights;
    for (const auto& s : cfg.data.train_blend) weights.push_back(s.weight);
    const rt::data::BlendDraw draw(weights, cfg.training.seed);
    std::vector<int64_t> count(weights.size());
    for (int64_t g = 0; g < o.windows; ++g) ++count[static_cast<size_t>(draw.source(g))];
    for (size_t s = 0; s < weights.size(); ++s) {
      rows.push_back({cfg.data.train_blend[s].path, draw.share(static_cast<int>(s)),
                      static_cast<double>(count[s]) / static_cast<double>(o.windows)});
    }
  }
  if (o.json) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const auto& r : rows) {
      // The weight's share to 12 digits: 0.7 of (0.7, 0.2, 0.1) prints as 0.7, not 0.7000000000000001.
      const double weight = std::round(r.weight * 1e12) / 1e12;
      list.push_back({{"path", r.path}, {"weight", weight}, {"share", r.share}});
    }
    std::cout << nlohmann::ordered_json{{"sources", list}}.dump() << std::endl;
    return 0;
  }
  size_t width = 6;
  for (const auto& r : rows) width = std::max(width, r.path.size());
  std::cout << fmt::format("{}: {} source{}, the first {} windows (seed {})\n", o.config,
                           rows.size(), rows.size() == 1 ? "" : "s", o.windows, cfg.training.seed);
  std::cout << fmt::format("  {:<{}}  {:>8}  {:>8}\n", "source", width, "weight", "share");
  for (const auto& r : rows) {
    std::cout << fmt::format("  {:<{}}  {:>8.4f}  {:>8.4f}\n", r.path, width, r.weight, r.share);
  }
  return 0;
}

}  // namespace

void add_data_mix_command(CLI::App* data, std::vector<Command>& out) {
  auto opts = std::make_shared<DataMixOptions>();
  auto* mix = data->add_subcommand(
      "mix",
      "a training blend's mix over its first windows: each source's weight and realised share "
      "(reads only the config)");
  mix->add_option("--config", opts->config, "the job config (JSON)")->required();
  mix->add_option("--windows", opts->windows, "how many windows of the draw to count")
      ->capture_default_str();
  mix->add_option(
      "--world-size,-n", opts->world_size,
      "ranks the config is validated for (default: its tensor x pipeline x context-parallel size; "
      "the draw does not depend on it)");
  mix->add_flag("--json", opts->json,
                "print {\"sources\": [{\"path\", \"weight\", \"share\"}]} on stdout");
  out.push_back({mix, [opts] { return run_data_mix(*opts); }});
}

}  // namespace ds::cli
