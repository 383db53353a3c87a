// Every CUDA kernel against its CPU twin on random data: fp32 within ~1e-5 relative (1e-4 where
// the GPU sums in another order over hundreds of terms), bf16 variants against the CPU run on the
// same bf16-rounded inputs within ~1e-2. Skips itself (reported as skipped) without a GPU.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cmath>
#include <memory>
#include <vector>

#include "common/error.h"
#include "core/allocator.h"
#include "core/dtype.h"
#include "gpu/cuda_test_util.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda/kernels.h"
#include "kernels/dispatch.h"
#include "optim/adamw.h"
#include "optim/clip.h"

namespace ds::rt {
namespace {

using test::cu;

using test::close;
using test::DeviceArray;
using test::random_floats;
using test::random_tokens;
using test::from_bf16;
using test::to_bf16;

constexpr double kTight = 1e-5;   // element-wise fp32
constexpr double kSum = 1e-4;     // fp32 reductions in another order
constexpr double kBf16 = 2e-2;    // bf16 storage

class CudaKernels : public test::CudaStreamTest {};

// The value a bf16 buffer would hold: round through bf16.
std::vector<float> rounded(const std::vector<float>& v) { return from_bf16(to_bf16(v)); }

TEST_F(CudaKernels, GemmEveryTranspose) {
  const int M = 37, N = 53, K = 71;
  for (int ta = 0; ta < 2; ta++) {
    for (int tb = 0; tb < 2; tb++) {
      auto A = random_floats(size_t{M} * K, 1), B = random_floats(size_t{K} * N, 2);
      auto C = random_floats(size_t{M} * N, 3);
      const int lda = ta ? M : K, ldb = tb ? K : N;
      DeviceArray<float> dA(A), dB(B), dC(C);
      cu().gemm(ta, tb, M, N, K, 0.5f, dA.get(), lda, dB.get(), ldb, 2.0f, dC.get(), N, stream_);
      cpu::gemm(ta, tb, M, N, K, 0.5f, A.data(), lda, B.data(), ldb, 2.0f, C.data(), N);
      EXPECT_TRUE(close(dC.download(), C, kSum, 1e-5)) << "trans_a " << ta << " trans_b " << tb;
    }
  }
}

TEST_F(CudaKernels, GemmBf16) {
  const int M = 64, N = 48, K = 96;
  auto A = rounded(random_floats(size_t{M} * K, 1)), B = rounded(random_floats(size_t{K} * N, 2));
  std::vector<float> C(size_t{M} * N, 0.0f);
  DeviceArray<uint16_t> dA(to_bf16(A)), dB(to_bf16(B)), dC(size_t{M} * N);
  cu().gemm_bf16(false, true, M, N, K, 1.0f, dA.get(), K, dB.get(), K, 0.0f, dC.get(), N,
                  stream_);
  // B read as (N, K) transposed: reuse the data with that shape on the CPU too.
  cpu::gemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 0.0f, C.data(), N);
  EXPECT_TRUE(close(from_bf16(dC.download()), C, kBf16, 5e-2));
}

TEST_F(CudaKernels, EncoderForwardBackward) {
  const int B = 3, T = 17, C = 40, V = 11;  // small V: tokens repeat, dwte sums collide
  auto inp = random_tokens(size_t{B} * T, 1, V);
  auto wte = random_floats(size_t{V} * C, 2), wpe = random_floats(size_t{T} * C, 3);
  auto dout = random_floats(size_t{B} * T * C, 4);
  auto dwte = random_floats(size_t{V} * C, 5), dwpe = random_floats(size_t{T} * C, 6);
  DeviceArray<int32_t> dinp(inp);
  DeviceArray<float> dwte_p(wte), dwpe_p(wpe), dout_d(dout), out(size_t{B} * T * C);
  DeviceArray<float> gwte(dwte), gwpe(dwpe);
  cu().f32.encoder_forward(out.get(), dinp.get(), dwte_p.get(), dwpe_p.get(), B, T, C, stream_);
  std::vector<float> ref(size_t{B} * T * C);
  cpu::encoder_forward(ref.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  EXPECT_TRUE(close(out.download(), ref, kTight, 0));
  cu().f32.encoder_backward(gwte.get(), gwpe.get(), dout_d.get(), dinp.get(), B, T, C, stream_);
  cpu::encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), B, T, C);
  EXPECT_TRUE(close(gwte.download(), dwte, kSum, 1e-5));
  EXPECT_TRUE(close(gwpe.download(), dwpe, kSum, 1e-5));
  // add_position on top of the token embedding.
  cu().f32.add_position(out.get(), dwpe_p.get(), B, T, C, stream_);
  cpu::add_position(ref.data(), wpe.data(), B, T, C);
  EXPECT_TRUE(close(out.download(), ref, kTight, 0));
}

TEST_F(CudaKernels, EncoderVocabParallel) {
  const int B = 2, T = 9, C = 24, V = 30, v0 = 10, Vl = 12;
  auto inp = random_tokens(size_t{B} * T, 7, V);
  auto wte = random_floats(size_t{Vl} * C, 8), dout = random_floats(size_t{B} * T * C, 9);
  auto dwte = random_floats(size_t{Vl} * C, 10);
  DeviceArray<int32_t> dinp(inp);
  DeviceArray<float> dw(wte), ddout(dout), gw(dwte), out(size_t{B} * T * C);
  cu().f32.encoder_forward_vocab(out.get(), dinp.get(), dw.get(), B, T, C, v0, Vl, stream_);
  std::vector<float> ref(size_t{B} * T * C);
  cpu::encoder_forward_vocab(ref.data(), inp.data(), wte.data(), B, T, C, v0, Vl);
  EXPECT_TRUE(close(out.download(), ref, 0, 0));
  cu().f32.encoder_backward_vocab(gw.get(), ddout.get(), dinp.get(), B, T, C, v0, Vl, stream_);
  cpu::encoder_backward_vocab(dwte.data(), dout.data(), inp.data(), B, T, C, v0, Vl);
  EXPECT_TRUE(close(gw.download(), dwte, kSum, 1e-5));
}

