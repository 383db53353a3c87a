// The optimizers beside AdamW (train/optimizer_state.h, optimizer_update.cpp) and the 1-bit
// compressed all-reduce (parallel/onebit_allreduce.h) against an independent NumPy model of
// each formula (make_optimizer_reference.py prints the digests below): 20 steps of Lamb, Adagrad,
// Lion, OneBitAdam, ZeroOneAdam and OneBitLamb on one rank; 1-bit Adam on 2 and 4 ranks (threads
// over shm and Gloo) through its warm-up and 15 compressed steps, step by step the model's; the
// compressed all-reduce alone, its output and its error feedback after 3 rounds.
// Also: LAMB's trust ratio is per tensor of the whole model, so ZeRO-1 at dp 2 and 3 (partitions
// that cut tensors) gives the single rank's weights.
#include <omp.h>

#include <cmath>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "model/gpt2.h"
#include "parallel/onebit_allreduce.h"
#include "train/optimizer_state.h"

namespace ds::rt::train {
namespace {

namespace ms = ds::model_spec;

struct Digest {
  std::string name;
  double sum, sumsq;
  std::vector<double> picks;
};

// /usr/bin/python3 tests/unit/train/make_optimizer_reference.py
const std::vector<Digest> kReference = {
{"Lamb", 0.010710069520428078, 3.014891072873956, {0.005656973458826542, 0.016735857352614403, -0.016332998871803284, 0.015725595876574516, 0.0036817381624132395, 0.00621046731248498, -0.008268080651760101, 0.008877033367753029}},
{"Adagrad", 0.0949502534981832, 3.4882837937067954, {-0.0021294369362294674, 0.010308480821549892, -0.011822444386780262, 0.022250397130846977, 0.008699720725417137, 0.007295031100511551, -0.022577695548534393, 0.016903264448046684}},
{"Lion", 0.02472077769925818, 3.054276171694732, {0.0019031896954402328, 0.01690518856048584, -0.01623976044356823, 0.015475242398679256, 0.001525937463156879, 0.007902740500867367, -0.009939421899616718, 0.012616773135960102}},
{"OneBitAdam", 0.1069898051864584, 5.234333263665769, {-0.007415326312184334, 0.0076110269874334335, -0.024139132350683212, 0.026048731058835983, 0.009391024708747864, 0.022347530350089073, -0.025129783898591995, 0.022470414638519287}},
{"ZeroOneAdam", 0.12576681709469995, 5.780170938520218, {-0.006632080301642418, 0.008807706646621227, -0.030059445649385452, 0.02499251812696457, 0.007559724152088165, 0.022129330784082413, -0.028998825699090958, 0.021742988377809525}},
{"OneBitLamb", 0.016636677983115078, 3.0281402521190195, {0.004813704639673233, 0.016101375222206116, -0.016767673194408417, 0.016424089670181274, 0.0041258553974330425, 0.007216309197247028, -0.009318296797573566, 0.009723274037241936}},
{"OneBitAdam dp2", -2.527533730433788, 17.009216156262262, {-0.0024578706361353397, 0.012366952374577522, -0.03795599564909935, 0.021207690238952637, 0.003780060214921832, -0.02200937643647194, -0.023522142320871353, 0.016878215596079826}},
{"OneBitAdam dp4", 0.4426351911970414, 8.049569684417616, {0.009543100371956825, 0.022810962051153183, -0.02737129107117653, 0.009170982986688614, -0.01023419201374054, 0.007158653344959021, -0.020683063194155693, 0.006149871740490198}},
{"ZeroOneAdam dp2", 1.2309276377782226, 1383.6309193514337, {0.0006981986807659268, 0.014823241159319878, -0.08872759342193604, 0.01694895513355732, -0.008318671956658363, 0.1743796318769455, -0.015560653060674667, 0.01691039837896824}},
{"OneBitLamb dp2", 0.0883629126001324, 3.0343363852692677, {0.005050333682447672, 0.01649252511560917, -0.017378509044647217, 0.016006020829081535, 0.0037131081335246563, 0.006891048979014158, -0.009184346534311771, 0.009375989437103271}},
{"ZeroOneAdam dp4", -10.788373233284801, 131.75761281716507, {0.00650764349848032, 0.027263108640909195, -0.05263378471136093, -0.0013840419705957174, -0.016412876546382904, -0.044260941445827484, -0.016554109752178192, 0.0020215227268636227}},
{"OneBitLamb dp4", -0.037319902734452626, 3.0331198145089395, {0.00611696345731616, 0.01732860505580902, -0.017053615301847458, 0.014962758868932724, 0.00220571830868721, 0.005869357846677303, -0.008884468115866184, 0.008405404165387154}},
{"allreduce2", -3.6006710529327393, 44.27149509702233, {-0.06231512874364853, -0.06231512874364853, 0.06231512874364853, 0.06231512874364853, 0.06258827447891235, -0.04877575486898422, 0.04888399690389633, -0.03172885254025459}},
{"worker_error2", 1.598944928497076, 19.36758410550187, {-0.10011886060237885, -0.035226479172706604, -0.01556900143623352, 0.010824032127857208, 0.04736538603901863, 0.03965198993682861, -0.048875968903303146, 0.07296434044837952}},
{"allreduce4", -2.1965578608214855, 13.15709445297027, {-0.032450467348098755, -0.032450467348098755, 0.032450467348098755, 0.032450467348098755, 0.03264854475855827, -0.03284280374646187, 0.025051308795809746, -0.027483804151415825}},
{"worker_error4", 3.4191104490309954, 19.40886213254067, {0.03480396419763565, -0.03075512871146202, 0.034555621445178986, 0.04948289692401886, 0.004503119736909866, -0.015604972839355469, -0.037108082324266434, 0.03016331046819687}},
};

const Digest& reference(const std::string& name) {
  for (const Digest& d : kReference) {
    if (d.name == name) return d;
  }
  throw std::runtime_error("no reference " + name);
}

ms::ModelShape tiny_shape() {
  ms::ModelShape s;
  s.n_layer = 1;
  s.n_head = 2;
  s.n_embd = 32;
  s.vocab_size = 64;
  s.padded_vocab_size = 64;
  s.seq_len = 8;
  return s;
}

// The script's LAYOUT: (numel, decays) of each tensor in the flat layout's order.
const std::vector<std::pair<int64_t, bool>> kLayout = {
    {2048, true}, {256, true}, {32, false},  {32, false},   {3072, true}, {96, false}, {1024, true}, {32, false},
    {32, false},  {32, false}, {4096, true}, {128, false}, {4096, true}, {32, false}, {32, false},  {32, false}};
const std::vector<int64_t> kPicks = {0, 1, 777, 2047, 2048, 5000, 9999, 15071};

float init_value(int64_t i) { return static_cast<float>(0.02 * std::sin(0.71 * static_cast<double>(i) + 0.3)); }
float grad_value(int64_t i, int t, int r) {
  const double x = static_cast<double>(i);
  return static_cast<float>(0.1 * std::sin(0.37 * x + 1.3 * t + 0.9 * r) * (0.5 + 0.5 * std::cos(0.11 * x + 0.2 * r)));
}

void expect_digest(const std::vector<float>& p, const std::string& name) {
  SCOPED_TRACE(name);
  const Digest& d = reference(name);
  double sum = 0, sq = 0;
  for (float x : p) {
    sum += x;
    sq += static_cast<double>(x) * x;
  }
  EXPECT_NEAR(sum, d.sum, 1e-4 * (1 + std::abs(d.sum)));
  EXPECT_NEAR(sq, d.sumsq, 1e-4 * d.sumsq);
  for (size_t k = 0; k < kPicks.size(); ++k) {
    EXPECT_NEAR(p[static_cast<size_t>(kPicks[k])], d.picks[k], 1e-6 + 1e-4 * std::abs(d.picks[k])) << "element " << kPicks[k];
  }
}

config::OptimizerConfig optimizer_of(const std::string& type) {
  config::OptimizerConfig o;
  o.type = type;
  o.beta1 = 0.9;
  o.beta2 = 0.999;
  o.eps = 1e-8;
  o.weight_decay = 0.01;
  if (type == "Lamb" || type == "OneBitLamb") o.lr = 0.01;
  if (type == "Adagrad") {
    o.lr = 0.01;
    o.eps = 1e-10;
  }
  if (type == "Lion") {
    o.lr = 0.001;
    o.beta2 = 0.99;
    o.weight_decay = 0.1;
  }
  if (type == "OneBitAdam" || type == "ZeroOneAdam") o.lr = 0.001;
  o.freeze_step = type == "OneBitLamb" ? 6 : 5;
  o.var_freeze_step = 8;
  o.var_update_scaler = 2;
  o.local_step_scaler = 3;
  o.local_step_clipper = 4;
  return o;
}

// One rank's model, engine and optimizer state over `comm` (null: one rank).
struct Rank {
  Rank(const config::OptimizerConfig& opt, comm::CommPtr comm, int stage = 0)
      : shape(tiny_shape()), part(ms::ModelPart::whole(shape)), layout(ms::param_layout(shape, part)),
        zero(zero_options(stage), comm, layout, alloc), model(shape, part, model_options(zero), alloc, &zero),
        world(comm) {
    zero.attach(model.params().f32(), model.grads().f32());
    float* p = model.params().f32();
    for (int64_t i = 0; i < layout.total; ++i) p[i] = init_value(i);
    cfg.optimizer = opt;
    cfg.path = "test.json";
    state = std::make_unique<OptimizerState>(cfg, layout::Precision::kFp32, Device::kCpu, model, zero, 0, 1, alloc, 0,
                                             &world);
  }
  static parallel::ZeroOptions zero_options(int stage) {
    parallel::ZeroOptions z;
    z.stage = stage;
    return z;
  }
  static ModelOptions model_options(const parallel::ZeroEngine& z) {
    ModelOptions m;
    m.B = 1;
    m.T = 8;
    m.own_params = z.model_owns_params();
    m.own_grads = z.model_owns_grads();
    return m;
  }
  // One step with these gradients over the whole model (the engine's reduce is not run: the
  // caller gives each rank what the all-reduce would, or its own gradient when local).
  void step(const std::vector<float>& g, double lr) {
    std::copy(g.begin(), g.end(), model.grads().f32());
    state->update(optim::AdamWConfig{}, lr, 1.0, zero.opt_grads());
  }
  std::vector<float> params() { return {model.params().f32(), model.params().f32() + layout.total}; }

