// `dstrain plan`: memory per rank before anything runs.
//   generic mode:  --params P --world-size N --zero-stage K [--formula paper|deepspeed]
//   paper activations: --formula paper --hidden H --heads A --seq-len S [--micro-batch B] [--tp T]
//   model mode:    --config C --world-size N [--hostfile H] [--gpu-mem SIZE]
//   layout search: --recommend --config C --world-size N --gpu-mem SIZE [--calibration F]
//                  [--tokens N] [--measure [--top K]]
//   calibration:   --calibrate [--config C] [--nproc-per-node N | --hostfile H] -o calib.json
//                  (the launching, and --measure's runs, are cmd_plan_calibrate.cpp; the
//                  measuring is the runtime's, train/calibration_rank.h)
// The numbers, the resolution of the inputs (lib/plan/plan_inputs.h: world, config, device
// memory, hardware) and the --json shapes (lib/plan/plan_json.h) live in lib/plan; this file
// binds the flags, picks the mode and prints: text tables here, JSON as lib/plan builds it. It
// is the only place of the plan that may ask the runtime which GPUs exist.
#include <algorithm>
#include <random>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "auto_batch.h"
#include "commands.h"
#include "common/error.h"
#include "common/strings.h"
#include "config/job_config.h"
#include "core/device.h"
#include "model_spec/family.h"
#include "plan/activation_paper.h"
#include "plan/memory_model.h"
#include "plan/model_state.h"
#include "plan/calibration.h"
#include "plan/plan_inputs.h"
#include "plan/plan_json.h"
#include "plan/recommend.h"
#include "plan_calibrate.h"

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
  // model mode
  std::string config;
  config::ParseOptions parse;  // --strict
  std::string hostfile;
  std::string gpu_mem;  // "80GiB"
  int threads = 0;  // 0: OMP_NUM_THREADS, else 1
  // layout search
  bool recommend = false;
  int top = 0;  // 0: 10 printed, 3 measured
  plan::HardwareFlags hardware;
  std::string calibration;  // --calibration calib.json
  std::string tokens;       // --tokens 3e9: time to train
  bool measure = false;
  int measure_steps = 4;
  int measure_passes = 1;
  bool measure_shuffle = false;
  // calibration
  bool calibrate = false;
  std::string output;
  int nproc_per_node = 0;
  std::string worker_dir;  // internal: --calibrate-worker DIR (one launched rank)
};

void print_json(const nlohmann::ordered_json& j) { std::cout << j.dump(2) << "\n"; }

std::string gb(double bytes) { return fmt::format("{:.2f} GB", bytes / 1e9); }