TEST_F(CudaKernels, LayernormForwardBackward) {
  const int B = 2, T = 13, C = 200;  // C not a multiple of 32
  auto x = random_floats(size_t{B} * T * C, 1, 2.0f), w = random_floats(C, 2),
       b = random_floats(C, 3), dout = random_floats(size_t{B} * T * C, 4);
  auto dinp = random_floats(size_t{B} * T * C, 5);  // accumulates onto this
  auto dw = random_floats(C, 6), db = random_floats(C, 7);
  DeviceArray<float> dx(x), dwt(w), dbs(b), ddout(dout), out(x.size()), mean(size_t{B} * T),
      rstd(size_t{B} * T), gdinp(dinp), gdw(dw), gdb(db);
  cu().f32.layernorm_forward(out.get(), mean.get(), rstd.get(), dx.get(), dwt.get(), dbs.get(), B, T,
                          C, stream_);
  std::vector<float> ref(x.size()), rm(size_t{B} * T), rr(size_t{B} * T);
  cpu::layernorm_forward(ref.data(), rm.data(), rr.data(), x.data(), w.data(), b.data(), B, T, C);
  EXPECT_TRUE(close(out.download(), ref, kSum, 1e-5));
  EXPECT_TRUE(close(mean.download(), rm, kSum, 1e-6));
  EXPECT_TRUE(close(rstd.download(), rr, kSum, 0));
  cu().f32.layernorm_backward(gdinp.get(), gdw.get(), gdb.get(), ddout.get(), dx.get(), dwt.get(),
                           mean.get(), rstd.get(), B, T, C, stream_);
  cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                          rm.data(), rr.data(), B, T, C);
  EXPECT_TRUE(close(gdinp.download(), dinp, kSum, 1e-5));
  EXPECT_TRUE(close(gdw.download(), dw, kSum, 1e-5));
  EXPECT_TRUE(close(gdb.download(), db, kSum, 1e-5));
}

TEST_F(CudaKernels, MatmulForwardBackwardWithAndWithoutBias) {
  const int B = 2, T = 33, C = 96, OC = 150;
  auto inp = random_floats(size_t{B} * T * C, 1), w = random_floats(size_t{OC} * C, 2),
       bias = random_floats(OC, 3), dout = random_floats(size_t{B} * T * OC, 4);
  for (bool with_bias : {true, false}) {
    auto dw = random_floats(size_t{OC} * C, 5), db = random_floats(OC, 6);
    DeviceArray<float> di(inp), dwt(w), dbias(bias), ddout(dout), out(size_t{B} * T * OC),
        gdinp(inp.size()), gdw(dw), gdb(db);
    const float* bp = with_bias ? dbias.get() : nullptr;
    cu().f32.matmul_forward(out.get(), di.get(), dwt.get(), bp, B, T, C, OC, stream_);
    std::vector<float> ref(size_t{B} * T * OC);
    cpu::matmul_forward(ref.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, B, T,
                        C, OC);
    EXPECT_TRUE(close(out.download(), ref, kSum, 1e-5)) << "bias " << with_bias;
    cu().f32.matmul_backward(gdinp.get(), gdw.get(), with_bias ? gdb.get() : nullptr, ddout.get(),
                          di.get(), dwt.get(), B, T, C, OC, stream_);
    std::vector<float> rdinp(inp.size());
    cpu::matmul_backward(rdinp.data(), dw.data(), with_bias ? db.data() : nullptr, dout.data(),
                         inp.data(), w.data(), B, T, C, OC);
    EXPECT_TRUE(close(gdinp.download(), rdinp, kSum, 1e-5));
    EXPECT_TRUE(close(gdw.download(), dw, kSum, 1e-5));
    EXPECT_TRUE(close(gdb.download(), db, kSum, 1e-5));
  }
}

// Views into flat buffers are not 256-byte aligned: a 4-byte aligned bias takes the fallback
// (sgemm + add_bias), 4-byte aligned matrices take cuBLASLt with the alignment stated.
TEST_F(CudaKernels, MatmulForwardOnMisalignedViews) {
  const int B = 1, T = 19, C = 72, OC = 40;
  auto inp = random_floats(size_t{B} * T * C + 1, 1), w = random_floats(size_t{OC} * C + 1, 2),
       bias = random_floats(OC + 1, 3);
  std::vector<float> ref(size_t{B} * T * OC);
  cpu::matmul_forward(ref.data(), inp.data() + 1, w.data() + 1, bias.data() + 1, B, T, C, OC);
  DeviceArray<float> di(inp), dw(w), db(bias), out(ref.size() + 1);
  for (int shift_bias = 0; shift_bias < 2; shift_bias++) {
    std::vector<float> b2(bias.begin() + 1, bias.end());
    b2.insert(b2.begin(), shift_bias ? 1 : 0, 0.0f);  // the bias at offset 0 or 1
    b2.resize(bias.size());
    DeviceArray<float> dbias(b2);
    cu().f32.matmul_forward(out.get() + 1, di.get() + 1, dw.get() + 1, dbias.get() + shift_bias, B,
                         T, C, OC, stream_);
    auto got = out.download();
    EXPECT_TRUE(close(std::vector<float>(got.begin() + 1, got.end()), ref, kSum, 1e-5))
        << "bias offset " << shift_bias;
  }
}

TEST_F(CudaKernels, AddBias) {
  const int N = 45, OC = 70;
  auto out = random_floats(size_t{N} * OC, 1), bias = random_floats(OC, 2);
  DeviceArray<float> d(out), db(bias);
  cu().f32.add_bias(d.get(), db.get(), N, OC, stream_);
  cpu::add_bias(out.data(), bias.data(), N, OC);
  EXPECT_TRUE(close(d.download(), out, kTight, 0));
}

