// Document-aware packing (ModelOptions::document_token, data.packing "document") through the whole
// decoder: a window of packed documents trains exactly as its documents run one by one, each alone
// in a sequence of its own length with positions from 0, their losses and gradients weighted by
// their share of the window's tokens (the window's mean loss is the token-weighted mean of theirs).
// For GPT-2 (learned positions: wpe rows read at each document's positions) and Llama (RoPE tables
// read at them, grouped-query attention), with and without recompute; the first layer's q, k and v
// rows of each document are its own run's (positions restart at every document). A window without any
// document token trains bit for bit as packing "none".
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "model/decoder.h"
#include "model_spec/shape.h"

using namespace ds::rt;
namespace ms = ds::model_spec;

namespace {

constexpr int kDoc = 7;  // the document token of these tests

ms::ModelShape gpt2_shape() { return ms::ModelShape{2, 4, 32, 50, 64, 40}; }

ms::ModelShape llama_shape() {
  ms::ModelShape s{2, 4, 32, 50, 50, 40};
  s.family = ms::ModelFamily::kLlama;
  s.n_kv_head = 2;
  s.intermediate_size = 48;
  return s;
}

// A window's inputs and targets (B,T) as the loader cuts them from one stream of B*T + 1 tokens,
// with document tokens at the given positions of each row (and nowhere else).
struct Window {
  int B, T;
  std::vector<int32_t> inputs, targets;
};

Window make_window(int B, int T, const std::vector<std::vector<int>>& docs, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> tok(8, 49);
  std::vector<int32_t> stream(static_cast<size_t>(B) * T + 1);
  for (auto& t : stream) t = tok(rng);
  for (int b = 0; b < B; b++) {
    for (int p : docs[static_cast<size_t>(b)]) stream[static_cast<size_t>(b) * T + p] = kDoc;
  }
  Window w{B, T, {}, {}};
  w.inputs.assign(stream.begin(), stream.end() - 1);
  w.targets.assign(stream.begin() + 1, stream.end());
  return w;
}

struct Result {
  double loss = 0;
  std::vector<float> grads;
  std::vector<float> qkv;  // the first layer's q, k, v rows (q and k after RoPE), row by row
};

Result run(const ms::ModelShape& s, const ModelOptions& o, const int32_t* in, const int32_t* tg, float scale) {
  Allocator alloc;
  Decoder m(s, ms::ModelPart::whole(s), o, alloc);
  m.init_weights(5);
  m.zero_grads();
  auto a = m.make_activations();
  Result r;
  r.loss = m.forward_backward(a, in, tg, scale);
  const float* g = m.grads().f32();
  r.grads.assign(g, g + m.num_params());
  const int width = (s.n_head + 2 * ms::kv_heads(s)) * s.head_dim();
  const float* q = a.layers[0].qkv.f32();
  r.qkv.assign(q, q + static_cast<int64_t>(o.B) * o.T * width);
  return r;
}

// Each document of the window alone: B = 1, T = its length, weighted by its share of the tokens.
Result one_by_one(const ms::ModelShape& s, const Window& w, bool recompute) {
  Result sum;
  const double total = static_cast<double>(w.B) * w.T;
  for (int b = 0; b < w.B; b++) {
    const int64_t r0 = static_cast<int64_t>(b) * w.T;
    int start = 0;
    for (int t = 1; t <= w.T; t++) {
      if (t < w.T && w.inputs[static_cast<size_t>(r0 + t)] != kDoc) continue;
      const int len = t - start;
      ModelOptions o;
      o.B = 1;
      o.T = len;
      o.recompute = recompute;
      const float share = static_cast<float>(len / total);
      const Result r = run(s, o, w.inputs.data() + r0 + start, w.targets.data() + r0 + start, share);
      sum.loss += r.loss * share;
      if (sum.grads.empty()) sum.grads.assign(r.grads.size(), 0.0f);
      for (size_t i = 0; i < r.grads.size(); i++) sum.grads[i] += r.grads[i];
      sum.qkv.insert(sum.qkv.end(), r.qkv.begin(), r.qkv.end());  // documents in row order
      start = t;
    }
  }
  return sum;
}

void expect_packed_equals_one_by_one(const ms::ModelShape& s, bool recompute) {
  omp_set_num_threads(2);
  // Row 0: a document from its first token, a one-token document at 9, others at 10 and 25.
  // Row 1: tokens before the first document token (a document from index 0), then two more.
  const Window w = make_window(2, 40, {{0, 9, 10, 25}, {13, 30}}, 3);
  ModelOptions o;
  o.B = w.B;
  o.T = w.T;
  o.recompute = recompute;
  o.document_token = kDoc;
  const Result packed = run(s, o, w.inputs.data(), w.targets.data(), 1.0f);
  const Result ref = one_by_one(s, w, recompute);
  EXPECT_NEAR(packed.loss, ref.loss, 1e-5 * std::fabs(ref.loss));
  ASSERT_EQ(packed.grads.size(), ref.grads.size());
  float gmax = 0;
  for (float g : ref.grads) gmax = std::max(gmax, std::fabs(g));
  ASSERT_GT(gmax, 0.0f);
  int bad = 0;
  for (size_t i = 0; i < ref.grads.size() && bad < 5; i++) {
    if (std::fabs(packed.grads[i] - ref.grads[i]) > 2e-5f * gmax + 1e-3f * std::fabs(ref.grads[i])) {
      ADD_FAILURE() << "gradient " << i << ": packed " << packed.grads[i] << " one by one " << ref.grads[i];
      bad++;
    }
  }
  // Each document's rows of the first layer's qkv (q and k rotated at their positions under RoPE,
  // GPT-2's input carrying wpe) are the document's own: positions restart at every document. (A
  // RoPE model's loss alone cannot show it: its scores depend on distances only.)
  ASSERT_EQ(packed.qkv.size(), ref.qkv.size());
  float qmax = 0;
  for (float v : ref.qkv) qmax = std::max(qmax, std::fabs(v));
  for (size_t i = 0; i < ref.qkv.size(); i++) {
    ASSERT_NEAR(packed.qkv[i], ref.qkv[i], 1e-5f * qmax) << "qkv element " << i;
  }
  // Packing changes the numbers: the same window without it is another loss.
  o.document_token = -1;
  EXPECT_GT(std::fabs(run(s, o, w.inputs.data(), w.targets.data(), 1.0f).loss - packed.loss), 1e-4);
}

void expect_no_documents_bit_identical(const ms::ModelShape& s) {
  omp_set_num_threads(2);
  const Window w = make_window(2, 40, {{}, {}}, 4);
  ModelOptions o;
  o.B = w.B;
  o.T = w.T;
  const Result none = run(s, o, w.inputs.data(), w.targets.data(), 1.0f);
  o.document_token = kDoc;
  const Result packed = run(s, o, w.inputs.data(), w.targets.data(), 1.0f);
  EXPECT_EQ(none.loss, packed.loss);
  ASSERT_EQ(none.grads.size(), packed.grads.size());
  for (size_t i = 0; i < none.grads.size(); i++) ASSERT_EQ(none.grads[i], packed.grads[i]) << i;
}

}  // namespace

