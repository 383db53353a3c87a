// Training on SFT data with loss masks (data/sft.h) through the real trainer, one process:
//   - the step's loss and gradient norm against an independent computation: the model run window
//     by window with ignored targets, the counted tokens' losses summed and divided by the step's
//     count (and the gradients, each window's of sum/(B*T), rescaled to sum/count);
//   - a mask of all ones trains exactly as the unmasked file does;
//   - random prompts with one fixed completion: the masked loss (the completion only) falls
//     below 0.5 while the same tokens unmasked (mostly random prompt characters) stay above 2.
// The layouts (dp with accumulation, tp, pp, cp) against this single process are in
// tests/multiproc/train/sft_multiproc_test.cpp.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "config/job_config.h"
#include "core/allocator.h"
#include "data/chat_template.h"
#include "data/corpus.h"
#include "data/sft.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "model/model.h"
#include "train/trainer.h"

namespace ds::rt::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class SftTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ds_sft_train_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  config::JobConfig config(const json& j, const std::string& name = "cfg") const {
    const std::string path = (dir_ / (name + ".json")).string();
    std::ofstream(path) << j.dump(2);
    return config::load_job_config(path, 1);
  }
  std::vector<json> metrics(const std::string& path) const {
    std::vector<json> out;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) out.push_back(json::parse(line));
    }
    return out;
  }
  fs::path dir_;
};

void write_masked(const std::string& bin, const std::vector<uint16_t>& toks, const std::vector<uint8_t>& mask) {
  data::write_token_file(bin, toks);
  data::MaskFileWriter w(data::mask_path_for(bin));
  w.append(mask);
  w.finish();
}

TEST_F(SftTraining, StepLossAndGradNormAgainstPerTokenSums) {
  const int n = 4000, B = 2, T = 16, G = 3;
  std::vector<uint16_t> toks(n);
  std::vector<uint8_t> mask(n);
  std::mt19937 rng(4);
  for (int i = 0; i < n; ++i) {
    toks[i] = static_cast<uint16_t>((i * 7 + i / 5) % 31);
    if (rng() % 8 == 0) toks[i] = static_cast<uint16_t>(rng() % 32);
    mask[i] = (i / 9) % 4 == 1 || rng() % 7 == 0 ? 1 : 0;  // uneven counts per window
  }
  const std::string bin = (dir_ / "train.bin").string();
  write_masked(bin, toks, mask);
  const json j = {
      {"train_micro_batch_size_per_gpu", B},
      {"gradient_accumulation_steps", G},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}, {"weight_decay", 0.0}}}}},
      {"model", {{"type", "gpt2"}, {"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 32}, {"seq_len", T}}},
      {"data", {{"train", bin}}},
      {"training", {{"steps", 1}, {"seed", 5}, {"log_interval", 1}}},
  };
  TrainOptions o;
  o.metrics_path = (dir_ / "m.jsonl").string();
  Trainer t(config(j), o);
  t.run();
  const auto m = metrics(o.metrics_path);
  ASSERT_EQ(m.size(), 1u);

  // Independently: the same initial weights, the step's G windows one by one.
  const auto cfg = config(j, "again");
  const auto& shape = cfg.model.shape;
  ModelOptions mo;
  mo.B = B;
  mo.T = T;
  auto model = make_model(shape, model_spec::ModelPart::whole(shape), mo, Allocator::process());
  model->init_weights(5);
  model->zero_grads();
  double loss_sum = 0, count = 0;
  for (int g = 0; g < G; ++g) {
    const int start = g * B * T;
    std::vector<int32_t> in(B * T), tg(B * T);
    for (int k = 0; k < B * T; ++k) {
      in[k] = toks[start + k];
      tg[k] = mask[start + 1 + k] ? toks[start + 1 + k] : -1;
    }
    auto acts = model->new_activations();
    model->forward_backward(*acts, in.data(), tg.data(), 1.0f);  // gradients of sum(counted) / (B*T)
    for (int k = 0; k < B * T; ++k) {
      if (tg[k] == -1) {
        EXPECT_EQ(acts->losses[k], 0.0f);
        continue;
      }
      loss_sum += acts->losses[k];
      count += 1;
    }
  }
  ASSERT_GT(count, 0);
  const auto* grads = static_cast<const float*>(model->grads().data);
  double sq = 0;
  for (int64_t i = 0; i < model->num_params(); ++i) sq += static_cast<double>(grads[i]) * grads[i];
  const double norm = std::sqrt(sq) * (B * T) / count;
  const double loss = loss_sum / count;
  std::cout << "masked step: " << count << " of " << G * B * T << " targets count; loss " << m[0]["loss"]
            << " vs per-token sum " << loss << ", grad_norm " << m[0]["grad_norm"] << " vs " << norm << "\n";
  EXPECT_NEAR(m[0]["loss"].get<double>(), loss, 1e-5 * loss);
  EXPECT_NEAR(m[0]["grad_norm"].get<double>(), norm, 1e-4 * norm);
  EXPECT_EQ(m[0]["counted_tokens"].get<double>(), count);
}

TEST_F(SftTraining, AllOnesMaskTrainsAsTheUnmaskedFile) {
  std::vector<uint16_t> toks(3000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>((i * 7 + i / 5) % 31);
  const std::string plain = (dir_ / "plain.bin").string(), ones = (dir_ / "ones.bin").string();
  data::write_token_file(plain, toks);
  write_masked(ones, toks, std::vector<uint8_t>(toks.size(), 1));
  std::vector<std::vector<json>> runs;
  for (const std::string& bin : {plain, ones}) {
    const json j = {
        {"train_micro_batch_size_per_gpu", 2},
        {"gradient_accumulation_steps", 2},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}}}}},
        {"model", {{"type", "gpt2"}, {"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 32}, {"seq_len", 16}}},
        {"data", {{"train", bin}, {"val", bin}}},
        {"training", {{"steps", 6}, {"seed", 5}, {"log_interval", 1}, {"eval_interval", 3}, {"eval_steps", 2}}},
    };
    TrainOptions o;
    o.metrics_path = bin + ".jsonl";
    Trainer(config(j), o).run();
    runs.push_back(metrics(o.metrics_path));
  }
  ASSERT_EQ(runs[0].size(), 6u);
  ASSERT_EQ(runs[1].size(), 6u);
  for (size_t s = 0; s < 6; ++s) {
    // The gradients are bit for bit the same (each token's dloss is grad_scale / (B*T) either way);
    // the loss is summed in another order.
    EXPECT_EQ(runs[0][s]["grad_norm"], runs[1][s]["grad_norm"]) << s;
    EXPECT_NEAR(runs[0][s]["loss"].get<double>(), runs[1][s]["loss"].get<double>(), 1e-6) << s;
    if (runs[0][s].contains("val_loss")) {
      EXPECT_NEAR(runs[0][s]["val_loss"].get<double>(), runs[1][s]["val_loss"].get<double>(), 1e-6) << s;
    }
  }
}