// Several shapes: head sizes below, at and not a multiple of the warp; T not a multiple of 64.
TEST_F(CudaKernels, AttentionForwardBackward) {
  struct Case {
    int B, T, C, NH;
  };
  for (const Case& c : {Case{2, 67, 48, 3}, Case{1, 130, 128, 2}, Case{2, 40, 160, 2},
                        Case{1, 64, 768, 12}}) {
    const int C3 = 3 * c.C;
    auto qkv = random_floats(size_t(c.B) * c.T * C3, 1), dout = random_floats(size_t(c.B) * c.T * c.C, 2);
    std::vector<float> out(size_t(c.B) * c.T * c.C), lse(size_t(c.B) * c.NH * c.T),
        dqkv(qkv.size()), scratch(cpu::attention_scratch_floats(c.T));
    cpu::attention_forward(out.data(), lse.data(), qkv.data(), scratch.data(), c.B, c.T, c.C, c.NH);
    cpu::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(),
                            scratch.data(), c.B, c.T, c.C, c.NH);
    DeviceArray<float> dq(qkv), ddout(dout), gout(out.size()), glse(lse.size()),
        gdqkv(qkv.size());
    cu().f32.attention_forward(gout.get(), glse.get(), dq.get(), nullptr, c.B, c.T, c.C, c.NH,
                            stream_);
    const std::string what = "B " + std::to_string(c.B) + " T " + std::to_string(c.T) + " C " +
                             std::to_string(c.C) + " NH " + std::to_string(c.NH);
    EXPECT_TRUE(close(gout.download(), out, kSum, 1e-5)) << what;
    EXPECT_TRUE(close(glse.download(), lse, kSum, 1e-5)) << what;
    // Backward from the CPU's saved out and lse, so only the backward is compared.
    DeviceArray<float> cout(out), clse(lse);
    cu().f32.attention_backward(gdqkv.get(), ddout.get(), dq.get(), cout.get(), clse.get(), nullptr,
                             c.B, c.T, c.C, c.NH, stream_);
    EXPECT_TRUE(close(gdqkv.download(), dqkv, 1e-3, 1e-4)) << what;
  }
}

TEST_F(CudaKernels, AttentionRejectsHugeHeads) {
  DeviceArray<float> buf(16);
  EXPECT_THROW(cu().f32.attention_forward(buf.get(), buf.get(), buf.get(), nullptr, 1, 1, 512, 1,
                                       stream_),
               ds::Error);
}

TEST_F(CudaKernels, GeluResidual) {
  const int64_t N = 100003;
  auto x = random_floats(N, 1, 3.0f), y = random_floats(N, 2), d = random_floats(N, 3);
  auto a1 = random_floats(N, 4), a2 = random_floats(N, 5);
  DeviceArray<float> dx(x), dy(y), dd(d), out(N), g1(a1), g2(a2);
  std::vector<float> ref(N);
  cu().f32.gelu_forward(out.get(), dx.get(), N, stream_);
  cpu::gelu_forward(ref.data(), x.data(), N);
  EXPECT_TRUE(close(out.download(), ref, kTight, 1e-6));
  cu().f32.gelu_backward(out.get(), dx.get(), dd.get(), N, stream_);
  cpu::gelu_backward(ref.data(), x.data(), d.data(), N);
  EXPECT_TRUE(close(out.download(), ref, kTight, 1e-6));
  cu().f32.residual_forward(out.get(), dx.get(), dy.get(), N, stream_);
  cpu::residual_forward(ref.data(), x.data(), y.data(), N);
  EXPECT_TRUE(close(out.download(), ref, 0, 0));
  cu().f32.residual_backward(g1.get(), g2.get(), dd.get(), N, stream_);
  cpu::residual_backward(a1.data(), a2.data(), d.data(), N);
  EXPECT_TRUE(close(g1.download(), a1, 0, 0));
  EXPECT_TRUE(close(g2.download(), a2, 0, 0));
}

TEST_F(CudaKernels, CrossEntropyForwardBackwardWithABadTarget) {
  const int N = 7, V = 1000, Vp = 1024;
  auto logits = random_floats(size_t{N} * Vp, 1, 3.0f);
  auto targets = random_tokens(N, 2, V);
  targets[3] = V;  // invalid: NaN loss, counted
  DeviceArray<float> dl(logits), losses(N);
  DeviceArray<int32_t> dt(targets), bad(1);
  std::vector<float> rl(N);
  cu().f32.crossentropy_forward(losses.get(), dl.get(), dt.get(), N, V, Vp, bad.get(), stream_);
  EXPECT_EQ(cpu::crossentropy_forward(rl.data(), logits.data(), targets.data(), N, V, Vp), 1);
  EXPECT_TRUE(close(losses.download(), rl, kSum, 1e-5));
  EXPECT_EQ(bad.download()[0], 1);
  cu().f32.crossentropy_softmax_backward(losses.get(), dl.get(), dt.get(), 0.25f, N, V, Vp, bad.get(),
                                      stream_);
  cpu::crossentropy_softmax_backward(rl.data(), logits.data(), targets.data(), 0.25f, N, V, Vp);
  EXPECT_TRUE(close(losses.download(), rl, kSum, 1e-5));
  EXPECT_TRUE(close(dl.download(), logits, kSum, 1e-7));
  EXPECT_EQ(bad.download()[0], 2);
}

