// The model-mode memory model on a tiny GPT-2 computed by hand.
//
// Tiny model: L = 2, NH = 2, C = 8, V = Vp = 16, maxT = T = 4.
//   one layer: ln1 16 + qkv 192 + 24 + attproj 64 + 8 + ln2 16 + fc 256 + 32 + fcproj 256 + 8 = 872
//   wte 16 x 8 = 128, wpe 4 x 8 = 32, lnf 16; whole model 128 + 32 + 2 x 872 + 16 = 1920
// Activations for B = 2 (BT = 8), in fp32 elements:
//   per layer: ln1 64, ln1_mean 8, ln1_rstd 8, qkv 192, atty 64, att_lse 16, res2 64, ln2 64,
//              ln2_mean 8, ln2_rstd 8, fch 256, fch_gelu 256, out 64 = 1072
//   per micro-batch: input 64; head: lnf 64, lnf_mean 8, lnf_rstd 8, losses 8
//   workspace: logits 8 x 16 = 128, dres 64, dln 64, dqkv 192, datty 64, dfch 256,
//              att_scratch 1 thread x 2 x 4 x 4 = 32; total 800; plus the trainer's token ids
//              2 x BT int32 = 64 bytes
#include <gtest/gtest.h>

#include "common/error.h"
#include "plan/memory_model.h"

