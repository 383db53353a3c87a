// `dstrain launch`: resolve the hostfile (or the Slurm allocation) and filters into a world and
// start one worker per slot (lib/launch/launcher.h: in-process agent for one local node, `dstrain
// agent` per node over SSH, srun or mpirun otherwise, or this node's share of a --launcher none
// job). With --dry-run it prints the plan of ranks (text or --json) and starts nothing.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "commands.h"
#include "common/error.h"
#include "common/strings.h"
#include "config/hostfile.h"
#include "config/job_config.h"
#include "core/device.h"
#include "common/env.h"
#include "common/preemption.h"
#include "launch/cluster.h"
#include "launch/env_file.h"
#include "launch/rank_env.h"
#include "launch/slurm.h"
#include "launch/launcher.h"
#include "launch/world.h"

namespace ds::cli {

namespace {

struct LaunchOptions {
  std::string hostfile;
  std::string include, exclude;
  int num_nodes = -1, num_gpus = -1;
  int nproc_per_node = 0;
  std::string config;
  std::string master_addr;
  int master_port = 29500;
  std::vector<std::string> env;  // --env KEY=VAL
  bool dry_run = false;
  bool json = false;
  std::vector<std::string> command;  // after --
  // Running the job.
  double kill_timeout_s = 10.0;
  double agent_timeout_s = 10.0;
  double failure_grace_s = 5.0;
  std::string log_dir;
  std::string ranks_filter;
  bool bind_cores = false;
  int max_restarts = 0;
  std::string nnodes;  // --nnodes MIN:MAX (elastic) or N
  int store_port = 0;
  std::string launcher = "auto";
  int node_rank = -1;              // --launcher none
  std::string preempt_signal;      // besides SIGTERM
  std::string launcher_args;       // extra words for srun / mpirun
  double join_timeout_s = 120.0;
  std::string launcher_addr;
  // SSH.
  int ssh_port = 22;
  std::string ssh_user;
  std::vector<std::string> ssh_keys;
  std::string known_hosts;
  bool accept_new_host_keys = false;
  double ssh_timeout_s = 10.0;
  std::string remote_dstrain;
};

void setup_launch(CLI::App& sub, LaunchOptions& o) {
  sub.add_option("--hostfile,-H", o.hostfile,
                 "DeepSpeed-style hostfile ('host slots=N' per line). Without one: the local "
                 "node, with its GPU count or --nproc-per-node");
  sub.add_option("--include,-i", o.include,
                 "only these hosts/slots, DeepSpeed syntax: 'worker-0@worker-1:0,2'");
  sub.add_option("--exclude,-e", o.exclude, "all but these hosts/slots, same syntax as --include");
  sub.add_option("--num-nodes", o.num_nodes, "use the first N hosts of the hostfile");
  sub.add_option("--num-gpus", o.num_gpus, "use the first N slots of each host");
  sub.add_option("--nnodes", o.nnodes,
                 "MIN:MAX (torchrun's spelling): elastic; when nodes are lost the job restarts on the ones left, from "
                 "its latest checkpoint, while at least MIN remain (ssh, slurm, openmpi, mpich). N means N:N");
  sub.add_option("--nproc-per-node", o.nproc_per_node,
                 "workers on the local node when there is no hostfile (CPU jobs)");
  sub.add_option("--config,-c", o.config, "job config (DeepSpeed-style JSON)");
  sub.add_option("--master-addr", o.master_addr, "MASTER_ADDR for the workers (default: first node)");
  sub.add_option("--master-port", o.master_port, "MASTER_PORT for the workers (default 29500)");
  sub.add_option("--env", o.env, "extra KEY=VALUE for every worker (repeatable)")
      ->allow_extra_args(false);
  sub.add_flag("--dry-run", o.dry_run, "print every rank's host, devices, command and environment; start nothing");
  sub.add_flag("--json", o.json, "with --dry-run: print a JSON array of ranks");
  sub.add_option("--kill-timeout", o.kill_timeout_s,
                 "seconds between SIGTERM and SIGKILL when tearing a job down (default 10)")
      ->check(CLI::Range(0.0, 86400.0));
  sub.add_option("--agent-timeout", o.agent_timeout_s,
                 "multi-node jobs: seconds without a word (agents send a heartbeat every second) "
                 "after which a node's agent counts as stopped, hung or gone, and the job fails "
                 "naming it (default 10)")
      ->check(CLI::Range(2.0, 86400.0));
  sub.add_option("--failure-grace", o.failure_grace_s,
                 "when a rank fails, seconds the other ranks may take to exit on their own (and "
                 "report, e.g., which peer died) before they are sent SIGTERM (default 5; Ctrl-C "
                 "does not wait)")
      ->check(CLI::Range(0.0, 86400.0));
  sub.add_option("--log-dir", o.log_dir, "also write each rank's output to DIR/rank_<N>.log");
  sub.add_option("--ranks-filter", o.ranks_filter,
                 "show only these ranks' output on the console, e.g. 0 or 0,2-3 (logs keep all)");
  sub.add_flag("--bind-cores-to-rank", o.bind_cores,
               "pin each local rank to its own contiguous block of the node's CPUs");
  sub.add_option("--max-restarts", o.max_restarts,
                 "restart every rank up to N times after a failure (default 0)")
      ->check(CLI::Range(0, 1000));
  sub.add_option("--store-port", o.store_port,
                 "port of the job's rendezvous store on node 0 (default 0: a free port; with "
                 "--launcher none: DSTRAIN_STORE_PORT, else 29401)")
      ->check(CLI::Range(0, 65535));
  sub.add_option("--launcher", o.launcher,
                 "auto (slurm inside a multi-node Slurm allocation, local for one local node, else "
                 "ssh), local, ssh, slurm, openmpi, mpich or none (every node runs its own launch "
                 "with --node-rank)")
      ->check(CLI::IsMember({"auto", "local", "ssh", "slurm", "openmpi", "mpich", "none"}));
  sub.add_option("--node-rank", o.node_rank, "with --launcher none: this node's index in the hostfile");
  sub.add_option("--preempt-signal", o.preempt_signal,
                 "besides SIGTERM, a signal (e.g. USR1, from `sbatch --signal`) that preempts the job: "
                 "forwarded to every rank, which finishes its step, writes a checkpoint and exits 75");
  sub.add_option("--launcher-args", o.launcher_args,
                 "extra arguments for srun or mpirun, as one string (split like a shell does)");
  sub.add_option("--join-timeout", o.join_timeout_s,
                 "slurm/openmpi/mpich/none: seconds every node's agent has to join (default 120)")
      ->check(CLI::Range(0.1, 86400.0));
  sub.add_option("--launcher-addr", o.launcher_addr,
                 "slurm/openmpi/mpich: this machine's address as the nodes reach it (default: its "
                 "hostname)");
  sub.add_option("--ssh-port", o.ssh_port, "SSH port of every node (default 22)")
      ->check(CLI::Range(1, 65535));
  sub.add_option("--ssh-user", o.ssh_user, "SSH user on every node (default: yours)");
  sub.add_option("--ssh-key", o.ssh_keys,
                 "private key file (repeatable); default: ssh-agent, then ~/.ssh/id_ed25519, "
                 "id_ecdsa, id_rsa")
      ->allow_extra_args(false);
  sub.add_option("--ssh-known-hosts", o.known_hosts, "known_hosts file (default ~/.ssh/known_hosts)");
  sub.add_flag("--ssh-accept-new-host-keys", o.accept_new_host_keys,
               "trust and record host keys not yet in known_hosts (a changed key is still an error)");
  sub.add_option("--ssh-timeout", o.ssh_timeout_s,
                 "seconds to connect and authenticate to a node (default 10)")
      ->check(CLI::Range(0.1, 3600.0));
  sub.add_option("--remote-dstrain", o.remote_dstrain,
                 "path of dstrain on the nodes (default: the same path as this one)");
  sub.add_option("command", o.command,
                 "program and arguments to run on every rank (after --); default: dstrain train --config C");
}

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("dstrain") : p.string();
}

launch::Backend parse_backend(const std::string& name) {
  for (auto b : {launch::Backend::kAuto, launch::Backend::kLocal, launch::Backend::kSsh, launch::Backend::kSlurm,
                 launch::Backend::kOpenMpi, launch::Backend::kMpich, launch::Backend::kNone}) {
    if (name == launch::backend_name(b)) return b;
  }
  throw invalid_argument("--launcher {}: unknown launcher", name);
}

// --launcher auto inside a Slurm allocation of several nodes, without a hostfile: slurm.
launch::Backend choose_backend(const LaunchOptions& o) {
  launch::Backend b = parse_backend(o.launcher);
  auto env = launch::process_env();
  if (b == launch::Backend::kAuto && o.hostfile.empty() && launch::in_slurm_allocation(env) &&
      launch::read_slurm_allocation(env).nodes.size() > 1) {
    return launch::Backend::kSlurm;
  }
  return b;
}

std::vector<config::NodeSlots> resolve_nodes(const LaunchOptions& o, launch::Backend backend) {
  config::ResourceFilter filter{o.include, o.exclude, o.num_nodes, o.num_gpus};
  if (backend == launch::Backend::kSlurm) {
    if (!o.hostfile.empty()) {
      throw invalid_argument("--launcher slurm takes its nodes from the Slurm allocation; --hostfile {} "
                             "is not used with it (filter the allocation with --include/--exclude/--num-nodes)",
                             o.hostfile);
    }
    auto alloc = launch::read_slurm_allocation(launch::process_env());
    return config::apply_filters(launch::slurm_hostfile(alloc, o.nproc_per_node, rt::gpu_count()), filter);
  }
  if (!o.hostfile.empty()) {
    if (o.nproc_per_node > 0) {
      throw invalid_argument("--nproc-per-node applies only without --hostfile; the hostfile "
                             "{} gives each host's slots",
                             o.hostfile);
    }
    return config::apply_filters(config::load_hostfile(o.hostfile), filter);
  }
  int slots = o.nproc_per_node;
  if (slots < 0) throw invalid_argument("--nproc-per-node must be at least 1, got {}", slots);
  if (slots == 0) slots = rt::gpu_count();
  if (slots == 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "no hostfile given and no GPU visible on this node, so there is nothing to run on",
                "pass --nproc-per-node N for a CPU job on this node, or --hostfile FILE");
  }
  return config::apply_filters(config::local_hostfile(slots), filter);
}

