// Fuzzes checkpoint manifests (runtime/checkpoint: checkpoint_dir.h's read_manifest, manifest.h's
// read_shard_layout, verify.h's verify_checkpoint_dir) as `dstrain checkpoint verify` and a resume
// read them. The input is manifest.json of a step directory that also holds two intact shards
// (rank_00000.bin, rank_00001.bin: params, exp_avg, exp_avg_sq and master of 8 f32 each), written
// once at start-up. Manifests without a "crc32c" key are read unchecked (those written before
// checksums), so mutations reach the layout's rules.
// Invariants: verify never throws for a corrupt checkpoint (its faults are lines); a layout it
// returns has tp, pp, dp >= 1, ZeRO stage 0-3, and partitions that fit the model's parameters.
#include <filesystem>
#include <string>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/manifest.h"
#include "checkpoint/shard_file.h"
#include "checkpoint/verify.h"
#include "fuzz_support.h"

using namespace ds;
using namespace ds::rt;

namespace {

const std::string& step_dir() {
  static const std::string dir = [] {
    std::string d = fuzz::scratch_dir() + "/step_00000004";
    std::filesystem::create_directories(d);
    std::vector<float> v(8, 0.5f);
    for (int q = 0; q < 2; ++q) {
      ckpt::ShardWriter w;
      for (const char* name : {"params", "master", "exp_avg", "exp_avg_sq"}) w.add(name, "f32", {8}, v.data(), 32);
      w.write(d + "/" + ckpt::shard_file_name(q));
    }
    return d;
  }();
  return dir;
}

void check_layout(const ckpt::ShardLayout& l) {
  DS_FUZZ_CHECK(l.tensor_parallel_size >= 1 && l.pipeline_stages >= 1 && l.data_parallel_size >= 1);
  DS_FUZZ_CHECK(l.zero_stage >= 0 && l.zero_stage <= 3);
  DS_FUZZ_CHECK(l.world_size == static_cast<int>(l.partitions.size()));
  DS_FUZZ_CHECK(static_cast<int64_t>(l.data_parallel_size) * l.tensor_parallel_size * l.pipeline_stages == l.world_size);
  DS_FUZZ_CHECK(l.num_params >= 0);
  for (size_t q = 0; q < l.partitions.size(); ++q) {
    const auto [begin, count] = l.partitions[q];
    const int64_t part = l.part_num_params.empty() ? l.num_params : l.part_num_params[q];
    DS_FUZZ_CHECK(part >= 0 && begin >= 0 && count >= 0 && begin <= part && count <= part - begin);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::quiet_logging();
  step_dir();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = step_dir();
  std::filesystem::path scratch = fuzz::write_scratch("manifest.json", data, size);
  std::filesystem::rename(scratch, dir + "/manifest.json");
  fuzz::clear_error_or_value([&] {
    auto m = ckpt::read_manifest(dir);
    check_layout(ckpt::read_shard_layout(m, dir + "/manifest.json", "parameters"));
  });
  ckpt::VerifyResult r = ckpt::verify_checkpoint_dir(dir);
  DS_FUZZ_CHECK(!r.lines.empty());
  return 0;
}
