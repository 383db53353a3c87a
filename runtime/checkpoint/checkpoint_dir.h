// Checkpoint directories: one per step, written under a temporary name and renamed into place,
// with a `latest` pointer updated last, and old ones pruned (keep_last).
//
//   <root>/step_00000100/manifest.json    config, step, layout, data position, RNG state
//   <root>/step_00000100/rank_00000.bin   each rank's tensors (shard_file.h)
//   <root>/latest                         "step_00000100\n", replaced atomically
//   <root>/.tmp-step_00000100/            while being written (removed if a write is retried)
//
// A crash at any point leaves either the previous complete checkpoint as `latest`, or the new
// complete one: never a partial directory under a final name.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace ds::rt::ckpt {

std::string step_dir_name(int64_t step);        // "step_00000100"
std::string shard_file_name(int rank);           // "rank_00000.bin"

// Creates a fresh <root>/.tmp-step_N directory (removing a stale one) and returns its path.
// Called by one rank; the others wait (barrier) before writing their shards into it.
std::string begin_checkpoint(const std::string& root, int64_t step);

// Writes manifest.json into the temporary directory, renames it to <root>/step_N (replacing an
// existing checkpoint of the same step), updates `latest`, then removes all but the newest
// `keep_last` step directories (keep_last <= 0 keeps all). Returns the final directory.
std::string commit_checkpoint(const std::string& root, int64_t step, const nlohmann::json& manifest,
                              int keep_last);

// The directory `latest` points to, or nullopt when there is no checkpoint under root.
// A `latest` naming a missing directory is an invalid_argument naming both.
std::optional<std::string> latest_checkpoint(const std::string& root);

// Reads and parses <dir>/manifest.json and checks its CRC-32C (the "crc32c" key, over the compact
// dump of the rest; commit_checkpoint writes it); errors name the file.
nlohmann::json read_manifest(const std::string& dir);

}  // namespace ds::rt::ckpt
