// step_bench: ms per training step (forward + backward + AdamW) and tokens/s on the CPU of the
// configs S, M (issue 4) and L (issue 19), the named shapes step-s, step-m and step-l of
// model_spec/named_shapes.h (two learned-position LayerNorm/GELU models and a grouped-query
// RMSNorm/SwiGLU/RoPE one), at fp32 and at bf16 (2-byte parameters, gradients and activations,
// an fp32 master + m + v, as `dstrain train` with bf16.enabled), beside the same model in PyTorch
// (bench/torch_<model.type>_step.py, run with /usr/bin/python3 in the same environment when
// python3-torch is installed) at fp32 and with torch.autocast("cpu", dtype=torch.bfloat16), with
// the ratios. Every family is built through the Model interface (runtime/model/model.h,
// make_model). Also
// the matmul rate (GFLOP/s) of one 4096x768x768 product on oneDNN fp32, oneDNN bf16 and OpenBLAS
// sgemm.
//
//   step_bench [--config S|M|L|MoE|all] [--precision fp32|bf16|all] [--steps N] [--warmup N]
//              [--threads N] [--recompute] [--head-rows N] [--gemm split|blas] [--no-torch]
//              [--no-matmul] [--best-env]
//
// --best-env gives each side its fastest environment, tried in the same run: every variant of
// {glibc malloc, jemalloc} x {OMP_WAIT_POLICY unset, PASSIVE} (libgomp reads its wait policy
// before main, so each variant is a child process: this binary with --no-torch for dstrain, the
// script for PyTorch). PyTorch's variants also unset OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
// (PyTorch 1.13's fp32 GEMMs run on OpenBLAS, which those variables pin to older kernels) and,
// where this environment sets them, it runs once more with them as inherited. Each variant's
// ms/step is printed, and the fastest is that side's figure. Unsetting is for that command alone
// (never in tests or CI). Without --best-env both run in this process's environment.
//
// Not a test: it prints figures and never fails on them. fp32 steps run a local fused AdamW loop;
// bf16 steps the kernels' mixed-precision AdamW (the trainer's: fp32 master, rounded into the bf16
// parameters in the same pass).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <memory>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/allocator.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/onednn.h"
#include "model/model.h"
#include "model_spec/family.h"
#include "model_spec/named_shapes.h"
#include "optim/adamw.h"

using namespace ds::rt;
namespace ms = ds::model_spec;

