// The seam of the CUDA module (runtime/core/cuda_module.h) seen from outside, on the built
// binaries: `ldd dstrain` names no CUDA library; a dstrain copied to a directory without the
// module (as on a machine where it was never installed) runs a CPU training job to the end, and
// a CUDA job there fails with an error naming the missing module and what to install.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/cuda_module.h"
#include "data/token_file.h"
#include "support/run_command.h"

namespace ds::test {
namespace {

namespace fs = std::filesystem;

class CudaModuleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ds_cuda_module_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "bin");
    std::vector<uint16_t> toks(8000);
    for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<uint16_t>((i * 7 + i / 5) % 29);
    rt::data::write_token_file((dir_ / "train.bin").string(), toks);
    // The executable alone: no libdstrain_cuda.so beside it.
    fs::copy_file(dstrain(), dir_ / "bin" / "dstrain");
    fs::permissions(dir_ / "bin" / "dstrain", fs::perms::owner_all);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write_config(const std::string& device) const {
    nlohmann::json j = {
        {"train_micro_batch_size_per_gpu", 2},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.003}}}}},
        {"model", {{"type", "gpt2"}, {"n_layer", 1}, {"n_head", 2}, {"n_embd", 16}, {"vocab_size", 32}, {"seq_len", 8}}},
        {"data", {{"train", (dir_ / "train.bin").string()}}},
        {"training", {{"steps", 3}, {"device", device}}},
    };
    const std::string path = (dir_ / (device + ".json")).string();
    std::ofstream(path) << j.dump(2);
    return path;
  }
  // Runs the copied binary with no store or rank variables of an outer launch.
  CommandResult run_copy(const std::string& args) const {
    return run_command("env -u DSTRAIN_STORE -u RANK -u WORLD_SIZE -u DSTRAIN_CUDA_MODULE OMP_NUM_THREADS=1 " +
                       (dir_ / "bin" / "dstrain").string() + " " + args);
  }

  fs::path dir_;
};

TEST(CudaModule, DstrainLinksNoCudaLibrary) {
  const auto r = run_command("ldd " + dstrain());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* lib : {"libcudart", "libcublas", "libcublasLt", "libnccl", "libcuda."}) {
    EXPECT_EQ(r.out.find(lib), std::string::npos) << "dstrain links " << lib << ":\n" << r.out;
  }
}

TEST_F(CudaModuleTest, CpuTrainingRunsWithoutTheModule) {
  const auto r = run_copy("train --config " + write_config("cpu"));
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("step 3/3"), std::string::npos) << r.out << r.err;
}

TEST_F(CudaModuleTest, CudaWithoutTheModuleNamesItAndWhatToDo) {
  const auto r = run_copy("train --config " + write_config("cuda"));
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("$.training.device"), std::string::npos) << all;
  if (rt::cuda_module_built()) {
    EXPECT_NE(all.find((dir_ / "bin" / rt::kCudaModuleFile).string() + " is missing"), std::string::npos) << all;
    EXPECT_NE(all.find("DSTRAIN_CUDA_MODULE"), std::string::npos) << all;  // the hint
  } else {
    EXPECT_NE(all.find("built without CUDA"), std::string::npos) << all;
  }
}

TEST_F(CudaModuleTest, ReportSaysTheModuleIsMissingWithoutFailing) {
  const auto r = run_copy("report");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find(rt::cuda_module_built() ? "is missing" : "not compiled in"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace ds::test