// Random 48-character prompts, one fixed completion: only the completion is learnable.
TEST_F(SftTraining, FixedCompletionIsLearnedOnlyWhenMasked) {
  const data::ByteTokenizer tok;
  const auto tmpl = data::open_chat_template("plain");
  std::mt19937 rng(1);
  const std::string alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-*/=%&";
  const std::string masked_dir = (dir_ / "masked").string(), plain_dir = (dir_ / "plain").string();
  fs::create_directories(masked_dir);
  fs::create_directories(plain_dir);
  {
    data::ShardWriter masked(masked_dir, "train", data::TokenFormat::kU16, 0, true);
    data::ShardWriter plain(plain_dir, "train", data::TokenFormat::kU16, 0, false);
    for (int e = 0; e < 600; ++e) {
      std::string prompt;
      for (int c = 0; c < 48; ++c) prompt += alphabet[rng() % alphabet.size()];
      const json line = {{"prompt", prompt}, {"completion", "42"}};
      std::vector<uint32_t> ids;
      std::vector<uint8_t> mask;
      data::encode_sft_example(tok, *tmpl, data::parse_sft_line(line.dump(), "gen"), "gen", ids, mask);
      masked.append(ids, mask);
      plain.append(ids);
    }
    masked.finish();
    plain.finish();
  }
  std::vector<double> last;
  for (const std::string& d : {masked_dir, plain_dir}) {
    const json j = {
        {"train_micro_batch_size_per_gpu", 8},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}, {"weight_decay", 0.0}}}}},
        {"model",
         {{"type", "gpt2"}, {"n_layer", 2}, {"n_head", 4}, {"n_embd", 64}, {"vocab_size", 256}, {"seq_len", 64}}},
        {"data", {{"train", d + "/train.bin"}}},
        {"training", {{"steps", 80}, {"seed", 3}, {"log_interval", 40}}},
    };
    Trainer t(config(j, "fixed"), {});
    const auto r = t.run();
    double tail = 0;
    for (size_t s = r.losses.size() - 10; s < r.losses.size(); ++s) tail += r.losses[s] / 10;
    last.push_back(tail);
  }
  std::cout << "fixed completion: mean loss of the last 10 steps masked " << last[0] << ", unmasked " << last[1]
            << "\n";
  EXPECT_LT(last[0], 0.5);
  EXPECT_GT(last[1], 2.0);
}

}  // namespace
}  // namespace ds::rt::train