namespace {

constexpr const char* kJemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2";

struct BenchConfig {
  const char* name;
  ms::ModelShape shape;
  int B, T;
  std::string torch_script;  // the PyTorch peer, under bench/: torch_<model.type>_step.py
};

BenchConfig bench_config(const char* name, const char* shape, int B, int T) {
  const ms::ModelShape s = ms::named_shape(shape, "step_bench").shape;
  return {name, s, B, T, std::string("torch_") + ms::family_of(s.family).name + "_step.py"};
}
const std::vector<BenchConfig>& configs() {
  static const std::vector<BenchConfig> c = {bench_config("S", "step-s", 8, 128), bench_config("M", "step-m", 4, 256),
                                             bench_config("L", "step-l", 8, 128),
                                             bench_config("MoE", "step-moe", 8, 128)};
  return c;
}

// CPU time of the whole process (all threads), ms: with one thread, a measure of work that
// other load on the machine does not inflate.
double cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// One environment for a child run: the words put before its command.
struct ChildEnv {
  std::string label;
  std::string prefix;
};

// The variants --best-env tries (see the header); without it, the environment as it is.
std::vector<ChildEnv> child_envs(bool best, bool torch) {
  if (!best) return {{"as inherited", ""}};
  std::vector<ChildEnv> v;
  const char* blas = torch ? "-u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE " : "";
  for (const bool jemalloc : {false, true}) {
    for (const bool passive : {false, true}) {
      std::string prefix = std::string("env -u LD_PRELOAD -u OMP_WAIT_POLICY ") + blas;
      if (jemalloc) prefix += std::string("LD_PRELOAD=") + kJemalloc + " ";
      if (passive) prefix += "OMP_WAIT_POLICY=PASSIVE ";
      v.push_back({std::string(jemalloc ? "jemalloc" : "glibc malloc") + (passive ? ", PASSIVE" : ", wait policy unset") +
                       (torch ? ", OPENBLAS_* unset" : ""),
                   prefix});
    }
  }
  const bool blas_set = std::getenv("OPENBLAS_CORETYPE") != nullptr || std::getenv("OPENBLAS_L2_SIZE") != nullptr;
  if (torch && blas_set) {
    v.push_back({"glibc malloc, wait policy unset, OPENBLAS_* as inherited", "env -u LD_PRELOAD -u OMP_WAIT_POLICY "});
  }
  return v;
}

// Runs `command` in each environment, echoing its lines that start with `what`; returns the
// fastest of their "ms_per_step V" figures (negative when no run gave one) and sets `which` to that run's environment.
double run_children(const std::string& command, const std::string& what, bool best, bool torch, std::string& which) {
  double best_ms = -1;
  for (const ChildEnv& e : child_envs(best, torch)) {
    FILE* f = popen((e.prefix + command + " 2>&1").c_str(), "r");
    if (f == nullptr) continue;
    char line[1024];
    double ms = -1;
    while (std::fgets(line, sizeof line, f) != nullptr) {
      const std::string l = line;
      const size_t at = l.rfind(what + " ", 0) == 0 ? l.find("ms_per_step ") : std::string::npos;
      if (at == std::string::npos) continue;
      std::printf("  [%s] %s", e.label.c_str(), line);
      ms = std::atof(l.c_str() + at + 12);
    }
    pclose(f);
    if (ms > 0 && (best_ms < 0 || ms < best_ms)) {
      best_ms = ms;
      which = e.label;
    }
  }
  std::fflush(stdout);
  return best_ms;
}

// The config's PyTorch peer: the fastest ms/step over the environments (negative when it could not
// run), with `which` naming the environment.
double run_torch(const BenchConfig& c, const std::string& precision, int steps, int warmup, int threads, bool best,
                 std::string& which) {
  const std::string script = std::string(DS_SOURCE_DIR) + "/bench/" + c.torch_script;
  const std::string cmd = "OMP_NUM_THREADS=" + std::to_string(threads) + " /usr/bin/python3 " + script + " --config " +
                          c.name + " --precision " + precision + " --steps " + std::to_string(steps) + " --warmup " +
                          std::to_string(warmup) + " --threads " + std::to_string(threads);
  return run_children(cmd, std::string("torch ") + c.name + "-" + precision, best, /*torch=*/true, which);
}

// GFLOP/s of C (4096x768) = A (4096x768) B (768x768), the median of 20 products after 3 warm-ups.
void matmul_rates(int threads) {
  const int M = 4096, K = 768, N = 768;
  std::vector<float> a32(static_cast<size_t>(M) * K), b32(static_cast<size_t>(K) * N), c32(static_cast<size_t>(M) * N);
  for (size_t i = 0; i < a32.size(); i++) a32[i] = 0.001f * static_cast<float>(i % 997) - 0.5f;
  for (size_t i = 0; i < b32.size(); i++) b32[i] = 0.001f * static_cast<float>(i % 991) - 0.5f;
  std::vector<bf16> a16(a32.size()), b16(b32.size()), c16(c32.size());
  cpu::convert(a16.data(), a32.data(), static_cast<int64_t>(a32.size()));
  cpu::convert(b16.data(), b32.data(), static_cast<int64_t>(b32.size()));
  auto rate = [&](DType t, cpu::onednn::Backend backend) {
    cpu::onednn::set_backend(backend);
    const void* A = t == DType::kF32 ? static_cast<const void*>(a32.data()) : a16.data();
    const void* B = t == DType::kF32 ? static_cast<const void*>(b32.data()) : b16.data();
    void* C = t == DType::kF32 ? static_cast<void*>(c32.data()) : c16.data();
    std::vector<double> ms;
    for (int i = 0; i < 23; i++) {
      const auto t0 = std::chrono::steady_clock::now();
      cpu::onednn::matmul(t, {A, K, 1}, {B, N, 1}, nullptr, t, C, N, M, N, K, false);
      const double d = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (i >= 3) ms.push_back(d);
    }
    cpu::onednn::set_backend(cpu::onednn::Backend::kOneDnn);
    return 2.0 * M * N * K / (median(ms) * 1e6);
  };
  const double f32 = rate(DType::kF32, cpu::onednn::Backend::kOneDnn);
  const double bf = rate(DType::kBF16, cpu::onednn::Backend::kOneDnn);
  const double blas = rate(DType::kF32, cpu::onednn::Backend::kOpenBlas);
  std::printf("matmul 4096x768x768, %d threads: oneDNN fp32 %.0f GFLOP/s, oneDNN bf16 %.0f GFLOP/s, OpenBLAS sgemm "
              "%.0f GFLOP/s (%s)\n", threads, f32, bf, blas, cpu::kernel_report().c_str());
  std::fflush(stdout);
}

// One model at one storage type: prints its line and returns the median ms per step.
double bench_model(const BenchConfig& c, DType dtype, int steps, int warmup, bool recompute, int head_rows) {
  const bool half = dtype != DType::kF32;
  Allocator alloc;
  ModelOptions opt{c.B, c.T, recompute};
  opt.head_chunk_rows = head_rows;
  opt.dtype = dtype;
  opt.grad_dtype = dtype;
  const std::unique_ptr<Model> owned = make_model(c.shape, ms::ModelPart::whole(c.shape), opt, alloc);
  Model& model = *owned;
  model.init_weights(1337);
  const std::unique_ptr<Activations> owned_acts = model.new_activations();
  Activations& acts = *owned_acts;
  const int64_t n = model.num_params();
  Buffer m = alloc.allocate(static_cast<size_t>(n) * 4, MemTag::kOptimizer, "adam m");
  Buffer v = alloc.allocate(static_cast<size_t>(n) * 4, MemTag::kOptimizer, "adam v");
  Buffer master;
  if (half) {
    master = alloc.allocate(static_cast<size_t>(n) * 4, MemTag::kOptimizer, "fp32 master");
    cpu::convert(master.as<float>(), static_cast<const bf16*>(model.params().data), n);
  }
  std::memset(m.as<float>(), 0, static_cast<size_t>(n) * 4);
  std::memset(v.as<float>(), 0, static_cast<size_t>(n) * 4);
  std::vector<int32_t> in(static_cast<size_t>(c.B) * c.T), tg(in.size());
  uint32_t x = 1;
  for (size_t i = 0; i < in.size(); i++) {
    x = x * 1664525u + 1013904223u;
    in[i] = static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(c.shape.vocab_size));
  }
  for (size_t i = 0; i + 1 < in.size(); i++) tg[i] = in[i + 1];
  tg.back() = 0;
  std::vector<double> times, fwd_bwd, cpu_times;
  double pieces[5] = {};
  float loss = 0;
  for (int s = 0; s < warmup + steps; s++) {
    const double c0 = cpu_ms();
    const auto t0 = std::chrono::steady_clock::now();
    model.zero_grads();
    // The pieces forward_backward runs, timed one by one.
    auto lap = [&, tp = t0](int k) mutable {
      const auto now = std::chrono::steady_clock::now();
      if (s >= warmup) pieces[k] += std::chrono::duration<double, std::milli>(now - tp).count();
      tp = now;
    };
    model.embed_forward(acts, in.data());
    lap(0);
    model.blocks_forward(acts, 0, c.shape.n_layer);
    lap(1);
    loss = model.head_forward_backward(acts, tg.data(), 1.0f);
    lap(2);
    model.blocks_backward(acts, 0, c.shape.n_layer);
    lap(3);
    model.embed_backward(acts, in.data());
    lap(4);
    const auto t1 = std::chrono::steady_clock::now();
    // The trainer's AdamW at both precisions: lr 1e-4, betas 0.9/0.999, eps 1e-8, no decay.
    optim::AdamWConfig adam;
    adam.lr = 1e-4;
    adam.weight_decay = 0.0;
    const kern::AdamWStep st = optim::adamw_step_scalars(adam, s + 1, adam.lr);
    if (half) {
      cpu::adamw_update_partition_mixed<bf16, bf16>(st, master.as<float>(), static_cast<const bf16*>(model.grads().data),
                                                    m.as<float>(), v.as<float>(), 0, n, {},
                                                    static_cast<bf16*>(model.params().data));
    } else {
      cpu::adamw_update_partition(st, model.params().f32(), model.grads().f32(), m.as<float>(), v.as<float>(), 0, n,
                                  {});
    }
    const auto t2 = std::chrono::steady_clock::now();
    if (s >= warmup) {
      cpu_times.push_back(cpu_ms() - c0);
      times.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
      fwd_bwd.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
  }
  const double ms_step = median(times);
  const auto st = alloc.stats();
  std::printf("dstrain %s %s params %.2fM B=%d T=%d: ms_per_step %.1f (fwd+bwd %.1f, min %.1f) "
              "cpu_ms_per_step %.1f tokens_per_s %.0f loss %.4f peak_MiB %.1f (params %.1f grads %.1f optimizer %.1f "
              "activations %.1f workspace %.1f)\n",
              c.name, half ? "bf16" : "fp32", n / 1e6, c.B, c.T, ms_step, median(fwd_bwd),
              *std::min_element(times.begin(), times.end()), median(cpu_times), c.B * c.T / (ms_step / 1e3), loss,
              st.peak_total / 1048576.0, st.peak[0] / 1048576.0, st.peak[1] / 1048576.0, st.peak[2] / 1048576.0,
              st.peak[3] / 1048576.0, st.peak[5] / 1048576.0);
  std::printf("  mean ms: embed_fwd %.1f blocks_fwd %.1f head_fwd_bwd %.1f blocks_bwd %.1f embed_bwd %.1f\n",
              pieces[0] / steps, pieces[1] / steps, pieces[2] / steps, pieces[3] / steps, pieces[4] / steps);
  std::fflush(stdout);
  return ms_step;
}

}  // namespace

