// The ZeRO paper's and DeepSpeed's model-state formulas against the numbers their authors print.
#include <gtest/gtest.h>

#include "common/error.h"
#include "plan/model_state.h"

namespace ds::plan {
namespace {

constexpr double kGiB = 1073741824.0;

TEST(ZeroPaper, SevenPointFiveBillionOnSixtyFourRanks) {
  // Rajbhandari et al. 2019, Figure 1: 120, 31.4, 16.6, 1.88 GB for stages 0-3.
  const double expected[] = {120.0, 31.4, 16.6, 1.88};
  const double precision[] = {0.5, 0.05, 0.05, 0.005};
  for (int s = 0; s <= 3; ++s) {
    auto m = zero_paper_model_states(7.5e9, 64, s);
    EXPECT_NEAR(m.total() / 1e9, expected[s], precision[s]) << "stage " << s;
  }
  auto m3 = zero_paper_model_states(7.5e9, 64, 3);
  EXPECT_DOUBLE_EQ(m3.params, 2 * 7.5e9 / 64);
  EXPECT_DOUBLE_EQ(m3.optimizer, 12 * 7.5e9 / 64);
  auto m1 = zero_paper_model_states(7.5e9, 64, 1);
  EXPECT_DOUBLE_EQ(m1.grads, 2 * 7.5e9);  // stage 1 keeps full gradients
}

TEST(ZeroPaper, RejectsImpossibleInputs) {
  EXPECT_THROW(zero_paper_model_states(7.5e9, 64, 4), Error);
  EXPECT_THROW(zero_paper_model_states(0, 64, 1), Error);
  EXPECT_THROW(zero_paper_model_states(1e9, 0, 1), Error);
}

DeepSpeedEstimateInput t5_3b(int stage) {
  DeepSpeedEstimateInput in;
  in.stage = stage;
  in.total_params = 2851e6;
  in.largest_layer_params = 32e6;
  in.gpus_per_node = 8;
  in.num_nodes = 1;
  return in;
}

TEST(DeepSpeedEstimators, T5ThreeBillionZero3NoOffload) {
  auto in = t5_3b(3);
  auto e = deepspeed_model_states(in);
  // 4 * 32e6 + int(18 * 2851e6 / 8) = 6,542,750,000 bytes = 6.09 GiB
  EXPECT_EQ(e.gpu_bytes, 6542750000);
  EXPECT_NEAR(e.gpu_bytes / kGiB, 6.09, 0.005);
  EXPECT_EQ(e.largest_layer_bytes, 128000000);
  // zero_init=1: cpu = largest * 4 * gpus_per_node * 1.5
  EXPECT_EQ(e.cpu_bytes, static_cast<int64_t>(32e6 * 4 * 8 * 1.5));
  EXPECT_EQ(e.options, "offload_param=none, offload_optimizer=none, zero_init=1");
}

TEST(DeepSpeedEstimators, T5ThreeBillionZero2NoOffload) {
  auto e = deepspeed_model_states(t5_3b(2));
  // 2P + int(18P / 8) = 5,702,000,000 + 6,414,750,000 = 11.28 GiB
  EXPECT_EQ(e.gpu_bytes, 12116750000);
  EXPECT_NEAR(e.gpu_bytes / kGiB, 11.28, 0.005);
  EXPECT_EQ(e.cpu_bytes, static_cast<int64_t>(2851e6 * 4 * 8 * 1.5));
}

TEST(DeepSpeedEstimators, OffloadVariants) {
  auto in = t5_3b(3);
  in.offload_optimizer_cpu = true;
  auto e = deepspeed_model_states(in);
  EXPECT_EQ(e.gpu_bytes, 128000000 + static_cast<int64_t>(2 * 2851e6 / 8));
  EXPECT_EQ(e.cpu_bytes, static_cast<int64_t>(2851e6 * 16 * 1.5));
  in.offload_param_cpu = true;
  e = deepspeed_model_states(in);
  EXPECT_EQ(e.gpu_bytes, 128000000);
  EXPECT_EQ(e.cpu_bytes, static_cast<int64_t>(2851e6 * 18 * 1.5));
  EXPECT_NEAR(e.cpu_bytes / kGiB, 71.69, 0.005);  // printed as "71.69GB"
  in.zero_init = false;
  e = deepspeed_model_states(in);
  // max(4 * 8, 18 / 1) = 32
  EXPECT_EQ(e.cpu_bytes, static_cast<int64_t>(2851e6 * 32 * 1.5));

  auto z2 = t5_3b(2);
  z2.offload_optimizer_cpu = true;
  z2.num_nodes = 2;
  e = deepspeed_model_states(z2);
  EXPECT_EQ(e.gpu_bytes, static_cast<int64_t>(2 * 2851e6));
  EXPECT_EQ(e.cpu_bytes, static_cast<int64_t>(2851e6 * 64 * 1.5));  // max(4 * 16, 16)
}

TEST(DeepSpeedEstimators, AllOptionsInDeepSpeedsOrder) {
  auto rows = deepspeed_model_states_all(t5_3b(3));
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_EQ(rows[0].options, "offload_param=cpu , offload_optimizer=cpu , zero_init=1");
  EXPECT_EQ(rows[5].options, "offload_param=none, offload_optimizer=none, zero_init=0");
  EXPECT_EQ(rows[4].gpu_bytes, 6542750000);
  EXPECT_EQ(deepspeed_model_states_all(t5_3b(2)).size(), 2u);
}

TEST(DeepSpeedEstimators, ErrorsNameTheRule) {
  auto in = t5_3b(1);
  try {
    deepspeed_model_states(in);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stages 2 and 3"), std::string::npos) << e.what();
  }
  in = t5_3b(2);
  in.offload_param_cpu = true;
  in.offload_optimizer_cpu = true;
  EXPECT_THROW(deepspeed_model_states(in), Error);
  in = t5_3b(3);
  in.offload_param_cpu = true;
  EXPECT_THROW(deepspeed_model_states(in), Error);  // param offload needs optimizer offload
  in = t5_3b(3);
  in.largest_layer_params = 0;
  EXPECT_THROW(deepspeed_model_states(in), Error);
}

}  // namespace
}  // namespace ds::plan