std::vector<std::string> worker_command(const LaunchOptions& o) {
  if (!o.command.empty()) return o.command;
  if (o.config.empty()) {
    throw Error(ErrorKind::kInvalidArgument, "nothing to run: no --config and no command",
                "pass --config CONFIG to run dstrain's trainer, or a program after '--'");
  }
  std::string cfg = std::filesystem::absolute(o.config).string();
  return {self_exe(), "train", "--config", cfg};
}

// Without a command every rank runs `dstrain train --config C`: validate C once here, against the
// job's world size, so a bad config fails before any rank starts (with every fault listed).
void check_trainer_config(const LaunchOptions& o, int world_size) {
  if (!o.command.empty() || o.config.empty()) return;
  auto cfg = config::load_job_config(o.config, world_size);
  config::require_training_sections(cfg);
}

launch::EnvList user_env(const LaunchOptions& o) {
  launch::EnvList env;
  for (const auto& e : o.env) env.push_back(launch::parse_env_assignment(e, "--env"));
  return env;
}

// .dstrain_env in the current directory, then --env (which wins on the same key).
launch::EnvList env_file_vars() { return launch::load_env_file(launch::kEnvFileName); }

int print_dry_run(const LaunchOptions& o) {
  auto world = launch::make_world(resolve_nodes(o, choose_backend(o)), o.master_addr, o.master_port);
  if (o.master_addr.empty()) launch::check_master_reachable(world);
  auto cmd = worker_command(o);
  check_trainer_config(o, world.world_size());
  launch::JobEnv job;
  job.store_addr = fmt::format("{}:<free port chosen at launch>", world.nodes.front().host);
  job.job_id = "<assigned at launch>";
  job.job_token = "<hidden>";
  job.user_env = user_env(o);
  for (const auto& [k, v] : env_file_vars()) {
    job.user_env.insert(job.user_env.begin(), {k, "<hidden: from .dstrain_env>"});
  }

  if (o.json) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& w : world.workers) {
      nlohmann::ordered_json env = nlohmann::ordered_json::object();
      for (const auto& [k, v] : launch::worker_env(world, w, job)) {
        env[k] = launch::is_secret_env(k) ? "<hidden>" : v;
      }
      out.push_back({{"rank", w.rank},
                     {"host", w.host},
                     {"node_rank", w.node_rank},
                     {"local_rank", w.local_rank},
                     {"devices", w.devices},
                     {"command", cmd},
                     {"env", env}});
    }
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::cout << fmt::format("dry run: {} rank(s) on {} node(s); MASTER_ADDR={} MASTER_PORT={}\n",
                           world.world_size(), world.nodes.size(), world.master_addr,
                           world.master_port);
  std::cout << fmt::format("command: {}\n", fmt::join(cmd, " "));
  for (const auto& w : world.workers) {
    std::cout << fmt::format("rank {:>3}  host {}  node_rank {}  local_rank {}  devices {}\n",
                             w.rank, w.host, w.node_rank, w.local_rank,
                             fmt::join(w.devices, ","));
    for (const auto& [k, v] : launch::worker_env(world, w, job)) {
      std::cout << fmt::format("    {}={}\n", k, launch::is_secret_env(k) ? "<hidden>" : v);
    }
  }
  return 0;
}

