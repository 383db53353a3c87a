// safetensors reader and writer: round trips in F32/BF16/F16, a file from a hand-rolled Python
// writer (write_safetensors.py), sharded directories with an index, and every malformed file
// the reader must refuse with an error naming the problem.
#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/half.h"
#include "support/run_command.h"

using namespace ds::rt::ckpt;
namespace fs = std::filesystem;

namespace {

std::string tmp_dir(const std::string& tag) {
  const std::string d = fs::temp_directory_path() / ("ds_st_" + tag + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A raw file: header JSON text (unpadded), then `data`; optionally a lying header length.
void write_raw(const std::string& path, const std::string& header, const std::string& data,
               int64_t header_len = -1) {
  const uint64_t n = header_len >= 0 ? static_cast<uint64_t>(header_len) : header.size();
  std::string out;
  for (int i = 0; i < 8; i++) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  out += header + data;
  std::ofstream(path, std::ios::binary) << out;
}

std::string error_of(const std::string& path) {
  try {
    SafetensorsFile f(path);
  } catch (const ds::Error& e) {
    EXPECT_EQ(e.kind(), ds::ErrorKind::kInvalidArgument) << e.what();
    return e.what();
  }
  return "";
}

std::vector<float> ramp(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = (static_cast<float>(i) - 3.3f) * scale;
  return v;
}

}  // namespace

TEST(Safetensors, RoundTripEachDtype) {
  const std::string d = tmp_dir("rt");
  std::vector<StTensorOut> ts = {{"w.f32", StDtype::kF32, {3, 4}, ramp(12, 0.37f)},
                                 {"w.bf16", StDtype::kBF16, {5}, ramp(5, 1.01f)},
                                 {"w.f16", StDtype::kF16, {2, 1, 3}, ramp(6, 0.013f)}};
  write_safetensors(d + "/m.safetensors", ts, {{"format", "pt"}});
  SafetensorsFile f(d + "/m.safetensors");
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  for (const auto& t : ts) {
    const StTensorInfo* info = f.find(t.name);
    ASSERT_NE(info, nullptr) << t.name;
    EXPECT_EQ(info->dtype, t.dtype);
    EXPECT_EQ(info->shape, t.shape);
    std::vector<float> got(t.values.size());
    f.read_f32(t.name, t.shape, got.data());
    for (size_t i = 0; i < got.size(); i++) {
      const float want = t.dtype == StDtype::kF32    ? t.values[i]
                         : t.dtype == StDtype::kBF16 ? ds::bf16_to_f32(ds::f32_to_bf16(t.values[i]))
                                                     : ds::f16_to_f32(ds::f32_to_f16(t.values[i]));
      EXPECT_EQ(got[i], want) << t.name << "[" << i << "]";
    }
  }
  // The header is padded to 8 bytes, as the reference writer does.
  std::ifstream in(d + "/m.safetensors", std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  fs::remove_all(d);
}

TEST(Safetensors, ReadsAFileWrittenByPython) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  const std::string d = tmp_dir("py");
  const auto r = ds::test::run_command("/usr/bin/python3 " +
                                       ds::test::source_path("tests/unit/safetensors/write_safetensors.py") + " " +
                                       d + "/py.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  SafetensorsFile f(d + "/py.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  std::vector<float> a(6), b(4), c(4);
  f.read_f32("a", {2, 3}, a.data());
  f.read_f32("b", {4}, b.data());
  f.read_f32("c", {2, 2}, c.data());
  for (int i = 0; i < 6; i++) EXPECT_EQ(a[i], i * 0.25f - 1);
  for (int i = 0; i < 4; i++) EXPECT_EQ(b[i], i - 1.5f);
  for (int i = 0; i < 4; i++) EXPECT_EQ(c[i], i * 0.5f + 0.125f);
  EXPECT_EQ(f.find("b")->dtype, StDtype::kBF16);
  EXPECT_EQ(f.find("c")->dtype, StDtype::kF16);
  fs::remove_all(d);
}

TEST(Safetensors, ShardedDirectoryWithIndex) {
  const std::string d = tmp_dir("shards");
  std::vector<StTensorOut> ts;
  for (int i = 0; i < 5; i++) ts.push_back({"t" + std::to_string(i), StDtype::kF32, {10}, ramp(10, i + 1.0f)});
  const auto files = write_safetensors_dir(d, ts, 100);  // 40 bytes each: two a shard
  ASSERT_EQ(files.size(), 4u);  // 3 shards + index
  EXPECT_EQ(files[0], "model-00001-of-00003.safetensors");
  SafetensorsSet set(d);
  EXPECT_EQ(set.names().size(), 5u);
  for (const auto& t : ts) {
    std::vector<float> got(10);
    set.read_f32(t.name, {10}, got.data());
    EXPECT_EQ(got, t.values);
  }
  // One file fits: a plain model.safetensors, found through the directory.
  const std::string d1 = tmp_dir("single");
  EXPECT_EQ(write_safetensors_dir(d1, ts, 1 << 20), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(SafetensorsSet(d1).names().size(), 5u);
  // An index naming a tensor its shard does not hold.
  nlohmann::json idx = nlohmann::json::parse(ds::test::read_file(d + "/model.safetensors.index.json"));
  idx["weight_map"]["ghost"] = "model-00001-of-00003.safetensors";
  std::ofstream(d + "/model.safetensors.index.json") << idx.dump();
  try {
    SafetensorsSet bad(d);
    FAIL() << "expected an error";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'ghost'"), std::string::npos) << e.what();
  }
  fs::remove_all(d);
  fs::remove_all(d1);
}

TEST(Safetensors, MalformedFilesAreClearErrors) {
  const std::string d = tmp_dir("bad");
  const std::string p = d + "/bad.safetensors";
  const std::string data16(16, '\0');
  auto expect = [&](const std::string& header, const std::string& data, const std::string& needle,
                    int64_t header_len = -1) {
    write_raw(p, header, data, header_len);
    const std::string err = error_of(p);
    EXPECT_NE(err.find(needle), std::string::npos) << "header " << header << ": got '" << err << "'";
    EXPECT_NE(err.find(p), std::string::npos) << err;
  };
  // Offsets past the data section.
  expect(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", data16, "reach past the data section");
  // Overlapping tensors.
  expect(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"y":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
         data16, "overlap");
  // A dtype dstrain does not read, and a dtype/shape disagreeing with the byte range.
  expect(R"({"x":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", data16, "dtype I64");
  expect(R"({"x":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})", data16, "needs 24 bytes");
  expect(R"({"x":{"dtype":"BF16","shape":[4],"data_offsets":[0,16]}})", data16, "needs 8 bytes");
  // Bytes no tensor owns, end before begin, missing fields, negative sizes, not JSON.
  expect(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", data16, "belong to no tensor");
  expect(R"({"x":{"dtype":"F32","shape":[0],"data_offsets":[16,8]}})", data16, "end before they begin");
  expect(R"({"x":{"dtype":"F32","shape":[4]}})", data16, "no \"data_offsets\"");
  expect(R"({"x":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", data16, "non-negative");
  expect(R"({"x": nope)", data16, "not a JSON object");
  // Truncation: of the data, of the header, and a file shorter than the length field.
  expect(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data16.substr(0, 10),
         "reach past the data section");
  expect(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", "", "truncated", 4096);
  std::ofstream(p, std::ios::binary) << "abc";
  EXPECT_NE(error_of(p).find("too short"), std::string::npos);
  // A good file read with the wrong expected shape.
  write_raw(p, R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data16);
  SafetensorsFile f(p);
  std::vector<float> buf(4);
  try {
    f.read_f32("x", {2, 2}, buf.data());
    FAIL() << "expected a shape error";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("has shape [4] but the model expects [2, 2]"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(f.read_f32("missing", {}, buf.data()), ds::Error);
  fs::remove_all(d);
}
