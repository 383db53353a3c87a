// Checkpoints that cannot be trusted or cannot be written, on real 2-rank jobs:
//   - a flipped bit in the newest checkpoint (a shard's tensor, a shard's header, the manifest) is
//     found and named by `dstrain checkpoint verify`, and `--resume` refuses it, naming the
//     newest intact checkpoint and how to use it (--resume-from), which then continues the
//     uninterrupted run's curve bit for bit;
//   - a checkpoint that hits a full disk (a small tmpfs mounted by the test, else a file-size
//     limit) fails the job with an error naming the path and the bytes needed, leaves the previous
//     checkpoint and `latest` intact and no final directory of the failed step, and the previous
//     checkpoint resumes bit-exact.
#include <sys/mount.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/token_file.h"
#include "multiproc/launch/job_process.h"
#include "multiproc/train/train_job.h"
#include "support/run_command.h"

namespace ds {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using nlohmann::json;
using test::TempDir;

constexpr int kSteps = 12;

class CheckpointIntegrity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::vector<uint16_t> toks(20000);
    std::mt19937 rng(5);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>((i * 3 + i / 5 + rng() % 3) % 31);
    rt::data::write_token_file(*dir_ / "train.bin", toks);
    auto r = run(config(""), {});
    ASSERT_EQ(r.rc, 0) << r.err;
    ASSERT_EQ(r.metrics.size(), static_cast<size_t>(kSteps));
    baseline_ = new std::vector<json>(r.metrics);
  }
  static void TearDownTestSuite() {
    delete baseline_;
    delete dir_;
  }
  static json config(const std::string& ckpt_dir, int interval = 4) {
    json training = {{"steps", kSteps}, {"seed", 3}, {"log_interval", 4}};
    if (!ckpt_dir.empty()) {
      training["checkpoint_dir"] = ckpt_dir;
      training["checkpoint_interval"] = interval;
    }
    return {{"train_batch_size", 4},
            {"train_micro_batch_size_per_gpu", 1},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}}}}},
            {"zero_optimization", {{"stage", 1}}},
            {"model", {{"type", "gpt2"}, {"n_layer", 2}, {"n_head", 2}, {"n_embd", 32}, {"vocab_size", 32}, {"seq_len", 16}}},
            {"data", {{"train", *dir_ / "train.bin"}}},
            {"training", training}};
  }
  static test::TrainJobResult run(const json& cfg, const std::vector<std::string>& extra) {
    static int counter = 0;
    return test::run_train_job(dir_->path(), "run" + std::to_string(counter++), 2, cfg, extra, 120s);
  }
  // The resumed run's losses equal the uninterrupted run's, bit for bit, from `first_step` on.
  static void expect_continues(const test::TrainJobResult& r, int first_step) {
    ASSERT_EQ(r.rc, 0) << r.err;
    ASSERT_EQ(r.metrics.size(), static_cast<size_t>(kSteps - first_step + 1));
    for (size_t i = 0; i < r.metrics.size(); ++i) {
      EXPECT_EQ(r.metrics[i]["loss"].get<double>(), (*baseline_)[first_step - 1 + i]["loss"].get<double>())
          << "step " << first_step + static_cast<int>(i);
    }
  }
  static void flip_bit(const std::string& file, uint64_t offset) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x04);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(&c, 1);
  }
  static inline TempDir* dir_ = nullptr;
  static inline std::vector<json>* baseline_ = nullptr;
};