// The options of the slurm/openmpi/mpich/none backends and of preemption.
void set_cluster_options(const LaunchOptions& o, launch::JobSpec& spec) {
  if (!o.preempt_signal.empty()) spec.preempt_signal = preempt::parse_signal(o.preempt_signal, "--preempt-signal");
  spec.launcher_args = launch::split_launcher_args(o.launcher_args);
  spec.join_timeout = Millis(static_cast<int64_t>(o.join_timeout_s * 1000.0));
  spec.launcher_addr = o.launcher_addr;
  const bool none = spec.backend == launch::Backend::kNone;
  if (o.node_rank >= 0 && !none) throw invalid_argument("--node-rank applies only with --launcher none");
  if (!none) return;
  if (o.node_rank < 0) {
    throw Error(ErrorKind::kInvalidArgument, "--launcher none needs --node-rank N (this node's hostfile index)",
                "run `dstrain launch --launcher none --node-rank N` on node N of the hostfile, every node "
                "with the same hostfile, --master-addr and DSTRAIN_JOB_TOKEN");
  }
  spec.node_rank = o.node_rank;
  spec.token = env::get_or_default("DSTRAIN_JOB_TOKEN");
  if (spec.store_port == 0) spec.store_port = static_cast<int>(env::get_int("DSTRAIN_STORE_PORT"));
}