// Loss masks: a target of -1 (kIgnoreTarget) has loss 0 and zero dlogits and is not counted as
// bad, in the fused kernel and the vocabulary-parallel phases, as on the CPU.
TEST_F(CudaKernels, CrossEntropyIgnoredTargets) {
  const int N = 6, V = 1000, Vp = 1024;
  auto logits = random_floats(size_t{N} * Vp, 1, 3.0f);
  auto targets = random_tokens(N, 2, V);
  targets[1] = targets[4] = -1;
  DeviceArray<float> dl(logits), losses(N);
  DeviceArray<int32_t> dt(targets), bad(1);
  std::vector<float> rl(N);
  cu().f32.crossentropy_softmax_backward(losses.get(), dl.get(), dt.get(), 0.25f, N, V, Vp, bad.get(),
                                      stream_);
  EXPECT_EQ(cpu::crossentropy_softmax_backward(rl.data(), logits.data(), targets.data(), 0.25f, N, V, Vp), 0);
  EXPECT_EQ(bad.download()[0], 0);
  EXPECT_EQ(rl[1], 0.0f);
  EXPECT_TRUE(close(losses.download(), rl, kSum, 1e-5));
  EXPECT_TRUE(close(dl.download(), logits, kSum, 1e-7));
  const int v0 = 512, Vl = 512;  // the second half of the vocabulary
  auto shard = random_floats(size_t{N} * Vl, 3, 2.0f);
  DeviceArray<float> ds(shard), mx(N), se(N), tl(N), vl(N);
  std::vector<float> rmx(N), rse(N), rtl(N), rvl(N);
  cu().f32.vocab_ce_max(mx.get(), ds.get(), N, Vl, v0, V, stream_);
  cpu::vocab_ce_max(rmx.data(), shard.data(), N, Vl, v0, V);
  cu().f32.vocab_ce_sums(se.get(), tl.get(), ds.get(), mx.get(), dt.get(), N, Vl, v0, V, stream_);
  cpu::vocab_ce_sums(rse.data(), rtl.data(), shard.data(), rmx.data(), targets.data(), N, Vl, v0, V);
  cu().f32.vocab_ce_finish(vl.get(), ds.get(), mx.get(), se.get(), tl.get(), dt.get(), 0.5f, N, Vl, v0, V, stream_);
  cpu::vocab_ce_finish(rvl.data(), shard.data(), rmx.data(), rse.data(), rtl.data(), targets.data(), 0.5f, N, Vl, v0, V);
  EXPECT_EQ(rvl[4], 0.0f);
  EXPECT_TRUE(close(vl.download(), rvl, kSum, 1e-5));
  EXPECT_TRUE(close(ds.download(), shard, kSum, 1e-7));
}

TEST_F(CudaKernels, VocabParallelCrossEntropyPhases) {
  // One shard of a vocabulary of 100 split in 64-column shards: this rank holds [64, 128), of
  // which only [64, 100) are real.
  const int N = 5, V = 100, v0 = 64, Vl = 64;
  auto logits = random_floats(size_t{N} * Vl, 1, 2.0f);
  auto targets = random_tokens(N, 2, V);
  targets[0] = 70;  // at least one target on this shard
  DeviceArray<float> dl(logits), mx(N), se(N), tl(N), losses(N);
  DeviceArray<int32_t> dt(targets);
  std::vector<float> rmx(N), rse(N), rtl(N), rl(N);
  cu().f32.vocab_ce_max(mx.get(), dl.get(), N, Vl, v0, V, stream_);
  cpu::vocab_ce_max(rmx.data(), logits.data(), N, Vl, v0, V);
  EXPECT_TRUE(close(mx.download(), rmx, 0, 0));
  cu().f32.vocab_ce_sums(se.get(), tl.get(), dl.get(), mx.get(), dt.get(), N, Vl, v0, V, stream_);
  cpu::vocab_ce_sums(rse.data(), rtl.data(), logits.data(), rmx.data(), targets.data(), N, Vl, v0,
                     V);
  EXPECT_TRUE(close(se.download(), rse, kSum, 0));
  EXPECT_TRUE(close(tl.download(), rtl, 0, 0));
  cu().f32.vocab_ce_finish(losses.get(), nullptr, mx.get(), se.get(), tl.get(), dt.get(), 0.5f, N, Vl,
                        v0, V, stream_);
  cu().f32.vocab_ce_finish(losses.get(), dl.get(), mx.get(), se.get(), tl.get(), dt.get(), 0.5f, N,
                        Vl, v0, V, stream_);
  cpu::vocab_ce_finish(rl.data(), logits.data(), rmx.data(), rse.data(), rtl.data(),
                       targets.data(), 0.5f, N, Vl, v0, V);
  EXPECT_TRUE(close(losses.download(), rl, kSum, 1e-5));
  EXPECT_TRUE(close(dl.download(), logits, kSum, 1e-7));
}

TEST_F(CudaKernels, ConversionsBitExact) {
  auto x = random_floats(70001, 1, 100.0f);
  x[0] = 0.0f;
  x[1] = -0.0f;
  x[2] = INFINITY;
  x[3] = 1e-40f;  // denormal
  x[4] = 65504.0f;
  x[5] = 1e6f;  // fp16 overflow -> inf
  const auto n = static_cast<int64_t>(x.size());
  DeviceArray<float> dx(x), back(x.size());
  DeviceArray<uint16_t> h(x.size());
  std::vector<uint16_t> rh(x.size());
  std::vector<float> rback(x.size());
  cu().convert_f32_to_bf16(h.get(), dx.get(), n, stream_);
  cpu::convert_f32_to_bf16(rh.data(), x.data(), n);
  EXPECT_EQ(h.download(), rh);
  cu().convert_bf16_to_f32(back.get(), h.get(), n, stream_);
  cpu::convert_bf16_to_f32(rback.data(), rh.data(), n);
  EXPECT_TRUE(close(back.download(), rback, 0, 0));
  cu().convert_f32_to_f16(h.get(), dx.get(), n, stream_);
  cpu::convert_f32_to_f16(rh.data(), x.data(), n);
  EXPECT_EQ(h.download(), rh);
  cu().convert_f16_to_f32(back.get(), h.get(), n, stream_);
  cpu::convert_f16_to_f32(rback.data(), rh.data(), n);
  EXPECT_TRUE(close(back.download(), rback, 0, 0));
}

