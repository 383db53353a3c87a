// The dstrain CLI's subcommands. Each lives in cmd_<name>.cpp with an Options struct, a setup
// function that binds flags to it and a run function that consumes it; `add_<name>_command`
// registers it on the top-level app and returns what main needs to run it.
#pragma once

#include <functional>
#include <vector>

#include <CLI/CLI.hpp>

namespace ds::config {
struct ParseOptions;
}

namespace ds::cli {

struct Command {
  CLI::App* app = nullptr;    // the (leaf) subcommand
  std::function<int()> run;   // runs it after parsing; returns the exit status
};

void add_report_command(CLI::App& app, std::vector<Command>& out);
void add_launch_command(CLI::App& app, std::vector<Command>& out);
void add_train_command(CLI::App& app, std::vector<Command>& out);
void add_agent_command(CLI::App& app, std::vector<Command>& out);
void add_check_command(CLI::App& app, std::vector<Command>& out);
void add_plan_command(CLI::App& app, std::vector<Command>& out);
void add_config_command(CLI::App& app, std::vector<Command>& out);
void add_data_command(CLI::App& app, std::vector<Command>& out);
// `data inspect` (cmd_data_inspect.cpp), registered by add_data_command under `data`.
void add_data_inspect_command(CLI::App* data, std::vector<Command>& out);
// `data mix` (cmd_data_mix.cpp), registered by add_data_command under `data`.
void add_data_mix_command(CLI::App* data, std::vector<Command>& out);
void add_checkpoint_command(CLI::App& app, std::vector<Command>& out);
void add_debug_command(CLI::App& app, std::vector<Command>& out);
void add_token_command(CLI::App& app, std::vector<Command>& out);
void add_sample_command(CLI::App& app, std::vector<Command>& out);
void add_eval_command(CLI::App& app, std::vector<Command>& out);
void add_plot_command(CLI::App& app, std::vector<Command>& out);

// The flags that change how a job config is read, shared by `train`, `config check` and `plan`
// (cmd_config.cpp): --strict and --set KEY=VALUE.
void add_config_read_flags(CLI::App* sub, config::ParseOptions& o);

}  // namespace ds::cli
