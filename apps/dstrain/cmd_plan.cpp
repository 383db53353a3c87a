// `dstrain plan`: memory per rank before anything runs.
//   generic mode:  --params P --world-size N --zero-stage K [--formula paper|deepspeed]
//   paper activations: --formula paper --hidden H --heads A --seq-len S [--micro-batch B] [--tp T]
//   model mode:    --config C --world-size N [--hostfile H] [--gpu-mem SIZE]
//   layout search: --recommend --config C --world-size N --gpu-mem SIZE
// The numbers come from lib/plan; this file parses flags, picks the mode and prints tables or
// JSON. It is the only place of the plan that may ask the runtime which GPUs exist.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common/error.h"
#include "common/strings.h"
#include "plan/activation_paper.h"
#include "plan/model_state.h"

namespace ds::cli {

namespace {

struct PlanOptions {
  // generic mode
  std::string params;  // "7.5e9"
  int64_t world_size = 0;
  int zero_stage = -1;
  std::string formula;  // paper | deepspeed | (model mode: empty = dstrain's own)
  std::string largest_layer_params;
  int64_t gpus_per_node = 0;
  int64_t num_nodes = 0;
  std::string offload_optimizer = "none";
  std::string offload_param = "none";
  int zero_init = 1;
  double buffer_factor = 1.5;
  bool json = false;
  // paper activations without a config
  int64_t hidden = 0, heads = 0, seq_len = 0, micro_batch = 1, tp = 1, layers = 0, pp = 1;
};

double parse_count(const std::string& s, const char* flag) {
  auto v = parse_bytes(s);  // accepts 7.5e9, 2851000000, ...
  if (!v || *v <= 0) throw invalid_argument("{} expects a positive number like 7.5e9, got '{}'", flag, s);
  return *v;
}

bool parse_device(const std::string& s, const char* flag) {
  if (s == "none") return false;
  if (s == "cpu") return true;
  throw invalid_argument("{} expects 'none' or 'cpu', got '{}'", flag, s);
}

std::string gb(double bytes) { return fmt::format("{:.2f} GB", bytes / 1e9); }

int run_generic_paper(const PlanOptions& o, double params) {
  auto m = plan::zero_paper_model_states(params, o.world_size, o.zero_stage);
  if (o.json) {
    nlohmann::ordered_json j;
    j["formula"] = "paper";
    j["params"] = params;
    j["world_size"] = o.world_size;
    j["zero_stage"] = o.zero_stage;
    j["k"] = plan::kZeroPaperK;
    j["per_gpu"] = {{"params", std::llround(m.params)},
                    {"grads", std::llround(m.grads)},
                    {"optimizer", std::llround(m.optimizer)},
                    {"total", std::llround(m.total())}};
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format(
      "ZeRO paper accounting (Rajbhandari et al. 2019): {:.4g} parameters, {} data-parallel ranks, "
      "ZeRO stage {}\n2 B fp16 params + 2 B fp16 grads + K={} B optimizer state per parameter; "
      "GB = 1e9 bytes\n\n",
      params, o.world_size, o.zero_stage, plan::kZeroPaperK);
  std::cout << fmt::format("  {:<12} {:>12}\n", "per GPU", "");
  std::cout << fmt::format("  {:<12} {:>12}\n", "params", gb(m.params));
  std::cout << fmt::format("  {:<12} {:>12}\n", "grads", gb(m.grads));
  std::cout << fmt::format("  {:<12} {:>12}\n", "optimizer", gb(m.optimizer));
  std::cout << fmt::format("  {:<12} {:>12}\n", "total", gb(m.total()));
  std::cout << "\n  all stages:";
  for (int s = 0; s <= 3; ++s) {
    std::cout << fmt::format("  {}: {}", s,
                             gb(plan::zero_paper_model_states(params, o.world_size, s).total()));
  }
  std::cout << "\n";
  return 0;
}

int run_generic_deepspeed(const PlanOptions& o, double params) {
  plan::DeepSpeedEstimateInput in;
  in.stage = o.zero_stage;
  in.total_params = params;
  if (!o.largest_layer_params.empty()) {
    in.largest_layer_params = parse_count(o.largest_layer_params, "--largest-layer-params");
  }
  // Nodes and GPUs per node: given, or derived from --world-size (one node when it is not split).
  in.gpus_per_node = o.gpus_per_node > 0 ? o.gpus_per_node : 0;
  in.num_nodes = o.num_nodes > 0 ? o.num_nodes : 0;
  if (in.gpus_per_node == 0 && in.num_nodes == 0) {
    if (o.world_size <= 0) {
      throw Error(ErrorKind::kInvalidArgument, "--formula deepspeed needs the GPUs",
                  "give --world-size N (one node), or --gpus-per-node G and --num-nodes M");
    }
    in.gpus_per_node = o.world_size;
    in.num_nodes = 1;
  } else if (in.gpus_per_node == 0) {
    if (o.world_size <= 0 || o.world_size % in.num_nodes != 0) {
      throw invalid_argument("--num-nodes {} needs --gpus-per-node, or a --world-size divisible by it",
                             in.num_nodes);
    }
    in.gpus_per_node = o.world_size / in.num_nodes;
  } else if (in.num_nodes == 0) {
    if (o.world_size > 0 && o.world_size % in.gpus_per_node != 0) {
      throw invalid_argument("--world-size {} is not a multiple of --gpus-per-node {}", o.world_size,
                             in.gpus_per_node);
    }
    in.num_nodes = o.world_size > 0 ? o.world_size / in.gpus_per_node : 1;
  }
  if (o.world_size > 0 && o.world_size != in.gpus_per_node * in.num_nodes) {
    throw invalid_argument("--world-size {} differs from --num-nodes {} x --gpus-per-node {}",
                           o.world_size, in.num_nodes, in.gpus_per_node);
  }
  in.offload_optimizer_cpu = parse_device(o.offload_optimizer, "--offload-optimizer");
  in.offload_param_cpu = parse_device(o.offload_param, "--offload-param");
  if (o.zero_init != 0 && o.zero_init != 1) throw invalid_argument("--zero-init expects 0 or 1, got {}", o.zero_init);
  in.zero_init = o.zero_init == 1;
  in.additional_buffer_factor = o.buffer_factor;

  auto chosen = plan::deepspeed_model_states(in);
  auto all = plan::deepspeed_model_states_all(in);
  if (o.json) {
    nlohmann::ordered_json j;
    j["formula"] = "deepspeed";
    j["zero_stage"] = in.stage;
    j["params"] = params;
    j["largest_layer_params"] = in.largest_layer_params;
    j["num_nodes"] = in.num_nodes;
    j["gpus_per_node"] = in.gpus_per_node;
    j["additional_buffer_factor"] = in.additional_buffer_factor;
    auto row = [](const plan::DeepSpeedEstimate& e) {
      return nlohmann::ordered_json{{"options", e.options},
                                    {"per_cpu", e.cpu_bytes},
                                    {"per_gpu", e.gpu_bytes}};
    };
    j["estimate"] = row(chosen);
    j["all_options"] = nlohmann::ordered_json::array();
    for (const auto& e : all) j["all_options"].push_back(row(e));
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  // DeepSpeed's own layout (…_all_cold), GiB printed under the label GB as DeepSpeed does.
  std::cout << "DeepSpeed estimate_zero" << in.stage
            << "_model_states_mem_needs (GB here means GiB, 2^30 bytes, as DeepSpeed prints it)\n";
  std::cout << fmt::format("HW: Setup with {} node{}, {} GPU{} per node.\n", in.num_nodes,
                           in.num_nodes > 1 ? "s" : "", in.gpus_per_node,
                           in.gpus_per_node > 1 ? "s" : "");
  if (in.stage == 3) {
    std::cout << fmt::format("SW: Model with {}M total params, {}M largest layer params.\n",
                             static_cast<int64_t>(params / 1e6),
                             static_cast<int64_t>(in.largest_layer_params / 1e6));
  } else {
    std::cout << fmt::format("SW: Model with {}M total params.\n", static_cast<int64_t>(params / 1e6));
  }
  std::cout << "  per CPU  |  per GPU |   Options\n";
  for (const auto& e : all) {
    bool sel = e.options == chosen.options;
    std::cout << fmt::format(" {:7.2f}GB | {:6.2f}GB | {}{}\n",
                             static_cast<double>(e.cpu_bytes) / 1073741824.0,
                             static_cast<double>(e.gpu_bytes) / 1073741824.0, e.options,
                             sel ? "   <- selected" : "");
  }
  return 0;
}

// Korthikanti et al. 2022 Table 2 for the given sizes: per layer, and for the first pipeline stage
// under 1F1B (pp micro-batches of L/pp layers in flight: L layers' worth).
int print_paper_activations(int64_t s, int64_t b, int64_t h, int64_t a, int64_t t, int64_t layers,
                            int64_t pp, bool json) {
  auto rows = plan::korthikanti_table(static_cast<double>(s), static_cast<double>(b),
                                      static_cast<double>(h), static_cast<double>(a),
                                      static_cast<double>(t));
  // Layers the first stage holds, times the micro-batches 1F1B keeps in flight there (pp).
  int64_t stage_layers = layers > 0 ? (layers + pp - 1) / pp : 0;
  int64_t layer_mbs = stage_layers * pp;
  if (json) {
    nlohmann::ordered_json j;
    j["formula"] = "paper";
    j["source"] = "Korthikanti et al. 2022, Table 2 (16-bit activations)";
    j["s"] = s; j["b"] = b; j["h"] = h; j["a"] = a; j["t"] = t;
    j["layers"] = layers; j["pp"] = pp;
    j["rows"] = nlohmann::ordered_json::array();
    for (const auto& r : rows) {
      nlohmann::ordered_json row{{"name", r.name}, {"formula", r.formula},
                                 {"per_layer", std::llround(r.layer_bytes)}};
      if (layers > 0) row["first_stage"] = std::llround(r.layer_bytes * static_cast<double>(layer_mbs));
      j["rows"].push_back(row);
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format(
      "Activation memory, Korthikanti et al. 2022 Table 2 (16-bit): s={} b={} h={} a={} t={}\n", s,
      b, h, a, t);
  if (layers > 0) {
    std::cout << fmt::format("first stage under 1F1B: {} layer(s) x {} micro-batch(es) in flight\n",
                             stage_layers, pp);
  }
  std::cout << "\n";
  std::cout << fmt::format("  {:<50} {:<28} {:>12}", "", "formula", "per layer");
  if (layers > 0) std::cout << fmt::format(" {:>12}", "first stage");
  std::cout << "\n";
  for (const auto& r : rows) {
    std::cout << fmt::format("  {:<50} {:<28} {:>12}", r.name, r.formula, format_bytes(r.layer_bytes));
    if (layers > 0) std::cout << fmt::format(" {:>12}", format_bytes(r.layer_bytes * static_cast<double>(layer_mbs)));
    std::cout << "\n";
  }
  return 0;
}

int run_plan(const PlanOptions& o) {
  if (o.params.empty() && o.hidden > 0) {
    if (!o.formula.empty() && o.formula != "paper") {
      throw invalid_argument("--hidden without --config gives the paper's activation view; "
                             "--formula {} does not apply", o.formula);
    }
    if (o.heads <= 0 || o.seq_len <= 0) {
      throw invalid_argument("the paper activation view needs --hidden, --heads and --seq-len");
    }
    if (o.pp < 1) throw invalid_argument("--pp must be at least 1, got {}", o.pp);
    return print_paper_activations(o.seq_len, o.micro_batch, o.hidden, o.heads, o.tp, o.layers,
                                   o.pp, o.json);
  }
  if (o.params.empty()) {
    throw Error(ErrorKind::kInvalidArgument, "dstrain plan needs --params or --config",
                "generic mode: --params 7.5e9 --world-size 64 --zero-stage 2; model mode: "
                "--config job.json --world-size N");
  }
  double params = parse_count(o.params, "--params");
  if (o.zero_stage < 0) throw invalid_argument("--params needs --zero-stage 0, 1, 2 or 3");
  std::string formula = o.formula.empty() ? "paper" : o.formula;
  if (formula == "paper") {
    if (o.world_size <= 0) throw invalid_argument("--formula paper needs --world-size N (data-parallel ranks)");
    return run_generic_paper(o, params);
  }
  if (formula == "deepspeed") return run_generic_deepspeed(o, params);
  throw invalid_argument("--formula expects 'paper' or 'deepspeed', got '{}'", formula);
}

void setup_plan(CLI::App& sub, PlanOptions& o) {
  sub.add_option("--params", o.params, "generic mode: total parameters, e.g. 7.5e9");
  sub.add_option("--world-size,-n", o.world_size, "ranks (GPUs) in the job");
  sub.add_option("--zero-stage", o.zero_stage, "generic mode: ZeRO stage 0-3");
  sub.add_option("--formula", o.formula,
                 "paper: ZeRO paper (model states) / Korthikanti et al. 2022 (activations); "
                 "deepspeed: DeepSpeed's estimate_zero{2,3}_model_states_mem_needs");
  sub.add_option("--largest-layer-params", o.largest_layer_params,
                 "deepspeed formula, ZeRO-3: the largest layer's parameters, e.g. 32e6");
  sub.add_option("--gpus-per-node", o.gpus_per_node, "GPUs per node (deepspeed formula, recommend)");
  sub.add_option("--num-nodes", o.num_nodes, "nodes (deepspeed formula)");
  sub.add_option("--offload-optimizer", o.offload_optimizer, "none or cpu");
  sub.add_option("--offload-param", o.offload_param, "none or cpu (ZeRO-3)");
  sub.add_option("--zero-init", o.zero_init, "deepspeed formula, ZeRO-3: 1 if built under zero.Init (default 1)");
  sub.add_option("--buffer-factor", o.buffer_factor,
                 "deepspeed formula: additional_buffer_factor for CPU memory (default 1.5)");
  sub.add_flag("--json", o.json, "print JSON with integer bytes");
  sub.add_option("--hidden", o.hidden, "paper activation view: hidden size h");
  sub.add_option("--heads", o.heads, "paper activation view: attention heads a");
  sub.add_option("--seq-len", o.seq_len, "paper activation view: sequence length s");
  sub.add_option("--micro-batch", o.micro_batch, "paper activation view: micro-batch size b (default 1)");
  sub.add_option("--tp", o.tp, "paper activation view: tensor-parallel size t (default 1)");
  sub.add_option("--layers", o.layers, "paper activation view: layers L (for the per-stage total)");
  sub.add_option("--pp", o.pp, "paper activation view: pipeline stages (default 1)");
}

}  // namespace

void add_plan_command(CLI::App& app, std::vector<Command>& out) {
  auto opts = std::make_shared<PlanOptions>();
  auto* sub = app.add_subcommand("plan", "memory per rank before anything runs: model states, "
                                         "activations, buffers; fit verdict; layout search");
  setup_plan(*sub, *opts);
  out.push_back({sub, [opts] { return run_plan(*opts); }});
}

}  // namespace ds::cli
