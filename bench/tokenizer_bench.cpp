// Encoding throughput of dstrain's tokenizers through the data prepare pipeline
// (runtime/data/encode_pipeline.h): MB of input text per second, wall clock and per CPU second,
// on 1 and more threads. Figures, never pass/fail; bench/tokenizer_bench.sh runs it on the King
// James Bible and a 100 MB English + code mix beside Debian's spm_encode (the peer), same run.
//
//   tokenizer_bench --input FILE... [--gpt2 DIR] [--hf DIR_OR_TOKENIZER_JSON]... [--spm MODEL]
//                   [--threads 1,2] [--reps 3]
// bench/hf_tokenizer_bench.sh compares Hugging Face tokenizer.json files (--hf) with --gpt2.
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/encode_pipeline.h"
#include "data/tokenizer.h"

namespace {

namespace dd = ds::rt::data;

struct Args {
  std::vector<std::string> inputs;
  std::string gpt2, spm;
  std::vector<std::string> hf;
  std::vector<int> threads = {1, 2};
  int reps = 3;
};

double cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

struct Run {
  double wall, cpu;
  int64_t tokens;
};

// One pass: encode the file into a counting sink.
Run encode_once(const dd::Tokenizer& tok, const std::string& file, int threads) {
  dd::EncodeOptions o;
  o.threads = threads;
  int64_t tokens = 0;
  const double c0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  dd::encode_files(tok, {file}, o, [&](std::span<const uint32_t> t, int) { tokens += t.size(); });
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return {wall, cpu_seconds() - c0, tokens};
}

void bench(const dd::Tokenizer& tok, const std::string& label, const std::string& file, const Args& a) {
  struct stat st {};
  ::stat(file.c_str(), &st);
  const double mb = st.st_size / 1e6;
  for (int threads : a.threads) {
    std::vector<Run> runs;
    for (int r = 0; r < a.reps; ++r) runs.push_back(encode_once(tok, file, threads));
    std::sort(runs.begin(), runs.end(), [](const Run& x, const Run& y) { return x.wall < y.wall; });
    const Run& m = runs[runs.size() / 2];
    std::printf("%-14s %-40s %7.1f MB %2d threads  %7.2f MB/s wall  %7.2f MB/s per CPU-s  "
                "%.3f tokens/byte  %6.2f M tokens/s wall\n",
                label.c_str(), file.c_str(), mb, threads, mb / m.wall, mb / m.cpu,
                m.tokens / (mb * 1e6), m.tokens / m.wall / 1e6);
  }
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw ds::invalid_argument("tokenizer_bench: {} needs a value", k);
      return argv[++i];
    };
    if (k == "--input") a.inputs.push_back(val());
    else if (k == "--gpt2") a.gpt2 = val();
    else if (k == "--spm") a.spm = val();
    else if (k == "--hf") a.hf.push_back(val());
    else if (k == "--reps") a.reps = std::max(1, std::atoi(val().c_str()));
    else if (k == "--threads") {
      a.threads.clear();
      std::stringstream ss(val());
      for (std::string t; std::getline(ss, t, ',');) a.threads.push_back(std::max(1, std::atoi(t.c_str())));
    } else {
      throw ds::invalid_argument("tokenizer_bench: unknown argument {} (see the file's header)", k);
    }
  }
  if (a.inputs.empty()) throw ds::invalid_argument("tokenizer_bench: give at least one --input FILE");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    std::vector<std::pair<std::string, std::unique_ptr<dd::Tokenizer>>> toks;
    toks.emplace_back("byte", dd::open_tokenizer({"byte", ""}));
    if (!a.gpt2.empty()) toks.emplace_back("gpt2", dd::open_tokenizer({"gpt2", a.gpt2}));
    for (const auto& h : a.hf) {  // labelled hf:<directory name>
      const std::string dir = h.ends_with(".json") ? h.substr(0, h.find_last_of('/')) : h;
      toks.emplace_back("hf:" + dir.substr(dir.find_last_of('/') + 1), dd::open_tokenizer({"hf", h}));
    }
    if (!a.spm.empty()) toks.emplace_back("sentencepiece", dd::open_tokenizer({"sentencepiece", a.spm}));
    for (const auto& file : a.inputs) {
      for (const auto& [label, t] : toks) bench(*t, label, file, a);
    }
    return 0;
  } catch (const ds::Error& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 2;
  }
}
