// Flash attention on the tensor cores (kernels/cuda/flash_attention.cu) against the exact
// warp-per-row kernels (the reference, AttentionKernel::kExact) and the CPU, at the attention
// shapes of every config in configs/ and at awkward ones (T not a multiple of the 64-row tile,
// T = 1, multi-query, head sizes 16 to 128):
//   - forward: out within 2e-2 relative (bf16 storage; flash rounds P to bf16 before P V, the exact
//     kernel does not) + 1e-2 absolute; lse within 1e-4 + 1e-4 (fp32 either way);
//   - backward from the same saved out and lse: dqkv within 2e-2 of the largest gradient element
//     (P and dS enter the products rounded to bf16 on the flash side);
//   - deterministic: a second run gives the same bits; the bf16 attention entry points (GPT-2's
//     attention_forward/backward<bf16>, Llama's attention_gqa_*_bf16) run flash by default and the
//     exact kernels under kExact, for head sizes flash does not take, and on misaligned buffers.
// Skips itself without a GPU.
#include <gtest/gtest.h>
#include <omp.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "core/dtype.h"
#include "gpu/cuda_test_util.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cuda_kernel_table.h"

namespace ds::rt {
namespace {

using test::close;
using test::from_bf16;
using test::to_bf16;
using test::cu;
using test::DeviceArray;
using test::random_floats;

constexpr double kB = 2e-2;

bf16* b16(uint16_t* p) { return reinterpret_cast<bf16*>(p); }

class FlashAttention : public test::CudaStreamTest {
 protected:
  void SetUp() override {
    test::CudaStreamTest::SetUp();
    omp_set_num_threads(2);
  }
};

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

struct Case {
  const char* what;
  int B, T, NH, KV, hd;
  size_t qkv() const { return static_cast<size_t>(B) * T * (NH + 2 * KV) * hd; }
  size_t out() const { return static_cast<size_t>(B) * T * NH * hd; }
  size_t lse() const { return static_cast<size_t>(B) * NH * T; }
  std::string name() const {
    return std::string(what) + " B" + std::to_string(B) + " T" + std::to_string(T) + " NH" + std::to_string(NH) +
           " KV" + std::to_string(KV) + " hd" + std::to_string(hd);
  }
};

// The attention of every config (configs/*.json: model.n_head, n_kv_head, n_embd / n_head,
// seq_len) and awkward shapes.
const Case kCases[] = {
    {"gpt2-124m / 350m (hd 64)", 1, 1024, 12, 12, 64},
    {"gpt2-small-*", 2, 256, 6, 6, 64},
    {"gpt2-tiny, gpu-smoke-*", 2, 128, 4, 4, 32},
    {"gpu-smoke-tp2 (per rank)", 2, 128, 2, 2, 32},
    {"llama-tiny-cpu", 2, 128, 4, 2, 32},
    {"llama3-8b", 1, 8192, 32, 8, 128},
    {"T past a tile, hd 80, MQA", 1, 100, 2, 1, 80},
    {"T = 1, hd 16", 3, 1, 2, 2, 16},
    {"T = 65, hd 96", 1, 65, 4, 4, 96},
    {"T = 130, hd 128, MQA", 2, 130, 4, 1, 128},
};

struct Result {
  std::vector<uint16_t> out, dqkv;
  std::vector<float> lse;
};

// The Llama entry points under `kernel` on the same inputs; the backward reads `saved_out` and
// `saved_lse` (the reference's forward), so only the backward differs between kernels.
Result run(const Case& c, cuda::AttentionKernel kernel, const DeviceArray<uint16_t>& qkv,
           const DeviceArray<uint16_t>& dout, const std::vector<uint16_t>* saved_out,
           const std::vector<float>* saved_lse, cudaStream_t stream) {
  const kern::ScopedCudaAttentionKernel scope(kernel);
  DeviceArray<uint16_t> out(c.out()), dqkv(c.qkv());
  DeviceArray<float> lse(c.lse());
  cu().bf16.attention_gqa_forward(b16(out.get()), lse.get(), b16(qkv.get()), nullptr, c.B, c.T, c.NH, c.KV, c.hd, stream);
  Result r{out.download(), {}, lse.download()};
  if (saved_out != nullptr) {
    out.upload(*saved_out);
    lse.upload(*saved_lse);
  }
  cu().bf16.attention_gqa_backward(b16(dqkv.get()), b16(dout.get()), b16(qkv.get()), b16(out.get()), lse.get(), nullptr, c.B, c.T,
                                     c.NH, c.KV, c.hd, stream);
  r.dqkv = dqkv.download();
  return r;
}

TEST_F(FlashAttention, MatchesTheExactKernelAtEveryConfigsShape) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name());
    ASSERT_TRUE(cu().flash_attention_supported(c.hd));
    DeviceArray<uint16_t> qkv(to_bf16(random_floats(c.qkv(), 1))), dout(to_bf16(random_floats(c.out(), 2)));
    const Result exact = run(c, cuda::AttentionKernel::kExact, qkv, dout, nullptr, nullptr, stream_);
    const Result flash = run(c, cuda::AttentionKernel::kFlash, qkv, dout, &exact.out, &exact.lse, stream_);
    EXPECT_TRUE(close(from_bf16(flash.out), from_bf16(exact.out), kB, 1e-2));
    EXPECT_TRUE(close(flash.lse, exact.lse, 1e-4, 1e-4));
    const auto ref = from_bf16(exact.dqkv);
    EXPECT_TRUE(close(from_bf16(flash.dqkv), ref, kB, kB * max_abs(ref)));
    // The same bits again: no atomics, a fixed summation order.
    const Result again = run(c, cuda::AttentionKernel::kFlash, qkv, dout, &exact.out, &exact.lse, stream_);
    EXPECT_EQ(again.out, flash.out);
    EXPECT_EQ(again.lse, flash.lse);
    EXPECT_EQ(again.dqkv, flash.dqkv);
  }
}