  Allocator alloc;
  ms::ModelShape shape;
  ms::ModelPart part;
  ms::ParamLayout layout;
  parallel::ZeroEngine zero;
  Decoder model;
  parallel::HostWorld world;
  config::JobConfig cfg;
  std::unique_ptr<OptimizerState> state;
};

std::vector<float> grads_of(int64_t n, int t, int r, float scale = 1.0f) {
  std::vector<float> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) g[static_cast<size_t>(i)] = grad_value(i, t, r) * scale;
  return g;
}

TEST(OptimizerTypes, LayoutIsTheReferenceScripts) {
  Rank r(optimizer_of("Lamb"), nullptr);
  const auto all = ms::model_params(r.shape);
  ASSERT_EQ(r.layout.tensors.size(), kLayout.size());
  for (size_t k = 0; k < kLayout.size(); ++k) {
    EXPECT_EQ(r.layout.tensors[k].numel, kLayout[k].first) << k;
    EXPECT_EQ(ms::find_param(all, r.layout.tensors[k].id).shape.size() == 2, kLayout[k].second) << k;
  }
}

TEST(OptimizerTypes, EachMatchesItsNumPyModelOver20Steps) {
  for (const char* type : {"Lamb", "Adagrad", "Lion", "OneBitAdam", "ZeroOneAdam", "OneBitLamb"}) {
    Rank r(optimizer_of(type), nullptr);
    for (int t = 1; t <= 20; ++t) {
      EXPECT_FALSE(r.state->begin_step()) << type << ": one rank never has local gradients";
      r.step(grads_of(r.layout.total, t, 0), r.cfg.optimizer.lr);
    }
    expect_digest(r.params(), type);
  }
}

TEST(OptimizerTypes, MomentsAreTheOptimizersOwn) {
  EXPECT_EQ(Rank(optimizer_of("Lion"), nullptr).state->moments().size(), 1u);
  EXPECT_EQ(Rank(optimizer_of("Lion"), nullptr).state->moments()[0].first, "exp_avg");
  EXPECT_EQ(Rank(optimizer_of("Adagrad"), nullptr).state->moments()[0].first, "exp_avg_sq");
  EXPECT_EQ(Rank(optimizer_of("Lamb"), nullptr).state->moments().size(), 2u);
  EXPECT_EQ(Rank(optimizer_of("OneBitLamb"), nullptr).state->moments().size(), 3u);
}

// Runs fn(rank) on `n` threads over `backend`'s comms and rethrows the first error.
template <typename F>
void on_ranks(int n, comm::Backend backend, F&& fn) {
  comm::CommOptions o;
  o.backend = backend;
  auto comms = comm::make_thread_comms(n, o);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        omp_set_num_threads(1);
        fn(r, comms[static_cast<size_t>(r)]);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

// Every 1-bit optimizer on 2 and 4 ranks through its warm-up and its compressed steps: the ranks
// are given what the trainer would (the all-reduced mean gradient on full steps, their own share
// of the global batch on local ones), and rank 0's weights are the NumPy model's.
TEST(OptimizerTypes, OneBitOptimizersOn2And4RanksAreTheNumPyModelStepByStep) {
  for (const char* type : {"OneBitAdam", "ZeroOneAdam", "OneBitLamb"}) {
    for (const auto backend : {comm::Backend::kShm, comm::Backend::kGloo}) {
      for (int n : {2, 4}) {
        SCOPED_TRACE(::testing::Message() << type << " " << comm::backend_name(backend) << " dp " << n);
        std::vector<std::vector<float>> out(static_cast<size_t>(n));
        on_ranks(n, backend, [&](int r, comm::CommPtr c) {
          Rank rank(optimizer_of(type), c);
          const int64_t P = rank.layout.total;
          const float share = 1.0f / static_cast<float>(n);
          for (int t = 1; t <= 20; ++t) {
            const bool local = rank.state->begin_step();
            if (std::string(type) != "ZeroOneAdam") {
              EXPECT_EQ(local, t > rank.cfg.optimizer.freeze_step) << t;
            }
            if (local) {
              rank.step(grads_of(P, t, r, share), rank.cfg.optimizer.lr);  // this rank's share of the batch
            } else {
              std::vector<float> mean(static_cast<size_t>(P), 0.0f);  // what the all-reduce gives
              for (int q = 0; q < n; ++q) {
                const auto g = grads_of(P, t, q);
                for (int64_t i = 0; i < P; ++i) mean[static_cast<size_t>(i)] += g[static_cast<size_t>(i)] * share;
              }
              rank.step(mean, rank.cfg.optimizer.lr);
            }
          }
          out[static_cast<size_t>(r)] = rank.params();
        });
        expect_digest(out[0], std::string(type) + " dp" + std::to_string(n));
        if (std::string(type) != "ZeroOneAdam") {  // 0/1 Adam's local steps leave the ranks apart
          for (int r = 1; r < n; ++r) EXPECT_EQ(out[static_cast<size_t>(r)], out[0]) << "rank " << r << " differs";
        }
      }
    }
  }
}

TEST(OptimizerTypes, CompressedAllReduceAndItsErrorFeedback) {
  for (const auto backend : {comm::Backend::kShm, comm::Backend::kGloo}) {
    for (int n : {2, 4}) {
      SCOPED_TRACE(::testing::Message() << comm::backend_name(backend) << " ranks " << n);
      const int64_t N = 15072;
      std::vector<float> out0, err_last;
      std::vector<uint64_t> sent(static_cast<size_t>(n));
      on_ranks(n, backend, [&](int r, comm::CommPtr c) {
        Allocator a;
        parallel::OneBitAllReduce ar(*c, N, a);
        std::vector<float> x;
        for (int round = 0; round < 3; ++round) {
          x = grads_of(N, round + 1, r);
          ar.run(x.data());
        }
        if (r == 0) out0 = x;
        if (r == n - 1) err_last.assign(ar.worker_error(), ar.worker_error() + N);
      });
      expect_digest(out0, "allreduce" + std::to_string(n));
      expect_digest(err_last, "worker_error" + std::to_string(n));
    }
  }
}

TEST(OptimizerTypes, OneBitTrafficIsAbout1Of32OfAnAllReduce) {
  const layout::OneBitSizes s = layout::onebit_sizes(124000000, 4);
  const double fp32_ring = 2.0 * 3 / 4 * 124000000 * 4;
  const double onebit = 2.0 * 3 / 4 * 4 * static_cast<double>(s.message_bytes);
  EXPECT_LT(onebit / fp32_ring, 1.0 / 30);
  EXPECT_GT(onebit / fp32_ring, 1.0 / 33);
}

TEST(OptimizerTypes, LambRatioIsPerWholeTensorUnderZero1) {
  // The single rank's weights after 5 steps, then ZeRO-1 at dp 2 and 3 (the partitions cut
  // tensors; the squares of each tensor are summed over the ranks).
  Rank one(optimizer_of("Lamb"), nullptr);
  for (int t = 1; t <= 5; ++t) one.step(grads_of(one.layout.total, t, 0), 0.01);
  const std::vector<float> want = one.params();
  for (int n : {2, 3}) {
    SCOPED_TRACE(::testing::Message() << "dp " << n);
    std::vector<std::vector<float>> part(static_cast<size_t>(n));
    std::vector<int64_t> begin(static_cast<size_t>(n));
    on_ranks(n, comm::Backend::kShm, [&](int r, comm::CommPtr c) {
      Rank rank(optimizer_of("Lamb"), c, /*stage=*/1);
      for (int t = 1; t <= 5; ++t) rank.step(grads_of(rank.layout.total, t, 0), 0.01);
      const float* p = rank.state->master_params();
      part[static_cast<size_t>(r)].assign(p, p + rank.state->opt_count());
      begin[static_cast<size_t>(r)] = rank.state->opt_begin();
    });
    for (int r = 0; r < n; ++r) {
      const auto& v = part[static_cast<size_t>(r)];
      for (size_t i = 0; i < v.size(); ++i) {
        const float w = want[static_cast<size_t>(begin[static_cast<size_t>(r)]) + i];
        ASSERT_NEAR(v[i], w, 1e-7 + 1e-5 * std::abs(w)) << "rank " << r << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace ds::rt::train
