// Document-aware attention's cost on the CPU (data.packing "document"): one forward + backward of
// kern attention_gqa_forward/backward (packing "none") against attention_gqa_doc_forward/backward
// with null starts (must cost the same) and with documents of D tokens (each row block skips the
// keys before its first document, so the work falls towards T x D from T^2 / 2).
//
//   build/bin/attention_doc_bench [T=1024] [reps=5]     (B=2, NH=8, KV=4, hd=64, fp32)
//
// Times are this process's CPU seconds (CLOCK_PROCESS_CPUTIME_ID) per call, median of `reps`,
// with OMP_NUM_THREADS as set (1 gives the work itself on a busy machine). Not a test.
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernels/cpu/kernels.h"

using namespace ds::rt::cpu;

namespace {

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  const int T = argc > 1 ? std::atoi(argv[1]) : 1024;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  const int B = 2, NH = 8, KV = 4, hd = 64;
  const size_t nqkv = static_cast<size_t>(B) * T * (NH + 2 * KV) * hd, nout = static_cast<size_t>(B) * T * NH * hd;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> qkv(nqkv), dout(nout), out(nout), dqkv(nqkv), lse(static_cast<size_t>(B) * NH * T);
  for (auto& v : qkv) v = nd(rng);
  for (auto& v : dout) v = nd(rng);
  std::vector<float> scratch(attention_scratch_floats(T, hd, 4));
  std::printf("T=%d B=%d NH=%d KV=%d hd=%d, %d OpenMP threads, CPU ms per forward+backward (median of %d)\n", T, B,
              NH, KV, hd, omp_get_max_threads(), reps);
  std::printf("%-26s %10s %10s\n", "attention", "ms", "vs none");
  double none_ms = 0;
  auto measure = [&](const char* name, const std::vector<int32_t>* starts, bool plain) {
    std::vector<double> t;
    for (int r = 0; r < reps + 1; r++) {
      const double t0 = cpu_seconds();
      if (plain) {
        attention_gqa_forward(out.data(), lse.data(), qkv.data(), scratch.data(), B, T, NH, KV, hd);
        attention_gqa_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), scratch.data(), B, T, NH,
                               KV, hd);
      } else {
        const int32_t* ds = starts == nullptr ? nullptr : starts->data();
        attention_gqa_doc_forward(out.data(), lse.data(), qkv.data(), ds, scratch.data(), B, T, NH, KV, hd);
        attention_gqa_doc_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), ds, scratch.data(),
                                   B, T, NH, KV, hd);
      }
      if (r > 0) t.push_back(1e3 * (cpu_seconds() - t0));  // the first call warms up
    }
    std::sort(t.begin(), t.end());
    const double ms = t[t.size() / 2];
    if (plain) none_ms = ms;
    std::printf("%-26s %10.1f %10.3f\n", name, ms, ms / none_ms);
  };
  measure("none (attention_gqa)", nullptr, true);
  measure("doc, null starts", nullptr, false);
  for (int D : {T, T / 2, 256, 64}) {
    if (D <= 0 || D > T) continue;
    std::vector<int32_t> starts(static_cast<size_t>(B) * T);
    for (int b = 0; b < B; b++) {
      for (int t = 0; t < T; t++) starts[static_cast<size_t>(b) * T + t] = t / D * D;
    }
    char name[64];
    std::snprintf(name, sizeof name, "doc, documents of %d", D);
    measure(name, &starts, false);
  }
  return 0;
}
