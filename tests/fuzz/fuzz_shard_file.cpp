// Fuzzes checkpoint shard files (runtime/checkpoint/shard_file.h) as a resume reads them: open
// (header, index), names, every tensor read with the dtype and shape its index claims, verify().
// Input byte 0, bit 0: "fix the header's checksums" (bytes 16-23 of a DSSHARD2 file are
// recomputed over the mutated header and index), so mutations reach the JSON index and the
// tensors' own CRCs instead of always failing the header's; the rest is the file.
// Invariants of an opened file: every tensor's dims are >= 0 and, for the dtypes dstrain writes,
// its bytes are its elements times the element size; a read returns exactly those bytes.
#include <cstring>
#include <string>

#include "checkpoint/shard_file.h"
#include "common/crc32c.h"
#include "fuzz_support.h"

using namespace ds;
using namespace ds::rt;

namespace {

void fix_header_crcs(std::string& f) {
  if (f.size() < 24 || std::memcmp(f.data(), "DSSHARD2", 8) != 0) return;
  uint64_t n = 0;
  std::memcpy(&n, f.data() + 8, 8);
  if (n <= f.size() - 24) {
    uint32_t c = crc32c(f.data() + 24, n);
    std::memcpy(f.data() + 16, &c, 4);
  }
  uint32_t h = crc32c(f.data(), 20);
  std::memcpy(f.data() + 20, &h, 4);
}

size_t element_size(const std::string& dtype) {
  if (dtype == "f32") return 4;
  if (dtype == "bf16" || dtype == "f16") return 2;
  if (dtype == "i64") return 8;
  return 0;  // a dtype dstrain does not write: no size rule to check
}

void read_all(const ckpt::ShardReader& r, size_t file_size) {
  for (const auto& name : r.names()) {
    const auto& shape = r.shape_of(name);
    const auto& dtype = r.dtype_of(name);
    const size_t es = element_size(dtype);
    uint64_t bytes = es;
    for (int64_t d : shape) {
      DS_FUZZ_CHECK(d >= 0);
      DS_FUZZ_CHECK(!__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes));
    }
    if (es == 0) continue;
    DS_FUZZ_CHECK(bytes <= file_size);  // the index's shape agrees with bytes that lie in the file
    std::vector<char> out(bytes);
    r.read(name, dtype, shape, out.data(), out.size());
  }
  r.verify();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string file(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 1) fix_header_crcs(file);
  const std::string path =
      fuzz::write_scratch("rank_00000.bin", reinterpret_cast<const uint8_t*>(file.data()), file.size());
  fuzz::clear_error_or_value([&] {
    ckpt::ShardReader r(path);
    read_all(r, file.size());
  });
  return 0;
}