namespace ds::plan {
namespace {

model_spec::ModelShape tiny() {
  model_spec::ModelShape s;
  s.n_layer = 2;
  s.n_head = 2;
  s.n_embd = 8;
  s.vocab_size = 16;
  s.padded_vocab_size = 16;
  s.seq_len = 4;
  return s;
}

TEST(MemoryModel, TinyZero1DataParallelByHand) {
  Layout l;
  l.dp = 2;
  l.zero_stage = 1;
  l.micro_batch = 2;
  auto p = plan_memory(tiny(), l);
  ASSERT_EQ(p.ranks.size(), 2u);
  const auto& r = p.ranks[1];
  EXPECT_EQ(r.local_params, 1920);
  EXPECT_EQ(r.params, 1920 * 4);
  EXPECT_EQ(r.grads, 1920 * 4);
  EXPECT_EQ(r.optimizer, 960 * 8);  // fp32: Adam m, v only, half the elements
  EXPECT_EQ(r.activations, (64 + 2 * 1072 + 64 + 8 + 8 + 8) * 4);
  EXPECT_EQ(r.workspace, 800 * 4 + 64);
  EXPECT_EQ(r.comm, 0);
  EXPECT_EQ(r.total(), 7680 + 7680 + 7680 + 9184 + 3264);
  EXPECT_EQ(distinct_ranks(p).size(), 1u);
  EXPECT_EQ(distinct_ranks(p)[0].ranks_text, "0-1");
}

TEST(MemoryModel, TinyZero3Bf16OnCudaByHand) {
  Layout l;
  l.dp = 2;
  l.zero_stage = 3;
  l.micro_batch = 2;
  l.precision = Precision::kBf16;
  l.device = DeviceKind::kCuda;  // bf16 buffers (2 bytes), as on the CPU
  auto r = plan_memory(tiny(), l).ranks[0];
  // partition: stride = ceil(1920 / 2) = 960 (a multiple of 16); every unit is below the
  // persistence threshold (1e5), so all 1920 elements stay resident besides the shard
  EXPECT_EQ(r.params, (960 + 1920) * 2);
  // grads: partition 960 + one bucket of max(872, min(5e8, 32 + 872 + 872 + 16 = 1792)) + wte 128
  EXPECT_EQ(r.grads, (960 + 1792 + 128) * 2);
  EXPECT_EQ(r.optimizer, 960 * 12);  // m, v and the fp32 master copy
  // receive buffers: min(1792, 960) + min(128, 960)
  EXPECT_EQ(r.comm, (960 + 128) * 2);
  // no persistence, no prefetch: wte + wpe + lnf gathered once each, one layer buffer
  l.stage3_param_persistence_threshold = 0;
  l.stage3_prefetch_bucket_size = 0;
  r = plan_memory(tiny(), l).ranks[0];
  EXPECT_EQ(r.params, (960 + 128 + 32 + 16 + 872) * 2);
  // prefetch room for one layer: two layer buffers
  l.stage3_prefetch_bucket_size = 872;
  EXPECT_EQ(plan_memory(tiny(), l).ranks[0].params, (960 + 176 + 2 * 872) * 2);
  // overlap_comm: two buckets and two receive buffers
  l.overlap_comm = true;
  r = plan_memory(tiny(), l).ranks[0];
  EXPECT_EQ(r.grads, (960 + 2 * 1792 + 128) * 2);
  EXPECT_EQ(r.comm, (2 * 960 + 128) * 2);
  l.overlap_comm = false;
  l.stage3_prefetch_bucket_size = 0;
  // offload_optimizer: m, v, an fp32 master and the bf16 gradients for the CPU's AdamW in pinned
  // host memory (14 B per partition element), nothing of the optimizer on the GPU
  l.offload_optimizer = true;
  r = plan_memory(tiny(), l).ranks[0];
  EXPECT_EQ(r.params, (960 + 128 + 32 + 16 + 872) * 2);
  EXPECT_EQ(r.optimizer, 0);
  EXPECT_EQ(r.cpu, 960 * 14);
  // offload_param: the runtime does not offload ZeRO-3 partitions on a GPU, so the plan refuses
  l.offload_param = true;
  try {
    plan_memory(tiny(), l);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("offload_param on a GPU run"), std::string::npos) << e.what();
  }
}

// training.checkpoint_async: the host staging buffer holds the rank's checkpoint partition (its
// ZeRO partition even at stage 0) of params, master and moments; pinned (cpu) on CUDA.
TEST(MemoryModel, AsyncCheckpointStagingIsTheRanksPartition) {
  Layout l;
  l.dp = 2;
  l.zero_stage = 0;
  l.micro_batch = 2;
  const RankMemory off = plan_memory(tiny(), l).ranks[1];
  EXPECT_EQ(off.checkpoint, 0);
  l.checkpoint_staging = true;
  RankMemory r = plan_memory(tiny(), l).ranks[1];
  EXPECT_EQ(r.checkpoint, 960 * (4 + 8));  // fp32 params, Adam m and v
  EXPECT_EQ(r.total(), off.total() + r.checkpoint);
  l.precision = Precision::kBf16;
  l.zero_stage = 2;
  EXPECT_EQ(plan_memory(tiny(), l).ranks[0].checkpoint, 960 * (2 + 4 + 8));  // + the fp32 master
  l.device = DeviceKind::kCuda;
  r = plan_memory(tiny(), l).ranks[0];
  EXPECT_EQ(r.checkpoint, 0);
  EXPECT_EQ(r.cpu, 960 * (2 + 4 + 8));  // pinned host memory
}

// training.cuda_graph: the trainer's token ids move to pinned host memory (cpu), one slot per
// micro-batch of the step; the model's device copy stays in the workspace.
TEST(MemoryModel, ACudaGraphPinsTheStepsTokenIds) {
  Layout l;
  l.device = DeviceKind::kCuda;
  l.micro_batch = 2;
  l.grad_accum = 3;
  const RankMemory eager = plan_memory(tiny(), l).ranks[0];
  l.cuda_graph = true;
  const RankMemory graph = plan_memory(tiny(), l).ranks[0];
  const int64_t T = tiny().seq_len;
  EXPECT_EQ(graph.workspace, eager.workspace - kTokenBufferBytes * 2 * T);
  EXPECT_EQ(graph.cpu, eager.cpu + kTokenBufferBytes * 2 * T * 3);
}

TEST(MemoryModel, CpuStoresSixteenBitValuesInTwoBytes) {
  Layout l;
  l.precision = Precision::kBf16;
  l.micro_batch = 2;
  auto r = plan_memory(tiny(), l).ranks[0];
  EXPECT_EQ(r.params, 1920 * 2);
  EXPECT_EQ(r.grads, 1920 * 2);
  EXPECT_EQ(r.optimizer, 1920 * 12);  // fp32 master + m + v
  l.grad_precision = Precision::kFp32;  // grad_accum_dtype fp32
  EXPECT_EQ(plan_memory(tiny(), l).ranks[0].grads, 1920 * 4);
  EXPECT_EQ(plan_memory(tiny(), l).ranks[0].params, 1920 * 2);
  l.grad_precision.reset();
  l.device = DeviceKind::kCuda;  // bf16 buffers on the GPU too
  EXPECT_EQ(plan_memory(tiny(), l).ranks[0].params, 1920 * 2);
  EXPECT_EQ(plan_memory(tiny(), l).ranks[0].grads, 1920 * 2);
  l.grad_precision = Precision::kFp32;
  EXPECT_EQ(plan_memory(tiny(), l).ranks[0].grads, 1920 * 4);
  l.grad_precision.reset();
  l.precision = Precision::kFp16;  // no fp16 CUDA kernels: fp32 buffers on the GPU
  EXPECT_EQ(plan_memory(tiny(), l).ranks[0].params, 1920 * 4);
  EXPECT_EQ(plan_memory(tiny(), l).ranks[0].grads, 1920 * 4);
  EXPECT_EQ(plan_memory(tiny(), l).ranks[0].optimizer, 1920 * 12);  // the runtime keeps a master
  l.precision = Precision::kBf16;
  l.device = DeviceKind::kCpu;
  l.zero_stage = 1;
  l.offload_optimizer = true;  // host memory is the device memory: nothing moves
  EXPECT_EQ(plan_memory(tiny(), l).ranks[0].optimizer, 1920 * 12);
}

TEST(MemoryModel, EachOptimizersStateAndTheOneBitBuffers) {
  Layout l;  // fp32, one rank: 1920 elements
  auto opt = [&](const char* type) {
    l.optimizer = type;
    return plan_memory(tiny(), l).ranks[0];
  };
  EXPECT_EQ(opt("AdamW").optimizer, 1920 * 8);
  EXPECT_EQ(opt("Lamb").optimizer, 1920 * 8);
  EXPECT_EQ(opt("Lion").optimizer, 1920 * 4);
  EXPECT_EQ(opt("Adagrad").optimizer, 1920 * 4);
  EXPECT_EQ(opt("ZeroOneAdam").optimizer, 1920 * 12);
  EXPECT_EQ(opt("OneBitLamb").optimizer, 1920 * 16);
  EXPECT_EQ(opt("OneBitAdam").comm, 0);  // one rank: no exchange
  // dp 2: the error feedback (padded 4096 + server chunk 2048, fp32) and 3 x 2 messages of
  // 2048 / 8 bytes of signs + one fp32 scale
  l.dp = 2;
  const auto r = opt("OneBitAdam");
  EXPECT_EQ(r.optimizer, 1920 * 8 + (4096 + 2048) * 4);
  EXPECT_EQ(r.comm, 6 * (256 + 4));
  // On a GPU the optimizers beside Adam run on the CPU: their state (and the 1-bit buffers) in
  // pinned host memory with an fp32 master and the gradients' host copy.
  l.device = DeviceKind::kCuda;
  const auto g = opt("OneBitAdam");
  EXPECT_EQ(g.optimizer, 0);
  EXPECT_EQ(g.cpu, 1920 * (8 + 4 + 4) + (4096 + 2048) * 4 + 6 * (256 + 4));
  l.dp = 1;
  EXPECT_EQ(opt("Lion").cpu, 1920 * (4 + 4 + 4));
  EXPECT_EQ(opt("AdamW").cpu, 0);
}

// A tiny untied Llama by hand: L = 2, NH = 2, KV = 1, C = 8 (hd 4), I = 12, V = Vp = 16, T = 4.
//   one layer: input_layernorm 8 + q_proj 64 + k_proj 32 + v_proj 32 + o_proj 64
//              + post_attention_layernorm 8 + gate_proj 96 + up_proj 96 + down_proj 96 = 496
//   embed_tokens 128; norm 8 and lm_head 128 (the final-norm unit, on the last stage)
// Activations for B = 2 (BT = 8), elements (* = fp32 whatever the storage type):
//   per layer: ln1 64, ln1_rstd* 8, qkv 8 x (2 + 2) x 4 = 128, atty 64, att_lse* 16, res2 64,
//              ln2 64, ln2_rstd* 8, gu 192, act 96, out 64 = 768 (32 of them fp32)
//   per micro-batch: input 64; head: lnf 64, lnf_rstd* 8, losses* 8
//   workspace: dres 64, dln 64, dqkv 128, datty 64, dgu 192, dact 96, att_scratch* 2 x 4 x 4 = 32
//              (+ 8 x 4 x 4 = 128 at 16 bits), rope_cos* 8, rope_sin* 8, logits 8 x 16 = 128
model_spec::ModelShape tiny_llama() {
  model_spec::ModelShape s = tiny();
  s.family = model_spec::ModelFamily::kLlama;
  s.n_kv_head = 1;
  s.intermediate_size = 12;
  return s;
}

TEST(MemoryModel, TinyLlamaPipelineByHand) {
  Layout l;
  l.pp = 2;
  l.micro_batch = 2;
  l.grad_accum = 4;
  auto p = plan_memory(tiny_llama(), l);
  const auto& s0 = p.ranks[0];
  const auto& s1 = p.ranks[1];
  EXPECT_EQ(s0.local_params, 128 + 496);
  EXPECT_EQ(s1.local_params, 496 + 8 + 128);  // the untied lm_head lives with the final norm
  // no tied-wte gradient buffer: the lm_head is a tensor of its own
  EXPECT_EQ(s0.grads, (128 + 496) * 4);
  EXPECT_EQ(s1.grads, (496 + 136) * 4);
  EXPECT_EQ(s0.optimizer, (128 + 496) * 8);
  EXPECT_EQ(s0.activations, 2 * (64 + 768) * 4);  // 1F1B: 2 in flight on stage 0
  EXPECT_EQ(s1.activations, 1 * (64 + 768 + 80) * 4);
  // workspace: no logits on stage 0; token ids of all 4 micro-batches, 8 B per token
  EXPECT_EQ(s0.workspace, (784 - 128) * 4 + 4 * 64);
  EXPECT_EQ(s1.workspace, 784 * 4 + 4 * 64);
  for (const auto& n : p.notes) EXPECT_EQ(n.text.find("tied-wte"), std::string::npos) << n.text;
}

TEST(MemoryModel, TinyLlamaAtBf16KeepsItsStatisticsInFp32) {
  Layout l;
  l.precision = Precision::kBf16;
  l.micro_batch = 2;
  auto r = plan_memory(tiny_llama(), l).ranks[0];
  const int64_t n = 128 + 2 * 496 + 136;
  EXPECT_EQ(r.params, n * 2);
  EXPECT_EQ(r.grads, n * 2);
  EXPECT_EQ(r.optimizer, n * 12);  // fp32 master + m + v
  // per layer 736 x 2 + 32 x 4; input 64 x 2; head lnf 64 x 2 + (8 + 8) x 4
  EXPECT_EQ(r.activations, 64 * 2 + 2 * (736 * 2 + 32 * 4) + 64 * 2 + 16 * 4);
  // 16-bit: dres .. dact and logits 736 x 2; fp32: att_scratch (32 + 128) and the RoPE tables 16
  EXPECT_EQ(r.workspace, 736 * 2 + (160 + 16) * 4 + 64);
}

TEST(MemoryModel, UnevenPartitionsGiveTheLastRankLess) {
  Layout l;
  l.dp = 7;
  l.zero_stage = 1;
  auto p = plan_memory(tiny(), l);
  // ceil(1920 / 7) = 275, rounded up to 288; ranks 0-5 own 288, rank 6 the last 192
  EXPECT_EQ(p.ranks[0].optimizer, 288 * 8);
  EXPECT_EQ(p.ranks[6].optimizer, 192 * 8);
  auto groups = distinct_ranks(p);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].ranks_text, "0-5");
  EXPECT_EQ(groups[1].ranks_text, "6");
  EXPECT_EQ(zero_partition(1920, 7).stride(), 288);
  EXPECT_EQ(zero_partition(10, 4).count(3), 0);  // stride 16: rank 0 owns all 10
}