int main(int argc, char** argv) {
  std::string which = "all";
  int steps = 10, warmup = 2, threads = 2;
  std::string precision = "all";
  bool recompute = false, torch = true, torch_best = false, matmul = true;
  int head_rows = 0;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--config") which = next();
    else if (a == "--steps") steps = std::stoi(next());
    else if (a == "--warmup") warmup = std::stoi(next());
    else if (a == "--threads") threads = std::stoi(next());
    else if (a == "--recompute") recompute = true;
    else if (a == "--head-rows") head_rows = std::stoi(next());
    else if (a == "--gemm") cpu::set_gemm_threading(next() == "blas" ? cpu::GemmThreading::kBlas
                                                                    : cpu::GemmThreading::kSplit);
    else if (a == "--no-torch") torch = false;
    else if (a == "--no-matmul") matmul = false;
    else if (a == "--precision") precision = next();
    else if (a == "--best-env") torch_best = true;
    else {
      std::fprintf(stderr,
                   "usage: step_bench [--config S|M|L|MoE|all] [--precision fp32|bf16|all] [--steps N] [--warmup N] "
                   "[--threads N] [--recompute] [--head-rows N] [--gemm split|blas] [--no-torch] [--no-matmul] "
                   "[--best-env]\n");
      return 2;
    }
  }
  omp_set_num_threads(threads);
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  std::printf("step_bench: %d threads, gemm %s, recompute %s, OPENBLAS_CORETYPE=%s, "
              "OMP_WAIT_POLICY=%s%s\n",
              threads, cpu::gemm_threading() == cpu::GemmThreading::kSplit ? "split" : "blas",
              recompute ? "on" : "off", coretype != nullptr ? coretype : "(unset)",
              wait != nullptr ? wait : "(unset)",
              torch_best ? "; dstrain and PyTorch in each of --best-env's environments" : "");
  if (matmul) matmul_rates(threads);
  struct Row { std::string name; double ms; };
  for (const auto& c : configs()) {
    if (which != "all" && which != c.name) continue;
    std::vector<Row> rows;
    for (const char* p : {"fp32", "bf16"}) {
      if (precision != "all" && precision != p) continue;
      double ms = -1;
      if (torch_best) {
        // This binary as a child in each environment, the same model and options.
        std::string which;
        std::string cmd = std::string("/proc/") + std::to_string(getpid()) + "/exe --no-torch --no-matmul --config " +
                          c.name + " --precision " + p + " --steps " + std::to_string(steps) + " --warmup " +
                          std::to_string(warmup) + " --threads " + std::to_string(threads) + " --head-rows " +
                          std::to_string(head_rows) + " --gemm " +
                          (cpu::gemm_threading() == cpu::GemmThreading::kSplit ? "split" : "blas") +
                          (recompute ? " --recompute" : "");
        ms = run_children(cmd, std::string("dstrain ") + c.name + " " + p, true, /*torch=*/false, which);
        if (ms > 0) std::printf("dstrain %s %s: fastest %.1f ms/step with %s\n", c.name, p, ms, which.c_str());
      } else {
        ms = bench_model(c, std::string(p) == "bf16" ? DType::kBF16 : DType::kF32, steps, warmup, recompute,
                         head_rows);
      }
      rows.push_back({std::string("dstrain ") + p, ms});
    }
    if (torch) {
      for (const char* p : {"fp32", "bf16"}) {
        if (precision != "all" && precision != p) continue;
        std::string which;
        const double tms = run_torch(c, p, steps, warmup, threads, torch_best, which);
        if (tms > 0) {
          std::printf("torch %s %s: fastest %.1f ms/step with %s\n", c.name, p, tms, which.c_str());
          rows.push_back({std::string("torch ") + (std::string(p) == "bf16" ? "bf16 autocast" : "fp32"), tms});
        } else {
          std::printf("torch %s %s: the PyTorch peer did not run (python3-torch missing?)\n", c.name, p);
        }
      }
    }
    auto find = [&](const std::string& n) {
      for (const auto& r : rows) {
        if (r.name == n) return r.ms;
      }
      return -1.0;
    };
    std::printf("summary %s:", c.name);
    for (const auto& r : rows) std::printf("  %s %.1f ms", r.name.c_str(), r.ms);
    std::printf("\n");
    const double d32 = find("dstrain fp32"), d16 = find("dstrain bf16"), t32 = find("torch fp32"),
                 t16 = find("torch bf16 autocast");
    if (d32 > 0 && t32 > 0) std::printf("ratio %s fp32: torch / dstrain = %.2fx\n", c.name, t32 / d32);
    if (d16 > 0 && t16 > 0) std::printf("ratio %s bf16: torch autocast / dstrain = %.2fx\n", c.name, t16 / d16);
    if (d16 > 0 && d32 > 0) std::printf("ratio %s: dstrain bf16 / dstrain fp32 = %.2fx\n", c.name, d16 / d32);
    std::fflush(stdout);
  }
  return 0;
}
