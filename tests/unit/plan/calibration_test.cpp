// The calibration file (lib/plan/calibration.h): written and read back unchanged, validated on
// read with errors naming the file, line and JSON path; the collective fit.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "common/error.h"
#include "plan/calibration.h"

namespace ds::plan {
namespace {

Calibration sample_calibration() {
  Calibration c;
  c.measured = true;
  c.cpu = true;
  c.cores = 2;
  c.ranks_per_node = 4;
  c.shape = model_spec::ModelShape{6, 6, 384, 256, 256, 256};
  ComputeSample s;
  s.micro_batch = 4;
  s.concurrency = 2;
  s.layer_fwd = 0.02;
  s.layer_bwd = 0.04;
  s.head = 0.003;
  c.compute = {s};
  c.collectives = {fit_collective(CollectiveOp::kAllReduce, 2, 2, false, {{65536, 1e-4}, {1 << 20, 1e-3}})};
  c.optimizer_rate = 5e8;
  c.cpu_adam_rate = 5e8;
  return c;
}

std::string text_of(const Calibration& c) { return calibration_json(c, {"vm", "cpu", "shm", 1}).dump(2); }

// The message of parsing `text`, or "" when it parses.
std::string error_of(const std::string& text) {
  try {
    parse_calibration(text, "calib.json");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    return e.what();
  }
  return "";
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

TEST(Calibration, RoundTrip) {
  const Calibration c = sample_calibration();
  const CalibrationFile f = parse_calibration(text_of(c), "calib.json");
  EXPECT_EQ(f.cal.source, "calib.json");
  EXPECT_TRUE(f.cal.measured);
  EXPECT_TRUE(f.cal.cpu);
  EXPECT_EQ(f.meta.backend, "shm");
  EXPECT_EQ(f.cal.cores, 2);
  EXPECT_EQ(f.cal.ranks_per_node, 4);
  EXPECT_EQ(f.cal.shape.n_embd, 384);
  ASSERT_EQ(f.cal.compute.size(), 1u);
  EXPECT_DOUBLE_EQ(f.cal.compute[0].layer_bwd, 0.04);
  EXPECT_EQ(f.cal.compute[0].concurrency, 2);
  ASSERT_EQ(f.cal.collectives.size(), 1u);
  EXPECT_DOUBLE_EQ(f.cal.collectives[0].bus_bw, c.collectives[0].bus_bw);
  EXPECT_EQ(f.cal.collectives[0].points.size(), 2u);
  EXPECT_DOUBLE_EQ(f.cal.optimizer_rate, 5e8);
}

TEST(Calibration, MalformedFilesNameThePathAndLine) {
  const std::string ok = text_of(sample_calibration());
  EXPECT_EQ(error_of(ok), "");
  std::string e = error_of(replace(ok, "\"layer_fwd_s\": 0.02", "\"layer_fwd_s\": -1"));
  EXPECT_NE(e.find("calib.json:"), std::string::npos) << e;
  EXPECT_NE(e.find("$.compute[0].layer_fwd_s: expected a number > 0, got -1"), std::string::npos) << e;
  e = error_of(replace(ok, "\"layer_bwd_s\": 0.04,", ""));
  EXPECT_NE(e.find("$.compute[0].layer_bwd_s: expected key 'layer_bwd_s'"), std::string::npos) << e;
  e = error_of(replace(ok, "\"op\": \"all_reduce\"", "\"op\": \"broadcast\""));
  EXPECT_NE(e.find("$.collectives[0].op: expected \"all_reduce\" | "), std::string::npos) << e;
  EXPECT_NE(e.find("\"all_to_all\" | \"ring_exchange\""), std::string::npos) << e;
  EXPECT_EQ(error_of(replace(ok, "\"op\": \"all_reduce\"", "\"op\": \"ring_exchange\"")), "");
  e = error_of(replace(ok, "\"dstrain-calibration\"", "\"something\""));
  EXPECT_NE(e.find("$.format"), std::string::npos) << e;
  e = error_of(replace(ok, "\"cores\": 2", "\"cores\": \"two\""));
  EXPECT_NE(e.find("$.cores: expected an integer >= 0"), std::string::npos) << e;
  e = error_of("{\"format\": ");
  EXPECT_NE(e.find("calib.json:1:"), std::string::npos) << e;
  e = error_of(replace(ok, "\"compute\": [", "\"compute\": [] , \"x\": ["));
  EXPECT_NE(e.find("$.compute: expected a non-empty array"), std::string::npos) << e;
}

// The model's family and its own sizes travel with the file, so the step-time model scales a
// Llama's samples as a Llama's; a file without "type" (written before) holds a GPT-2 shape.
TEST(Calibration, TheFamilyRoundTrips) {
  Calibration c = sample_calibration();
  c.shape.family = model_spec::ModelFamily::kLlama;
  c.shape.n_kv_head = 2;
  c.shape.intermediate_size = 1024;
  c.shape.tie_embeddings = true;
  const std::string text = text_of(c);
  const CalibrationFile f = parse_calibration(text, "calib.json");
  EXPECT_EQ(f.cal.shape.family, model_spec::ModelFamily::kLlama);
  EXPECT_EQ(f.cal.shape.n_kv_head, 2);
  EXPECT_EQ(f.cal.shape.intermediate_size, 1024);
  EXPECT_TRUE(f.cal.shape.tie_embeddings);
  EXPECT_EQ(parse_calibration(replace(text_of(sample_calibration()), "\"type\": \"gpt2\",", ""), "c.json").cal.shape.family,
            model_spec::ModelFamily::kGpt2);
  const std::string e = error_of(replace(text, "\"type\": \"llama\"", "\"type\": \"mamba\""));
  EXPECT_NE(e.find("$.model.type: expected one of the model families (gpt2, llama, mixtral)"), std::string::npos) << e;
  const std::string kv = error_of(replace(text, "\"n_kv_head\": 2,", ""));
  EXPECT_NE(kv.find("$.model.n_kv_head: expected key 'n_kv_head'"), std::string::npos) << kv;
}

// The H200 profile the device script measured (tests/gpu/device-run.sh, stage calibrate) is a
// valid GPU calibration that the step-time model takes.
TEST(Calibration, TheShippedH200ProfileIsAGpuCalibration) {
  const CalibrationFile f = read_calibration(std::string(DS_SOURCE_DIR) + "/configs/calibration/h200-gpt2-124m-bf16.json");
  EXPECT_EQ(f.meta.device, "cuda");
  EXPECT_FALSE(f.cal.cpu);
  EXPECT_EQ(f.cal.shape.family, model_spec::ModelFamily::kGpt2);
  EXPECT_EQ(f.cal.shape.n_embd, 768);
  ASSERT_FALSE(f.cal.compute.empty());
  for (const auto& c : f.cal.compute) EXPECT_EQ(c.precision, layout::Precision::kBf16);
  EXPECT_GT(f.cal.host_link_bw, 1e9);
}

TEST(Calibration, MissingFileIsAClearError) {
  try {
    read_calibration("/nonexistent/calib.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/calib.json"), std::string::npos) << e.what();
    EXPECT_NE(e.hint().find("--calibrate"), std::string::npos);
  }
}

TEST(Calibration, FitRecoversLatencyAndBandwidth) {
  // all_reduce on 4 ranks: 10 us + bus bytes (1.5 x buffer) / 2 GB/s.
  std::vector<std::pair<double, double>> pts;
  for (double b : {65536.0, 1048576.0, 8388608.0}) pts.emplace_back(b, 1e-5 + 1.5 * b / 2e9);
  const CollectiveFit f = fit_collective(CollectiveOp::kAllReduce, 4, 1, false, pts);
  EXPECT_NEAR(f.latency, 1e-5, 1e-9);
  EXPECT_NEAR(f.bus_bw, 2e9, 1e3);
  EXPECT_NEAR(collective_seconds(f, 1048576), 1e-5 + 1.5 * 1048576 / 2e9, 1e-9);
  EXPECT_THROW(fit_collective(CollectiveOp::kAllReduce, 4, 1, false, {}), Error);
}

}  // namespace
}  // namespace ds::plan