int run_generic_paper(const PlanOptions& o, double params) {
  auto m = plan::zero_paper_model_states(params, o.world_size, o.zero_stage);
  if (o.json) {
    print_json(plan::paper_model_states_json(params, o.world_size, o.zero_stage, m));
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

plan::DeepSpeedFlags deepspeed_flags(const PlanOptions& o, double params) {
  plan::DeepSpeedFlags f;
  f.zero_stage = o.zero_stage;
  f.params = params;
  f.largest_layer_params = o.largest_layer_params;
  f.world_size = o.world_size;
  f.gpus_per_node = o.gpus_per_node;
  f.num_nodes = o.num_nodes;
  f.offload_optimizer = o.offload_optimizer;
  f.offload_param = o.offload_param;
  f.zero_init = o.zero_init;
  f.buffer_factor = o.buffer_factor;
  return f;
}

int run_generic_deepspeed(const PlanOptions& o, double params) {
  const plan::DeepSpeedEstimateInput in = plan::resolve_deepspeed_input(deepspeed_flags(o, params));
  auto chosen = plan::deepspeed_model_states(in);
  auto all = plan::deepspeed_model_states_all(in);
  if (o.json) {
    print_json(plan::deepspeed_estimate_json(in, chosen, all));
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
  const plan::KorthikantiView v = plan::korthikanti_view(s, b, h, a, t, layers, pp);
  if (json) {
    print_json(plan::paper_activations_json(v));
    return 0;
  }
  std::cout << fmt::format(
      "Activation memory, Korthikanti et al. 2022 Table 2 (16-bit): s={} b={} h={} a={} t={}\n", s,
      b, h, a, t);
  if (layers > 0) {
    std::cout << fmt::format("first stage under 1F1B: {} layer(s) x {} micro-batch(es) in flight\n",
                             v.stage_layers, pp);
  }
  std::cout << "\n";
  std::cout << fmt::format("  {:<50} {:<28} {:>12}", "", "formula", "per layer");
  if (layers > 0) std::cout << fmt::format(" {:>12}", "first stage");
  std::cout << "\n";
  const auto in_flight = static_cast<double>(v.layer_micro_batches);
  for (const auto& r : v.rows) {
    std::cout << fmt::format("  {:<50} {:<28} {:>12}", r.name, r.formula, format_bytes(r.layer_bytes));
    if (layers > 0) std::cout << fmt::format(" {:>12}", format_bytes(r.layer_bytes * in_flight));
    std::cout << "\n";
  }
  return 0;
}


// ---- model mode ------------------------------------------------------------------------------

std::string gib(int64_t bytes) { return format_bytes(static_cast<double>(bytes)); }

std::string seconds(double s) {
  if (s >= 1) return fmt::format("{:.2f} s", s);
  if (s >= 1e-3) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.2f} us", s * 1e6);
}

std::string count(int64_t n) {
  if (n >= 1000000000) return fmt::format("{:.2f}B", static_cast<double>(n) / 1e9);
  if (n >= 1000000) return fmt::format("{:.2f}M", static_cast<double>(n) / 1e6);
  return std::to_string(n);
}

// Device memory: --gpu-mem, else the smallest GPU the runtime finds; 0 when neither.
plan::DeviceMemory device_memory(const PlanOptions& o) {
  return plan::resolve_device_memory(o.gpu_mem, [] {
    std::vector<int64_t> sizes;
    for (const auto& g : rt::query_accelerators(rt::ModuleUse::kIfGpuPresent).gpus) {
      sizes.push_back(static_cast<int64_t>(g.total_bytes));
    }
    return sizes;
  });
}

// The verdict line(s) of the text output.
void print_verdict_text(const plan::MemoryPlan& p, const plan::DeviceMemory& device) {
  const auto& peak = p.peak_rank();
  if (device.bytes <= 0) {
    std::cout << fmt::format("verdict: none (peak {} on rank {}); no --gpu-mem given and no GPU found\n",
                             gib(peak.total()), peak.rank);
    return;
  }
  auto v = plan::verdict(p, device.bytes);
  if (v.fits) {
    std::cout << fmt::format("verdict: fits: peak {} on rank {} of {} per GPU ({}), {} free\n",
                             gib(v.peak_bytes), v.peak_rank, gib(device.bytes), device.source,
                             gib(v.margin));
    return;
  }
  std::cout << fmt::format("verdict: does NOT fit: peak {} on rank {} exceeds {} per GPU ({}) by {}\n",
                           gib(v.peak_bytes), v.peak_rank, gib(device.bytes), device.source,
                           gib(-v.margin));
  if (v.fixes.empty()) {
    std::cout << "no single change fits; try dstrain plan --recommend\n";
  } else {
    std::cout << "each of these alone would fit:\n";
    for (const auto& f : v.fixes) std::cout << "  - " << f << "\n";
  }
}

void print_plan_text(const PlanOptions& o, const plan::MemoryPlan& p,
                     const plan::DeviceMemory& device) {
  const auto& l = p.layout;
  const auto& s = p.shape;
  std::cout << fmt::format("plan for {} on {} rank(s): {}, {}{}\n", o.config, l.world_size(),
                           plan::describe_layout(l), layout::precision_name(l.precision),
                           l.pp > 1 ? fmt::format(", {} schedule", layout::schedule_name(l.schedule)) : "");
  const int64_t active = model_spec::active_param_count(s);
  std::cout << fmt::format("model: {}, {} parameters{}\n\n", model_spec::describe_shape(s),
                           count(model_spec::param_count(s)),
                           active != model_spec::param_count(s) ? fmt::format(" ({} active per token)", count(active))
                                                                : std::string());
  auto groups = plan::distinct_ranks(p);
  const char* row = "  {:<12} {:>5} {:>7} {:>9} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}\n";
  std::cout << fmt::format(fmt::runtime(row), "ranks", "stage", "layers", "in-flight", "params", "grads",
                           "optimizer", "activations", "comm", "workspace", "total");
  for (const auto& g : groups) {
    const auto& r = *g.first;
    std::cout << fmt::format(fmt::runtime(row), g.ranks_text, r.stage,
                             fmt::format("{}-{}", r.layer_begin, r.layer_end - 1), r.in_flight,
                             gib(r.params), gib(r.grads), gib(r.optimizer), gib(r.activations),
                             gib(r.comm), gib(r.workspace), gib(r.total()));
  }
  plan::RankMemory sum;
  int64_t cpu = 0;
  for (const auto& r : p.ranks) {
    sum.params += r.params;
    sum.grads += r.grads;
    sum.optimizer += r.optimizer;
    sum.activations += r.activations;
    sum.comm += r.comm;
    sum.workspace += r.workspace;
    sum.checkpoint += r.checkpoint;
    cpu = std::max(cpu, r.cpu);
  }
  std::cout << fmt::format(fmt::runtime(row), "all ranks", "", "", "", gib(sum.params), gib(sum.grads),
                           gib(sum.optimizer), gib(sum.activations), gib(sum.comm), gib(sum.workspace),
                           gib(sum.total()));
  if (sum.checkpoint > 0) {
    std::cout << fmt::format("\nasync checkpoint staging (tag checkpoint, in total): {} all ranks, {} on rank {}\n",
                             gib(sum.checkpoint), gib(p.peak_rank().checkpoint), p.peak_rank().rank);
  }
  if (cpu > 0) std::cout << fmt::format("\nhost memory per rank (offloaded): up to {}\n", gib(cpu));

  std::cout << fmt::format("\nhow rank {} (the peak) is counted:\n", p.peak_rank().rank);
  for (const auto& n : p.notes) std::cout << fmt::format("  {:<12} {}\n", n.tag, n.text);

  std::cout << "\n";
  print_verdict_text(p, device);
}

void print_model_header(const plan::RecommendReport& report, const plan::Calibration& cal) {
  const plan::Hardware& hw = report.hardware;
  if (!report.calibrated) {
    std::cout << fmt::format("step time model: built-in constants, NOT calibrated ({:.0f} TFLOP/s per GPU, "
                             "{:.1f} GB/s intra-node, {:.1f} GB/s inter-node, {} GPUs per node; flags "
                             "override; dstrain plan --calibrate measures this machine)\n\n",
                             hw.gpu_flops / 1e12, hw.intra_node_bw / 1e9, hw.inter_node_bw / 1e9,
                             hw.gpus_per_node);
    return;
  }
  std::cout << fmt::format("step time model: calibrated by {} ({} compute samples, {} collective fits; "
                           "{} ranks per node{})\n\n",
                           cal.source, cal.compute.size(), cal.collectives.size(), cal.ranks_per_node,
                           cal.cpu ? fmt::format(", {} cores, {} thread(s) per rank", cal.cores,
                                                 cal.threads_per_rank)
                                   : "");
}

int print_recommend_text(const plan::RecommendReport& report, const plan::SearchResult& res,
                         const plan::Calibration& cal, const std::string& device_source) {
  std::cout << fmt::format(
      "layouts of {} rank(s) for {} at global batch {} that fit {} per GPU ({}): {} of {} "
      "({} over memory, {} impossible)\n",
      report.world_size, report.config_path, report.global_batch, gib(report.device_bytes),
      device_source, res.fits.size(), res.considered, res.rejected_memory, res.rejected_rule);
  print_model_header(report, cal);
  if (res.fits.empty()) {
    std::cout << "no layout fits; more GPUs, a smaller model or a shorter sequence are needed\n";
    return 1;
  }
  const size_t n = std::min(res.fits.size(), report.shown);
  const bool measured = !report.measured_ms.empty();
  size_t width = 6;
  for (size_t i = 0; i < n; ++i) width = std::max(width, plan::describe_layout(res.fits[i].layout).size());
  std::cout << fmt::format("  {:>3}  {:<{}} {:>11} {:>11}{}{}  {}\n", "#", "layout", width, "peak", "step (pred)",
                           measured ? fmt::format(" {:>11} {:>7}", "measured", "error") : "",
                           report.tokens > 0 ? fmt::format(" {:>12}", "to train") : "", "what bounds it");
  for (size_t i = 0; i < n; ++i) {
    const auto& c = res.fits[i];
    std::string meas;
    if (measured) {
      const double ms = i < report.measured_ms.size() ? report.measured_ms[i] : 0;
      meas = ms > 0 ? fmt::format(" {:>11} {:>+6.1f}%", seconds(ms / 1e3), 100 * (1e3 * c.time.total() - ms) / ms)
                    : fmt::format(" {:>11} {:>7}", "-", "");
    }
    std::cout << fmt::format("  {:>3}  {:<{}} {:>11} {:>11}{}{}  {}\n", i + 1, plan::describe_layout(c.layout),
                             width, gib(c.peak_bytes), seconds(c.time.total()), meas,
                             report.tokens > 0 ? fmt::format(" {:>12}", seconds(plan::time_to_train(report, c))) : "",
                             c.reason);
  }
  if (res.fits.size() > 1) {
    std::cout << fmt::format("\nrunner-up (#2) against the pick: {}\n", plan::compare_steps(res.fits[0], res.fits[1]));
  }
  return 0;
}

plan::Calibration recommend_calibration(const PlanOptions& o, plan::RecommendReport& report,
                                        const plan::PlanWorld& w) {
  report.hardware = plan::resolve_hardware(o.hardware, w.gpus_per_node);
  if (o.calibration.empty()) return plan::builtin_calibration(report.hardware);
  plan::Calibration cal = plan::read_calibration(o.calibration).cal;
  report.calibration_source = o.calibration;
  report.calibrated = true;
  // The cluster at hand: its GPUs per node when given, else one node of all the ranks on a CPU.
  if (w.gpus_per_node > 0) {
    cal.ranks_per_node = w.gpus_per_node;
  } else if (cal.cpu) {
    cal.ranks_per_node = w.world_size;
  }
  return cal;
}

int run_recommend(const PlanOptions& o, const plan::PlanInput& in, const plan::PlanWorld& w,
                  const plan::DeviceMemory& device) {
  if (device.bytes <= 0) {
    throw Error(ErrorKind::kInvalidArgument, "--recommend needs the device memory",
                "give --gpu-mem SIZE (e.g. 80GiB), or run where GPUs are visible");
  }
  if (o.top < 0) throw invalid_argument("--top must be at least 1, got {}", o.top);
  plan::RecommendReport report;
  const plan::Calibration cal = recommend_calibration(o, report, w);
  report.config_path = o.config;
  report.world_size = w.world_size;
  report.device_bytes = device.bytes;
  report.global_batch =
      static_cast<int64_t>(in.layout.micro_batch) * in.layout.grad_accum * in.layout.dp;
  report.seq_len = in.shape.seq_len;
  if (!o.tokens.empty()) report.tokens = static_cast<int64_t>(plan::parse_count_flag(o.tokens, "--tokens"));
  report.shown = static_cast<size_t>(o.top > 0 ? o.top : 10);
  auto res = plan::recommend(in.shape, in.layout, w.world_size, device.bytes, cal,
                             plan::comm_types(in.layout.precision, in.grad_precision,
                                               in.layout.device == plan::DeviceKind::kCuda));
  if (o.measure) {
    const size_t k = std::min(res.fits.size(), static_cast<size_t>(o.top > 0 ? o.top : 3));
    report.shown = std::max(report.shown, k);
    MeasureRequest req{o.config, o.hostfile, w.world_size, in.layout.num_threads, o.measure_steps, o.json, o.parse};
    // Each pass measures every layout once, in the model's order or (--measure-shuffle) in a
    // shuffled one (a fixed seed per pass), so that a load change on a shared machine does not
    // line up with the ranking; a layout's figure is its fastest over the passes.
    report.measured_ms.assign(k, 0.0);
    std::vector<size_t> order(k);
    for (size_t i = 0; i < k; ++i) order[i] = i;
    for (int pass = 0; pass < o.measure_passes; ++pass) {
      if (o.measure_shuffle) {
        std::mt19937 rng(static_cast<uint32_t>(1000 + pass));
        std::shuffle(order.begin(), order.end(), rng);
      }
      for (size_t i : order) {
        const double ms = measure_layout(req, res.fits[i].layout);
        double& best = report.measured_ms[i];
        if (ms > 0 && (best <= 0 || ms < best)) best = ms;
      }
    }
  }
  if (o.json) {
    print_json(plan::recommend_json(report, res));
    return res.fits.empty() ? 1 : 0;
  }
  return print_recommend_text(report, res, cal, device.source);
}

int run_model(const PlanOptions& o) {
  if (!o.params.empty()) throw invalid_argument("--config and --params are two modes; give one");
  const plan::PlanWorld w = plan::resolve_plan_world(o.world_size, o.hostfile, o.gpus_per_node);
  config::JobConfig cfg = config::load_job_config(o.config, w.world_size, o.parse);
  if (!o.calibration.empty() && !o.recommend && !cfg.auto_micro_batch.pending) {
    throw invalid_argument("--calibration is read by --recommend and by a micro-batch \"auto\"");
  }
  if (cfg.auto_micro_batch.pending) {
    // As `dstrain train` picks it: --gpu-mem (else the GPUs found, or host memory on a CPU run),
    // --calibration; the node's ranks are --gpus-per-node or the hostfile's, else all of them.
    const size_t before = cfg.warnings.size();
    resolve_auto_batch(cfg, {o.gpu_mem, o.calibration}, w.gpus_per_node > 0 ? w.gpus_per_node : w.world_size,
                       plan::resolve_threads_per_rank(o.threads));
    for (size_t i = before; i < cfg.warnings.size(); ++i) std::cerr << "dstrain: note: " << cfg.warnings[i] << "\n";
  }
  plan::PlanInput in = plan::plan_input_from_config(cfg);
  in.layout.num_threads = plan::resolve_threads_per_rank(o.threads);
  if (o.formula == "paper") {
    if (o.recommend) throw invalid_argument("--recommend uses dstrain's own model; drop --formula paper");
    return print_paper_activations(in.shape.seq_len, in.layout.micro_batch, in.shape.n_embd,
                                   in.shape.n_head, in.layout.tp, in.shape.n_layer, in.layout.pp, o.json);
  }
  if (!o.formula.empty()) {
    throw invalid_argument("--formula {} does not apply with --config (paper: Korthikanti's "
                           "activation view; deepspeed: use --params)", o.formula);
  }
  const plan::DeviceMemory device = device_memory(o);
  if (o.recommend) return run_recommend(o, in, w, device);

  auto p = plan::plan_memory(in.shape, in.layout);
  if (o.json) {
    print_json(plan::memory_plan_json(o.config, in, p, device.bytes));
  } else {
    print_plan_text(o, p, device);
  }
  if (device.bytes > 0 && p.peak_total() > device.bytes) return 1;
  return 0;
}

int run_plan(const PlanOptions& o) {
  if (!o.worker_dir.empty()) return run_calibration_worker(o.config, o.worker_dir, o.parse);
  if (o.calibrate) {
    if (o.recommend) throw invalid_argument("--calibrate and --recommend are two runs: calibrate first, "
                                            "then --recommend --calibration FILE");
    return run_calibrate({o.config, o.hostfile, o.nproc_per_node, o.output, o.threads, o.parse});
  }
  if (!o.calibration.empty() && !o.recommend && o.config.empty()) {
    throw invalid_argument("--calibration is read by --recommend and by a micro-batch \"auto\"");
  }
  if (o.measure && !o.recommend) throw invalid_argument("--measure runs --recommend's picks; add --recommend");
  if (!o.config.empty()) return run_model(o);
  if (o.recommend) throw invalid_argument("--recommend needs --config (the model and the batch)");
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
  double params = plan::parse_count_flag(o.params, "--params");
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
  sub.add_option("--config,-c", o.config, "model mode: job config (DeepSpeed-style JSON with a model section)");
  add_config_read_flags(&sub, o.parse);
  sub.add_option("--hostfile,-H", o.hostfile, "model mode: hostfile giving the ranks and GPUs per node");
  sub.add_option("--gpu-mem", o.gpu_mem, "device memory per GPU for the verdict, e.g. 80GiB (default: the GPUs found)");
  sub.add_option("--threads", o.threads, "model mode: CPU threads per rank (attention scratch is per thread; default OMP_NUM_THREADS or 1)");
  sub.add_flag("--recommend", o.recommend, "enumerate the layouts that fit, fastest first (needs --config, --gpu-mem)");
  sub.add_option("--top", o.top, "--recommend: how many layouts to print (default 10); with --measure "
                 "how many to run (default 3)");
  sub.add_option("--calibration", o.calibration, "--recommend: the machine as dstrain plan --calibrate measured it "
                 "(default: built-in constants)");
  sub.add_option("--tokens", o.tokens, "--recommend: tokens to train, for a time-to-train column (e.g. 3e9)");
  sub.add_flag("--measure", o.measure, "--recommend: run the top K layouts for a few steps each through "
               "dstrain launch and print measured beside predicted step time");
  sub.add_option("--measure-steps", o.measure_steps, "--measure: steps per layout (default 4; the first is not counted)");
  sub.add_option("--measure-passes", o.measure_passes,
                 "--measure: run every layout this many times, keeping its fastest (default 1)")
      ->check(CLI::Range(1, 100));
  sub.add_flag("--measure-shuffle", o.measure_shuffle,
               "--measure: measure the layouts in a shuffled order (another per pass), not the model's");
  sub.add_flag("--calibrate", o.calibrate, "measure this machine for the step-time model (with -o FILE)");
  sub.add_option("-o,--output", o.output, "--calibrate: the calibration file to write");
  sub.add_option("--nproc-per-node", o.nproc_per_node, "--calibrate: ranks to measure with on this node "
                 "(default: the hostfile's slots, else 1)");
  sub.add_option("--calibrate-worker", o.worker_dir, "internal: one rank of --calibrate")->group("");
  sub.add_option("--gpu-tflops", o.hardware.gpu_tflops, "--recommend: achieved TFLOP/s per GPU (default 125)");
  sub.add_option("--intra-node-gbps", o.hardware.intra_gbps, "--recommend: GB/s per GPU inside a node (default 150)");
  sub.add_option("--inter-node-gbps", o.hardware.inter_gbps, "--recommend: GB/s per GPU across nodes (default 12.5)");
  sub.add_option("--pcie-gbps", o.hardware.pcie_gbps, "--recommend: GB/s host<->device for offload (default 16)");
  sub.add_option("--cpu-adam-rate", o.hardware.base.cpu_adam_rate, "--recommend: parameters/s of the CPU optimizer (default 1e9)");
  sub.add_option("--layer-overhead", o.hardware.base.layer_overhead,
                 "--recommend: seconds per layer per micro-batch of launch overhead (default 50e-6)");
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
