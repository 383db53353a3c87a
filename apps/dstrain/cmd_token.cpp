// `dstrain token`: prints a fresh job token (256 random bits, hex) for jobs whose ranks srun or
// mpirun start directly, or whose nodes run `dstrain launch --launcher none` each:
//   export DSTRAIN_JOB_TOKEN=$(dstrain token)
// The token authenticates every client of the job's store; it is a secret (keep it out of
// command lines and logs).
#include <iostream>

#include "commands.h"
#include "launch/launcher.h"

namespace ds::cli {

void add_token_command(CLI::App& app, std::vector<Command>& out) {
  auto* sub = app.add_subcommand(
      "token", "print a fresh job token: export DSTRAIN_JOB_TOKEN=$(dstrain token)");
  out.push_back({sub, [] {
                   std::cout << launch::make_job_token() << "\n";
                   return 0;
                 }});
}

}  // namespace ds::cli
