// `dstrain plan --calibrate`: measures what the step-time model (lib/plan/step_time.h) needs,
// with the runtime's own kernels and backends, in ranks started by `dstrain launch` (so the
// collectives go through the store, the backend and the placement a job would get):
//   compute      the pieces of one layer, the embedding and the head (runtime/model/gpt2.h) at
//                micro-batch 1, 2, 4, ... 16 (capped by the config's batch), for each tp shard
//                size the node allows, while 1, 2, 4, ... of the node's ranks compute at once
//                (the others wait): how much slower a rank gets when ranks share cores;
//   collectives  all_reduce, reduce_scatter and all_gather at 64 KiB, 256 KiB, 1, 4 and 8 MiB for every
//                group size dividing the world, all groups of a size at once (as a layout runs
//                them), and send/recv between neighbours; each fitted to latency + bus bytes /
//                bandwidth (calibration.h). Across nodes too when the hostfile has several;
//   optimizer    the AdamW kernel's parameters/s with as many ranks at once as share the cores.
// Each figure is the fastest of a few repetitions (the least disturbed by other load on a
// shared machine), the slowest rank's. Rank 0 writes the file.
//
// `--recommend --measure`: the top layouts run as real jobs (dstrain launch ... dstrain train)
// for a few steps; the fastest step after the first is what is printed beside the model.
// CPU only for now: a CUDA config is refused with a hint (no NCCL calibration yet).
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
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "comm/comm.h"
#include "common/error.h"
#include "config/hostfile.h"
#include "core/allocator.h"
#include "kernels/cpu/kernels.h"
#include "model/gpt2.h"
#include "plan/calibration.h"
#include "plan/plan_inputs.h"
#include "store/tcp_store_client.h"

