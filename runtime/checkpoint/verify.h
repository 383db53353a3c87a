// Checking a checkpoint without training (`dstrain checkpoint verify DIR`, and --resume when the
// checkpoint it was pointed at turns out corrupt): the manifest's CRC-32C and layout, then every
// shard the layout names: present, its header and index intact, every tensor's CRC-32C, and the
// tensors of a rank's partition (params, exp_avg, exp_avg_sq, master when the config had
// bf16/fp16) with the partition's element count.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ds::rt::ckpt {

struct VerifyResult {
  bool ok = true;
  std::vector<std::string> lines;  // one per file: "ok <path>..." or the fault
};

// One step directory (<root>/step_N). Never throws for a corrupt checkpoint: faults are lines.
VerifyResult verify_checkpoint_dir(const std::string& dir);

// Every step directory under `root`, newest first, with where `latest` points.
VerifyResult verify_checkpoint_root(const std::string& root);

// The newest step directory under `root`, other than `except`, that verifies; nullopt if none.
std::optional<std::string> newest_intact_checkpoint(const std::string& root, const std::string& except);

}  // namespace ds::rt::ckpt
