// SFT data (data/sft.h, data/chat_template.h): the masks are exactly the assistant spans for both
// input forms and both templates (expected ids written out), bad input is named, mask files are
// validated, the loader turns masked-out targets into -1 and counts a step's targets, and the
// cross-entropy kernels give an ignored target no loss and no gradient (against a direct
// computation of the softmax).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/chat_template.h"
#include "data/corpus.h"
#include "data/loader.h"
#include "data/sft.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "gpt2_vocab.h"
#include "kernels/cpu/kernels.h"
#include "support/run_command.h"
#include "test_dir.h"

namespace ds::rt::data {
namespace {

using test::dstrain;
using test::run_command;
using test::TempDir;

void write_text(const std::string& path, const std::string& text) { test::write_bytes(path, text.data(), text.size()); }

struct Prepared {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> mask;
};

Prepared read_prepared(const std::string& bin) {
  TokenFile f(bin);
  Prepared p;
  for (int64_t i = 0; i < f.size(); ++i) p.tokens.push_back(f.token(i));
  const MaskFile m(mask_path_for(bin), f.size());
  p.mask.assign(m.mask().begin(), m.mask().end());
  return p;
}

// The byte tokenizer's ids of `s` with every id's mask `m`.
void push(Prepared& p, const std::string& s, uint8_t m) {
  for (unsigned char c : s) {
    p.tokens.push_back(c);
    p.mask.push_back(m);
  }
}

Prepared encode(const Tokenizer& tok, const std::string& tmpl, const std::string& line) {
  Prepared p;
  encode_sft_example(tok, *open_chat_template(tmpl), parse_sft_line(line, "t.jsonl:1"), "t.jsonl:1", p.tokens, p.mask);
  return p;
}

const char* kChat =
    R"({"messages": [{"role": "system", "content": "Be nice"}, {"role": "user", "content": "Hello"}, )"
    R"({"role": "assistant", "content": "Hey"}]})";

TEST(SftTemplates, PlainWithBytesBothForms) {
  const ByteTokenizer tok;
  Prepared want;
  push(want, "user: ", 0);
  push(want, "Hi\n", 0);
  push(want, "assistant: ", 0);
  push(want, " there\n", 1);
  const Prepared got = encode(tok, "plain", R"({"prompt": "Hi", "completion": " there"})");
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.mask, want.mask);