TEST(Packing, Gpt2PackedEqualsDocumentsOneByOne) { expect_packed_equals_one_by_one(gpt2_shape(), false); }
TEST(Packing, Gpt2PackedEqualsDocumentsOneByOneWithRecompute) { expect_packed_equals_one_by_one(gpt2_shape(), true); }
TEST(Packing, LlamaPackedEqualsDocumentsOneByOne) { expect_packed_equals_one_by_one(llama_shape(), false); }
TEST(Packing, LlamaPackedEqualsDocumentsOneByOneWithRecompute) { expect_packed_equals_one_by_one(llama_shape(), true); }

TEST(Packing, Gpt2WindowWithoutDocumentTokensIsPackingNone) { expect_no_documents_bit_identical(gpt2_shape()); }
TEST(Packing, LlamaWindowWithoutDocumentTokensIsPackingNone) { expect_no_documents_bit_identical(llama_shape()); }

TEST(Packing, BadOptionsAreNamed) {
  Allocator alloc;
  ModelOptions o;
  o.B = 1;
  o.T = 8;
  o.document_token = 50;  // vocab_size 50
  const auto s = gpt2_shape();
  try {
    Decoder m(s, ms::ModelPart::whole(s), o, alloc);
    FAIL() << "a document token outside the vocabulary was accepted";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("document token 50"), std::string::npos) << e.what();
  }
  o.document_token = kDoc;
  Decoder m(s, ms::ModelPart::whole(s), o, alloc);
  auto a = m.make_activations();
  try {
    m.find_documents(a, nullptr);
    FAIL() << "null tokens were accepted";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("every pipeline stage"), std::string::npos) << e.what();
  }
}