// --nnodes MIN:MAX (or N) against the nodes the job starts with: sets spec.min_nodes and
// max_nodes (0 when not given, or not elastic).
void set_elastic_nodes(const LaunchOptions& o, launch::JobSpec& spec) {
  if (o.nnodes.empty()) return;
  const std::string& t = o.nnodes;
  const size_t colon = t.find(':');
  auto number = [&](const std::string& s) {
    const auto v = parse_int(s);
    if (!v || *v < 1 || *v > 100000) {
      throw invalid_argument("--nnodes '{}': expected MIN:MAX or N with whole numbers >= 1 (torchrun's spelling)", t);
    }
    return static_cast<int>(*v);
  };
  const int lo = number(t.substr(0, colon));
  const int hi = colon == std::string::npos ? lo : number(t.substr(colon + 1));
  if (lo > hi) throw invalid_argument("--nnodes '{}': MIN {} is above MAX {}", t, lo, hi);
  const int have = static_cast<int>(spec.world.nodes.size());
  if (have < lo || have > hi) {
    throw invalid_argument("--nnodes {}: the job has {} node(s){}; it must start with MIN..MAX = {}..{}", t, have,
                           spec.backend == launch::Backend::kSlurm ? " in the allocation" : " in the hostfile", lo, hi);
  }
  if (spec.backend == launch::Backend::kLocal || spec.backend == launch::Backend::kNone ||
      (spec.backend == launch::Backend::kAuto && have == 1 && launch::is_local_host(spec.world.nodes[0].host))) {
    if (lo < have) {
      throw invalid_argument("--nnodes {}: elastic restarts need a multi-node launcher (ssh, slurm, openmpi, mpich)",
                             t);
    }
    return;
  }
  spec.min_nodes = lo;
  spec.max_nodes = hi;
}

