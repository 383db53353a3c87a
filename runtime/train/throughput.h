// Model FLOPs and utilisation (MFU): what a step's tokens cost in matmul FLOPs, and the peak a
// rank's device could do, so the log and --metrics can say how much of it the run achieves.
//
// FLOPs per token: model_spec/flops.h, the one convention (llm.c's 6N + 6·L·(NH·hd)·T, from the
// family's tensors) that gpu_bench and the plan use too.
//
// Peak per rank: training.peak_tflops when the config gives it; on a GPU the dense peak of a
// table of known parts for the run's matmul math (bf16 tensor cores with bf16, pedantic fp32
// otherwise); on a CPU a short measured matmul at start-up (the kernel the model's matmuls use,
// in the model's storage type, with this rank's threads, while every rank measures at once).
#pragma once

#include <optional>
#include <string>

#include "config/job_config.h"
#include "core/allocator.h"
#include "core/dtype.h"
#include "layout/choices.h"
#include "model_spec/shape.h"

namespace ds::rt::train {

// model_spec::model_flops_per_token at the model's seq_len, for the whole (unsharded) model.
double model_flops_per_token(const model_spec::ModelShape& s);

// Dense peak TFLOP/s of a known GPU part for `precision` (bf16: tensor cores; fp32 and fp16 runs
// multiply in fp32 on this runtime), by the name CUDA reports ("NVIDIA H100 80GB HBM3");
// nullopt for a part not in the table.
std::optional<double> gpu_peak_tflops(const std::string& gpu_name, layout::Precision precision);

// The best of a few timed (rows x k) @ (k x n) matmuls through the CPU kernel in `dtype`, in
// TFLOP/s. Takes about 50 ms.
double measure_cpu_matmul_tflops(DType dtype);

struct PeakFlops {
  double tflops = 0;   // per rank; 0 = unknown (MFU is then not reported)
  std::string source;  // for the run's opening line: "training.peak_tflops", "measured ...", ...
};

// The peak per rank for this run: training.peak_tflops, else the GPU table for `cuda_device`
// (the visible device index), else on a CPU the measured matmul in `model_dtype`. Never throws; an
// unknown GPU gives tflops 0 and a source saying to set training.peak_tflops.
PeakFlops run_peak_flops(const config::JobConfig& cfg, Device device, DType model_dtype, int cuda_device);

// The MFU figures of one step. `tokens`: the step's global tokens; `world`: the ranks sharing
// them; `peak`: per rank (0: mfu stays 0).
struct StepFlops {
  double tflops = 0;  // achieved model TFLOP/s per rank
  double mfu = 0;     // tflops / peak
};
StepFlops step_flops(double flops_per_token, double tokens, double seconds, int world, double peak_tflops);

}  // namespace ds::rt::train
