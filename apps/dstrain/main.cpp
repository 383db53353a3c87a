// dstrain: launch and run distributed training jobs. See README.md and docs/.
// main is the only place that turns errors into messages and exit statuses.
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "common/error.h"
#include "common/logging.h"
#include "dstrain/build_info.h"

int main(int argc, char** argv) {
  CLI::App app{"dstrain: launch and run distributed transformer training (DeepSpeed-style)", "dstrain"};
  app.set_version_flag("--version", std::string("dstrain ") + DSTRAIN_VERSION);
  app.require_subcommand(1);
  app.fallthrough(false);
  std::string log_level;
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off "
                                           "(default: DSTRAIN_LOG_LEVEL or info)");

  std::vector<ds::cli::Command> commands;
  ds::cli::add_launch_command(app, commands);
  ds::cli::add_train_command(app, commands);
  ds::cli::add_agent_command(app, commands);
  ds::cli::add_check_command(app, commands);
  ds::cli::add_report_command(app, commands);
  ds::cli::add_plan_command(app, commands);
  ds::cli::add_config_command(app, commands);
  ds::cli::add_data_command(app, commands);
  ds::cli::add_checkpoint_command(app, commands);
  ds::cli::add_debug_command(app, commands);
  ds::cli::add_token_command(app, commands);
  ds::cli::add_sample_command(app, commands);
  ds::cli::add_eval_command(app, commands);
  ds::cli::add_plot_command(app, commands);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    ds::log::init(log_level);
    for (auto& c : commands) {
      if (c.app->parsed()) return c.run();
    }
    std::fprintf(stderr, "dstrain: no command given\n%s", app.help().c_str());
    return 2;
  } catch (const ds::Error& e) {
    std::fprintf(stderr, "dstrain: error: %s\n", e.what());
    if (!e.hint().empty()) std::fprintf(stderr, "hint: %s\n", e.hint().c_str());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dstrain: internal error: %s\n", e.what());
    return 70;
  }
}
