// `dstrain report`: what this build is made of and what this machine offers: compiler, every
// dependency's version, CUDA and NCCL found or not, GPUs and their memory, CPU cores, and the CPU
// matmul kernels oneDNN picks on this processor (one small product per storage type, run here) and
// the path bf16 attention takes (one small bf16 attention).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <vector>

#include <fmt/format.h>

#include "commands.h"
#include "common/env.h"
#include "common/strings.h"
#include "core/cuda_module.h"
#include "core/device.h"
#include "dstrain/build_info.h"
#include "kernels/cpu/kernels.h"

namespace ds::cli {

namespace {

// One 64x64x64 matmul per storage type, so that oneDNN says which implementation it dispatches
// to on this processor (the same primitives training creates; kernels/cpu/onednn.h).
template <typename S>
void run_one_matmul() {
  const int B = 1, T = 64, C = 64, OC = 64;
  std::vector<S> inp(static_cast<size_t>(T) * C, rt::from_f32<S>(0.5f));
  std::vector<S> w(static_cast<size_t>(OC) * C, rt::from_f32<S>(0.25f));
  std::vector<S> out(static_cast<size_t>(T) * OC);
  rt::cpu::matmul_forward<S>(out.data(), inp.data(), w.data(), nullptr, B, T, C, OC);
}

// One bf16 attention (T 64, one head of 64), so the report says which path bf16 attention takes.
void run_one_bf16_attention() {
  const int B = 1, T = 64, C = 64, NH = 1;
  std::vector<rt::bf16> qkv(static_cast<size_t>(T) * 3 * C, rt::from_f32<rt::bf16>(0.125f));
  std::vector<rt::bf16> out(static_cast<size_t>(T) * C);
  std::vector<float> lse(static_cast<size_t>(T) * NH), scratch(rt::cpu::attention_scratch_floats(T, C / NH, 2));
  rt::cpu::attention_forward<rt::bf16>(out.data(), lse.data(), qkv.data(), scratch.data(), B, T, C, NH);
}

std::string cpu_matmul_kernels() {
  run_one_matmul<float>();
  run_one_matmul<rt::bf16>();
  run_one_matmul<rt::f16>();
  run_one_bf16_attention();
  return rt::cpu::kernel_report();
}

struct ReportOptions {
  bool env = false;
};

int run_report(const ReportOptions& o) {
  auto row = [](const char* k, const std::string& v) {
    std::cout << fmt::format("  {:<16} {}\n", k, v.empty() ? "-" : v);
  };
  std::cout << "dstrain " << DSTRAIN_VERSION << "\n\nbuild\n";
  row("compiler", DSTRAIN_CXX_COMPILER);
  row("build type", DSTRAIN_BUILD_TYPE);
  row("sanitizers", std::string(DSTRAIN_SANITIZE_ON) == "ON" ? "address, undefined" : "off");
  std::cout << "\ndependencies\n";
  row("CLI11", DSTRAIN_CLI11_VERSION);
  row("nlohmann-json", DSTRAIN_NLOHMANN_JSON_VERSION);
  row("spdlog", DSTRAIN_SPDLOG_VERSION);
  row("fmt", DSTRAIN_FMT_VERSION);
  row("libssh2", DSTRAIN_LIBSSH2_VERSION);
  row("OpenSSL", DSTRAIN_OPENSSL_VERSION);
  row("Boost", DSTRAIN_BOOST_VERSION);
  row("Gloo", DSTRAIN_GLOO_VERSION);
  row("OpenBLAS", DSTRAIN_OPENBLAS_VERSION);
  row("GoogleTest", DSTRAIN_GTEST_VERSION);
  row("oneDNN", rt::cpu::onednn_version());

  auto acc = rt::query_accelerators();
  std::cout << "\naccelerators\n";
  if (!rt::cuda_module_built()) {
    row("CUDA", "not compiled in");
    row("NCCL", "not compiled in");
  } else if (!rt::cuda_module_loaded()) {
    row("CUDA module", fmt::format("{}: {}", rt::cuda_module_path(), acc.status));
  } else {
    row("CUDA module", fmt::format("{} (loaded on demand)", rt::cuda_module_path()));
    row("CUDA", fmt::format("compiled (nvcc {}, sm {}), runtime {}, driver {}",
                            DSTRAIN_CUDA_COMPILER, DSTRAIN_CUDA_ARCHS, acc.cuda_runtime,
                            acc.cuda_driver.empty() ? "not loaded" : acc.cuda_driver));
    row("NCCL", acc.nccl_version.empty() ? "not found" : acc.nccl_version);
  }
  row("GPUs", fmt::format("{}{}", acc.gpus.size(),
                          acc.gpus.empty() ? " (" + acc.status + ")" : std::string()));
  for (const auto& g : acc.gpus) {
    std::cout << fmt::format("    [{}] {}  {}  sm_{}{}\n", g.index, g.name,
                             format_bytes(static_cast<double>(g.total_bytes)), g.sm_major,
                             g.sm_minor);
  }
  std::cout << "\nCPU kernels (oneDNN's matmul choice on this processor; the bf16 attention path)\n";
  for (const auto& part : split(cpu_matmul_kernels(), ';')) std::cout << "  " << trim(part) << "\n";
  std::cout << "\nhost\n";
  row("CPU cores", std::to_string(sysconf(_SC_NPROCESSORS_ONLN)));
  row("memory", format_bytes(static_cast<double>(sysconf(_SC_PHYS_PAGES)) *
                             static_cast<double>(sysconf(_SC_PAGESIZE))));
  if (o.env) {
    std::cout << "\nenvironment variables dstrain reads\n";
    size_t n = 0;
    const auto* k = env::knobs(&n);
    for (size_t i = 0; i < n; ++i) {
      auto v = env::get(k[i].name);
      bool secret = std::string(k[i].name) == "DSTRAIN_JOB_TOKEN";
      row(k[i].name, v ? (secret ? "<hidden>" : *v) : std::string("(unset)"));
    }
  }
  return 0;
}

}  // namespace

void add_report_command(CLI::App& app, std::vector<Command>& out) {
  auto opts = std::make_shared<ReportOptions>();
  auto* sub = app.add_subcommand("report", "print the build, dependency versions, CUDA/NCCL and GPUs");
  sub->add_flag("--env", opts->env, "also list the environment variables dstrain reads");
  out.push_back({sub, [opts] { return run_report(*opts); }});
}

}  // namespace ds::cli
