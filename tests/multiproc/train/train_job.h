// One training job for the multi-process tests: writes the config, runs `dstrain train` alone
// (nproc 1) or on every rank of `dstrain launch --nproc-per-node N` (one OpenMP thread per rank,
// the store and rank variables of an outer launch removed), and reads back rank 0's metrics file.
// Shared by tests/multiproc/train and tests/multiproc/plan.
//
// Also the checks the layout tests share: a run's curve against the single process's, and
// `dstrain plan --json`'s bytes against every rank's measured peaks.
//
// Not here: the configs themselves.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "multiproc/launch/job_process.h"

namespace ds::test {

struct TrainJobResult {
  int rc = -1;
  std::string out, err;
  std::vector<nlohmann::json> metrics;  // one object per logged step, in order
  double seconds = 0;
};

// The layout tests' synthetic corpus: a periodic token pattern (mod 31) with every 16th token on
// average replaced by a random one below `vocab` (seeded: every test gets the same tokens).
inline std::vector<uint16_t> patterned_tokens(size_t n, int vocab) {
  std::vector<uint16_t> toks(n);
  std::mt19937 rng(5);
  for (size_t i = 0; i < toks.size(); ++i) {
    toks[i] = static_cast<uint16_t>((i * 7 + i / 5) % 31);
    if (rng() % 16 == 0) toks[i] = static_cast<uint16_t>(rng() % static_cast<unsigned>(vocab));
  }
  return toks;
}

// `name` names the config and metrics files written under `dir`; `extra` is appended to the
// `dstrain train` arguments. Waits at most `timeout` (the JobProcess then kills the job).
inline TrainJobResult run_train_job(const std::string& dir, const std::string& name, int nproc,
                                    const nlohmann::json& cfg, const std::vector<std::string>& extra,
                                    std::chrono::seconds timeout) {
  const std::string cfg_path = dir + "/" + name + ".json";
  const std::string metrics = dir + "/" + name + ".jsonl";
  std::ofstream(cfg_path) << cfg.dump(2);
  std::vector<std::string> argv;
  if (nproc > 1) {
    argv = {DS_DSTRAIN_BIN, "launch", "--nproc-per-node", std::to_string(nproc), "--master-port", "0", "--env",
            "OMP_NUM_THREADS=1", "--kill-timeout", "5", "--", DS_DSTRAIN_BIN};
  } else {
    argv = {DS_DSTRAIN_BIN};
  }
  for (const std::string& a : {std::string("train"), std::string("--config"), cfg_path, std::string("--metrics"),
                               metrics}) {
    argv.push_back(a);
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  const auto t0 = std::chrono::steady_clock::now();
  JobProcess job(argv, {}, {"OMP_NUM_THREADS=1"}, {"DSTRAIN_STORE", "RANK", "WORLD_SIZE"});
  TrainJobResult r;
  r.rc = job.wait(timeout);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.out = job.out();
  r.err = job.err();
  std::ifstream in(metrics);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) r.metrics.push_back(nlohmann::json::parse(line));
  }
  return r;
}

// The steps of `m` from `first_step` against the single process's `base` (steps 1..), for loss,
// grad_norm and val_loss where the baseline has them: within tolerance(key) relative. Prints the
// worst relative difference of each.
inline void expect_curve_matches(const std::vector<nlohmann::json>& base, const std::vector<nlohmann::json>& m,
                                 int first_step, const std::function<double(const std::string&)>& tolerance,
                                 const std::string& what) {
  ASSERT_EQ(m.size(), base.size() - static_cast<size_t>(first_step - 1)) << what;
  std::map<std::string, double> worst;
  for (size_t i = 0; i < m.size(); ++i) {
    const int step = first_step + static_cast<int>(i);
    const nlohmann::json& want = base[static_cast<size_t>(step - 1)];
    EXPECT_EQ(m[i].at("step").get<int>(), step) << what;
    for (const char* key : {"loss", "grad_norm", "val_loss"}) {
      if (!want.contains(key)) continue;
      ASSERT_TRUE(m[i].contains(key)) << what << " step " << step << " " << key;
      const double w = want.at(key).get<double>(), g = m[i].at(key).get<double>();
      EXPECT_LE(std::abs(g - w), tolerance(key) * std::abs(w))
          << what << " step " << step << " " << key << ": " << g << " vs single process " << w;
      worst[key] = std::max(worst[key], std::abs(g - w) / std::abs(w));
    }
  }
  std::cout << what << ": worst relative difference to the single process:";
  for (const auto& [key, d] : worst) std::cout << " " << key << " " << d;
  std::cout << "\n";
}

// `dstrain plan --json --threads 1` for the config at `cfg_path` on `world` ranks: its "ranks".
inline nlohmann::json plan_ranks(const std::string& cfg_path, int world) {
  using namespace std::chrono_literals;
  JobProcess plan({DS_DSTRAIN_BIN, "plan", "--config", cfg_path, "--world-size", std::to_string(world), "--threads",
                   "1", "--json"});
  EXPECT_EQ(plan.wait(60s), 0) << plan.err();
  return nlohmann::json::parse(plan.out()).at("ranks");
}

// Every rank's measured peak per tag (`last`: the last metrics line of a --metrics-all-ranks run,
// peaks over the whole run) equals the plan's `ranks`. Returns how many (rank, tag) pairs agree.
inline int expect_plan_equals_peaks(const nlohmann::json& ranks, const nlohmann::json& last, int world,
                                    const std::string& what) {
  EXPECT_EQ(ranks.size(), static_cast<size_t>(world)) << what;
  int exact = 0;
  for (int q = 0; q < world && q < static_cast<int>(ranks.size()); ++q) {
    for (const char* tag : {"params", "grads", "optimizer", "activations", "comm", "workspace", "checkpoint", "total"}) {
      const std::string key = std::string("peak_bytes_") + tag + "_rank" + std::to_string(q);
      EXPECT_TRUE(last.contains(key)) << what << ": " << key << " missing";
      if (!last.contains(key)) continue;
      const int64_t measured = last.at(key).get<int64_t>();
      const int64_t planned = ranks[static_cast<size_t>(q)].at(tag).get<int64_t>();
      EXPECT_EQ(measured, planned) << what << " rank " << q << " " << tag
                                   << ": measured (left) against dstrain plan (right)";
      exact += measured == planned;
    }
  }
  return exact;
}

}  // namespace ds::test
