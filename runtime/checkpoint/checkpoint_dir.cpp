#include "checkpoint/checkpoint_dir.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/atomic_file.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "common/strings.h"

namespace ds::rt::ckpt {

namespace fs = std::filesystem;

namespace {
// The manifest's CRC-32C: of its compact dump (sorted keys) without the "crc32c" key itself, so it
// does not depend on the file's whitespace.
uint32_t manifest_crc(nlohmann::json m) {
  m.erase("crc32c");
  return crc32c(m.dump());
}
nlohmann::json with_checksum(const nlohmann::json& manifest) {
  nlohmann::json m = manifest;
  m["crc32c"] = crc32c_hex(manifest_crc(m));
  return m;
}
}  // namespace

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }
std::string shard_file_name(int rank) { return fmt::format("rank_{:05d}.bin", rank); }

std::string begin_checkpoint(const std::string& root, int64_t step) {
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw system_error("cannot create checkpoint directory {}: {}", root, ec.message());
  fs::path tmp = fs::path(root) / (".tmp-" + step_dir_name(step));
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  if (ec) throw system_error("cannot create {}: {}", tmp.string(), ec.message());
  return tmp.string();
}

std::string commit_checkpoint(const std::string& root, int64_t step, const nlohmann::json& manifest,
                              int keep_last) {
  fs::path tmp = fs::path(root) / (".tmp-" + step_dir_name(step));
  fs::path final_dir = fs::path(root) / step_dir_name(step);
  write_file_atomic((tmp / "manifest.json").string(), with_checksum(manifest).dump(2) + "\n");
  sync_dir(tmp.string());
  std::error_code ec;
  if (fs::exists(final_dir)) {
    // Re-saving a step (e.g. after a resume): move the old one aside first, then drop it.
    fs::path old = fs::path(root) / (".old-" + step_dir_name(step));
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    if (ec) throw system_error("cannot replace {}: {}", final_dir.string(), ec.message());
    fs::rename(tmp, final_dir, ec);
    if (ec) throw system_error("cannot rename {} to {}: {}", tmp.string(), final_dir.string(), ec.message());
    fs::remove_all(old, ec);
  } else {
    fs::rename(tmp, final_dir, ec);
    if (ec) throw system_error("cannot rename {} to {}: {}", tmp.string(), final_dir.string(), ec.message());
  }
  sync_dir(root);
  write_file_atomic((fs::path(root) / "latest").string(), step_dir_name(step) + "\n");

  if (keep_last > 0) {
    std::vector<std::string> steps;
    for (const auto& e : fs::directory_iterator(root)) {
      std::string name = e.path().filename().string();
      if (e.is_directory() && starts_with(name, "step_")) steps.push_back(name);
    }
    std::sort(steps.begin(), steps.end());  // zero-padded: lexical order is step order
    std::string keep = step_dir_name(step);
    size_t excess = steps.size() > static_cast<size_t>(keep_last) ? steps.size() - keep_last : 0;
    for (size_t i = 0; i < excess; ++i) {
      if (steps[i] == keep) continue;
      fs::remove_all(fs::path(root) / steps[i], ec);
    }
  }
  return final_dir.string();
}

std::optional<std::string> latest_checkpoint(const std::string& root) {
  fs::path latest = fs::path(root) / "latest";
  if (!fs::exists(latest)) return std::nullopt;
  std::string name(trim(read_file(latest.string(), "checkpoint pointer")));
  fs::path dir = fs::path(root) / name;
  if (name.empty() || !fs::is_directory(dir)) {
    throw invalid_argument("{} points to '{}', which is not a checkpoint directory in {}",
                           latest.string(), name, root);
  }
  return dir.string();
}

nlohmann::json read_manifest(const std::string& dir) {
  std::string path = (fs::path(dir) / "manifest.json").string();
  std::string text = read_file(path, "checkpoint manifest");
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw invalid_argument("{}: corrupt checkpoint manifest: {}", path, e.what());
  }
  // Manifests written before checksums have no "crc32c"; they are read unchecked.
  if (m.is_object() && m.contains("crc32c")) {
    const std::string stored = m["crc32c"].is_string() ? m["crc32c"].get<std::string>() : std::string("?");
    const std::string computed = crc32c_hex(manifest_crc(m));
    if (stored != computed) {
      throw invalid_argument("{}: the manifest fails its CRC-32C check (stored {}, computed {}): the file is corrupt",
                             path, stored, computed);
    }
  }
  return m;
}

}  // namespace ds::rt::ckpt
