// llm.c's checkpoint format, so weights move between llm.c and dstrain. It holds one family,
// model_spec::llmc_family() (the description with llmc_checkpoint); its tensors:
//
//   header: 256 int32: [0] magic 20240326, [1] version (3: fp32 parameters, 5: bf16, as llm.c's
//           GPU trainer writes), [2] maxT, [3] V,
//           [4] L, [5] NH, [6] C, [7] Vp
//   then every parameter in llm.c's order, tensor-major: wte (Vp,C), wpe (maxT,C), ln1w (L,C),
//   ln1b (L,C), qkvw (L,3C,C), qkvb (L,3C), attprojw (L,C,C), attprojb (L,C), ln2w (L,C),
//   ln2b (L,C), fcw (L,4C,C), fcb (L,4C), fcprojw (L,C,4C), fcprojb (L,C), lnfw (C), lnfb (C).
//
// dstrain's flat buffer is layer-major (model_spec::param_layout); these functions translate,
// for any model part (pipeline stage, tensor-parallel shard), so each rank loads only its share.
// Versions 3 (fp32) and 5 (bf16) are read and written; bf16 values load exactly as fp32.
#pragma once

#include <string>

#include "model_spec/shape.h"

namespace ds::rt::ckpt {

inline constexpr int kLlmcMagic = 20240326;
inline constexpr int kLlmcVersionFp32 = 3;
inline constexpr int kLlmcVersionBf16 = 5;

// Reads the header of an llm.c checkpoint; errors name the file (missing, truncated, wrong magic,
// unsupported version, sizes that disagree with the header).
model_spec::ModelShape read_llmc_shape(const std::string& path);

// Loads the part's parameters into `params` (part layout, fp32; a version 5 file's bf16 values
// converted exactly). The file's shape must equal `shape` (every field compared, each mismatch
// named).
void load_llmc(const std::string& path, const model_spec::ModelShape& shape,
               const model_spec::ModelPart& part, float* params);

// Writes the whole model (a ModelPart::whole layout buffer) as an llm.c checkpoint, atomically:
// version 3 (fp32), or with `bf16` version 5, every value rounded to bf16 once. The file is read
// back and compared (llm.c's format has no checksum).
void save_llmc(const std::string& path, const model_spec::ModelShape& shape, const float* params, bool bf16 = false);

}  // namespace ds::rt::ckpt
