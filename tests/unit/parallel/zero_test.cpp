// ZeRO stages 0-3 with ranks as threads (comm::make_thread_comms): the reduced gradients of each
// rank's optimizer range equal a single model's gradients over the same global batch, whatever
// the stage, group size (including sizes that do not divide the model), bucket size, overlap and
// accumulation; parameter gathers after an update deliver every rank the same full parameters;
// stage-3 forward/backward through gathered (prefetched, bounded) units gives the same losses.
#include "parallel/zero.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "model/gpt2.h"

namespace ds::rt::parallel {
namespace {

namespace ms = ds::model_spec;

struct Case {
  int stage;
  int dp;
  bool overlap;
  int64_t bucket;   // reduce_bucket_size
  int G;            // accumulation micro-batches
  int64_t allgather = 500000000;
  int64_t prefetch = 50000000;
  int64_t persist = 100;
  int64_t max_live = 1000000000;
};

ms::ModelShape tiny_shape() {
  ms::ModelShape s;
  s.n_layer = 3;
  s.n_head = 2;
  s.n_embd = 16;
  s.vocab_size = 40;
  s.padded_vocab_size = 48;
  s.seq_len = 8;
  return s;
}

constexpr int kB = 2, kT = 8;
constexpr uint64_t kSeed = 9;

std::vector<int32_t> tokens_for(int r, int g, int salt) {
  std::mt19937 rng(static_cast<unsigned>(1000 * r + 10 * g + salt));
  std::vector<int32_t> t(kB * kT);
  for (auto& x : t) x = static_cast<int32_t>(rng() % 40);
  return t;
}

void run_case(const Case& c) {
  SCOPED_TRACE(::testing::Message() << "stage " << c.stage << " dp " << c.dp << " overlap "
                                    << c.overlap << " bucket " << c.bucket << " G " << c.G
                                    << " allgather " << c.allgather << " prefetch " << c.prefetch
                                    << " max_live " << c.max_live);
  const auto shape = tiny_shape();
  const auto part = ms::ModelPart::whole(shape);
  const auto layout = ms::param_layout(shape, part);
  const int64_t P = layout.total;

  // Reference: one model, the whole global batch, gradients of the mean loss.
  Allocator ref_alloc;
  Gpt2Options ro;
  ro.B = kB;
  ro.T = kT;
  Gpt2 ref(shape, part, ro, ref_alloc);
  ref.init_weights(kSeed);
  std::vector<float> init(ref.params().f32(), ref.params().f32() + P);
  auto ra = ref.make_activations();
  ref.zero_grads();
  std::vector<std::vector<float>> ref_loss(c.dp, std::vector<float>(c.G));
  for (int g = 0; g < c.G; ++g) {
    for (int r = 0; r < c.dp; ++r) {
      auto in = tokens_for(r, g, 0), tg = tokens_for(r, g, 1);
      ref_loss[r][g] = ref.forward_backward(ra, in.data(), tg.data(), 1.0f / static_cast<float>(c.dp * c.G));
    }
  }
  std::vector<float> ref_grads(ref.grads().f32(), ref.grads().f32() + P);
  // A fake update every rank applies to its range; then a forward on the updated model.
  std::vector<float> updated(P);
  for (int64_t i = 0; i < P; ++i) updated[i] = init[i] + 0.001f * static_cast<float>(i % 7);
  std::copy(updated.begin(), updated.end(), ref.params().f32());
  auto in0 = tokens_for(0, 0, 0), tg0 = tokens_for(0, 0, 1);
  const float ref_after = ref.forward(ra, in0.data(), tg0.data());

  auto comms = comm::make_thread_comms(c.dp);
  std::vector<std::exception_ptr> errors(c.dp);
  std::vector<std::thread> threads;
  for (int r = 0; r < c.dp; ++r) {
    threads.emplace_back([&, r] {
      try {
        omp_set_num_threads(1);
        ZeroOptions zo;
        zo.stage = c.stage;
        zo.overlap_comm = c.overlap;
        zo.reduce_bucket_size = c.bucket;
        zo.allgather_bucket_size = c.allgather;
        zo.prefetch_bucket_size = c.prefetch;
        zo.param_persistence_threshold = c.persist;
        zo.max_live_parameters = c.max_live;
        Allocator a;
        Gpt2Options mo;
        mo.B = kB;
        mo.T = kT;
        ZeroEngine z(zo, comms[r], layout, a);
        mo.own_params = z.model_owns_params();
        mo.own_grads = z.model_owns_grads();
        Gpt2 m(shape, part, mo, a, &z);
        z.attach(m.params().f32(), m.grads().f32());
        if (c.stage == 3) {
          EXPECT_EQ(m.params().f32(), nullptr);
          z.fill_shard([&](float* dst, int64_t b, int64_t n) { std::copy_n(init.data() + b, n, dst); });
        } else {
          m.init_weights(kSeed);
        }
        EXPECT_EQ(m.grads().f32() == nullptr, c.stage >= 2);
        auto acts = m.make_activations();
        z.begin_step();
        for (int g = 0; g < c.G; ++g) {
          auto in = tokens_for(r, g, 0), tg = tokens_for(r, g, 1);
          z.begin_micro_batch(g == c.G - 1, true);
          float loss = m.forward_backward(acts, in.data(), tg.data(), 1.0f / static_cast<float>(c.dp * c.G));
          z.end_micro_batch();
          EXPECT_NEAR(loss, ref_loss[r][g], 1e-5f * std::abs(ref_loss[r][g]));
        }
        const float* gr = z.opt_grads().f32();
        int bad = 0;
        for (int64_t i = 0; i < z.opt_count() && bad < 5; ++i) {
          float want = ref_grads[z.opt_begin() + i];
          if (std::abs(gr[i] - want) > 1e-6f + 1e-4f * std::abs(want)) {
            ADD_FAILURE() << "rank " << r << " grad " << z.opt_begin() + i << ": " << gr[i] << " vs " << want;
            ++bad;
          }
        }
        // The partition's sum of squares adds up across ranks to the full norm (checked by the
        // caller through sum_over_ranks).
        float* p = z.opt_params().f32();
        for (int64_t i = 0; i < z.opt_count(); ++i) p[i] = updated[z.opt_begin() + i];
        z.gather_params();
        if (c.stage < 3) {
          for (int64_t i = 0; i < P && bad < 10; ++i) {
            if (m.params().f32()[i] != updated[i]) {
              ADD_FAILURE() << "rank " << r << " param " << i << " after gather: " << m.params().f32()[i]
                            << " vs " << updated[i];
              ++bad;
            }
          }
        }
        std::vector<float> full(P, 0.0f);
        const float* src = c.stage == 3 ? z.opt_params().f32() : m.params().f32() + z.partition().begin(r);
        if (c.stage == 0) src = m.params().f32() + z.partition().begin(r);
        std::copy_n(src, z.partition().count(r), full.data() + z.partition().begin(r));
        z.all_gather_partitions(full.data());
        EXPECT_EQ(full, updated) << "rank " << r;
        z.begin_micro_batch(true, false);
        float after = m.forward(acts, in0.data(), tg0.data());
        z.end_micro_batch();
        EXPECT_NEAR(after, ref_after, 1e-5f * std::abs(ref_after)) << "rank " << r;
        auto sums = z.sum_over_ranks({1.0, static_cast<double>(r)});
        EXPECT_EQ(sums[0], c.dp);
        EXPECT_EQ(sums[1], c.dp * (c.dp - 1) / 2);
        // Memory: what each stage promises.
        const int64_t mine = z.partition().count(r);
        if (c.stage >= 2) {
          EXPECT_EQ(a.current(MemTag::kGrads),
                    static_cast<int64_t>(sizeof(float)) * (mine + z.footprint().grad_buckets));
        } else {
          EXPECT_EQ(a.current(MemTag::kGrads), static_cast<int64_t>(sizeof(float)) * P);
        }
        if (c.stage == 3 && c.max_live < P) {
          int64_t max_unit = 0;
          for (const auto& u : layout.units) max_unit = std::max(max_unit, u.numel);
          EXPECT_LE(a.peak(MemTag::kParams), static_cast<int64_t>(sizeof(float)) *
                                                  (mine + z.footprint().persistent + c.max_live + max_unit));
          EXPECT_LT(a.peak(MemTag::kParams), static_cast<int64_t>(sizeof(float)) * P);
        }
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < c.dp; ++r) {
    if (errors[r]) {
      try {
        std::rethrow_exception(errors[r]);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    }
  }
}

TEST(Zero, Stage0And1ReduceTheLastMicroBatchInBuckets) {
  for (int stage : {0, 1}) {
    for (int dp : {2, 3}) {
      run_case({stage, dp, false, 1000, 1});
      run_case({stage, dp, true, 5000, 2});
    }
  }
  run_case({1, 3, true, 1000000, 2, /*allgather=*/100});  // chunked parameter all-gather
}

TEST(Zero, Stage2ReduceScattersEveryMicroBatchIntoThePartition) {
  for (int dp : {2, 3, 4}) {
    run_case({2, dp, false, 1000, 1});
    run_case({2, dp, true, 4000, 2});
  }
  run_case({2, 2, true, 100000000, 3});  // one bucket for all but the token embedding
  run_case({2, 1, true, 1000, 2});       // one rank: local copies
}

TEST(Zero, Stage3GathersUnitsWithPrefetchAndBoundedLiveParameters) {
  for (int dp : {2, 3}) {
    run_case({3, dp, false, 1000, 1});
    run_case({3, dp, true, 4000, 2, 500000000, /*prefetch=*/5000, /*persist=*/100});
  }
  run_case({3, 2, true, 4000, 1, 500000000, 0, 0});                  // no prefetch, nothing resident
  run_case({3, 2, true, 4000, 2, 500000000, 1000000, 100, 4000});    // max live below two layers
  run_case({3, 1, false, 1000, 1});
}

}  // namespace
}  // namespace ds::rt::parallel