TEST_F(CheckpointIntegrity, AFlippedBitIsNamedAndResumeSaysWhichCheckpointIsIntact) {
  const std::string root = *dir_ / "flip";
  auto r = run(config(root), {"--max-steps", "8"});  // checkpoints at steps 4 and 8
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string s4 = root + "/step_00000004", s8 = root + "/step_00000008";
  auto ok = test::run_command(test::dstrain() + " checkpoint verify " + root);
  EXPECT_EQ(ok.exit_code, 0) << ok.out << ok.err;
  // Each kind of file: a tensor's bytes (the last bytes of a shard), a shard's header, the manifest.
  const std::string shard = s8 + "/rank_00001.bin";
  for (const std::string& what : {std::string("tensor"), std::string("header"), std::string("manifest")}) {
    SCOPED_TRACE(what);
    const fs::path saved = *dir_ / "saved";
    fs::remove_all(saved);
    fs::copy(s8, saved);
    if (what == "tensor") flip_bit(shard, fs::file_size(shard) - 3);
    if (what == "header") flip_bit(shard, 9);
    if (what == "manifest") flip_bit(s8 + "/manifest.json", fs::file_size(s8 + "/manifest.json") / 2);
    auto v = test::run_command(test::dstrain() + " checkpoint verify " + root);
    EXPECT_EQ(v.exit_code, 1) << v.out;
    const std::string bad_file = what == "manifest" ? s8 + "/manifest.json" : shard;
    EXPECT_NE(v.out.find("BAD " + bad_file), std::string::npos) << v.out;
    if (what == "tensor") {
      EXPECT_NE(v.out.find("tensor 'exp_avg_sq' (bytes "), std::string::npos) << v.out;
    }
    EXPECT_NE(v.out.find("ok " + s4 + "/rank_00001.bin"), std::string::npos) << v.out;
    auto resumed = run(config(root), {"--resume"});
    EXPECT_NE(resumed.rc, 0) << resumed.err;
    EXPECT_NE(resumed.err.find("the newest intact checkpoint is " + s4), std::string::npos) << resumed.err;
    EXPECT_NE(resumed.err.find("--resume-from " + s4), std::string::npos) << resumed.err;
    fs::remove_all(s8);
    fs::copy(saved, s8);
  }
  flip_bit(shard, fs::file_size(shard) - 3);
  // What the message says to do works: the older checkpoint continues the curve bit for bit.
  expect_continues(run(config(*dir_ / "flip_resumed"), {"--resume-from", s4}), 5);
}

// Mounts a tmpfs of `bytes` at dir; false where the machine does not allow it.
bool mount_small_tmpfs(const std::string& dir, uint64_t bytes) {
  fs::create_directories(dir);
  const std::string opts = "size=" + std::to_string(bytes);
  return ::mount("tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) == 0;
}

TEST_F(CheckpointIntegrity, AFullDiskKeepsThePreviousCheckpointWhichResumesBitExact) {
  // The size of one checkpoint, from a run on the ordinary disk.
  const std::string probe = *dir_ / "probe";
  ASSERT_EQ(run(config(probe), {"--max-steps", "4"}).rc, 0);
  uint64_t one = 0, shard = 0;
  for (const auto& e : fs::recursive_directory_iterator(probe + "/step_00000004")) {
    if (e.is_regular_file()) one += (e.file_size() + 4095) / 4096 * 4096;
    if (e.path().filename() == "rank_00000.bin") shard = e.file_size();
  }
  const std::string root = *dir_ / "full";
  if (!mount_small_tmpfs(root, 2 * one + one / 2)) {  // room for two checkpoints, not three
    (void)shard;
    GTEST_SKIP() << "mounting a tmpfs is not allowed here; see ACheckpointOverTheFileSizeLimitFailsClearly";
  }
  const auto r = run(config(root), {});
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("bytes are free on the filesystem"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(root + "/step_00000008/manifest.json"));
  EXPECT_FALSE(fs::exists(root + "/step_00000012"));
  EXPECT_EQ(test::slurp(root + "/latest"), "step_00000008\n");
  const auto v = test::run_command(test::dstrain() + " checkpoint verify " + root + "/step_00000008");
  EXPECT_EQ(v.exit_code, 0) << v.out;
  const std::string copy = *dir_ / "full_copy";
  fs::copy(root, copy, fs::copy_options::recursive);
  ::umount2(root.c_str(), MNT_DETACH);
  expect_continues(run(config(copy), {"--resume"}), 9);
}

// The fallback of machines without tmpfs, run everywhere: RLIMIT_FSIZE below one shard. The job
// fails at its first checkpoint naming the file and the bytes it needs; nothing final is left.
TEST_F(CheckpointIntegrity, ACheckpointOverTheFileSizeLimitFailsClearly) {
  const std::string root = *dir_ / "limited";
  const std::string cfg = *dir_ / "limited.json";
  std::ofstream(cfg) << config(root).dump(2);
  // Gloo: the shm backend's segments are files too, which the limit would refuse.
  const auto r = test::run_command("ulimit -f 4; env -u DSTRAIN_STORE -u RANK -u WORLD_SIZE OMP_NUM_THREADS=1 "
                                   "DSTRAIN_COMM_BACKEND=gloo " +
                                   test::dstrain() + " launch --nproc-per-node 2 --kill-timeout 5 -- " +
                                   test::dstrain() + " train --config " + cfg);
  EXPECT_NE(r.exit_code, 0);
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("File too large"), std::string::npos) << all;
  EXPECT_NE(all.find("the file needs"), std::string::npos) << all;
  EXPECT_FALSE(fs::exists(root + "/step_00000004"));
  EXPECT_FALSE(fs::exists(root + "/latest"));
}

}  // namespace
}  // namespace ds