// Against the CPU's bf16 attention (itself checked against an fp32 GEMM in the unit tests):
// forward from the same inputs, backward from the CPU's saved forward.
TEST_F(FlashAttention, MatchesTheCpu) {
  for (const Case& c : {Case{"gqa", 2, 100, 4, 2, 64}, Case{"mha", 1, 150, 3, 3, 32}}) {
    SCOPED_TRACE(c.name());
    auto qkv = to_bf16(random_floats(c.qkv(), 3)), dout = to_bf16(random_floats(c.out(), 4));
    std::vector<uint16_t> out(c.out()), dqkv(c.qkv());
    std::vector<float> lse(c.lse()), scratch(cpu::attention_scratch_floats(c.T, c.hd, 2));
    auto* bq = reinterpret_cast<bf16*>(qkv.data());
    cpu::attention_gqa_forward(reinterpret_cast<bf16*>(out.data()), lse.data(), bq, scratch.data(), c.B, c.T, c.NH,
                               c.KV, c.hd);
    cpu::attention_gqa_backward(reinterpret_cast<bf16*>(dqkv.data()), reinterpret_cast<bf16*>(dout.data()), bq,
                                reinterpret_cast<bf16*>(out.data()), lse.data(), scratch.data(), c.B, c.T, c.NH,
                                c.KV, c.hd);
    DeviceArray<uint16_t> gq(qkv), gd(dout);
    const Result flash = run(c, cuda::AttentionKernel::kFlash, gq, gd, &out, &lse, stream_);
    EXPECT_TRUE(close(from_bf16(flash.out), from_bf16(out), kB, 1e-2));
    EXPECT_TRUE(close(flash.lse, lse, 1e-4, 1e-4));
    const auto ref = from_bf16(dqkv);
    EXPECT_TRUE(close(from_bf16(flash.dqkv), ref, kB, kB * max_abs(ref)));
  }
}