TEST_F(CudaKernels, AdamWMatchesTheCpuOptimizer) {
  const int64_t n = 50000;
  for (bool adam_w_mode : {true, false}) {
    for (bool decay : {true, false}) {
      optim::AdamWConfig cfg;
      cfg.weight_decay = 0.1;
      cfg.adam_w_mode = adam_w_mode;
      auto p = random_floats(n, 1), g = random_floats(n, 2), m = random_floats(n, 3, 0.1f);
      auto v = random_floats(n, 4, 0.1f);
      for (auto& e : v) e = e * e;
      DeviceArray<float> dp(p), dg(g), dm(m), dv(v);
      DeviceArray<uint16_t> pb(n);
      for (int64_t step = 1; step <= 3; step++) {
        const auto s = optim::adamw_step_scalars(cfg, step, 3e-3, 0.5);
        const kern::AdamWStep& cs = s;
        cu().adamw_update(cs, dp.get(), dg.get(), dm.get(), dv.get(), n, decay, pb.get(), stream_);
        cpu::adamw_update(s, p.data(), g.data(), m.data(), v.data(), n, decay);
      }
      EXPECT_TRUE(close(dp.download(), p, kTight, 1e-7)) << adam_w_mode << decay;
      EXPECT_TRUE(close(dm.download(), m, kTight, 1e-8));
      EXPECT_TRUE(close(dv.download(), v, kTight, 1e-10));
      EXPECT_TRUE(close(from_bf16(pb.download()), rounded(p), 1e-2, 1e-6));
    }
  }
}

// ---- bf16 storage variants: CPU fp32 kernels on the same bf16-rounded inputs ----