int run_launch(const LaunchOptions& o) {
  if (o.json && !o.dry_run) throw invalid_argument("--json applies only with --dry-run");
  if (o.dry_run) return print_dry_run(o);
  if (o.master_port < 0 || o.master_port > 65535) {
    throw invalid_argument("--master-port {} is outside 0..65535", o.master_port);
  }
  launch::JobSpec spec;
  spec.backend = choose_backend(o);
  spec.world = launch::make_world(resolve_nodes(o, spec.backend), o.master_addr, o.master_port);
  if (o.master_addr.empty()) launch::check_master_reachable(spec.world);
  spec.command = worker_command(o);
  check_trainer_config(o, spec.world.world_size());
  spec.user_env = env_file_vars();
  for (auto& kv : user_env(o)) spec.user_env.push_back(kv);
  // OMP_NUM_THREADS set where the launcher runs counts as the user's choice on every node.
  if (const char* omp = std::getenv("OMP_NUM_THREADS")) {
    bool given = false;
    for (const auto& kv : spec.user_env) given = given || kv.first == "OMP_NUM_THREADS";
    if (!given) spec.user_env.emplace_back("OMP_NUM_THREADS", omp);
  }
  spec.kill_timeout = Millis(static_cast<int64_t>(o.kill_timeout_s * 1000.0));
  spec.agent_timeout = Millis(static_cast<int64_t>(o.agent_timeout_s * 1000.0));
  spec.failure_grace = Millis(static_cast<int64_t>(o.failure_grace_s * 1000.0));
  spec.bind_cores = o.bind_cores;
  spec.max_restarts = o.max_restarts;
  set_elastic_nodes(o, spec);
  spec.master_addr_option = o.master_addr;
  spec.store_port = o.store_port;
  spec.output.log_dir = o.log_dir;
  // The ranks write their flight records (comm/flight_recorder.h) beside their logs.
  // (first, so that an --env DSTRAIN_LOG_DIR or DSTRAIN_FLIGHT_DIR of the user's wins).
  if (!o.log_dir.empty()) {
    spec.user_env.insert(spec.user_env.begin(), {"DSTRAIN_LOG_DIR", std::filesystem::absolute(o.log_dir).string()});
  }
  if (!o.ranks_filter.empty()) {
    spec.output.console_ranks =
        launch::parse_rank_set(o.ranks_filter, spec.world.world_size(), "--ranks-filter");
  }
  spec.ssh.port = o.ssh_port;
  spec.ssh.user = o.ssh_user;
  spec.ssh.keys = o.ssh_keys;
  spec.ssh.known_hosts = o.known_hosts;
  spec.ssh.accept_new_host_keys = o.accept_new_host_keys;
  spec.ssh.connect_timeout = Millis(static_cast<int64_t>(o.ssh_timeout_s * 1000.0));
  spec.remote_dstrain = o.remote_dstrain.empty() ? self_exe() : o.remote_dstrain;
  spec.cwd = std::filesystem::current_path().string();
  if (spdlog::get_level() <= spdlog::level::debug) {
    spec.agent_log_level = spdlog::level::to_string_view(spdlog::get_level()).data();
  }
  set_cluster_options(o, spec);
  return launch::run_job(spec);
}

}  // namespace

void add_launch_command(CLI::App& app, std::vector<Command>& out) {
  auto opts = std::make_shared<LaunchOptions>();
  auto* sub = app.add_subcommand("launch", "start one worker per slot of a hostfile (or the local node)");
  setup_launch(*sub, *opts);
  out.push_back({sub, [opts] { return run_launch(*opts); }});
}

}  // namespace ds::cli
