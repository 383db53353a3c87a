// Shared by the cluster tests: the tiny training job they all run (a 2-layer GPT-2 on a
// repeating token pattern, global batch 8), its data,
// reading a metrics file back, and finding processes a test left behind. Header-only.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/token_file.h"
#include "multiproc/launch/job_process.h"

namespace ds::test {

inline void write_cluster_tokens(const std::string& path) {
  std::vector<uint16_t> toks(30000);
  std::mt19937 rng(3);
  for (size_t i = 0; i < toks.size(); ++i) {
    toks[i] = static_cast<uint16_t>((i * 5 + i / 7) % 29);
    if (rng() % 20 == 0) toks[i] = static_cast<uint16_t>(rng() % 32);
  }
  rt::data::write_token_file(path, toks);
}

// Global batch 8 sequences of 16 tokens, micro-batch 1 (G = 8 / world size).
inline nlohmann::json cluster_config(const std::string& data, int steps,
                                     const std::string& ckpt_dir = "") {
  nlohmann::json training = {{"steps", steps}, {"seed", 11}, {"log_interval", 100}};
  if (!ckpt_dir.empty()) {
    training["checkpoint_dir"] = ckpt_dir;
    training["checkpoint_interval"] = 1000;
  }
  return {{"train_batch_size", 8},
          {"train_micro_batch_size_per_gpu", 1},
          {"gradient_clipping", 1.0},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}, {"weight_decay", 0.1}}}}},
          {"zero_optimization", {{"stage", 1}}},
          {"model",
           {{"type", "gpt2"},
            {"n_layer", 2},
            {"n_head", 2},
            {"n_embd", 32},
            {"vocab_size", 32},
            {"seq_len", 16}}},
          {"data", {{"train", data}}},
          {"training", training}};
}

inline std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

inline std::vector<double> losses_of(const std::vector<nlohmann::json>& m) {
  std::vector<double> out;
  for (const auto& j : m) out.push_back(j.at("loss").get<double>());
  return out;
}

// Live processes whose command line mentions `needle` (e.g. a test's directory), as
// "pid: cmdline" lines.
inline std::vector<std::string> processes_mentioning(const std::string& needle) {
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = slurp(e.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(needle) != std::string::npos && pid_alive(std::stoi(name)))
      left.push_back(name + ": " + cmdline);
  }
  return left;
}

}  // namespace ds::test
