// MFU's pieces: the model FLOPs per token against the formula written out for a known shape, the
// GPU peak table's lookups (most specific name first, unknown parts and precisions), the step's
// TFLOP/s and MFU, and the wall-clock breakdown's clock (laps add up to the elapsed time).
#include "train/throughput.h"

#include <thread>

#include <gtest/gtest.h>

#include "train/step_clock.h"

namespace ds::rt::train {
namespace {

using layout::Precision;

TEST(Throughput, FlopsPerTokenIsSixNPlusAttention) {
  model_spec::ModelShape s;
  s.n_layer = 12;
  s.n_head = 12;
  s.n_embd = 768;
  s.vocab_size = 50257;
  s.padded_vocab_size = 50304;
  s.seq_len = 1024;
  // GPT-2 124M with the padded vocabulary, counted by hand: wte, wpe, 12 layers, lnf.
  const double C = 768, L = 12, Vp = 50304, T = 1024;
  const double layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
  const double n = Vp * C + T * C + L * layer + 2 * C;
  EXPECT_EQ(n, 124475904.0);  // llm.c's "num_parameters: 124475904"
  EXPECT_DOUBLE_EQ(model_flops_per_token(s), 6 * n + 6 * L * C * T);
}

TEST(Throughput, GpuTable) {
  EXPECT_DOUBLE_EQ(*gpu_peak_tflops("NVIDIA H100 80GB HBM3", Precision::kBf16), 989.4);
  EXPECT_DOUBLE_EQ(*gpu_peak_tflops("NVIDIA H100 80GB HBM3", Precision::kFp32), 67.0);
  EXPECT_DOUBLE_EQ(*gpu_peak_tflops("NVIDIA H100 PCIe", Precision::kBf16), 756.0);
  EXPECT_DOUBLE_EQ(*gpu_peak_tflops("NVIDIA H200", Precision::kBf16), 989.4);
  EXPECT_DOUBLE_EQ(*gpu_peak_tflops("NVIDIA A100-SXM4-80GB", Precision::kBf16), 312.0);
  EXPECT_DOUBLE_EQ(*gpu_peak_tflops("NVIDIA A100-SXM4-80GB", Precision::kFp16), 19.5);  // fp16 runs multiply in fp32
  EXPECT_DOUBLE_EQ(*gpu_peak_tflops("NVIDIA L4", Precision::kBf16), 121.0);
  EXPECT_DOUBLE_EQ(*gpu_peak_tflops("NVIDIA L40S", Precision::kBf16), 362.1);
  EXPECT_FALSE(gpu_peak_tflops("Tesla V100-SXM2-16GB", Precision::kBf16));  // no bf16 units
  EXPECT_FALSE(gpu_peak_tflops("Some Future GPU", Precision::kFp32));
}

TEST(Throughput, StepFlopsAndMfu) {
  const StepFlops f = step_flops(1e9, 8192, 0.5, 4, 2.0);
  EXPECT_DOUBLE_EQ(f.tflops, 1e9 * 8192 / 0.5 / 4 / 1e12);
  EXPECT_DOUBLE_EQ(f.mfu, f.tflops / 2.0);
  EXPECT_EQ(step_flops(1e9, 8192, 0.5, 4, 0).mfu, 0);  // peak unknown
}

TEST(Throughput, CpuMatmulMeasuresSomething) {
  const double t = measure_cpu_matmul_tflops(DType::kF32);
  EXPECT_GT(t, 1e-4);  // 0.1 GFLOP/s: any machine
  EXPECT_LT(t, 1e3);
}

TEST(StepClock, LapsAddUpToTheElapsedTime) {
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  const auto t0 = Clock::now();
  StepClock clock(nullptr);
  const auto t1 = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  clock.lap(Phase::kForward);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  clock.lap(Phase::kBackward);
  const auto t2 = Clock::now();
  clock.lap(Phase::kOptimizer);
  const auto t3 = Clock::now();
  const StepBreakdown b = clock.finish();
  EXPECT_GE(b[Phase::kForward], 3.0);
  EXPECT_GE(b[Phase::kBackward], 2.0);
  // The laps cover the clock's life up to its last lap: bounds that hold however the scheduler
  // delays this thread (a busy machine).
  EXPECT_LE(b.sum_ms(), ms(t0, t3));
  EXPECT_GE(b.sum_ms(), ms(t1, t2));
  EXPECT_LT(b.reduce_comm_ms, 0);  // no ZeRO engine: not measured
  nlohmann::ordered_json j;
  breakdown_to_json(b, j);
  EXPECT_TRUE(j.contains("time_forward_ms"));
  EXPECT_TRUE(j.contains("time_pipeline_wait_ms"));
  EXPECT_FALSE(j.contains("time_reduce_comm_ms"));
}

}  // namespace
}  // namespace ds::rt::train
