// `dstrain launch`: resolve the hostfile and filters into a world and start one worker per slot.
// With --dry-run it prints the plan of ranks (text or --json) and starts nothing.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common/error.h"
#include "config/hostfile.h"
#include "core/device.h"
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
  sub.add_option("--nproc-per-node", o.nproc_per_node,
                 "workers on the local node when there is no hostfile (CPU jobs)");
  sub.add_option("--config,-c", o.config, "job config (DeepSpeed-style JSON)");
  sub.add_option("--master-addr", o.master_addr, "MASTER_ADDR for the workers (default: first node)");
  sub.add_option("--master-port", o.master_port, "MASTER_PORT for the workers (default 29500)");
  sub.add_option("--env", o.env, "extra KEY=VALUE for every worker (repeatable)")
      ->allow_extra_args(false);
  sub.add_flag("--dry-run", o.dry_run, "print every rank's host, devices, command and environment; start nothing");
  sub.add_flag("--json", o.json, "with --dry-run: print a JSON array of ranks");
  sub.add_option("command", o.command,
                 "program and arguments to run on every rank (after --); default: dstrain train --config C");
}

std::string self_exe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("dstrain") : p.string();
}

std::vector<config::NodeSlots> resolve_nodes(const LaunchOptions& o) {
  config::ResourceFilter filter{o.include, o.exclude, o.num_nodes, o.num_gpus};
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

launch::EnvList user_env(const LaunchOptions& o) {
  launch::EnvList env;
  for (const auto& e : o.env) env.push_back(launch::parse_env_assignment(e, "--env"));
  return env;
}

int print_dry_run(const LaunchOptions& o) {
  auto world = launch::make_world(resolve_nodes(o), o.master_addr, o.master_port);
  auto cmd = worker_command(o);
  launch::JobEnv job;
  job.store_addr = fmt::format("{}:<free port chosen at launch>", world.nodes.front().host);
  job.job_id = "<assigned at launch>";
  job.job_token = "<hidden>";
  job.user_env = user_env(o);

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

int run_launch(const LaunchOptions& o) {
  if (o.json && !o.dry_run) throw invalid_argument("--json applies only with --dry-run");
  if (o.dry_run) return print_dry_run(o);
  throw Error(ErrorKind::kInvalidUsage, "starting jobs is not built yet: only --dry-run works",
              "run with --dry-run to see the ranks this job would start");
}

}  // namespace

void add_launch_command(CLI::App& app, std::vector<Command>& out) {
  auto opts = std::make_shared<LaunchOptions>();
  auto* sub = app.add_subcommand("launch", "start one worker per slot of a hostfile (or the local node)");
  setup_launch(*sub, *opts);
  out.push_back({sub, [opts] { return run_launch(*opts); }});
}

}  // namespace ds::cli
