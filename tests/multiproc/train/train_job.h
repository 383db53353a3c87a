// One training job for the multi-process tests: writes the config, runs `dstrain train` alone
// (nproc 1) or on every rank of `dstrain launch --nproc-per-node N` (one OpenMP thread per rank,
// the store and rank variables of an outer launch removed), and reads back rank 0's metrics file.
// Shared by tests/multiproc/train and tests/multiproc/plan.
//
// Not here: what a test checks, or the configs themselves.
#pragma once

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "multiproc/launch/job_process.h"

namespace ds::test {

struct TrainJobResult {
  int rc = -1;
  std::string out, err;
  std::vector<nlohmann::json> metrics;  // one object per logged step, in order
  double seconds = 0;
};

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

}  // namespace ds::test
