// Tensor parallelism of the transformer layers through the model's hooks: two tp ranks (threads)
// whose tp_reduce_* hooks sum over an in-process group compute the same layer outputs, input
// gradients and (sharded) parameter gradients as one unsharded model. This holds the tp-aware
// shapes, the hook points and the layout-independent init to what issue 6 needs.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <thread>
#include <vector>

#include "model_spec/gpt2_spec.h"
#include "core/allocator.h"
#include "model/gpt2.h"
#include "unit/kernels/grad_check.h"

using namespace ds::rt;
namespace ms = ds::model_spec;

namespace {
// A two-rank all-reduce over shared memory: every rank ends with the same sum (same order).
struct TpGroup {
  std::barrier<> bar{2};
  float* bufs[2] = {nullptr, nullptr};
  std::vector<float> sum;
  void all_reduce(int rank, float* buf, int64_t n, bool max = false) {
    bufs[rank] = buf;
    bar.arrive_and_wait();
    if (rank == 0) {
      sum.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; i++) {
        sum[i] = max ? std::max(bufs[0][i], bufs[1][i]) : bufs[0][i] + bufs[1][i];
      }
    }
    bar.arrive_and_wait();
    for (int64_t i = 0; i < n; i++) buf[i] = sum[i];
    bar.arrive_and_wait();
  }
};

struct TpHooks : ParallelHooks {
  TpGroup* group;
  int rank;
  int forward_calls = 0, backward_calls = 0;
  TpHooks(TpGroup* g, int r) : group(g), rank(r) {}
  void tp_reduce_forward(TypedPtr buf, int64_t n) override {
    forward_calls++;
    group->all_reduce(rank, buf.f32(), n);
  }
  void tp_reduce_backward(TypedPtr buf, int64_t n) override {
    backward_calls++;
    group->all_reduce(rank, buf.f32(), n);
  }
  void tp_loss_reduce_max(float* buf, int64_t n) override { group->all_reduce(rank, buf, n, true); }
  void tp_loss_reduce_sum(float* buf, int64_t n) override { group->all_reduce(rank, buf, n); }
};
}  // namespace

TEST(TensorParallel, TwoRanksMatchOneModel) {
  const ms::ModelShape s{2, 4, 16, 30, 32, 8};
  const int B = 2, T = 8, tp = 2;
  const int64_t BTC = int64_t{B} * T * s.n_embd;
  const auto x = ds::test::randn(static_cast<size_t>(BTC), 1);
  const auto dy = ds::test::randn(static_cast<size_t>(BTC), 2);
  omp_set_num_threads(1);

  Allocator alloc;
  Gpt2 full(s, ms::ModelPart{0, 2, false, false, 1, 0}, Gpt2Options{B, T}, alloc);
  full.init_weights(11);
  auto af = full.make_activations();
  std::copy(x.begin(), x.end(), af.input.f32());
  full.blocks_forward(af, 0, 2);
  full.zero_grads();
  std::copy(dy.begin(), dy.end(), full.d_stream().f32());
  full.blocks_backward(af, 0, 2);

  TpGroup group;
  std::vector<std::vector<float>> out(tp), dx(tp), grads(tp);
  std::vector<ms::ParamLayout> layouts(tp);
  std::vector<int> fwd_calls(tp), bwd_calls(tp);
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; r++) {
    threads.emplace_back([&, r] {
      omp_set_num_threads(1);
      TpHooks hooks(&group, r);
      Allocator a;
      Gpt2 m(s, ms::ModelPart{0, 2, false, false, tp, r}, Gpt2Options{B, T}, a, &hooks);
      m.init_weights(11);
      auto acts = m.make_activations();
      std::copy(x.begin(), x.end(), acts.input.f32());
      m.blocks_forward(acts, 0, 2);
      out[r].assign(m.output(acts).f32(), m.output(acts).f32() + BTC);
      m.zero_grads();
      std::copy(dy.begin(), dy.end(), m.d_stream().f32());
      m.blocks_backward(acts, 0, 2);
      dx[r].assign(m.d_stream().f32(), m.d_stream().f32() + BTC);
      grads[r].assign(m.grads().f32(), m.grads().f32() + m.num_params());
      layouts[r] = m.layout();
      fwd_calls[r] = hooks.forward_calls;
      bwd_calls[r] = hooks.backward_calls;
    });
  }
  for (auto& t : threads) t.join();

  const auto all = ms::gpt2_params(s);
  for (int r = 0; r < tp; r++) {
    EXPECT_EQ(fwd_calls[r], 4);  // two row-parallel matmuls per layer
    EXPECT_EQ(bwd_calls[r], 4);  // two column-parallel input gradients per layer
    for (int64_t i = 0; i < BTC; i++) {
      ASSERT_NEAR(out[r][i], full.output(af).f32()[i], 1e-5) << "rank " << r << " out " << i;
      ASSERT_NEAR(dx[r][i], full.d_stream().f32()[i], 1e-5) << "rank " << r << " dx " << i;
    }
    for (const auto& ts : layouts[r].tensors) {
      const auto& t = all[static_cast<size_t>(ts.id)];
      const float* gfull = full.grad(ts.id, ts.layer).f32();
      for (int64_t i = 0; i < ts.numel; i++) {
        const float want = gfull[ms::full_index(t, tp, r, i)];
        ASSERT_NEAR(grads[r][ts.offset + i], want, 1e-5 + 1e-4 * std::fabs(want))
            << t.name << " layer " << ts.layer << " rank " << r << " " << i;
      }
    }
  }
}

