// Korthikanti et al. 2022, Table 2, against hand-computed numbers.
#include <gtest/gtest.h>

#include "common/error.h"
#include "model_spec/shape.h"
#include "plan/activation_paper.h"

namespace ds::plan {
namespace {

// GPT-3 175B as in the paper: s = 2048, h = 12288, a = 96, t = 8, b = 1.
constexpr double kS = 2048, kH = 12288, kA = 96, kT = 8;
constexpr double kSbh = kS * kH;  // 25,165,824; 5as/h = 80

TEST(Korthikanti, Table2RowsForGpt3) {
  KorthikantiInput in{kS, 1, kH, kA, 1, false, PaperRecompute::kNone};
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(in), kSbh * 114);  // 34 + 80
  in.t = kT;
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(in), kSbh * 23);   // 10 + 3 + 10
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(in), 578813952.0);
  in.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(in), kSbh * 14.25);  // 34/8 + 10
  in.recompute = PaperRecompute::kSelective;
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(in), kSbh * 4.25);   // 34/8
  in.sequence_parallel = false;
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(in), kSbh * 13);     // 10 + 24/8
  in.recompute = PaperRecompute::kFull;
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(in), kSbh * 2);
  in.b = 4;
  EXPECT_DOUBLE_EQ(korthikanti_layer_bytes(in), kSbh * 8);
}

TEST(Korthikanti, TableHasSixRowsWithTensorParallelism) {
  auto rows = korthikanti_table(kS, 1, kH, kA, kT);
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows.back().formula, "2sbh");
  EXPECT_EQ(korthikanti_table(kS, 1, kH, kA, 1).size(), 4u);  // no SP rows at t = 1
}

TEST(Korthikanti, RejectsImpossibleSplits) {
  KorthikantiInput in{kS, 1, kH, kA, 7, false, PaperRecompute::kNone};
  EXPECT_THROW(korthikanti_layer_bytes(in), Error);  // 7 does not divide 96
  in.t = 1;
  in.sequence_parallel = true;
  EXPECT_THROW(korthikanti_layer_bytes(in), Error);
  in.sequence_parallel = false;
  in.s = 0;
  EXPECT_THROW(korthikanti_layer_bytes(in), Error);
}

}  // namespace
}  // namespace ds::plan

namespace ds::plan {
namespace {

// activation_checkpointing mode "selective" is Korthikanti's selective recompute: the runtime
// keeps every activation of a layer except attention's scores and softmax, which its attention
// never stores. Its per-layer bytes (the family's list, which the runtime allocates and the
// planner counts) are the paper's sbh(10 + 24/t) less the two dropout masks (dstrain has no
// dropout: 2sbh at 16 bits, 1 byte an element each) plus the fp32 statistics the paper leaves
// out (the norms' mean and rstd, attention's lse); full recompute keeps the paper's 2sbh.
TEST(Korthikanti, SelectiveRecomputeIsWhatTheRuntimeKeeps) {
  model_spec::ModelShape s;
  s.n_layer = 2;
  s.n_head = 8;
  s.n_embd = 256;
  s.vocab_size = 512;
  s.padded_vocab_size = 512;
  s.seq_len = 128;
  const int b = 2;
  for (int t : {1, 2, 4}) {
    model_spec::ModelPart part = model_spec::ModelPart::whole(s);
    part.tp = t;
    for (bool recompute : {false, true}) {
      model_spec::ActConfig cfg;
      cfg.B = b;
      cfg.T = s.seq_len;
      cfg.recompute = recompute;
      cfg.storage_bytes = 2;
      double layer = 0, stats = 0;
      for (const auto& a : model_spec::model_activations(s, part, cfg)) {
        if (a.scope != model_spec::ActScope::kPerLayer) continue;
        (a.fp32 ? stats : layer) += static_cast<double>(a.bytes(2));
      }
      KorthikantiInput in{static_cast<double>(s.seq_len), b, static_cast<double>(s.n_embd),
                          static_cast<double>(s.n_head), static_cast<double>(t), false,
                          recompute ? PaperRecompute::kFull : PaperRecompute::kSelective};
      const double sbh = 1.0 * s.seq_len * b * s.n_embd;
      const double want = korthikanti_layer_bytes(in) - (recompute ? 0 : 2 * sbh);
      EXPECT_DOUBLE_EQ(layer, want) << "t " << t << (recompute ? " full" : " selective");
      const double want_stats = recompute ? 0 : 4.0 * s.seq_len * b * (4 + s.n_head / t);
      EXPECT_DOUBLE_EQ(stats, want_stats) << "t " << t;
    }
  }
}

}  // namespace
}  // namespace ds::plan