TEST_F(CudaKernels, Bf16EncoderLayernormGeluResidual) {
  const int B = 2, T = 11, C = 96, V = 20;
  auto inp = random_tokens(size_t{B} * T, 1, V);
  auto wte = rounded(random_floats(size_t{V} * C, 2)), wpe = rounded(random_floats(size_t{T} * C, 3));
  DeviceArray<int32_t> dinp(inp);
  DeviceArray<uint16_t> bwte(to_bf16(wte)), bwpe(to_bf16(wpe)), bout(size_t{B} * T * C);
  cu().bf16_fp32_grads.encoder_forward(bout.bf(), dinp.get(), bwte.bf(), bwpe.bf(), B, T, C, stream_);
  std::vector<float> enc(size_t{B} * T * C);
  cpu::encoder_forward(enc.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
  EXPECT_TRUE(close(from_bf16(bout.download()), enc, kBf16, 1e-2));

  auto dout = rounded(random_floats(size_t{B} * T * C, 4));
  DeviceArray<uint16_t> bdout(to_bf16(dout));
  DeviceArray<float> gwte(size_t{V} * C), gwpe(size_t{T} * C);
  std::vector<float> rwte(size_t{V} * C), rwpe(size_t{T} * C);
  cu().bf16_fp32_grads.encoder_backward(gwte.get(), gwpe.get(), bdout.bf(), dinp.get(), B, T, C, stream_);
  cpu::encoder_backward(rwte.data(), rwpe.data(), dout.data(), inp.data(), B, T, C);
  EXPECT_TRUE(close(gwte.download(), rwte, kSum, 1e-5));
  EXPECT_TRUE(close(gwpe.download(), rwpe, kSum, 1e-5));

  auto x = rounded(random_floats(size_t{B} * T * C, 5, 2.0f)), w = rounded(random_floats(C, 6)),
       b = rounded(random_floats(C, 7));
  DeviceArray<uint16_t> bx(to_bf16(x)), bw(to_bf16(w)), bb(to_bf16(b)), bln(x.size()),
      bdx(x.size());
  DeviceArray<float> mean(size_t{B} * T), rstd(size_t{B} * T), gw(C), gb(C);
  cu().bf16_fp32_grads.layernorm_forward(bln.bf(), mean.get(), rstd.get(), bx.bf(), bw.bf(), bb.bf(), B,
                               T, C, stream_);
  std::vector<float> ln(x.size()), rm(size_t{B} * T), rr(size_t{B} * T), rdx(x.size()), rw(C),
      rb(C);
  cpu::layernorm_forward(ln.data(), rm.data(), rr.data(), x.data(), w.data(), b.data(), B, T, C);
  EXPECT_TRUE(close(from_bf16(bln.download()), ln, kBf16, 2e-2));
  EXPECT_TRUE(close(rstd.download(), rr, kSum, 0));
  cu().bf16_fp32_grads.layernorm_backward(bdx.bf(), gw.get(), gb.get(), bdout.bf(), bx.bf(), bw.bf(),
                                mean.get(), rstd.get(), B, T, C, stream_);
  cpu::layernorm_backward(rdx.data(), rw.data(), rb.data(), dout.data(), x.data(), w.data(),
                          rm.data(), rr.data(), B, T, C);
  EXPECT_TRUE(close(from_bf16(bdx.download()), rdx, kBf16, 2e-2));
  EXPECT_TRUE(close(gw.download(), rw, 1e-3, 1e-4));
  EXPECT_TRUE(close(gb.download(), rb, 1e-3, 1e-4));

  const auto n = static_cast<int64_t>(x.size());
  std::vector<float> ref(x.size());
  cu().bf16_fp32_grads.gelu_forward(bln.bf(), bx.bf(), n, stream_);
  cpu::gelu_forward(ref.data(), x.data(), n);
  EXPECT_TRUE(close(from_bf16(bln.download()), ref, kBf16, 1e-2));
  cu().bf16_fp32_grads.gelu_backward(bln.bf(), bx.bf(), bdout.bf(), n, stream_);
  cpu::gelu_backward(ref.data(), x.data(), dout.data(), n);
  EXPECT_TRUE(close(from_bf16(bln.download()), ref, kBf16, 1e-2));
  cu().bf16_fp32_grads.residual_forward(bln.bf(), bx.bf(), bdout.bf(), n, stream_);
  cpu::residual_forward(ref.data(), x.data(), dout.data(), n);
  EXPECT_TRUE(close(from_bf16(bln.download()), ref, kBf16, 1e-2));
  auto a1 = x, a2 = dout;
  DeviceArray<uint16_t> r1(to_bf16(a1)), r2(to_bf16(a2));
  cu().bf16_fp32_grads.residual_backward(r1.bf(), r2.bf(), bdout.bf(), 0, stream_);  // N = 0: no-op
  cu().bf16_fp32_grads.residual_backward(r1.bf(), r2.bf(), bdout.bf(), n, stream_);
  cpu::residual_backward(a1.data(), a2.data(), dout.data(), n);
  EXPECT_TRUE(close(from_bf16(r1.download()), a1, kBf16, 1e-2));
  EXPECT_TRUE(close(from_bf16(r2.download()), a2, kBf16, 1e-2));
}

// The memory-bound kernels read 16-byte packs where a row's width is a multiple of the pack and
// every pointer is aligned (device_util.cuh); the tests above take that path. Here the other:
// rows of 100 bf16, buffers one element past an alignment, a padded vocabulary of 300, a bias
// of 70 fp32. Same CPU references, same tolerances.
TEST_F(CudaKernels, Bf16KernelsOffThePackedPath) {
  const int B = 1, T = 9, C = 100;
  auto x = rounded(random_floats(size_t{B} * T * C, 1, 2.0f)), w = rounded(random_floats(C, 2)),
       b = rounded(random_floats(C, 3)), dout = rounded(random_floats(size_t{B} * T * C, 4));
  DeviceArray<uint16_t> bx(to_bf16(x)), bw(to_bf16(w)), bb(to_bf16(b)), bdout(to_bf16(dout)), bln(x.size()),
      bdx(x.size());
  DeviceArray<float> mean(size_t{B} * T), rstd(size_t{B} * T), gw(C), gb(C);
  std::vector<float> ln(x.size()), rm(size_t{B} * T), rr(size_t{B} * T), rdx(x.size()), rw(C), rb(C);
  cu().bf16_fp32_grads.layernorm_forward(bln.bf(), mean.get(), rstd.get(), bx.bf(), bw.bf(), bb.bf(), B, T, C, stream_);
  cpu::layernorm_forward(ln.data(), rm.data(), rr.data(), x.data(), w.data(), b.data(), B, T, C);
  EXPECT_TRUE(close(from_bf16(bln.download()), ln, kBf16, 2e-2));
  EXPECT_TRUE(close(rstd.download(), rr, kSum, 0));
  cu().bf16_fp32_grads.layernorm_backward(bdx.bf(), gw.get(), gb.get(), bdout.bf(), bx.bf(), bw.bf(), mean.get(),
                                rstd.get(), B, T, C, stream_);
  cpu::layernorm_backward(rdx.data(), rw.data(), rb.data(), dout.data(), x.data(), w.data(), rm.data(), rr.data(),
                          B, T, C);
  EXPECT_TRUE(close(from_bf16(bdx.download()), rdx, kBf16, 2e-2));
  EXPECT_TRUE(close(gw.download(), rw, 1e-3, 1e-4));

  // Element-wise, one element past the allocation's alignment.
  const int64_t n = static_cast<int64_t>(x.size()) - 1;
  auto tail = [](const std::vector<uint16_t>& v) { return from_bf16(std::vector<uint16_t>(v.begin() + 1, v.end())); };
  std::vector<float> ref(n);
  cu().bf16_fp32_grads.gelu_forward(bln.bf() + 1, bx.bf() + 1, n, stream_);
  cpu::gelu_forward(ref.data(), x.data() + 1, n);
  EXPECT_TRUE(close(tail(bln.download()), ref, kBf16, 1e-2));
  cu().bf16_fp32_grads.gelu_backward(bln.bf() + 1, bx.bf() + 1, bdout.bf() + 1, n, stream_);
  cpu::gelu_backward(ref.data(), x.data() + 1, dout.data() + 1, n);
  EXPECT_TRUE(close(tail(bln.download()), ref, kBf16, 1e-2));
  cu().bf16_fp32_grads.residual_forward(bln.bf() + 1, bx.bf() + 1, bdout.bf() + 1, n, stream_);
  cpu::residual_forward(ref.data(), x.data() + 1, dout.data() + 1, n);
  EXPECT_TRUE(close(tail(bln.download()), ref, kBf16, 1e-2));

  // Cross-entropy over rows of 300 (not a multiple of 8).
  const int N = 5, V = 290, Vp = 300;
  auto logits = rounded(random_floats(size_t{N} * Vp, 5, 3.0f));
  auto targets = random_tokens(N, 6, V);
  DeviceArray<uint16_t> bl(to_bf16(logits));
  DeviceArray<int32_t> dt(targets);
  DeviceArray<float> losses(N);
  std::vector<float> rl(N);
  cu().bf16_fp32_grads.crossentropy_softmax_backward(losses.get(), bl.bf(), dt.get(), 1.0f / N, N, V, Vp, nullptr, stream_);
  cpu::crossentropy_softmax_backward(rl.data(), logits.data(), targets.data(), 1.0f / N, N, V, Vp);
  EXPECT_TRUE(close(losses.download(), rl, 1e-4, 1e-4));
  EXPECT_TRUE(close(from_bf16(bl.download()), logits, kBf16, 1e-4));

  // fp32 bias rows of 72 (packed) beside the 70 of AddBias (one element).
  const int rows = 45, OC = 72;
  auto out = random_floats(size_t{rows} * OC, 7), bias = random_floats(OC, 8);
  DeviceArray<float> d(out), db(bias);
  cu().f32.add_bias(d.get(), db.get(), rows, OC, stream_);
  cpu::add_bias(out.data(), bias.data(), rows, OC);
  EXPECT_TRUE(close(d.download(), out, kTight, 0));
}

TEST_F(CudaKernels, Bf16CrossEntropyAndAdamW) {
  const int N = 6, V = 500, Vp = 512;
  auto logits = rounded(random_floats(size_t{N} * Vp, 1, 3.0f));
  auto targets = random_tokens(N, 2, V);
  DeviceArray<uint16_t> bl(to_bf16(logits));
  DeviceArray<int32_t> dt(targets);
  DeviceArray<float> losses(N);
  std::vector<float> rl(N);
  cu().bf16_fp32_grads.crossentropy_forward(losses.get(), bl.bf(), dt.get(), N, V, Vp, nullptr, stream_);
  cpu::crossentropy_forward(rl.data(), logits.data(), targets.data(), N, V, Vp);
  EXPECT_TRUE(close(losses.download(), rl, 1e-4, 1e-4));
  cu().bf16_fp32_grads.crossentropy_softmax_backward(losses.get(), bl.bf(), dt.get(), 1.0f / N, N, V, Vp,
                                           nullptr, stream_);
  cpu::crossentropy_softmax_backward(rl.data(), logits.data(), targets.data(), 1.0f / N, N, V, Vp);
  EXPECT_TRUE(close(losses.download(), rl, 1e-4, 1e-4));
  EXPECT_TRUE(close(from_bf16(bl.download()), logits, kBf16, 1e-4));

  const int64_t n = 4099;
  auto p = random_floats(n, 3), g = rounded(random_floats(n, 4));
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  DeviceArray<float> dp(p), dm(m), dv(v);
  DeviceArray<uint16_t> bg(to_bf16(g)), pb(n);
  optim::AdamWConfig cfg;
  const auto s = optim::adamw_step_scalars(cfg, 1, 1e-3);
  const kern::AdamWStep& cs = s;
  cu().adamw_update_bf16_grads(cs, dp.get(), bg.get(), dm.get(), dv.get(), n, true, pb.get(),
                                stream_);
  cpu::adamw_update(s, p.data(), g.data(), m.data(), v.data(), n, true);
  EXPECT_TRUE(close(dp.download(), p, kTight, 1e-7));
  EXPECT_TRUE(close(from_bf16(pb.download()), rounded(p), 1e-2, 1e-6));
}

TEST_F(CudaKernels, SumOfSquaresAndScaleMatchTheCpu) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{3000001}}) {
    auto x = random_floats(static_cast<size_t>(n), 5, 3.0f);
    DeviceArray<float> dx(x);
    DeviceArray<double> out(1), scratch(cuda::kSumSquaresBlocks);
    cu().sum_of_squares(out.get(), scratch.get(), dx.get(), n, stream_);
    const double ref = cpu::sum_of_squares(x.data(), n);
    EXPECT_NEAR(out.download()[0], ref, 1e-12 * (ref + 1)) << "n " << n;
    // Deterministic: the same bits again.
    const double first = out.download()[0];
    cu().sum_of_squares(out.get(), scratch.get(), dx.get(), n, stream_);
    EXPECT_EQ(out.download()[0], first);
    cu().f32.scale_in_place(dx.get(), n, 0.5f, stream_);
    cpu::scale_in_place(x.data(), n, 0.5f);
    EXPECT_TRUE(close(dx.download(), x, 0, 0));
  }
  std::vector<float> bad = {1.0f, INFINITY, 2.0f};
  DeviceArray<float> db(bad);
  DeviceArray<double> out(1), scratch(cuda::kSumSquaresBlocks);
  cu().sum_of_squares(out.get(), scratch.get(), db.get(), 3, stream_);
  EXPECT_FALSE(std::isfinite(out.download()[0]));
}