namespace ds::cli {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::ordered_json;
namespace comm = rt::comm;

std::string self_exe() {
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

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// The least disturbed of a few repetitions: on a shared machine the minimum is the figure
// other load inflates least, for the calibration and the measured steps alike.
double fastest(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ---- the worker ------------------------------------------------------------------------------

struct Worker {
  int rank = 0, world = 1, local_rank = 0, local_world = 1, nodes = 1;
  comm::CommPtr comm;
  model_spec::ModelShape shape;
  layout::Precision precision = layout::Precision::kFp32;
  int max_micro_batch = 16;
  int cores = 1;
  int threads = 1;

  // The slowest rank's value of x (ranks that did not measure pass 0).
  double slowest(double x) {
    int64_t ns = static_cast<int64_t>(x * 1e9);
    comm->all_reduce(&ns, 1, comm::DataType::kInt64, comm::ReduceOp::kMax);
    return static_cast<double>(ns) / 1e9;
  }
};

rt::DType dtype_of(layout::Precision p) {
  return p == layout::Precision::kBf16 ? rt::DType::kBF16
         : p == layout::Precision::kFp16 ? rt::DType::kF16 : rt::DType::kF32;
}

// Seconds of each piece over a few repetitions of one micro-batch of b sequences: the fastest
// repetition (what other load inflates least), or with `typical` the median: when more of the
// node's ranks compute at once than it has cores for, each rank's fastest repetition is one in
// which it happened to have a core to itself (4 ranks on 2 cores: the fastest was ~1x a rank
// alone, the median ~2x), and the point of those samples is how much the ranks slow each other.
// While every rank has its cores the fastest stays right: the median there only adds the noise
// the alone samples leave out (2 ranks on 2 cores: median 1.10x alone, fastest 1.0x, and the
// measured steps ran at the alone speed).
plan::ComputeSample time_pieces(const Worker& w, int tp, int b, bool typical) {
  rt::Allocator alloc;
  rt::Gpt2Options opt;
  opt.B = b;
  opt.T = w.shape.seq_len;
  opt.dtype = opt.grad_dtype = dtype_of(w.precision);
  model_spec::ModelPart part{0, 1, true, true, tp, 0};
  rt::Gpt2 model(w.shape, part, opt, alloc);
  model.init_weights(1);
  rt::Gpt2Activations acts = model.make_activations();
  std::vector<int32_t> tokens(static_cast<size_t>(b) * w.shape.seq_len);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7919) % w.shape.vocab_size);
  std::vector<double> t[5];
  const auto start = Clock::now();
  for (int rep = 0; rep < 8; ++rep) {
    double s[6];
    auto tick = [&](int k) { s[k] = std::chrono::duration<double>(Clock::now() - start).count(); };
    tick(0);
    model.embed_forward(acts, tokens.data());
    tick(1);
    model.blocks_forward(acts, 0, 1);
    tick(2);
    model.head_forward_backward(acts, tokens.data(), 1.0f);
    tick(3);
    model.blocks_backward(acts, 0, 1);
    tick(4);
    model.embed_backward(acts, tokens.data());
    tick(5);
    if (rep == 0) continue;  // warm-up
    for (int k = 0; k < 5; ++k) t[k].push_back(s[k + 1] - s[k]);
    if (rep >= 3 && s[5] > 1.5) break;
  }
  plan::ComputeSample c;
  c.tp = tp;
  c.micro_batch = b;
  c.precision = w.precision;
  const auto pick = [typical](std::vector<double>& v) { return typical ? median(v) : fastest(v); };
  c.embed_fwd = pick(t[0]);
  c.layer_fwd = pick(t[1]);
  c.head = pick(t[2]);
  c.layer_bwd = pick(t[3]);
  c.embed_bwd = pick(t[4]);
  return c;
}

std::vector<int> doubling(int upto) {
  std::vector<int> v;
  for (int k = 1; k < upto; k *= 2) v.push_back(k);
  v.push_back(upto);
  return v;
}

void measure_compute(Worker& w, plan::Calibration& cal) {
  std::vector<int> tps;
  for (int tp = 1; tp <= w.local_world; ++tp) {
    const auto& s = w.shape;
    if (s.n_head % tp == 0 && (4 * s.n_embd) % tp == 0 && s.padded_vocab_size % tp == 0) tps.push_back(tp);
  }
  for (int conc : doubling(w.local_world)) {
    for (int tp : tps) {
      for (int b : doubling(w.max_micro_batch)) {
        w.comm->barrier();
        plan::ComputeSample c;
        if (w.local_rank < conc) c = time_pieces(w, tp, b, /*typical=*/conc * w.threads > w.cores);
        c.tp = tp, c.micro_batch = b, c.precision = w.precision, c.concurrency = conc;
        c.layer_fwd = w.slowest(c.layer_fwd);
        c.layer_bwd = w.slowest(c.layer_bwd);
        c.embed_fwd = w.slowest(c.embed_fwd);
        c.embed_bwd = w.slowest(c.embed_bwd);
        c.head = w.slowest(c.head);
        cal.compute.push_back(c);
      }
    }
  }
}

// Fastest seconds of one call of `op` on `bytes` over `g`, the slowest rank's.
double time_collective(Worker& w, comm::Comm& g, plan::CollectiveOp op, size_t bytes) {
  const size_t n = bytes / 4;
  std::vector<float> in(n, 1.0f), out(n, 0.0f);
  const size_t part = n / static_cast<size_t>(g.size());
  std::vector<double> t;
  for (int rep = 0; rep < 8; ++rep) {
    w.comm->barrier();
    const auto t0 = Clock::now();
    switch (op) {
      case plan::CollectiveOp::kAllReduce: g.all_reduce(in.data(), n, comm::DataType::kFloat32, comm::ReduceOp::kSum); break;
      case plan::CollectiveOp::kReduceScatter:
        g.reduce_scatter(in.data(), out.data(), part, comm::DataType::kFloat32, comm::ReduceOp::kSum);
        break;
      case plan::CollectiveOp::kAllGather: g.all_gather(in.data(), out.data(), part, comm::DataType::kFloat32); break;
      case plan::CollectiveOp::kSendRecv:
        if (g.rank() == 0) g.send(in.data(), n, comm::DataType::kFloat32, 1, 7);
        else g.recv(out.data(), n, comm::DataType::kFloat32, 0, 7);
        break;
    }
    if (rep > 0) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return w.slowest(fastest(t));
}

void measure_group_shape(Worker& w, plan::Calibration& cal, int g, bool strided) {
  const int groups = w.world / g;
  std::vector<int> members;
  for (int i = 0; i < g; ++i) {
    members.push_back(strided ? w.rank % groups + i * groups : (w.rank / g) * g + i);
  }
  bool across = false;
  for (int r : members) across = across || r / w.local_world != members[0] / w.local_world;
  auto grp = w.comm->new_group(members, fmt::format("calib-{}{}-{}", strided ? "s" : "c", g,
                                                    strided ? w.rank % groups : w.rank / g));
  const size_t sizes[] = {size_t{64} << 10, size_t{256} << 10, size_t{1} << 20, size_t{4} << 20, size_t{8} << 20};
  const plan::CollectiveOp ops[] = {plan::CollectiveOp::kAllReduce, plan::CollectiveOp::kReduceScatter,
                                    plan::CollectiveOp::kAllGather};
  for (auto op : ops) {
    std::vector<std::pair<double, double>> pts;
    for (size_t b : sizes) pts.emplace_back(static_cast<double>(b), time_collective(w, *grp, op, b));
    cal.collectives.push_back(plan::fit_collective(op, g, groups, across, pts));
  }
  if (g != 2) return;
  std::vector<std::pair<double, double>> pts;
  for (size_t b : sizes) pts.emplace_back(static_cast<double>(b), time_collective(w, *grp, plan::CollectiveOp::kSendRecv, b));
  cal.collectives.push_back(plan::fit_collective(plan::CollectiveOp::kSendRecv, 2, groups, across, pts));
}

void measure_collectives(Worker& w, plan::Calibration& cal) {
  for (int g = 2; g <= w.world; ++g) {
    if (w.world % g != 0) continue;
    measure_group_shape(w, cal, g, false);
    if (w.nodes > 1 && g < w.world) measure_group_shape(w, cal, g, true);
  }
}

void measure_optimizer(Worker& w, plan::Calibration& cal) {
  const int conc = std::min(w.local_world, std::max(1, w.cores / w.threads));
  const int64_t n = int64_t{4} << 20;
  double t = 0;
  w.comm->barrier();
  if (w.local_rank < conc) {
    std::vector<float> p(n, 0.1f), g(n, 0.01f), m(n, 0.0f), v(n, 0.0f);
    rt::kern::AdamWStep s;
    s.lr = 1e-4f, s.beta1 = 0.9f, s.beta2 = 0.95f, s.eps = 1e-8f, s.one_minus_beta1 = 0.1f;
    s.one_minus_beta2 = 0.05f, s.step_size = 1e-4f, s.decay_factor = 1.0f;
    std::vector<double> ts;
    for (int rep = 0; rep < 4; ++rep) {
      const auto t0 = Clock::now();
      rt::cpu::adamw_update(s, p.data(), g.data(), m.data(), v.data(), n, true);
      if (rep > 0) ts.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    t = fastest(ts);
  }
  cal.optimizer_rate = static_cast<double>(n) / w.slowest(t);
  cal.cpu_adam_rate = cal.optimizer_rate;
}

Worker make_worker(const std::string& config) {
  Worker w;
  w.rank = env_int("RANK", 0);
  w.world = env_int("WORLD_SIZE", 1);
  w.local_rank = env_int("LOCAL_RANK", 0);
  w.local_world = env_int("LOCAL_WORLD_SIZE", 1);
  w.nodes = std::max(1, w.world / std::max(1, w.local_world));
  w.cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  w.threads = plan::resolve_threads_per_rank(0);
  w.shape = model_spec::ModelShape{12, 12, 768, 50257, 50304, 1024};  // GPT-2 124M
  if (!config.empty()) {
    const plan::PlanInput in = plan::model_plan_input(config, w.world, w.threads);
    if (in.layout.device != plan::DeviceKind::kCpu) {
      throw Error(ErrorKind::kInvalidArgument, fmt::format("{}: training.device cuda: --calibrate measures CPU ranks only", config),
                  "calibrate with a copy of the config whose training.device is cpu, or use --recommend without --calibration");
    }
    w.shape = in.shape;
    w.precision = in.layout.precision;
    const int64_t batch = static_cast<int64_t>(in.layout.micro_batch) * in.layout.grad_accum * in.layout.dp;
    w.max_micro_batch = static_cast<int>(std::clamp<int64_t>(batch, 1, 16));
  }
  w.comm = comm::make_world_comm(store::connect_from_env(), w.rank, w.world);
  return w;
}

std::string hostname() {
  char h[256] = {0};
  gethostname(h, sizeof h - 1);
  return h;
}

// ---- --measure -------------------------------------------------------------------------------

std::string absolute_beside(const std::string& path, const fs::path& dir) {
  if (path.empty() || fs::path(path).is_absolute()) return path;
  return fs::weakly_canonical(dir / path).string();
}

// The user's config with `l`'s keys, `steps` steps, no evaluation, no checkpoints; data paths
// made absolute (they are relative to the config's directory).
Json layout_config(const std::string& path, const plan::Layout& l, int steps) {
  std::ifstream in(path);
  Json j = Json::parse(in);  // already validated by the plan
  const fs::path dir = fs::absolute(path).parent_path();
  j.erase("train_batch_size");
  j["train_micro_batch_size_per_gpu"] = l.micro_batch;
  j["gradient_accumulation_steps"] = l.grad_accum;
  j["zero_optimization"]["stage"] = l.zero_stage;
  if (l.offload_optimizer) j["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  j["tensor_parallel"]["size"] = l.tp;
  j["pipeline"]["stages"] = l.pp;
  j["activation_checkpointing"]["enabled"] = l.checkpointing;
  for (const char* k : {"train", "val"}) {
    if (j.contains("data") && j["data"].contains(k) && j["data"][k].is_string()) {
      j["data"][k] = absolute_beside(j["data"][k].get<std::string>(), dir);
    }
  }
  j["data"].erase("val");
  auto& t = j["training"];
  t["steps"] = steps;
  t["eval_interval"] = 0;
  t["checkpoint_interval"] = 0;
  t["log_interval"] = 1;
  t.erase("checkpoint_dir");
  j.erase("scheduler");
  return j;
}

}  // namespace

int run_calibration_worker(const std::string& config, const std::string& dir) {
  Worker w = make_worker(config);
  plan::Calibration cal;
  cal.measured = true;
  cal.cpu = true;
  cal.cores = w.cores;
  cal.threads_per_rank = w.threads;
  cal.ranks_per_node = w.local_world;
  cal.shape = w.shape;
  measure_compute(w, cal);
  measure_collectives(w, cal);
  measure_optimizer(w, cal);
  if (w.rank == 0) {
    plan::CalibrationMeta meta;
    meta.host = hostname();
    meta.device = "cpu";
    meta.backend = comm::backend_name(w.comm->backend());
    meta.nodes = w.nodes;
    std::ofstream(fs::path(dir) / "calibration.json") << plan::calibration_json(cal, meta).dump(2) << "\n";
  }
  w.comm->barrier();
  return 0;
}

int run_calibrate(const CalibrateRequest& r) {
  if (r.output.empty()) throw invalid_argument("--calibrate needs -o FILE (the calibration file to write)");
  if (!r.hostfile.empty() && r.nproc_per_node > 0) {
    throw invalid_argument("--calibrate takes --hostfile or --nproc-per-node, not both");
  }
  const int nproc = r.nproc_per_node > 0 ? r.nproc_per_node : 1;
  const int threads = plan::resolve_threads_per_rank(r.threads);
  const std::string exe = self_exe();
  const std::string dir = temp_dir("calibrate");
  std::vector<std::string> argv = launch_prefix(exe, r.hostfile, nproc, threads);
  argv.insert(argv.end(), {exe, "plan", "--calibrate-worker", dir});
  if (!r.config.empty()) argv.insert(argv.end(), {"--config", fs::absolute(r.config).string()});
  std::cerr << fmt::format("calibrating {} rank(s){} with {} thread(s) each ...\n",
                           r.hostfile.empty() ? std::to_string(nproc) : "the hostfile's",
                           r.config.empty() ? " (GPT-2 124M's layer)" : " for " + r.config, threads);
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
  std::ofstream(cfg) << layout_config(r.config, l, r.steps).dump(2) << "\n";
  const std::string exe = self_exe();
  std::vector<std::string> argv = launch_prefix(exe, r.hostfile, r.world_size, r.threads);
  argv.insert(argv.end(), {exe, "train", "--config", cfg, "--metrics", metrics});
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

}  // namespace ds::cli