TEST(MemoryModel, PipelineStagesAndInFlightMicroBatches) {
  Layout l;
  l.pp = 2;
  l.micro_batch = 2;
  l.grad_accum = 4;
  auto p = plan_memory(tiny(), l);
  ASSERT_EQ(p.bounds, (std::vector<int>{0, 1, 2}));
  const auto& s0 = p.ranks[0];
  const auto& s1 = p.ranks[1];
  EXPECT_EQ(s0.stage, 0);
  EXPECT_EQ(s1.stage, 1);
  EXPECT_EQ(s0.local_params, 128 + 32 + 872);
  EXPECT_EQ(s1.local_params, 872 + 16 + 128);  // the tied wte lives on the last stage too
  // both ends keep the pipeline's tied-wte gradient buffer besides the model's gradients
  EXPECT_EQ(s0.grads, (1032 + 128) * 4);
  EXPECT_EQ(s1.grads, (1016 + 128) * 4);
  EXPECT_EQ(s0.in_flight, 2);  // 1F1B: pp - stage
  EXPECT_EQ(s1.in_flight, 1);
  EXPECT_EQ(s0.activations, 2 * (64 + 1072) * 4);
  EXPECT_EQ(s1.activations, 1 * (64 + 1072 + 88) * 4);
  // workspace: the backward's scratch (no logits on stage 0) and the token ids of all 4
  // micro-batches of the step (the pipeline loads them before the schedule), 8 B per token
  EXPECT_EQ(token_micro_batches(l), 4);
  EXPECT_EQ(s0.workspace, (800 - 128) * 4 + 4 * 64);
  EXPECT_EQ(s1.workspace, 800 * 4 + 4 * 64);
  EXPECT_EQ(distinct_ranks(p).size(), 2u);
  l.schedule = PipelineSchedule::kGPipe;
  EXPECT_EQ(plan_memory(tiny(), l).ranks[1].in_flight, 4);
}

