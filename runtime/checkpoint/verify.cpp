// Verifying checkpoints (verify.h). A fault in one file does not stop the check of the others, so
// one run lists everything that is wrong.
#include "checkpoint/verify.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/manifest.h"
#include "checkpoint/shard_file.h"
#include "common/error.h"
#include "common/strings.h"

namespace ds::rt::ckpt {

namespace fs = std::filesystem;

namespace {

bool mixed_precision(const nlohmann::json& m) {
  const auto& c = m.value("config", nlohmann::json::object());
  auto enabled = [&](const char* k) {
    if (!c.is_object() || !c.contains(k) || !c[k].is_object()) return false;
    auto e = c[k].find("enabled");
    return e != c[k].end() && e->is_boolean() && e->get<bool>();
  };
  return enabled("bf16") || enabled("fp16");
}

// The optimizer's moment tensors of the manifest's config: Adam's pair, Lion's exp_avg, Adagrad's
// exp_avg_sq (its sum of squares), 1-bit LAMB's fresh variance too.
std::vector<std::string> moment_names(const nlohmann::json& m) {
  const auto& c = m.value("config", nlohmann::json::object());
  std::string type;
  if (c.is_object() && c.contains("optimizer") && c["optimizer"].is_object()) {
    type = c["optimizer"].value("type", std::string());
  }
  if (type == "Lion") return {"exp_avg"};
  if (type == "Adagrad") return {"exp_avg_sq"};
  if (type == "OneBitLamb") return {"exp_avg", "exp_avg_sq", "exp_avg_sq_fresh"};
  return {"exp_avg", "exp_avg_sq"};
}

// One shard: intact, and holding its partition's tensors.
std::string verify_shard(const std::string& path, int64_t count, bool master, const std::vector<std::string>& moments) {
  ShardReader r(path);
  const bool checked = r.verify();
  std::vector<std::string> want = {"params"};
  want.insert(want.end(), moments.begin(), moments.end());
  if (master) want.push_back("master");
  for (const auto& name : want) {
    if (!r.has(name)) throw invalid_argument("{}: no tensor '{}'", path, name);
    const auto& shape = r.shape_of(name);
    if (shape.size() != 1 || shape[0] != count) {
      throw invalid_argument("{}: tensor '{}' has {} elements where the manifest's partition has {}", path, name,
                             shape.empty() ? 0 : shape[0], count);
    }
  }
  return fmt::format("ok {} ({} tensors{})", path, r.names().size(), checked ? ", CRC-32C verified" : ", no checksums (written before them)");
}

}  // namespace

VerifyResult verify_checkpoint_dir(const std::string& dir) {
  VerifyResult res;
  auto fail = [&](const std::string& what) {
    res.ok = false;
    res.lines.push_back("BAD " + what);
  };
  nlohmann::json m;
  ShardLayout layout;
  try {
    m = read_manifest(dir);
    layout = read_shard_layout(m, dir + "/manifest.json", "parameters");
    auto step = m.find("step");  // m is an object: read_shard_layout found its layout in it
    res.lines.push_back(fmt::format("ok {}/manifest.json (step {}, {} shard(s))", dir,
                                    step != m.end() && step->is_number_integer() ? step->dump() : std::string("?"),
                                    layout.world_size));
  } catch (const Error& e) {
    fail(e.what());
    return res;
  }
  const bool master = mixed_precision(m);
  for (int q = 0; q < layout.world_size; ++q) {
    const std::string path = dir + "/" + shard_file_name(q);
    try {
      res.lines.push_back(verify_shard(path, layout.partitions[static_cast<size_t>(q)].second, master, moment_names(m)));
    } catch (const Error& e) {
      fail(e.what());
    }
  }
  return res;
}

namespace {
std::vector<std::string> step_dirs_newest_first(const std::string& root) {
  std::vector<std::string> dirs;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_directory() && starts_with(name, "step_")) dirs.push_back(e.path().string());
  }
  std::sort(dirs.rbegin(), dirs.rend());  // zero-padded: lexical order is step order
  return dirs;
}
}  // namespace

VerifyResult verify_checkpoint_root(const std::string& root) {
  VerifyResult res;
  try {
    const auto latest = latest_checkpoint(root);
    res.lines.push_back(latest ? fmt::format("latest -> {}", *latest) : fmt::format("{}: no `latest` pointer", root));
  } catch (const Error& e) {
    res.ok = false;
    res.lines.push_back(std::string("BAD ") + e.what());
  }
  const auto dirs = step_dirs_newest_first(root);
  if (dirs.empty()) {
    res.ok = false;
    res.lines.push_back(fmt::format("BAD {}: no step_* checkpoint directories", root));
  }
  for (const auto& d : dirs) {
    auto r = verify_checkpoint_dir(d);
    res.ok = res.ok && r.ok;
    res.lines.insert(res.lines.end(), r.lines.begin(), r.lines.end());
  }
  return res;
}

std::optional<std::string> newest_intact_checkpoint(const std::string& root, const std::string& except) {
  for (const auto& d : step_dirs_newest_first(root)) {
    if (fs::path(d).lexically_normal() == fs::path(except).lexically_normal()) continue;
    if (verify_checkpoint_dir(d).ok) return d;
  }
  return std::nullopt;
}

}  // namespace ds::rt::ckpt