// GPT-2's bf16 attention (KV = NH, (B,T,3C) rows) takes the same path: by default its results are
// the flash kernel's bit for bit; under kExact, GPT-2's exact kernel's.
TEST_F(FlashAttention, Gpt2EntryPointsRunFlashByDefault) {
  const int B = 2, T = 77, NH = 4, hd = 64, C = NH * hd;
  const Case c{"gpt2", B, T, NH, NH, hd};
  DeviceArray<uint16_t> qkv(to_bf16(random_floats(c.qkv(), 5))), dout(to_bf16(random_floats(c.out(), 6)));
  const Result flash = run(c, cuda::AttentionKernel::kFlash, qkv, dout, nullptr, nullptr, stream_);
  const Result exact = run(c, cuda::AttentionKernel::kExact, qkv, dout, nullptr, nullptr, stream_);
  for (const auto kernel : {cuda::AttentionKernel::kFlash, cuda::AttentionKernel::kExact}) {
    const kern::ScopedCudaAttentionKernel scope(kernel);
    DeviceArray<bf16> out(c.out()), dqkv(c.qkv());
    DeviceArray<float> lse(c.lse());
    auto* q = reinterpret_cast<const bf16*>(qkv.get());
    cu().bf16.attention_forward(out.get(), lse.get(), q, nullptr, B, T, C, NH, stream_);
    cu().bf16.attention_backward(dqkv.get(), reinterpret_cast<const bf16*>(dout.get()), q, out.get(), lse.get(),
                                 nullptr, B, T, C, NH, stream_);
    const auto o = out.download();
    const auto d = dqkv.download();
    std::vector<uint16_t> ob(o.size()), db(d.size());
    std::memcpy(ob.data(), o.data(), o.size() * 2);
    std::memcpy(db.data(), d.data(), d.size() * 2);
    if (kernel == cuda::AttentionKernel::kFlash) {
      // The same flash kernel as Llama's entry point: the same bits.
      EXPECT_EQ(ob, flash.out);
      EXPECT_EQ(lse.download(), flash.lse);
      EXPECT_EQ(db, flash.dqkv);
    } else {
      // GPT-2's own exact kernel: close to Llama's exact one, and not the flash bits.
      EXPECT_TRUE(close(from_bf16(ob), from_bf16(exact.out), kB, 1e-2));
      EXPECT_TRUE(close(from_bf16(db), from_bf16(exact.dqkv), kB, kB * max_abs(from_bf16(exact.dqkv))));
      EXPECT_NE(ob, flash.out);
    }
  }
}

// Head sizes flash does not take, and buffers not 16-byte aligned, run the exact kernels.
TEST_F(FlashAttention, OtherHeadSizesAndMisalignedBuffersRunTheExactKernels) {
  EXPECT_FALSE(cu().flash_attention_supported(48));
  EXPECT_FALSE(cu().flash_attention_supported(256));
  const Case c{"hd 48", 1, 70, 2, 1, 48};
  DeviceArray<uint16_t> qkv(to_bf16(random_floats(c.qkv(), 7))), dout(to_bf16(random_floats(c.out(), 8)));
  const Result flash = run(c, cuda::AttentionKernel::kFlash, qkv, dout, nullptr, nullptr, stream_);
  const Result exact = run(c, cuda::AttentionKernel::kExact, qkv, dout, nullptr, nullptr, stream_);
  EXPECT_EQ(flash.out, exact.out);
  EXPECT_EQ(flash.dqkv, exact.dqkv);
  // hd 64 from a view one element in: not 16-byte aligned, so the exact kernel's bits.
  const Case m{"misaligned", 1, 70, 2, 2, 64};
  auto host = to_bf16(random_floats(m.qkv() + 1, 9));
  DeviceArray<uint16_t> big(host), out(m.out() + 1);
  DeviceArray<float> lse(m.lse());
  std::vector<std::vector<uint16_t>> outs;
  for (const auto kernel : {cuda::AttentionKernel::kFlash, cuda::AttentionKernel::kExact}) {
    const kern::ScopedCudaAttentionKernel scope(kernel);
    cu().bf16.attention_gqa_forward(b16(out.get() + 1), lse.get(), b16(big.get() + 1), nullptr, m.B, m.T, m.NH, m.KV, m.hd,
                                     stream_);
    outs.push_back(out.download());
  }
  EXPECT_EQ(outs[0], outs[1]);
}

TEST_F(FlashAttention, RejectsBadShapesByName) {
  DeviceArray<uint16_t> buf(64);
  DeviceArray<float> l(64);
  try {
    cu().flash_attention_forward_bf16(buf.get(), l.get(), buf.get(), 1, 1, 2, 1, 48, stream_);
    FAIL() << "hd 48 ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flash attention needs hd"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cu().flash_attention_backward_bf16(buf.get(), buf.get(), buf.get(), buf.get(), l.get(), 1, 1, 3, 2,
                                                  64, stream_),
               Error);
}

}  // namespace
}  // namespace ds::rt
