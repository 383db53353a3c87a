// Checkpoint files: shard round trip and its errors, the step-directory protocol (atomic commit,
// latest pointer, keep_last), and llm.c's format round trip and errors.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include <gtest/gtest.h>

#include "checkpoint/atomic_file.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/llmc_format.h"
#include "checkpoint/manifest.h"
#include "checkpoint/shard_file.h"
#include "checkpoint/verify.h"
#include "common/error.h"
#include "common/half.h"

namespace ds::rt::ckpt {
namespace {

namespace fs = std::filesystem;
namespace ms = ds::model_spec;

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ds_ckpt_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

using ShardFile = TempDir;

TEST_F(ShardFile, RoundTripAndShapeChecks) {
  std::vector<float> a(1000);
  std::iota(a.begin(), a.end(), 0.5f);
  std::vector<int64_t> b = {7, -3, 1ll << 40};
  ShardWriter w;
  w.add("params", "f32", {10, 100}, a.data(), a.size() * 4);
  w.add("step", "i64", {3}, b.data(), b.size() * 8);
  w.add("empty", "f32", {0}, nullptr, 0);
  w.write(path("s.bin"));

  ShardReader r(path("s.bin"));
  std::vector<float> a2(1000);
  r.read("params", "f32", {10, 100}, a2.data(), a2.size() * 4);
  EXPECT_EQ(a, a2);
  std::vector<int64_t> b2(3);
  r.read("step", "i64", {3}, b2.data(), 24);
  EXPECT_EQ(b, b2);
  EXPECT_TRUE(r.has("empty"));
  EXPECT_EQ(error_of([&] { r.read("params", "f32", {100, 10}, a2.data(), a2.size() * 4); }),
            path("s.bin") + ": tensor 'params' is f32 [10, 100] in the checkpoint but the config "
                            "needs f32 [100, 10]");
  EXPECT_EQ(error_of([&] { r.read("nope", "f32", {1}, a2.data(), 4); }),
            path("s.bin") + ": checkpoint has no tensor 'nope'");
}

TEST_F(ShardFile, CorruptFilesAreNamed) {
  ckpt::write_file_atomic(path("bad.bin"), "NOTASHARDFILE...");
  EXPECT_EQ(error_of([&] { ShardReader r(path("bad.bin")); }),
            path("bad.bin") + ": not a dstrain checkpoint shard (bad magic or truncated header)");
  std::vector<float> a(100, 1.0f);
  ShardWriter w;
  w.add("x", "f32", {100}, a.data(), 400);
  w.write(path("t.bin"));
  fs::resize_file(path("t.bin"), fs::file_size(path("t.bin")) - 10);
  EXPECT_EQ(error_of([&] { ShardReader r(path("t.bin")); }),
            path("t.bin") + ": truncated checkpoint shard: tensor 'x' ends past the file end");
  EXPECT_EQ(error_of([&] { ShardReader r(path("missing.bin")); }),
            "cannot read checkpoint shard " + path("missing.bin") + ": No such file or directory");
}

// Flips one bit at `offset` of the file.
void flip_bit(const std::string& file, uint64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

// Every byte of a shard is covered by a checksum: a flipped bit anywhere in the header, the index
// or a tensor is an error naming the file (and the tensor with its byte range).
TEST_F(ShardFile, AFlippedBitAnywhereIsNamed) {
  std::vector<float> a(256, 0.25f), b(100, -1.0f);
  ShardWriter w;
  w.add("params", "f32", {256}, a.data(), a.size() * 4);
  w.add("exp_avg", "f32", {100}, b.data(), b.size() * 4);
  w.write(path("good.bin"));
  const uint64_t size = fs::file_size(path("good.bin"));
  {
    ShardReader r(path("good.bin"));
    EXPECT_TRUE(r.checksummed());
    EXPECT_TRUE(r.verify());
  }
  int detected = 0, tested = 0;
  for (uint64_t off = 0; off < size; off += 7) {
    fs::copy_file(path("good.bin"), path("bad.bin"), fs::copy_options::overwrite_existing);
    flip_bit(path("bad.bin"), off);
    ++tested;
    const std::string err = error_of([&] {
      ShardReader r(path("bad.bin"));
      r.verify();
    });
    if (err == "<no error>") {
      // Only the zero padding between the index and the data, and after a tensor, is unchecked.
      continue;
    }
    ++detected;
    EXPECT_EQ(err.rfind(path("bad.bin") + ": ", 0), 0u) << err;
  }
  EXPECT_GT(detected, tested * 3 / 4);
  // A flipped bit in a tensor names it and its bytes.
  ShardReader good(path("good.bin"));
  fs::copy_file(path("good.bin"), path("bad.bin"), fs::copy_options::overwrite_existing);
  flip_bit(path("bad.bin"), size - 4);  // inside exp_avg, the last tensor
  ShardReader bad(path("bad.bin"));
  std::vector<float> out(100);
  const std::string err = error_of([&] { bad.read("exp_avg", "f32", {100}, out.data(), 400); });
  EXPECT_NE(err.find("tensor 'exp_avg' (bytes "), std::string::npos) << err;
  EXPECT_NE(err.find("fails its CRC-32C check"), std::string::npos) << err;
  std::vector<float> p(256);
  bad.read("params", "f32", {256}, p.data(), 1024);  // the other tensor still reads
  EXPECT_EQ(p[0], 0.25f);
}

using CheckpointDir = TempDir;

// A checkpoint directory as the trainer writes it: one shard per rank and the manifest.
void write_step(const std::string& root, int64_t step, float value) {
  const std::string tmp = begin_checkpoint(root, step);
  for (int q = 0; q < 2; ++q) {
    std::vector<float> v(64, value + static_cast<float>(q));
    ShardWriter w;
    for (const char* name : {"params", "exp_avg", "exp_avg_sq"}) w.add(name, "f32", {64}, v.data(), 256);
    w.write(tmp + "/" + shard_file_name(q));
  }
  nlohmann::json m = {{"step", step},
                      {"adam_steps", step},
                      {"config", {{"bf16", {{"enabled", false}}}}},
                      {"layout", {{"num_params", 128}, {"partitions", {{0, 64}, {64, 64}}}}}};
  commit_checkpoint(root, step, m, 0);
}

TEST_F(CheckpointDir, VerifyNamesEveryCorruptFileAndFindsTheNewestIntactOne) {
  const std::string root = path("ck");
  write_step(root, 1, 1.0f);
  write_step(root, 2, 2.0f);
  const std::string s1 = root + "/" + step_dir_name(1), s2 = root + "/" + step_dir_name(2);
  EXPECT_TRUE(verify_checkpoint_root(root).ok);
  EXPECT_EQ(read_manifest(s2).at("step"), 2);
  // The manifest: a changed number keeps the JSON valid; its checksum still catches it.
  std::string text = read_file(s2 + "/manifest.json", "manifest");
  const auto at = text.find("\"adam_steps\": 2");
  ASSERT_NE(at, std::string::npos) << text;
  text[at + 14] = '3';
  write_file_atomic(s2 + "/manifest.json", text);
  EXPECT_NE(error_of([&] { read_manifest(s2); }).find("manifest.json: the manifest fails its CRC-32C check"),
            std::string::npos);
  auto r = verify_checkpoint_dir(s2);
  EXPECT_FALSE(r.ok);
  // A shard's tensor in the older checkpoint.
  flip_bit(s1 + "/" + shard_file_name(1), fs::file_size(s1 + "/" + shard_file_name(1)) - 8);
  r = verify_checkpoint_dir(s1);
  ASSERT_FALSE(r.ok);
  bool named = false;
  for (const auto& l : r.lines) named |= l.find(shard_file_name(1) + ": tensor 'exp_avg_sq'") != std::string::npos;
  EXPECT_TRUE(named) << ::testing::PrintToString(r.lines);
  EXPECT_EQ(newest_intact_checkpoint(root, s2), std::nullopt);
  write_step(root, 3, 3.0f);
  EXPECT_EQ(newest_intact_checkpoint(root, ""), root + "/" + step_dir_name(3));
  EXPECT_EQ(newest_intact_checkpoint(root, root + "/" + step_dir_name(3)), std::nullopt);
  // A missing shard is named too.
  fs::remove(root + "/" + step_dir_name(3) + "/" + shard_file_name(0));
  r = verify_checkpoint_dir(root + "/" + step_dir_name(3));
  EXPECT_FALSE(r.ok);
}

TEST_F(CheckpointDir, CommitUpdatesLatestAndPrunes) {
  std::string root = path("ckpt");
  EXPECT_FALSE(latest_checkpoint(root).has_value());
  for (int step : {10, 20, 30, 40}) {
    std::string tmp = begin_checkpoint(root, step);
    EXPECT_TRUE(fs::is_directory(tmp));
    ckpt::write_file_atomic(tmp + "/" + shard_file_name(0), "x");
    // Before commit, latest still names the previous step and no final dir exists.
    EXPECT_FALSE(fs::exists(root + "/" + step_dir_name(step)));
    commit_checkpoint(root, step, {{"step", step}}, /*keep_last=*/2);
    auto latest = latest_checkpoint(root);
    ASSERT_TRUE(latest);
    EXPECT_EQ(fs::path(*latest).filename(), step_dir_name(step));
    EXPECT_EQ(read_manifest(*latest)["step"], step);
    EXPECT_FALSE(fs::exists(tmp));
  }
  std::vector<std::string> dirs;
  for (const auto& e : fs::directory_iterator(root)) dirs.push_back(e.path().filename().string());
  std::sort(dirs.begin(), dirs.end());
  EXPECT_EQ(dirs, (std::vector<std::string>{"latest", "step_00000030", "step_00000040"}));
}

TEST_F(CheckpointDir, DanglingLatestIsAClearError) {
  std::string root = path("ckpt");
  fs::create_directories(root);
  ckpt::write_file_atomic(root + "/latest", "step_00000099\n");
  EXPECT_EQ(error_of([&] { latest_checkpoint(root); }),
            root + "/latest points to 'step_00000099', which is not a checkpoint directory in " +
                root);
}

ms::ModelShape tiny_shape() {
  ms::ModelShape s;
  s.n_layer = 2;
  s.n_head = 2;
  s.n_embd = 8;
  s.vocab_size = 30;
  s.padded_vocab_size = 32;
  s.seq_len = 16;
  return s;
}

using LlmcFormat = TempDir;

TEST_F(LlmcFormat, RoundTripThroughTensorMajorFile) {
  auto s = tiny_shape();
  auto part = ms::ModelPart::whole(s);
  auto layout = ms::param_layout(s, part);
  std::vector<float> p(static_cast<size_t>(layout.total));
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>(i) * 0.25f - 3.0f;
  save_llmc(path("m.bin"), s, p.data());
  EXPECT_EQ(fs::file_size(path("m.bin")), 1024 + p.size() * 4);

  // The file is tensor-major: right after the header comes wte, then wpe, then ln1w of layer 0
  // and layer 1, ...
  std::ifstream in(path("m.bin"), std::ios::binary);
  std::vector<int32_t> header(256);
  in.read(reinterpret_cast<char*>(header.data()), 1024);
  EXPECT_EQ(header[0], 20240326);
  EXPECT_EQ(header[1], 3);
  EXPECT_EQ(header[2], 16);
  EXPECT_EQ(header[3], 30);
  EXPECT_EQ(header[4], 2);
  EXPECT_EQ(header[5], 2);
  EXPECT_EQ(header[6], 8);
  EXPECT_EQ(header[7], 32);
  int64_t wte_wpe = (32 + 16) * 8;
  std::vector<float> file(p.size());
  in.read(reinterpret_cast<char*>(file.data()), static_cast<std::streamsize>(file.size() * 4));
  const auto* ln1w_l1 = layout.find_tensor(ms::ParamId::kLn1w, 1);
  ASSERT_NE(ln1w_l1, nullptr);
  EXPECT_EQ(file[wte_wpe + 8], p[ln1w_l1->offset]);  // ln1w of layer 1 follows ln1w of layer 0

  std::vector<float> q(p.size(), 0.0f);
  load_llmc(path("m.bin"), s, part, q.data());
  EXPECT_EQ(p, q);
  EXPECT_EQ(read_llmc_shape(path("m.bin")).n_embd, 8);
}

// llm.c's bf16 checkpoint (version 5, what its GPU trainer writes): 2 bytes per parameter, each
// value rounded to bf16 once; loading gives those values exactly.
TEST_F(LlmcFormat, Bf16VersionFiveRoundTripsTheRoundedValues) {
  auto s = tiny_shape();
  auto part = ms::ModelPart::whole(s);
  auto layout = ms::param_layout(s, part);
  std::vector<float> p(static_cast<size_t>(layout.total));
  for (size_t i = 0; i < p.size(); ++i) p[i] = std::sin(static_cast<float>(i)) * 0.1f;
  save_llmc(path("m5.bin"), s, p.data(), /*bf16=*/true);
  EXPECT_EQ(fs::file_size(path("m5.bin")), 1024 + p.size() * 2);
  std::ifstream in(path("m5.bin"), std::ios::binary);
  std::vector<int32_t> header(256);
  in.read(reinterpret_cast<char*>(header.data()), 1024);
  EXPECT_EQ(header[1], 5);
  std::vector<float> q(p.size(), 0.0f);
  load_llmc(path("m5.bin"), s, part, q.data());
  for (size_t i = 0; i < p.size(); ++i) EXPECT_EQ(q[i], bf16_to_f32(f32_to_bf16(p[i]))) << i;
  // A tensor-parallel shard of the same file reads its columns.
  std::vector<float> half(static_cast<size_t>(ms::param_layout(s, ms::ModelPart{0, 2, true, true, 2, 1}).total));
  load_llmc(path("m5.bin"), s, ms::ModelPart{0, 2, true, true, 2, 1}, half.data());
  // A truncated version-5 file is named.
  fs::resize_file(path("m5.bin"), fs::file_size(path("m5.bin")) - 2);
  EXPECT_NE(error_of([&] { load_llmc(path("m5.bin"), s, part, q.data()); }).find("the file is truncated"),
            std::string::npos);
}

TEST_F(LlmcFormat, BadFilesAreNamed) {
  auto s = tiny_shape();
  std::vector<float> p(static_cast<size_t>(ms::param_layout(s, ms::ModelPart::whole(s)).total));
  save_llmc(path("m.bin"), s, p.data());
  std::vector<float> q(p.size());
  auto other = s;
  other.n_embd = 16;
  other.n_head = 4;
  EXPECT_EQ(error_of([&] { load_llmc(path("m.bin"), other, ms::ModelPart::whole(other), q.data()); }),
            path("m.bin") + ": the checkpoint's shapes disagree with the config: n_head is 2 in the "
                            "checkpoint but 4 in the config; n_embd is 8 in the checkpoint but 16 in "
                            "the config");
  fs::resize_file(path("m.bin"), fs::file_size(path("m.bin")) - 4);
  EXPECT_NE(error_of([&] { load_llmc(path("m.bin"), s, ms::ModelPart::whole(s), q.data()); })
                .find("the file is truncated"),
            std::string::npos);
  std::string blob(1024, '\0');
  int32_t magic = 12345;
  std::memcpy(blob.data(), &magic, 4);
  ckpt::write_file_atomic(path("bad.bin"), blob);
  EXPECT_EQ(error_of([&] { read_llmc_shape(path("bad.bin")); }),
            path("bad.bin") + ": not an llm.c GPT-2 checkpoint (magic 12345, expected 20240326)");
  ckpt::write_file_atomic(path("short.bin"), "abc");
  EXPECT_EQ(error_of([&] { read_llmc_shape(path("short.bin")); }),
            path("short.bin") + ": truncated llm.c checkpoint (3 bytes, the header alone is 1024)");
}

// The inputs tests/fuzz kept (tests/fuzz/regressions/), each now a clear error naming the fault.
TEST_F(ShardFile, AnIndexWhoseShapeDoesNotDescribeItsBytesIsNamed) {
  for (const char* name : {"negative-dimension", "shape-larger-than-bytes"}) {
    std::ifstream in(std::string(DS_SOURCE_DIR "/tests/fuzz/regressions/fuzz_shard_file/") + name, std::ios::binary);
    std::string blob((std::istreambuf_iterator<char>(in)), {});
    ckpt::write_file_atomic(path("s.bin"), blob.substr(1));  // byte 0 is the fuzz target's flag
    EXPECT_NE(error_of([&] { ShardReader r(path("s.bin")); }).find("corrupt checkpoint shard index: tensor 'params'"),
              std::string::npos)
        << name;
  }
}

TEST_F(CheckpointDir, ALayoutOutsideItsRulesIsNamed) {
  auto layout_error = [&](const nlohmann::json& lay) {
    return error_of([&] { read_shard_layout({{"layout", lay}}, "m.json", "parameters"); });
  };
  nlohmann::json ok = {{"num_params", 16}, {"data_parallel_size", 2}, {"partitions", {{0, 8}, {8, 8}}}};
  EXPECT_EQ(layout_error(ok), "<no error>");
  auto with = [&](const char* k, nlohmann::json v) {
    auto l = ok;
    l[k] = v;
    return layout_error(l);
  };
  EXPECT_EQ(with("data_parallel_size", 0), "m.json: layout.data_parallel_size 0 x tp x cp x pp 1 is not the 2 shards of layout.partitions");
  EXPECT_EQ(with("tensor_parallel_size", 65536).substr(0, 40), "m.json: layout.partitions has 2 entries,");
  EXPECT_EQ(with("zero_stage", 4), "m.json: layout.zero_stage 4 is not 0-3");
  // A float where an integer belongs is named, not cast (fuzz_manifest found a huge one).
  EXPECT_EQ(with("pipeline_stages", 3.3e104), "m.json: layout.pipeline_stages must be an integer, got 3.3e+104");
  EXPECT_EQ(with("tensor_parallel_size", 1.5), "m.json: layout.tensor_parallel_size must be an integer, got 1.5");
  EXPECT_EQ(with("zero_stage", int64_t{1} << 40),
            "m.json: layout.zero_stage must lie in [-2147483647, 2147483647], got 1099511627776");
  EXPECT_EQ(with("partitions", {{0, 8}, {8.5, 8}}), "m.json: layout.partitions must be an integer, got 8.5");
  EXPECT_EQ(with("expert_parallel_size", 3), "m.json: layout.expert_parallel_size 3 does not divide the 2 "
                                              "data-parallel x context-parallel ranks");
  EXPECT_EQ(with("part_num_params", {16, 10}),
            "m.json: layout.partitions[1] = [8, 8] is not a range inside its part's 10 parameters");
  auto old = ok;
  old.erase("data_parallel_size");  // older manifests: dp follows from the shards
  EXPECT_EQ(layout_error(old), "<no error>");
  EXPECT_EQ(read_shard_layout({{"layout", old}}, "m.json", "parameters").data_parallel_size, 2);
}

TEST_F(LlmcFormat, AHeaderWhoseModelIsNotTheFileIsNamed) {
  std::vector<int32_t> h(256, 0);
  h[0] = kLlmcMagic;
  h[1] = kLlmcVersionFp32;
  h[2] = 1024, h[3] = 50257, h[4] = 1 << 20, h[5] = 1, h[6] = 1 << 30, h[7] = 50304;  // overflowed int64 once
  ckpt::write_file_atomic(path("big.bin"), std::string(reinterpret_cast<const char*>(h.data()), 1024));
  EXPECT_NE(error_of([&] { read_llmc_shape(path("big.bin")); }).find("parameters): the file is truncated"),
            std::string::npos);
}

}  // namespace
}  // namespace ds::rt::ckpt