  Prepared chat;
  push(chat, "system: Be nice\nuser: Hello\nassistant: ", 0);
  push(chat, "Hey\n", 1);
  const Prepared g2 = encode(tok, "plain", kChat);
  EXPECT_EQ(g2.tokens, chat.tokens);
  EXPECT_EQ(g2.mask, chat.mask);
}

TEST(SftTemplates, Llama3WithBytesBothForms) {
  const ByteTokenizer tok;
  Prepared want;
  push(want, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>", 0);
  push(want, "<|start_header_id|>assistant<|end_header_id|>\n\n", 0);
  push(want, " there<|eot_id|>", 1);
  const Prepared got = encode(tok, "llama3", R"({"prompt": "Hi", "completion": " there"})");
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.mask, want.mask);

  Prepared chat;
  push(chat,
       "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe nice<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\n",
       0);
  push(chat, "Hey<|eot_id|>", 1);
  const Prepared g2 = encode(tok, "llama3", kChat);
  EXPECT_EQ(g2.tokens, chat.tokens);
  EXPECT_EQ(g2.mask, chat.mask);
}

// Through the real binary with GPT-2's tokenizer: <|endoftext|> (50256) opens every example.
TEST(SftPrepare, Gpt2PlainIdsAndMasks) {
  DS_REQUIRE_GPT2_VOCAB();
  TempDir dir;
  write_text(dir.file("a.jsonl"), std::string(R"({"prompt": "Hi", "completion": " there"})") + "\n\n" + kChat + "\n");
  auto r = run_command(dstrain() + " data prepare --format sft --input " + dir.file("a.jsonl") + " --output " +
                       dir.file("o") + " --tokenizer gpt2 --vocab " + test::gpt2_vocab_dir() + " --val-fraction 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Prepared p = read_prepared(dir.file("o/train.bin"));
  // "user: " "Hi\n" "assistant: " " there\n" | "system: " "Be nice\n" "user: " "Hello\n" "assistant: " "Hey\n"
  const std::vector<uint32_t> ids{50256, 7220, 25,   220,  17250, 198, 562,   10167, 25,   220,
                                  612,   198,  50256, 10057, 25,  220, 3856,  3621,  198,  7220,
                                  25,    220,  15496, 198,  562,   10167, 25,   220,   10814, 198};
  const std::vector<uint8_t> mask{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0,
                                  0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1};
  EXPECT_EQ(p.tokens, ids);
  EXPECT_EQ(p.mask, mask);
}

TEST(SftPrepare, Gpt2Llama3IdsAndMasks) {
  DS_REQUIRE_GPT2_VOCAB();
  const auto tok = open_tokenizer({"gpt2", test::gpt2_vocab_dir()});
  const Prepared p = encode(*tok, "llama3", R"({"prompt": "Hello", "completion": "Hey"})");
  // <|begin_of_text|> and the header markers are plain text to GPT-2's tokenizer.
  const std::vector<uint32_t> begin{27, 91, 27471, 62, 1659, 62, 5239, 91, 29};
  const std::vector<uint32_t> start{27, 91, 9688, 62, 25677, 62, 312, 91, 29};
  const std::vector<uint32_t> end{27, 91, 437, 62, 25677, 62, 312, 91, 29, 628};  // ...<|end_header_id|> "\n\n"
  const std::vector<uint32_t> eot{27, 91, 68, 313, 62, 312, 91, 29};
  std::vector<uint32_t> ids{50256};
  std::vector<uint8_t> mask{0};
  auto add = [&](const std::vector<uint32_t>& v, uint8_t m) {
    ids.insert(ids.end(), v.begin(), v.end());
    mask.insert(mask.end(), v.size(), m);
  };
  add(begin, 0);
  add(start, 0), add({7220}, 0), add(end, 0), add({15496}, 0), add(eot, 0);  // user: Hello
  add(start, 0), add({562, 10167}, 0), add(end, 0), add({10814}, 1), add(eot, 1);  // assistant: Hey
  EXPECT_EQ(p.tokens, ids);
  EXPECT_EQ(p.mask, mask);
}

TEST(SftPrepare, PadToGivesEachExampleItsRow) {
  TempDir dir;
  write_text(dir.file("a.jsonl"), "{\"prompt\": \"ab\", \"completion\": \"c\"}\n{\"prompt\": \"x\", \"completion\": \"yz\"}\n");
  auto r = run_command(dstrain() + " data prepare --format sft --input " + dir.file("a.jsonl") + " --output " +
                       dir.file("o") + " --val-fraction 0 --pad-to 32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Prepared p = read_prepared(dir.file("o/train.bin"));
  Prepared want;
  push(want, "user: ab\nassistant: ", 0);
  push(want, "c\n", 1);
  push(want, std::string(32 - want.tokens.size(), '\0'), 0);  // the byte tokenizer pads with 0
  push(want, "user: x\nassistant: ", 0);
  push(want, "yz\n", 1);
  push(want, std::string(64 - want.tokens.size(), '\0'), 0);
  EXPECT_EQ(p.tokens, want.tokens);
  EXPECT_EQ(p.mask, want.mask);

  r = run_command(dstrain() + " data prepare --format sft --input " + dir.file("a.jsonl") + " --output " +
                  dir.file("o") + " --val-fraction 0 --pad-to 10");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(dir.file("a.jsonl") + ":1: the example has 22 tokens, more than --pad-to 10"),
            std::string::npos)
      << r.err;
}

TEST(SftPrepare, ValSplitIsTheLastExamplesAndTextPrepareRemovesStaleMasks) {
  TempDir dir;
  std::string lines;
  for (int i = 0; i < 10; ++i) lines += "{\"prompt\": \"p\", \"completion\": \"" + std::to_string(i) + "\"}\n";
  write_text(dir.file("a.jsonl"), lines);
  auto r = run_command(dstrain() + " data prepare --format sft --input " + dir.file("a.jsonl") + " --output " +
                       dir.file("o") + " --val-fraction 0.2");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Prepared val = read_prepared(dir.file("o/val.bin"));
  Prepared want;
  for (const char* d : {"8", "9"}) {
    push(want, "user: p\nassistant: ", 0);
    push(want, std::string(d) + "\n", 1);
  }
  EXPECT_EQ(val.tokens, want.tokens);
  EXPECT_EQ(val.mask, want.mask);
  // Text data into the same directory: the masks beside it would be stale, so they go.
  write_text(dir.file("t.txt"), std::string(1000, 'x'));
  r = run_command(dstrain() + " data prepare --input " + dir.file("t.txt") + " --output " + dir.file("o"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir.file("o/train.bin.mask")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("o/val.bin.mask")));
  EXPECT_FALSE(TokenCorpus(dir.file("o/train.bin")).has_mask());
}

TEST(SftPrepare, ShardsEachHaveTheirMask) {
  TempDir dir;
  std::string lines;
  for (int i = 0; i < 12; ++i) lines += "{\"prompt\": \"question " + std::to_string(i) + "\", \"completion\": \"ok\"}\n";
  write_text(dir.file("a.jsonl"), lines);
  for (const std::string shards : {"0", "25"}) {
    auto r = run_command(dstrain() + " data prepare --format sft --input " + dir.file("a.jsonl") + " --output " +
                         dir.file("o" + shards) + " --val-fraction 0 --shard-tokens " + shards);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  const TokenCorpus whole(dir.file("o0/train.bin")), sharded(dir.file("o25/train_*.bin"));
  ASSERT_TRUE(sharded.has_mask());
  ASSERT_GT(sharded.files().size(), 5u);
  ASSERT_EQ(whole.size(), sharded.size());
  for (const auto& f : sharded.files()) EXPECT_TRUE(std::filesystem::exists(mask_path_for(f.path()))) << f.path();
  std::vector<int32_t> a(whole.size(), 0), b(whole.size(), 0);
  whole.apply_mask(0, whole.size(), a.data());
  sharded.apply_mask(0, sharded.size(), b.data());
  EXPECT_EQ(a, b);
  EXPECT_EQ(whole.counted(0, whole.size()), 12 * 3);  // "ok\n" of each example
}

TEST(SftPrepare, BadLinesAreNamed) {
  TempDir dir;
  auto prepare = [&](const std::string& text, const std::string& extra = "") {
    write_text(dir.file("b.jsonl"), text);
    return run_command(dstrain() + " data prepare --format sft --val-fraction 0 --input " + dir.file("b.jsonl") +
                       " --output " + dir.file("o") + extra);
  };
  const std::string ok = "{\"prompt\": \"a\", \"completion\": \"b\"}\n";
  auto r = prepare(ok + "{\"text\": \"a\"}\n");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(dir.file("b.jsonl") + ":2: neither \"messages\" nor \"prompt\"/\"completion\""),
            std::string::npos)
      << r.err;
  r = prepare(ok + ok + "{\"messages\": [{\"role\": \"bot\", \"content\": \"x\"}]}\n");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(dir.file("b.jsonl") + ":3: role \"bot\" is not known to the plain chat template"),
            std::string::npos)
      << r.err;
  r = prepare("{\"messages\": [{\"role\": \"ipython\", \"content\": \"x\"}]}\n");
  EXPECT_NE(r.err.find(":1: role \"ipython\" is not known to the plain"), std::string::npos) << r.err;
  r = prepare("{\"messages\": [{\"role\": \"ipython\", \"content\": \"x\"}]}\n", " --chat-template llama3");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = prepare("{\"messages\": [{\"role\": \"user\", \"content\": 5}]}\n");
  EXPECT_NE(r.err.find(":1: $.messages[0].content is a number, expected a string"), std::string::npos) << r.err;
  r = prepare("{\"prompt\": \"a\"}\n");
  EXPECT_NE(r.err.find(":1: $.completion is missing"), std::string::npos) << r.err;
  r = prepare("{\"prompt\": \"a\", \n");
  EXPECT_NE(r.err.find(":1: malformed JSON"), std::string::npos) << r.err;
  r = prepare("{\"messages\": []}\n");
  EXPECT_NE(r.err.find(":1: empty conversation"), std::string::npos) << r.err;
  r = prepare(ok, " --chat-template chatml");
  EXPECT_NE(r.err.find("chat template \"chatml\": unknown"), std::string::npos) << r.err;
  EXPECT_THROW(parse_sft_line("[1]", "x:1"), Error);
}

// ---- mask files and the loader ----

void write_masked(const std::string& bin, const std::vector<uint16_t>& toks, const std::vector<uint8_t>& mask) {
  write_token_file(bin, toks);
  MaskFileWriter w(mask_path_for(bin));
  w.append(mask);
  w.finish();
}

TEST(MaskFile, ValidatedOnRead) {
  TempDir dir;
  const std::string bin = dir.file("t.bin");
  write_masked(bin, std::vector<uint16_t>(100, 3), std::vector<uint8_t>(100, 1));
  EXPECT_TRUE(TokenCorpus(bin).has_mask());
  auto expect_error = [&](const std::string& what) {
    try {
      TokenCorpus c(bin);
      ADD_FAILURE() << "no error, expected " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  write_token_file(bin, std::vector<uint16_t>(99, 3));  // the mask belongs to other data
  expect_error("mask file " + bin + ".mask: 100 entries, but its token file has 99 tokens");
  write_masked(bin, std::vector<uint16_t>(100, 3), std::vector<uint8_t>(100, 2));
  expect_error("mask file " + bin + ".mask: byte 2 at index 0 is not 0 or 1");
  write_text(mask_path_for(bin), std::string(1100, 'x'));
  expect_error("mask file " + bin + ".mask: wrong magic");
  // Shards: all or none.
  write_masked(dir.file("s_0.bin"), std::vector<uint16_t>(10, 1), std::vector<uint8_t>(10, 1));
  write_token_file(dir.file("s_1.bin"), std::vector<uint16_t>(10, 1));
  try {
    TokenCorpus c(dir.file("s_*.bin"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token file " + dir.file("s_1.bin") + ": no loss mask"), std::string::npos)
        << e.what();
  }
}

TEST(MaskedLoader, TargetsAndStepCounts) {
  TempDir dir;
  const int n = 2000;
  std::vector<uint16_t> toks(n);
  std::vector<uint8_t> mask(n);
  std::mt19937 rng(3);
  for (int i = 0; i < n; ++i) {
    toks[i] = static_cast<uint16_t>(i % 50);
    mask[i] = (i / 13) % 3 == 0 || rng() % 5 == 0 ? 1 : 0;
  }
  // Two shards: the mask follows the tokens across the boundary.
  write_masked(dir.file("m_0.bin"), {toks.begin(), toks.begin() + 700}, {mask.begin(), mask.begin() + 700});
  write_masked(dir.file("m_1.bin"), {toks.begin() + 700, toks.end()}, {mask.begin() + 700, mask.end()});
  const TokenCorpus corpus(dir.file("m_*.bin"));
  ASSERT_TRUE(corpus.has_mask());
  for (bool shuffle : {false, true}) {
    const int B = 2, T = 8, N = 2, G = 3;
    std::vector<DataLoader> loaders;
    for (int r = 0; r < N; ++r) loaders.emplace_back(corpus, LoaderOptions{B, T, N, r, G, shuffle, 11});
    for (int step = 0; step < 40; ++step) {  // past an epoch (W = 124 windows, 20 steps of 6)
      const int64_t want = loaders[0].step_counted_targets(loaders[0].micro_step());
      EXPECT_EQ(loaders[1].step_counted_targets(loaders[1].micro_step()), want);
      int64_t counted = 0;
      for (int g = 0; g < G; ++g) {
        for (int r = 0; r < N; ++r) {
          const int64_t start = loaders[r].window_start(loaders[r].micro_step());
          std::vector<int32_t> in(B * T), tg(B * T);
          loaders[r].next(in.data(), tg.data());
          for (int k = 0; k < B * T; ++k) {
            const int64_t t = start + 1 + k;
            EXPECT_EQ(tg[k], mask[t] ? static_cast<int32_t>(toks[t]) : -1) << "token " << t;
            counted += tg[k] != -1;
          }
        }
      }
      EXPECT_EQ(counted, want) << "step " << step << " shuffle " << shuffle;
    }
  }
  // Without a mask every target counts.
  write_token_file(dir.file("plain.bin"), toks);
  const TokenCorpus plain(dir.file("plain.bin"));
  DataLoader l(plain, LoaderOptions{2, 8, 2, 0, 3, false, 0});
  EXPECT_EQ(l.step_counted_targets(0), 2 * 3 * 2 * 8);
}

// ---- the kernels: an ignored target (-1) has loss 0 and zero dlogits ----

TEST(MaskedCrossEntropy, IgnoredTargetsAgainstDirectSoftmax) {
  const int N = 7, V = 23, Vp = 24;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> logits(N * Vp);
  for (auto& x : logits) x = nd(rng);
  const std::vector<int32_t> targets{3, -1, 22, -1, -1, 0, 7};
  const float dloss = 0.25f;
  // Direct: double-precision softmax per row.
  std::vector<double> want_loss(N), want_d(N * Vp, 0.0);
  for (int n = 0; n < N; ++n) {
    if (targets[n] == -1) continue;
    double mx = -1e30, s = 0;
    for (int v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(logits[n * Vp + v]));
    for (int v = 0; v < V; ++v) s += std::exp(logits[n * Vp + v] - mx);
    want_loss[n] = mx + std::log(s) - logits[n * Vp + targets[n]];
    for (int v = 0; v < V; ++v) {
      want_d[n * Vp + v] = (std::exp(logits[n * Vp + v] - mx) / s - (v == targets[n] ? 1.0 : 0.0)) * dloss;
    }
  }
  std::vector<float> losses(N, -5.0f), fwd(N, -5.0f);
  EXPECT_EQ(cpu::crossentropy_forward(fwd.data(), logits.data(), targets.data(), N, V, Vp), 0);
  std::vector<float> d = logits;
  EXPECT_EQ(cpu::crossentropy_softmax_backward(losses.data(), d.data(), targets.data(), dloss, N, V, Vp), 0);
  // Vocabulary-parallel, two halves of 12 columns.
  const int Vl = 12;
  std::vector<float> vl_loss(N), mx(N), mx1(N), se(N), tl(N), se1(N), tl1(N);
  std::vector<std::vector<float>> halves(2, std::vector<float>(N * Vl));
  for (int h = 0; h < 2; ++h) {
    for (int n = 0; n < N; ++n) {
      for (int v = 0; v < Vl; ++v) halves[h][n * Vl + v] = logits[n * Vp + h * Vl + v];
    }
  }
  cpu::vocab_ce_max(mx.data(), halves[0].data(), N, Vl, 0, V);
  cpu::vocab_ce_max(mx1.data(), halves[1].data(), N, Vl, Vl, V);
  for (int n = 0; n < N; ++n) mx[n] = std::max(mx[n], mx1[n]);
  cpu::vocab_ce_sums(se.data(), tl.data(), halves[0].data(), mx.data(), targets.data(), N, Vl, 0, V);
  cpu::vocab_ce_sums(se1.data(), tl1.data(), halves[1].data(), mx.data(), targets.data(), N, Vl, Vl, V);
  for (int n = 0; n < N; ++n) se[n] += se1[n], tl[n] += tl1[n];
  cpu::vocab_ce_finish(vl_loss.data(), halves[0].data(), mx.data(), se.data(), tl.data(), targets.data(), dloss, N,
                       Vl, 0, V);
  cpu::vocab_ce_finish(vl_loss.data(), halves[1].data(), mx.data(), se.data(), tl.data(), targets.data(), dloss, N,
                       Vl, Vl, V);
  for (int n = 0; n < N; ++n) {
    EXPECT_NEAR(fwd[n], want_loss[n], 1e-5) << n;
    EXPECT_NEAR(losses[n], want_loss[n], 1e-5) << n;
    EXPECT_NEAR(vl_loss[n], want_loss[n], 1e-5) << n;
    for (int v = 0; v < Vp; ++v) {
      EXPECT_NEAR(d[n * Vp + v], want_d[n * Vp + v], 1e-6) << n << "," << v;
      EXPECT_NEAR(halves[v / Vl][n * Vl + v % Vl], want_d[n * Vp + v], 1e-6) << n << "," << v;
    }
  }
  // A real out-of-range target stays an error.
  const std::vector<int32_t> bad{3, -2, 23, -1, 0, 0, 0};
  EXPECT_EQ(cpu::crossentropy_forward(fwd.data(), logits.data(), bad.data(), N, V, Vp), 2);
}

}  // namespace
}  // namespace ds::rt::data
