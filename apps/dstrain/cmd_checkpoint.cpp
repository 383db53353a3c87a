// `dstrain checkpoint verify DIR`: check a checkpoint without training. DIR is a checkpoint root
// (training.checkpoint_dir: every step directory and `latest`) or one step directory. Prints one
// line per file ("ok ..." or "BAD ..." naming the file, the tensor and its byte range) and exits
// 0 when everything verifies, 1 otherwise (2 when DIR is not a checkpoint at all).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "checkpoint/verify.h"
#include "commands.h"
#include "common/error.h"

namespace ds::cli {

namespace {

struct CheckpointVerifyOptions {
  std::string dir;
};

int run_checkpoint_verify(const CheckpointVerifyOptions& o) {
  namespace fs = std::filesystem;
  const bool step_dir = fs::exists(fs::path(o.dir) / "manifest.json");
  if (!step_dir && !fs::exists(fs::path(o.dir) / "latest") && !fs::is_directory(o.dir)) {
    throw Error(ErrorKind::kInvalidArgument, o.dir + ": no such checkpoint directory",
                "pass training.checkpoint_dir or one of its step_* directories");
  }
  const auto r = step_dir ? rt::ckpt::verify_checkpoint_dir(o.dir) : rt::ckpt::verify_checkpoint_root(o.dir);
  for (const auto& line : r.lines) std::printf("%s\n", line.c_str());
  std::fprintf(stderr, "%s: %s\n", o.dir.c_str(), r.ok ? "every file verifies" : "corrupt or incomplete (see BAD lines)");
  return r.ok ? 0 : 1;
}

}  // namespace

void add_checkpoint_command(CLI::App& app, std::vector<Command>& out) {
  auto* sub = app.add_subcommand("checkpoint", "work with training checkpoints");
  sub->require_subcommand(1);
  auto opts = std::make_shared<CheckpointVerifyOptions>();
  auto* verify = sub->add_subcommand(
      "verify",
      "check a checkpoint without training: the manifest, every shard's header, index and per-tensor "
      "CRC-32C; exit 0 when all verify, 1 otherwise");
  verify->add_option("dir", opts->dir, "training.checkpoint_dir, or one step_* directory in it")->required();
  out.push_back({verify, [opts] { return run_checkpoint_verify(*opts); }});
}

}  // namespace ds::cli
