// `dstrain plan --calibrate` and `--recommend --measure` as real multi-process runs: 2 launched
// ranks calibrate a tiny model (every sample and fit present, the file valid), then the top 2
// recommended layouts run as real jobs and come back with a measured step time beside the
// predicted one. No timing is asserted: only that the figures exist and are positive.
#include <fstream>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "multiproc/launch/job_process.h"
#include "plan/calibration.h"
#include "support/run_command.h"

namespace ds {
namespace {

using test::TempDir;

std::string write_tiny(const TempDir& dir, const nlohmann::json& model = {{"type", "gpt2"}, {"n_layer", 2},
                                                                         {"n_head", 2}, {"n_embd", 32},
                                                                         {"vocab_size", 32}, {"seq_len", 16}}) {
  {
    std::ofstream f(dir / "train.bin", std::ios::binary);
    const int32_t n = 8192;
    int32_t header[256] = {20240520, 1, n};
    f.write(reinterpret_cast<const char*>(header), sizeof(header));
    for (int32_t i = 0; i < n; ++i) {
      const auto t = static_cast<uint16_t>((i * 7919 + i / 3) % 32);
      f.write(reinterpret_cast<const char*>(&t), sizeof(t));
    }
  }
  const nlohmann::json cfg = {
      {"train_batch_size", 4},
      {"train_micro_batch_size_per_gpu", 2},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.001}}}}},
      {"zero_optimization", {{"stage", 1}}},
      {"model", model},
      {"data", {{"train", "train.bin"}}},
      {"training", {{"steps", 100}, {"log_interval", 10}, {"device", "cpu"}}},
  };
  const std::string path = dir / "tiny.json";
  std::ofstream(path) << cfg.dump(2);
  return path;
}

TEST(PlanCalibrate, CalibratesThenMeasuresTheTopPicks) {
  TempDir dir;
  const std::string cfg = write_tiny(dir);
  const std::string calib = dir / "calib.json";
  auto r = test::run_command("OMP_NUM_THREADS=1 " + test::dstrain() + " plan --calibrate --config " + cfg +
                             " --nproc-per-node 2 -o " + calib);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const plan::CalibrationFile f = plan::read_calibration(calib);
  EXPECT_EQ(f.meta.backend, "shm");
  EXPECT_EQ(f.cal.ranks_per_node, 2);
  EXPECT_EQ(f.cal.shape.n_embd, 32);
  std::set<std::pair<int, int>> tp_conc;
  std::set<int> micro_batches;
  for (const auto& c : f.cal.compute) {
    tp_conc.insert({c.tp, c.concurrency});
    micro_batches.insert(c.micro_batch);
    EXPECT_GT(c.layer_fwd, 0);
    EXPECT_GT(c.layer_bwd, 0);
  }
  EXPECT_EQ(tp_conc, (std::set<std::pair<int, int>>{{1, 1}, {1, 2}, {2, 1}, {2, 2}}));
  EXPECT_EQ(micro_batches, (std::set<int>{1, 2, 4}));  // up to the global batch
  std::set<std::string> ops;
  for (const auto& c : f.cal.collectives) {
    ops.insert(plan::collective_name(c.op));
    EXPECT_EQ(c.group_size, 2);
    EXPECT_EQ(c.points.size(), 5u);  // 64 KiB, 256 KiB, 1, 4, 8 MiB
    EXPECT_GT(c.bus_bw, 0);
  }
  EXPECT_EQ(ops, (std::set<std::string>{"all_reduce", "reduce_scatter", "all_gather", "send_recv", "all_to_all",
                                        "ring_exchange"}));
  EXPECT_GT(f.cal.optimizer_rate, 0);

  r = test::run_command(test::dstrain() + " plan --recommend --config " + cfg + " --world-size 2 --gpu-mem 1GiB" +
                        " --threads 1 --calibration " + calib +
                        " --measure --top 2 --measure-steps 2 --measure-shuffle --measure-passes 2 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["calibration"]["measured"], true);
  EXPECT_EQ(j["calibration"]["source"], calib);
  ASSERT_GE(j["recommendations"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const auto& e = j["recommendations"][i];
    EXPECT_GT(e["predicted_ms"].get<double>(), 0) << e.dump();
    ASSERT_TRUE(e["measured_ms"].is_number()) << e.dump() << r.err;
    EXPECT_GT(e["measured_ms"].get<double>(), 0);
  }
  // Two passes: every layout ran twice.
  size_t runs = 0;
  for (size_t at = r.err.find("measuring "); at != std::string::npos; at = r.err.find("measuring ", at + 1)) ++runs;
  EXPECT_EQ(runs, 4u) << r.err;
}

// The measuring is the runtime's one decoder, so any family calibrates: a grouped-query Llama on
// one rank gives its compute samples (tp 1 only: one rank) and the optimizer's rate.
TEST(PlanCalibrate, CalibratesALlamaLayer) {
  TempDir dir;
  const std::string cfg = write_tiny(dir, {{"type", "llama"}, {"n_layer", 2}, {"n_head", 4}, {"n_kv_head", 2},
                                           {"n_embd", 32}, {"intermediate_size", 88}, {"vocab_size", 32},
                                           {"seq_len", 16}});
  const std::string calib = dir / "calib.json";
  auto r = test::run_command("OMP_NUM_THREADS=1 " + test::dstrain() + " plan --calibrate --config " + cfg +
                             " --nproc-per-node 1 -o " + calib);
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const plan::CalibrationFile f = plan::read_calibration(calib);
  EXPECT_EQ(f.cal.shape.family, model_spec::ModelFamily::kLlama);
  EXPECT_EQ(f.cal.shape.n_kv_head, 2);
  std::set<int> micro_batches;
  for (const auto& c : f.cal.compute) {
    EXPECT_EQ(c.tp, 1);
    micro_batches.insert(c.micro_batch);
    EXPECT_GT(c.layer_fwd, 0);
    EXPECT_GT(c.layer_bwd, 0);
    EXPECT_GT(c.head, 0);
  }
  EXPECT_EQ(micro_batches, (std::set<int>{1, 2, 4}));
  EXPECT_TRUE(f.cal.collectives.empty());
  EXPECT_GT(f.cal.optimizer_rate, 0);
}

}  // namespace
}  // namespace ds
