// Fuzzes llm.c GPT-2 checkpoints (runtime/checkpoint/llmc_format.h) as `model.init_from` and
// `dstrain train --init-from` read them: the header (read_llmc_shape), then the whole model's
// parameters into a buffer sized from the file (load_llmc), fp32 (version 3) and bf16 (5).
// Invariants: a shape that reads back is valid; a load that succeeds writes exactly the
// file's parameters (ASan guards the buffer's end).
#include <string>
#include <vector>

#include "checkpoint/llmc_format.h"
#include "fuzz_support.h"

using namespace ds;
using namespace ds::rt;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::quiet_logging();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = fuzz::write_scratch("model.bin", data, size);
  model_spec::ModelShape shape;
  if (!fuzz::clear_error_or_value([&] { shape = ckpt::read_llmc_shape(path); })) return 0;
  DS_FUZZ_CHECK(size >= 1024);
  shape.validate();  // throws (and so crashes here) if the reader let an impossible shape through
  const int32_t version = reinterpret_cast<const int32_t*>(data)[1];
  const size_t elem = version == ckpt::kLlmcVersionBf16 ? 2 : 4;
  std::vector<float> params(std::max<size_t>(1, (size - 1024) / elem));
  fuzz::clear_error_or_value(
      [&] { ckpt::load_llmc(path, shape, model_spec::ModelPart::whole(shape), params.data()); });
  return 0;
}
