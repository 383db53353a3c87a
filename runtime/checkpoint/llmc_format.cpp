#include "checkpoint/llmc_format.h"

#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/atomic_file.h"
#include "common/crc32c.h"
#include "common/error.h"
#include "common/half.h"
#include "model_spec/family.h"

namespace ds::rt::ckpt {

namespace ms = ds::model_spec;

namespace {

constexpr size_t kHeaderInts = 256;
constexpr size_t kHeaderBytes = kHeaderInts * sizeof(int32_t);

// Offset (elements) of each tensor's block in llm.c's tensor-major file.
std::vector<int64_t> llmc_offsets(const std::vector<ms::ParamTensor>& params, int n_layer) {
  std::vector<int64_t> off;
  int64_t cur = 0;
  for (const auto& t : params) {
    off.push_back(cur);
    cur += t.numel() * (t.per_layer ? n_layer : 1);
  }
  off.push_back(cur);
  return off;
}

// llm.c's file holds one family's tensors in that family's order (model_spec/family.h).
void require_llmc_family(const ms::ModelShape& s, const std::string& path) {
  if (!ms::family_of(s).llmc_checkpoint) {
    throw invalid_argument("{}: llm.c's checkpoint format holds {} models; model.type {} has none", path,
                           ms::llmc_family().display_name, ms::family_of(s).name);
  }
}

// The header's model must be the file's size before any offset is computed: a corrupt header's
// dimensions would overflow int64 (found by tests/fuzz: n_embd 2^30, n_layer 2^20), so the
// count is taken in long double, exact up to 2^64 and far past any real file.
void check_header_fits_file(const ms::ModelShape& s, int version, size_t file_bytes, const std::string& path) {
  long double count = 0;
  for (const auto& t : ms::model_params(s)) {
    long double n = t.per_layer ? s.n_layer : 1;
    for (int64_t d : t.shape) n *= static_cast<long double>(d);
    count += n;
  }
  const size_t elem = version == kLlmcVersionBf16 ? 2 : 4;
  const long double want = static_cast<long double>(kHeaderBytes) + count * elem;
  if (want != static_cast<long double>(file_bytes)) {
    throw invalid_argument("{}: llm.c checkpoint has {} bytes, expected {:.0Lf} for the header's model ({:.0Lf} "
                           "parameters){}",
                           path, file_bytes, want, count, static_cast<long double>(file_bytes) < want ? ": the file is truncated" : "");
  }
}

ms::ModelShape shape_from_header(const int32_t* h, size_t file_bytes, const std::string& path) {
  if (h[0] != kLlmcMagic) {
    throw invalid_argument("{}: not an llm.c {} checkpoint (magic {}, expected {})", path,
                           ms::llmc_family().display_name, h[0], kLlmcMagic);
  }
  if (h[1] != kLlmcVersionFp32 && h[1] != kLlmcVersionBf16) {
    throw invalid_argument("{}: llm.c checkpoint version {} is not supported (dstrain reads version {}, fp32 "
                           "parameters, and {}, bf16 parameters)",
                           path, h[1], kLlmcVersionFp32, kLlmcVersionBf16);
  }
  ms::ModelShape s;
  s.family = ms::llmc_family().family;
  s.seq_len = h[2];
  s.vocab_size = h[3];
  s.n_layer = h[4];
  s.n_head = h[5];
  s.n_embd = h[6];
  s.padded_vocab_size = h[7];
  try {
    s.validate();
  } catch (const Error& e) {
    throw invalid_argument("{}: the header describes an impossible model: {}", path, e.what());
  }
  check_header_fits_file(s, h[1], file_bytes, path);
  return s;
}

}  // namespace

model_spec::ModelShape read_llmc_shape(const std::string& path) {
  std::string blob = read_file(path, "llm.c checkpoint");
  if (blob.size() < kHeaderBytes) {
    throw invalid_argument("{}: truncated llm.c checkpoint ({} bytes, the header alone is {})", path,
                           blob.size(), kHeaderBytes);
  }
  return shape_from_header(reinterpret_cast<const int32_t*>(blob.data()), blob.size(), path);
}

void load_llmc(const std::string& path, const ms::ModelShape& shape, const ms::ModelPart& part,
               float* params) {
  require_llmc_family(shape, path);
  std::string blob = read_file(path, "llm.c checkpoint");
  if (blob.size() < kHeaderBytes) {
    throw invalid_argument("{}: truncated llm.c checkpoint ({} bytes, the header alone is {})", path,
                           blob.size(), kHeaderBytes);
  }
  ms::ModelShape file = shape_from_header(reinterpret_cast<const int32_t*>(blob.data()), blob.size(), path);
  struct Field {
    const char* name;
    int file, config;
  };
  const Field fields[] = {{"n_layer", file.n_layer, shape.n_layer},
                          {"n_head", file.n_head, shape.n_head},
                          {"n_embd", file.n_embd, shape.n_embd},
                          {"vocab_size", file.vocab_size, shape.vocab_size},
                          {"padded_vocab_size", file.padded_vocab_size, shape.padded_vocab_size},
                          {"seq_len", file.seq_len, shape.seq_len}};
  std::string mismatch;
  for (const auto& f : fields) {
    if (f.file != f.config) {
      mismatch += fmt::format("{}{} is {} in the checkpoint but {} in the config",
                              mismatch.empty() ? "" : "; ", f.name, f.file, f.config);
    }
  }
  if (!mismatch.empty()) {
    throw invalid_argument("{}: the checkpoint's shapes disagree with the config: {}", path, mismatch);
  }
  const int version = reinterpret_cast<const int32_t*>(blob.data())[1];
  const size_t elem = version == kLlmcVersionBf16 ? 2 : 4;
  auto all = ms::model_params(shape);
  auto off = llmc_offsets(all, shape.n_layer);
  size_t want = kHeaderBytes + static_cast<size_t>(off.back()) * elem;
  if (blob.size() != want) {
    throw invalid_argument("{}: llm.c checkpoint has {} bytes, expected {} for this model ({} "
                           "parameters){}",
                           path, blob.size(), want, off.back(),
                           blob.size() < want ? ": the file is truncated" : "");
  }
  const char* src = blob.data() + kHeaderBytes;
  // The file's element at index k, as fp32 (bf16 values are exact in fp32).
  auto value = [&](int64_t k) {
    if (elem == 4) {
      float f;
      std::memcpy(&f, src + static_cast<size_t>(k) * 4, 4);
      return f;
    }
    uint16_t b;
    std::memcpy(&b, src + static_cast<size_t>(k) * 2, 2);
    return bf16_to_f32(b);
  };
  auto layout = ms::param_layout(shape, part);
  for (const auto& ts : layout.tensors) {
    const auto& t = ms::find_param(all, ts.id);
    int64_t base = off[static_cast<size_t>(ts.id)] + (t.per_layer ? int64_t(ts.layer) * t.numel() : 0);
    for (int64_t i = 0; i < ts.numel; ++i) {
      params[ts.offset + i] = value(base + ms::full_index(t, part.tp, part.tp_rank, i, part.ep, part.ep_rank));
    }
  }
}

void save_llmc(const std::string& path, const ms::ModelShape& shape, const float* params, bool bf16) {
  require_llmc_family(shape, path);
  auto all = ms::model_params(shape);
  auto off = llmc_offsets(all, shape.n_layer);
  const size_t elem = bf16 ? 2 : 4;
  std::string blob(kHeaderBytes + static_cast<size_t>(off.back()) * elem, '\0');
  int32_t header[kHeaderInts] = {};
  header[0] = kLlmcMagic;
  header[1] = bf16 ? kLlmcVersionBf16 : kLlmcVersionFp32;
  header[2] = shape.seq_len;
  header[3] = shape.vocab_size;
  header[4] = shape.n_layer;
  header[5] = shape.n_head;
  header[6] = shape.n_embd;
  header[7] = shape.padded_vocab_size;
  std::memcpy(blob.data(), header, kHeaderBytes);
  char* dst = blob.data() + kHeaderBytes;
  auto layout = ms::param_layout(shape, ms::ModelPart::whole(shape));
  for (const auto& ts : layout.tensors) {
    const auto& t = ms::find_param(all, ts.id);
    int64_t base = off[static_cast<size_t>(ts.id)] + (t.per_layer ? int64_t(ts.layer) * t.numel() : 0);
    if (!bf16) {
      std::memcpy(dst + static_cast<size_t>(base) * 4, params + ts.offset, static_cast<size_t>(ts.numel) * 4);
      continue;
    }
    for (int64_t i = 0; i < ts.numel; ++i) {  // llm.c's bf16 file: each fp32 value rounded once
      const uint16_t b = f32_to_bf16(params[ts.offset + i]);
      std::memcpy(dst + static_cast<size_t>(base + i) * 2, &b, 2);
    }
  }
  write_file_atomic(path, blob);
  // llm.c's format has no room for a checksum: read the file back and compare.
  const uint32_t written = crc32c(blob), read = crc32c(read_file(path, "llm.c checkpoint"));
  if (written != read) {
    throw system_error("{}: the llm.c file reads back differently from what was written (CRC-32C {} written, {} "
                       "read): the disk or filesystem corrupted it",
                       path, crc32c_hex(written), crc32c_hex(read));
  }
}

}  // namespace ds::rt::ckpt
