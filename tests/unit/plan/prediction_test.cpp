// The trainer's view of the plan: predicted_rank_memory picks one world rank of the job's plan
// (grid order rank = (stage x dp + dp_rank) x tp + tp_rank), with the threads the rank runs;
// describe_prediction lays the plan beside measured peaks with relative differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "common/error.h"
#include "config/job_config.h"
#include "plan/from_config.h"

namespace ds::plan {
namespace {

// tp 2 x pp 2 x dp 2 over 8 ranks, ZeRO-1, 1F1B over 4 micro-batches of 2 sequences.
config::JobConfig job(int world = 8) {
  return config::parse_job_config(
      R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
          "zero_optimization": {"stage": 1},
          "tensor_parallel": {"size": 2}, "pipeline": {"stages": 2},
          "model": {"type": "gpt2", "n_layer": 4, "n_head": 2, "n_embd": 32, "vocab_size": 64,
                    "seq_len": 16}})",
      "job.json", world);
}

TEST(Prediction, OneRankOfTheJobsPlanWithItsThreads) {
  const auto c = job();
  PlanInput in = plan_input_from_config(c);
  in.layout.num_threads = 3;
  const MemoryPlan p = plan_memory(in.shape, in.layout);
  for (int r = 0; r < 8; ++r) {
    const RankMemory m = predicted_rank_memory(c, r, 3);
    EXPECT_TRUE(m.same_bytes(p.ranks[static_cast<size_t>(r)])) << "rank " << r;
    EXPECT_EQ(m.rank, r);
    EXPECT_EQ(m.tp_rank, r % 2);
    EXPECT_EQ(m.dp_rank, (r / 2) % 2);
    EXPECT_EQ(m.stage, r / 4);
  }
  // Attention scratch is per thread: 2 x T x T floats more per extra thread (stages have layers).
  const int64_t one = predicted_rank_memory(c, 5, 1).workspace;
  EXPECT_EQ(predicted_rank_memory(c, 5, 3).workspace - one, 2 * 2 * 16 * 16 * 4);
  // Pipelines: the token ids of all 4 micro-batches, 8 B per token, on every stage; the first
  // stage keeps 2 micro-batches of activations (1F1B), the last 1.
  EXPECT_EQ(token_micro_batches(in.layout), 4);
  EXPECT_EQ(predicted_rank_memory(c, 0, 1).in_flight, 2);
  EXPECT_EQ(predicted_rank_memory(c, 7, 1).in_flight, 1);
}

TEST(Prediction, RankOutsideTheJobNamesIt) {
  const auto c = job();
  for (int bad : {-1, 8}) {
    try {
      predicted_rank_memory(c, bad, 1);
      FAIL() << bad;
    } catch (const Error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find("rank " + std::to_string(bad)), std::string::npos) << w;
      EXPECT_NE(w.find("8 rank(s)"), std::string::npos) << w;
    }
  }
  EXPECT_THROW(predicted_rank_memory(c, 0, 0), Error);
}

TEST(Prediction, PlanBesideMeasuredTagByTag) {
  RankMemory r;
  r.rank = 3;
  r.stage = 1;
  r.layer_begin = 2;
  r.layer_end = 4;
  r.tp_rank = 1;
  r.dp_rank = 1;
  r.params = 1000;
  r.grads = 1000;
  r.optimizer = 2048;
  r.activations = 4096;
  r.comm = 0;
  r.workspace = 1024;
  EXPECT_EQ(tag_bytes(r).at("total"), 9168);
  EXPECT_EQ(relative_difference(1000, 1100), 0.1);
  EXPECT_EQ(relative_difference(0, 0), 0.0);
  EXPECT_TRUE(std::isinf(relative_difference(0, 5)));

  std::map<std::string, int64_t> measured{{"params", 1000}, {"grads", 1100},   {"optimizer", 2048},
                                          {"activations", 4096}, {"comm", 64}, {"total", 9332}};
  const std::string s = describe_prediction(r, measured);
  EXPECT_NE(s.find("memory of rank 3 (stage 1, layers 2-3, tp rank 1, dp rank 1)"), std::string::npos) << s;
  auto line = [&](const std::string& tag) {
    const auto b = s.find("\n  " + tag + " ");
    EXPECT_NE(b, std::string::npos) << tag << "\n" << s;
    return s.substr(b + 1, s.find('\n', b + 1) - b - 1);
  };
  EXPECT_NE(line("params").find("+0.00%"), std::string::npos) << s;
  EXPECT_NE(line("grads").find("+10.00%"), std::string::npos) << s;
  EXPECT_NE(line("grads").find("1.07 KiB"), std::string::npos) << s;  // 1100 B
  EXPECT_NE(line("comm").find("(not planned)"), std::string::npos) << s;
  EXPECT_NE(line("workspace").find("?"), std::string::npos) << s;  // not measured
  EXPECT_NE(line("total").find("+1.79%"), std::string::npos) << s;   // 9332 / 9168
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 9);  // header + 8 lines (checkpoint: 0 and not measured)
}

}  // namespace
}  // namespace ds::plan