TEST(MemoryModel, CheckpointingKeepsLayerOutputsOnly) {
  Layout l;
  l.micro_batch = 2;
  l.checkpointing = true;
  auto r = plan_memory(tiny(), l).ranks[0];
  // per micro-batch: input 64 + 2 layers x out 64 + head 88; shared: one layer's inner buffers 1008
  EXPECT_EQ(r.activations, (64 + 2 * 64 + 88 + 1008) * 4);
}

TEST(MemoryModel, StagePartitions) {
  auto s = tiny();
  s.n_layer = 8;
  EXPECT_EQ(stage_bounds(s, 3, StageSplit::kUniform), (std::vector<int>{0, 3, 6, 8}));
  // parameters: first stage carries wte + wpe (160), last lnf + wte (144), layers 872 each
  auto b = stage_bounds(s, 4, StageSplit::kParameters);
  EXPECT_EQ(b.front(), 0);
  EXPECT_EQ(b.back(), 8);
  EXPECT_EQ(b, (std::vector<int>{0, 2, 4, 6, 8}));
  EXPECT_THROW(stage_bounds(s, 9, StageSplit::kUniform), Error);
}

TEST(MemoryModel, ImpossibleLayoutsNameTheRule) {
  Layout l;
  l.tp = 3;
  try {
    plan_memory(tiny(), l);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_head"), std::string::npos) << e.what();
  }
  l = Layout{};
  l.offload_param = true;
  l.zero_stage = 2;
  EXPECT_THROW(plan_memory(tiny(), l), Error);
  l = Layout{};
  l.pp = 3;
  EXPECT_THROW(plan_memory(tiny(), l), Error);
  // ZeRO-3 with a pipeline: the config refuses it, so the plan does too (and --recommend never
  // offers it)
  l = Layout{};
  l.pp = 2;
  l.zero_stage = 3;
  try {
    plan_memory(tiny(), l);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline"), std::string::npos) << e.what();
  }
}

TEST(MemoryModel, VerdictSuggestsFixes) {
  Layout l;
  l.dp = 2;
  l.micro_batch = 2;
  auto p = plan_memory(tiny(), l);
  auto v = verdict(p, 1 << 20);
  EXPECT_TRUE(v.fits);
  EXPECT_EQ(v.margin, (1 << 20) - p.peak_total());
  // Just below the peak: ZeRO-1 (optimizer halves) fits.
  v = verdict(p, p.peak_total() - 1);
  EXPECT_FALSE(v.fits);
  EXPECT_EQ(v.margin, -1);
  ASSERT_FALSE(v.fixes.empty());
  bool zero = false;
  for (const auto& f : v.fixes) zero = zero || f.find("ZeRO stage") != std::string::npos;
  EXPECT_TRUE(zero);
  v = verdict(p, 100);
  EXPECT_TRUE(v.fixes.empty());
}

}  // namespace
}  // namespace ds::plan
