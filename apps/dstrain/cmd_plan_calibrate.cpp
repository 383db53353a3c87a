// `dstrain plan --calibrate` and `--recommend --measure`: the CLI's half, which starts processes.
// --calibrate launches ranks through `dstrain launch` (so the collectives go through the store,
// the backend and the placement a job would get), each running the runtime's measuring
// (runtime/train/calibration_rank.h: compute for any family, collectives, the optimizer) behind
// the hidden --calibrate-worker DIR, then checks and keeps the file rank 0 wrote.
//
// `--recommend --measure`: the top layouts run as real jobs (dstrain launch ... dstrain train)
// for a few steps; the fastest step after the first is what is printed beside the model.
// A CUDA config calibrates one GPU (the ranks' measuring says what; NCCL is not calibrated yet).
#include "plan_calibrate.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "model_spec/named_shapes.h"
#include "plan/calibration.h"
#include "plan/plan_inputs.h"
#include "plan/recommend.h"
#include "train/calibration_rank.h"

namespace ds::cli {

namespace {

namespace fs = std::filesystem;

// What calibration measures without a config: the default named shape's layer, for the log.
std::string default_shape_what() {
  namespace ms = ds::model_spec;
  return std::string(ms::named_shape(ms::kDefaultCalibrationShape, "dstrain plan --calibrate").what) + "'s layer";
}
using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;

std::string this_executable() {
  std::error_code ec;
  auto p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw system_error("readlink /proc/self/exe: {}", ec.message());
  return p.string();
}

std::string temp_dir(const char* what) {
  std::string t = (fs::temp_directory_path() / fmt::format("dstrain-{}-XXXXXX", what)).string();
  if (!mkdtemp(t.data())) throw system_error("mkdtemp {}: {}", t, errno_string(errno));
  return t;
}

// Runs argv with stdout and stderr into `log`; returns the exit status (128 + signal if killed).
int run_process(const std::vector<std::string>& argv, const std::string& log) {
  const pid_t pid = fork();
  if (pid < 0) throw system_error("fork: {}", errno_string(errno));
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string tail_of(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string l; std::getline(in, l);) all.push_back(l);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += "  " + all[i] + "\n";
  return out;
}

// `dstrain launch` for this machine or the hostfile, one OpenMP team of `threads` per rank.
std::vector<std::string> launch_prefix(const std::string& exe, const std::string& hostfile, int nproc,
                                       int threads) {
  std::vector<std::string> a = {exe, "launch"};
  if (!hostfile.empty()) {
    a.insert(a.end(), {"--hostfile", hostfile});
  } else {
    a.insert(a.end(), {"--nproc-per-node", std::to_string(nproc)});
  }
  a.insert(a.end(), {"--env", fmt::format("OMP_NUM_THREADS={}", threads), "--"});
  return a;
}

// The least disturbed of a few runs: on a shared machine the minimum is the figure other load
// inflates least.
double fastest(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }

// ---- --measure -------------------------------------------------------------------------------

std::string absolute_beside(const std::string& path, const fs::path& dir) {
  if (path.empty() || fs::path(path).is_absolute()) return path;
  return fs::weakly_canonical(dir / path).string();
}

// The user's config with the user's --set overrides, then `l`'s keys, `steps` steps, no
// evaluation, no checkpoints; data paths made absolute (they are relative to the config's
// directory, --set's as well).
Json layout_config(const std::string& path, const std::vector<std::string>& sets, const plan::Layout& l, int steps) {
  std::ifstream in(path);
  Json j = Json::parse(in);  // already validated by the plan, with these sets
  config::apply_sets(j, sets);
  const fs::path dir = fs::absolute(path).parent_path();
  j.erase("train_batch_size");
  j["train_micro_batch_size_per_gpu"] = l.micro_batch;
  j["gradient_accumulation_steps"] = l.grad_accum;
  j["zero_optimization"]["stage"] = l.zero_stage;
  if (l.offload_optimizer) j["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  j["tensor_parallel"]["size"] = l.tp;
  j["pipeline"]["stages"] = l.pp;
  j["activation_checkpointing"]["enabled"] = l.checkpointing;
  // A path, a list of paths, or a blend's list of {"path", "weight"}.
  auto absolute = [&](Json& p) {
    if (p.is_string()) p = absolute_beside(p.get<std::string>(), dir);
  };
  for (const char* k : {"train", "val"}) {
    if (!j.contains("data") || !j["data"].contains(k)) continue;
    Json& v = j["data"][k];
    absolute(v);
    if (!v.is_array()) continue;
    for (auto& e : v) {
      absolute(e);
      if (e.is_object() && e.contains("path")) absolute(e["path"]);
    }
  }
  if (j.contains("data") && j["data"].contains("tokenizer") && j["data"]["tokenizer"].is_object() &&
      j["data"]["tokenizer"].contains("path")) {
    absolute(j["data"]["tokenizer"]["path"]);
  }
  j["data"].erase("val");
  auto& t = j["training"];
  t["steps"] = steps;
  t["eval_interval"] = 0;
  t.erase("eval_tasks");  // no evaluation while a layout is timed
  t["checkpoint_interval"] = 0;
  t["log_interval"] = 1;
  t.erase("checkpoint_dir");
  j.erase("scheduler");
  return j;
}

}  // namespace

int run_calibrate(const CalibrateRequest& r) {
  if (r.output.empty()) throw invalid_argument("--calibrate needs -o FILE (the calibration file to write)");
  if (!r.hostfile.empty() && r.nproc_per_node > 0) {
    throw invalid_argument("--calibrate takes --hostfile or --nproc-per-node, not both");
  }
  const int nproc = r.nproc_per_node > 0 ? r.nproc_per_node : 1;
  const int threads = plan::resolve_threads_per_rank(r.threads);
  const std::string exe = this_executable();
  const std::string dir = temp_dir("calibrate");
  std::vector<std::string> argv = launch_prefix(exe, r.hostfile, nproc, threads);
  argv.insert(argv.end(), {exe, "plan", "--calibrate-worker", dir});
  if (!r.config.empty()) argv.insert(argv.end(), {"--config", fs::absolute(r.config).string()});
  for (const auto& s : r.parse.sets) argv.insert(argv.end(), {"--set", s});
  if (r.parse.strict) argv.push_back("--strict");
  std::cerr << fmt::format("calibrating {} rank(s){} with {} thread(s) each ...\n",
                           r.hostfile.empty() ? std::to_string(nproc) : "the hostfile's",
                           r.config.empty() ? " for " + default_shape_what() : " for " + r.config, threads);
  const auto t0 = Clock::now();
  const std::string log = dir + "/launch.log";
  const int rc = run_process(argv, log);
  if (rc != 0) {
    throw Error(ErrorKind::kSystem, fmt::format("dstrain plan --calibrate: the measuring job exited {}; its "
                                                "last lines:\n{}", rc, tail_of(log, 20)),
                "the whole log is " + log);
  }
  const std::string made = dir + "/calibration.json";
  const plan::CalibrationFile f = plan::read_calibration(made);  // what --recommend will accept
  fs::copy_file(made, r.output, fs::copy_options::overwrite_existing);
  fs::remove_all(dir);
  std::cout << fmt::format("wrote {} in {:.0f} s: {} compute samples, {} collective fits on {} ({} backend, "
                           "{} rank(s) per node, {} cores); AdamW {:.0f} M params/s\n",
                           r.output, std::chrono::duration<double>(Clock::now() - t0).count(),
                           f.cal.compute.size(), f.cal.collectives.size(), f.meta.host, f.meta.backend,
                           f.cal.ranks_per_node, f.cal.cores, f.cal.optimizer_rate / 1e6);
  std::cout << fmt::format("use it: dstrain plan --recommend --calibration {} --config ...\n", r.output);
  return 0;
}

double measure_layout(const MeasureRequest& r, const plan::Layout& l) {
  const std::string dir = temp_dir("measure");
  const std::string cfg = dir + "/layout.json", metrics = dir + "/metrics.jsonl", log = dir + "/log";
  std::ofstream(cfg) << layout_config(r.config, r.parse.sets, l, r.steps).dump(2) << "\n";
  const std::string exe = this_executable();
  std::vector<std::string> argv = launch_prefix(exe, r.hostfile, r.world_size, r.threads);
  argv.insert(argv.end(), {exe, "train", "--config", cfg, "--metrics", metrics});
  if (r.parse.strict) argv.push_back("--strict");
  std::cerr << fmt::format("measuring {} ({} steps) ...\n", plan::describe_layout(l), r.steps);
  if (const int rc = run_process(argv, log); rc != 0) {
    std::cerr << fmt::format("  failed (exit {}); its last lines:\n{}", rc, tail_of(log, 10));
    return -1;
  }
  std::vector<double> ms;
  std::ifstream in(metrics);
  bool first = true;
  for (std::string line; std::getline(in, line);) {
    const Json j = Json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("ms_per_step")) continue;
    if (!first) ms.push_back(j["ms_per_step"].get<double>());
    first = false;
  }
  fs::remove_all(dir);
  return ms.empty() ? -1 : fastest(ms);
}

int run_calibration_worker(const std::string& config, const std::string& dir, const config::ParseOptions& parse) {
  rt::train::run_calibration_rank(config, (fs::path(dir) / "calibration.json").string(), parse);
  return 0;
}

}  // namespace ds::cli
