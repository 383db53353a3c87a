// Model FLOPs, the peak table and the start-up matmul (throughput.h).
//
// The table holds NVIDIA's datasheet figures for dense math (the "with sparsity" figures halved),
// TFLOP/s per GPU: FP32 (CUDA cores) and BF16 (tensor cores, fp32 accumulate). Names are matched
// as substrings of the CUDA device name, most specific first (GH200 before H200, H100 PCIe
// before H100).
#include "train/throughput.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "core/device.h"
#include "kernels/typed.h"
#include "model_spec/flops.h"

namespace ds::rt::train {

double model_flops_per_token(const model_spec::ModelShape& s) { return model_spec::model_flops_per_token(s, s.seq_len); }

namespace {

struct GpuPeak {
  const char* name;
  double fp32, bf16;
};

constexpr GpuPeak kGpuPeaks[] = {
    {"GH200", 67.0, 989.4},     {"H200 NVL", 60.0, 835.0}, {"H200", 67.0, 989.4},
    {"H100 PCIe", 51.2, 756.0}, {"H100 NVL", 60.0, 835.0}, {"H100", 67.0, 989.4},
    {"H800", 67.0, 989.4},      {"A100", 19.5, 312.0},     {"A800", 19.5, 312.0},
    {"L40S", 91.6, 362.1},      {"L40", 90.5, 181.0},      {"L4", 30.3, 121.0},
    {"A10G", 31.2, 70.0},       {"A10", 31.2, 125.0},      {"V100", 15.7, 0.0},
};

}  // namespace

std::optional<double> gpu_peak_tflops(const std::string& gpu_name, layout::Precision precision) {
  for (const auto& g : kGpuPeaks) {
    if (gpu_name.find(g.name) == std::string::npos) continue;
    const double v = precision == layout::Precision::kBf16 ? g.bf16 : g.fp32;
    if (v <= 0) return std::nullopt;
    return v;
  }
  return std::nullopt;
}

// (rows x k) inputs against an (n x k) weight: the shape of an MLP matmul on a batch of
// rows tokens. Warm-up once, then the fastest of at least 10 runs and 150 ms: a peak is a maximum,
// and the ranks measure at once while their peers may still be touching memory at start-up.
double measure_cpu_matmul_tflops(DType dtype) {
  constexpr int kRows = 512, kK = 768, kN = 768 * 2;
  const size_t es = dtype_size(dtype);
  std::vector<uint8_t> inp(static_cast<size_t>(kRows) * kK * es), w(static_cast<size_t>(kN) * kK * es),
      out(static_cast<size_t>(kRows) * kN * es);
  // Small values (0 bits then a few ones) in any dtype: the byte pattern 0x01 0x3c is a normal number in each.
  for (size_t i = 0; i < inp.size(); ++i) inp[i] = static_cast<uint8_t>(i % 2 == 1 ? 0x3c : 0x01);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint8_t>(i % 2 == 1 ? 0x3c : 0x02);
  const TypedPtr o(out.data(), dtype), x(inp.data(), dtype), wt(w.data(), dtype);
  const double flops = 2.0 * kRows * kK * kN;
  using Clock = std::chrono::steady_clock;
  kern::typed::matmul_forward(o, x, wt, TypedPtr(nullptr, dtype), 1, kRows, kK, kN);
  double best = 1e30, spent = 0;
  for (int i = 0; i < 10 || (spent < 0.15 && i < 200); ++i) {
    const auto t0 = Clock::now();
    kern::typed::matmul_forward(o, x, wt, TypedPtr(nullptr, dtype), 1, kRows, kK, kN);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, s);
    spent += s;
  }
  return flops / best / 1e12;
}

PeakFlops run_peak_flops(const config::JobConfig& cfg, Device device, DType model_dtype, int cuda_device) {
  PeakFlops p;
  if (cfg.training.peak_tflops > 0) {
    p.tflops = cfg.training.peak_tflops;
    p.source = "training.peak_tflops";
    return p;
  }
  if (device == Device::kCuda) {
    const auto acc = query_accelerators(ModuleUse::kIfGpuPresent);
    const std::string name = cuda_device >= 0 && cuda_device < static_cast<int>(acc.gpus.size())
                                 ? acc.gpus[static_cast<size_t>(cuda_device)].name
                                 : std::string("an unlisted GPU");
    const auto peak = gpu_peak_tflops(name, cfg.precision());
    if (!peak) {
      p.source = fmt::format("no {} peak known for {}; set training.peak_tflops", layout::precision_name(cfg.precision()), name);
      return p;
    }
    p.tflops = *peak;
    p.source = fmt::format("{} dense {} peak, datasheet", name, cfg.precision() == layout::Precision::kBf16 ? "bf16" : "fp32");
    return p;
  }
  p.tflops = measure_cpu_matmul_tflops(model_dtype);
  p.source = fmt::format("measured: a {} 512x768x1536 matmul at start-up; set training.peak_tflops to use another", dtype_name(model_dtype));
  return p;
}

StepFlops step_flops(double flops_per_token, double tokens, double seconds, int world, double peak_tflops) {
  StepFlops f;
  if (seconds <= 0 || world <= 0) return f;
  f.tflops = flops_per_token * tokens / seconds / world / 1e12;
  if (peak_tflops > 0) f.mfu = f.tflops / peak_tflops;
  return f;
}

}  // namespace ds::rt::train