TEST_F(CudaKernels, DispatchRoutesToCudaInsideADeviceScope) {
  const int64_t N = 1000;
  auto a = random_floats(N, 1), b = random_floats(N, 2);
  std::vector<float> ref(N);
  kern::residual_forward(ref.data(), a.data(), b.data(), N);  // no scope: the CPU kernel
  DeviceArray<float> da(a), db(b), out(N);
  {
    kern::DeviceScope scope(Device::kCuda, stream_);
    EXPECT_EQ(kern::attention_scratch_floats(64), 0u);
    kern::residual_forward(out.get(), da.get(), db.get(), N);
  }
  EXPECT_TRUE(close(out.download(), ref, 0, 0));
  EXPECT_EQ(kern::kernel_context().device, Device::kCpu);  // restored
}

// What ZeRO, the pipeline's hooks and the trainer do to flat buffers, through the dispatch inside
// a CUDA scope, against the same calls on the CPU: in-place add, storage rounding (bit-exact),
// device copies (also to and from pinned host memory), the sum of squares returned to the host,
// AdamW over decay runs, and the current CUDA stream the NCCL backend orders after.
TEST_F(CudaKernels, EngineAndTrainerOpsMatchTheCpu) {
  const int64_t n = 70001;
  auto a = random_floats(n, 11, 3.0f), b = random_floats(n, 12);
  a[0] = INFINITY;
  a[1] = 1e-40f;
  auto ra = a;
  cpu::add_in_place(ra.data(), b.data(), n);
  auto rbf = ra, rf16 = ra;
  cpu::round_to_bf16_in_place(rbf.data(), n);
  cpu::round_to_f16_in_place(rf16.data(), n);
  DeviceArray<float> da(a), db(b), dc(static_cast<size_t>(n));
  {
    kern::DeviceScope scope(Device::kCuda, stream_);
    EXPECT_EQ(cu().current_stream(), static_cast<void*>(stream_));
    kern::add_in_place(da.get(), db.get(), n);
    kern::copy(dc.get(), da.get(), static_cast<size_t>(n) * sizeof(float));
  }
  EXPECT_EQ(cu().current_stream(), nullptr);  // restored with the scope
  EXPECT_TRUE(close(da.download(), ra, 0, 0));
  EXPECT_TRUE(close(dc.download(), ra, 0, 0));
  {
    kern::DeviceScope scope(Device::kCuda, stream_);
    kern::round_to_bf16_in_place(da.get(), n);
    kern::round_to_f16_in_place(dc.get(), n);
  }
  EXPECT_TRUE(close(da.download(), rbf, 0, 0));
  EXPECT_TRUE(close(dc.download(), rf16, 0, 0));

  // Pinned host memory on either side of kern::copy (ZeRO-Offload's master weights).
  Allocator alloc;
  Buffer pinned = alloc.allocate(static_cast<size_t>(n) * sizeof(float), MemTag::kOptimizer,
                                 "test pinned", Device::kCudaHost);
  EXPECT_EQ(alloc.stats().pinned_current, n * 4);
  EXPECT_EQ(alloc.current(MemTag::kOptimizer), 0);  // counted apart from the tags
  {
    kern::DeviceScope scope(Device::kCuda, stream_);
    kern::copy(pinned.data(), db.get(), static_cast<size_t>(n) * sizeof(float));
    kern::copy_to_host(pinned.data(), db.get(), static_cast<size_t>(n) * sizeof(float));
  }
  EXPECT_TRUE(close(std::vector<float>(pinned.as<float>(), pinned.as<float>() + n), b, 0, 0));

  // The sum of squares back on the host, deterministic; AdamW over decay runs.
  auto g = random_floats(n, 13), p = random_floats(n, 14), m = random_floats(n, 15, 0.1f);
  std::vector<float> v(static_cast<size_t>(n), 0.01f);
  const double ref_ss = cpu::sum_of_squares(g.data(), n);
  const std::vector<optim::DecayRange> decay = {{100, 30000, true}, {40000, 20000, true}};
  optim::AdamWConfig ac;
  ac.weight_decay = 0.1;
  const auto st = optim::adamw_step_scalars(ac, 3, 1e-3, 0.5);
  auto rp = p, rm = m, rv = v;
  cpu::adamw_update_partition(st, rp.data(), g.data(), rm.data(), rv.data(), 50, n, decay);
  DeviceArray<float> dg(g), dp(p), dm(m), dv(v);
  double ss = 0, ss2 = 0;
  {
    kern::DeviceScope scope(Device::kCuda, stream_);
    ss = kern::sum_of_squares(dg.get(), n);
    ss2 = kern::sum_of_squares(dg.get(), n);
    kern::adamw_update_partition(st, dp.get(), dg.get(), dm.get(), dv.get(), 50, n, decay);
  }
  EXPECT_NEAR(ss, ref_ss, 1e-12 * ref_ss);
  EXPECT_EQ(ss, ss2);
  EXPECT_TRUE(close(dp.download(), rp, kTight, 1e-7));
  EXPECT_TRUE(close(dm.download(), rm, kTight, 1e-7));
  EXPECT_TRUE(close(dv.download(), rv, kTight, 1e-9));
}

