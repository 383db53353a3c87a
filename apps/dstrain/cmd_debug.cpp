// `dstrain debug hang DIR`: reads the flight records a hung job's ranks left in DIR
// (flight_<rank>.json, comm/flight_recorder.h) and says which rank is behind, and in which
// operation and sequence number the others wait for it (comm/flight_analysis.h). Exit 0 when it
// names a rank behind, 1 when the records show none, 2 (an error) when DIR holds no records.
#include <cstdio>
#include <memory>
#include <string>

#include "comm/flight_analysis.h"
#include "commands.h"

namespace ds::cli {

namespace {

struct DebugHangOptions {
  std::string dir;
};

int run_debug_hang(const DebugHangOptions& o) {
  const auto a = rt::comm::flight::analyse_hang_dir(o.dir);
  std::fputs(rt::comm::flight::format_hang_report(a, o.dir).c_str(), stdout);
  return a.behind.empty() ? 1 : 0;
}

}  // namespace

void add_debug_command(CLI::App& app, std::vector<Command>& out) {
  auto* sub = app.add_subcommand("debug", "diagnose a job from what its ranks left behind");
  sub->require_subcommand(1);
  auto opts = std::make_shared<DebugHangOptions>();
  auto* hang = sub->add_subcommand(
      "hang",
      "read the ranks' flight records (flight_<rank>.json) and say which rank is behind and where the others "
      "wait; exit 0 when one is named, 1 when none is behind");
  hang->add_option("dir", opts->dir,
                   "the directory of the records: dstrain launch's --log-dir, DSTRAIN_FLIGHT_DIR, or "
                   "$TMPDIR/dstrain-flight-<job id>")
      ->required();
  out.push_back({hang, [opts] { return run_debug_hang(*opts); }});
}

}  // namespace ds::cli