TEST(TensorParallel, VocabularyParallelEmbeddingAndLossMatchOneModel) {
  // V = 27 of Vp = 32: rank 1's last 5 columns are padding, and some targets live on each rank.
  const ms::ModelShape s{2, 4, 16, 27, 32, 8};
  const int B = 2, T = 8, tp = 2;
  std::vector<int32_t> in(B * T), tg(B * T);
  for (int i = 0; i < B * T; i++) {
    in[i] = (i * 7 + 3) % s.vocab_size;
    tg[i] = (i * 11 + 5) % s.vocab_size;
  }
  omp_set_num_threads(1);
  Allocator alloc;
  Gpt2Options opt{B, T};
  opt.head_chunk_rows = 5;  // several chunks, one partial
  Gpt2 full(s, ms::ModelPart::whole(s), opt, alloc);
  full.init_weights(5);
  auto af = full.make_activations();
  full.zero_grads();
  const float loss_full = full.forward_backward(af, in.data(), tg.data(), 1.0f);
  const float eval_full = full.forward(af, in.data(), tg.data());

  TpGroup group;
  std::vector<float> loss(tp), eval(tp);
  std::vector<std::vector<float>> grads(tp);
  std::vector<ms::ParamLayout> layouts(tp);
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; r++) {
    threads.emplace_back([&, r] {
      omp_set_num_threads(1);
      TpHooks hooks(&group, r);
      Allocator a;
      Gpt2 m(s, ms::ModelPart{0, 2, true, true, tp, r}, opt, a, &hooks);
      m.init_weights(5);
      auto acts = m.make_activations();
      m.zero_grads();
      loss[r] = m.forward_backward(acts, in.data(), tg.data(), 1.0f);
      eval[r] = m.forward(acts, in.data(), tg.data());
      grads[r].assign(m.grads().f32(), m.grads().f32() + m.num_params());
      layouts[r] = m.layout();
    });
  }
  for (auto& t : threads) t.join();
  const auto all = ms::gpt2_params(s);
  for (int r = 0; r < tp; r++) {
    EXPECT_NEAR(loss[r], loss_full, 1e-5) << "rank " << r;
    EXPECT_NEAR(eval[r], eval_full, 1e-5) << "rank " << r;
    for (const auto& ts : layouts[r].tensors) {
      const auto& t = all[static_cast<size_t>(ts.id)];
      const float* gfull = full.grad(ts.id, ts.layer).f32();
      for (int64_t i = 0; i < ts.numel; i++) {
        const float want = gfull[ms::full_index(t, tp, r, i)];
        ASSERT_NEAR(grads[r][ts.offset + i], want, 1e-5 + 1e-4 * std::fabs(want))
            << t.name << " layer " << ts.layer << " rank " << r << " " << i;
      }
    }
  }
}