// What a GPU step synchronises on (training.sync_loss_once, sync_norm_once): the per-token
// losses summed into the thread's loss slots and brought back in one copy equal the host's
// double sum of the same floats; the sums of squares of several spans in one copy equal each
// span's sum_of_squares_to_host bit for bit, at fp32 and bf16.
TEST_F(CudaKernels, LossSlotsAndBatchedSumsOfSquares) {
  const int64_t n = 8192;
  std::vector<std::vector<float>> losses;
  for (uint32_t k = 0; k < 5; ++k) losses.push_back(random_floats(static_cast<size_t>(n), 40 + k, 4.0f));
  std::vector<std::unique_ptr<DeviceArray<float>>> dl;
  for (const auto& l : losses) dl.push_back(std::make_unique<DeviceArray<float>>(l));
  std::vector<double> back(losses.size(), -1.0);
  {
    kern::DeviceScope scope(Device::kCuda, stream_);
    for (size_t k = 0; k < losses.size(); ++k) kern::loss_sum_to_slot(dl[k]->get(), n, static_cast<int>(k));
    kern::loss_slots_to_host(back.data(), static_cast<int>(losses.size()));
  }
  for (size_t k = 0; k < losses.size(); ++k) {
    double ref = 0;
    for (float x : losses[k]) ref += x;
    EXPECT_NEAR(back[k], ref, 1e-12 * (std::fabs(ref) + n)) << "slot " << k;
  }
  EXPECT_THROW(cu().loss_sum_to_slot(dl[0]->get(), n, cuda::kLossSlots, stream_), Error);

  auto g = random_floats(300001, 50, 2.0f);
  DeviceArray<float> dg(g);
  DeviceArray<uint16_t> dh(to_bf16(g));
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 1000}, {1000, 0}, {5000, 295001}, {7, 3}};
  std::vector<const float*> xs;
  std::vector<const bf16*> hs;
  std::vector<int64_t> ns;
  for (const auto& [off, len] : ranges) {
    xs.push_back(dg.get() + off);
    hs.push_back(reinterpret_cast<const bf16*>(dh.get()) + off);
    ns.push_back(len);
  }
  std::vector<double> batched(ranges.size()), batched_h(ranges.size());
  cu().f32.sums_of_squares_to_host(batched.data(), xs.data(), ns.data(), static_cast<int>(ranges.size()), stream_);
  cu().bf16.sums_of_squares_to_host(batched_h.data(), hs.data(), ns.data(), static_cast<int>(ranges.size()), stream_);
  for (size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_EQ(batched[i], cu().f32.sum_of_squares_to_host(xs[i], ns[i], stream_)) << "range " << i;
    EXPECT_EQ(batched_h[i], cu().bf16.sum_of_squares_to_host(hs[i], ns[i], stream_)) << "range " << i;
    EXPECT_NEAR(batched[i], cpu::sum_of_squares(g.data() + ranges[i].first, ns[i]), 1e-12 * (batched[i] + 1));
  }
}

}  // namespace
}  // namespace ds::rt
