// comm_bench: bus bandwidth and latency of all_reduce, reduce_scatter and all_gather between
// forked processes on this host, for our shm backend, our Gloo backend and Gloo's own
// algorithms (gloo::allreduce, gloo::allgather: the peer), side by side in one run.
//
// Figures follow nccl-tests: size is the full buffer (all_reduce: the buffer; reduce_scatter:
// the input, size() x count; all_gather: the output), algbw = size / time, and
//   all_reduce busbw = algbw * 2(n-1)/n,   reduce_scatter / all_gather busbw = algbw * (n-1)/n.
// Time is the slowest rank's mean per iteration. Buffers are allocated and touched once.
//
// Usage: comm_bench [--ranks 2,4] [--min-bytes 4096] [--max-bytes 268435456]
//                   [--ops all_reduce,reduce_scatter,all_gather]
//                   [--backends shm-reg,shm,gloo,gloo-native] [--in-place]
// --in-place runs reduce_scatter and all_gather in place, as nccl-tests' in-place columns do (and
// ZeRO 1/2's parameter all_gather): a rank's output is its slice of the input (reduce_scatter),
// its input is its slice of the output (all_gather; Gloo's own without an input buffer). Without
// it they run out of place (separate buffers). all_reduce is always in place.
// shm-reg is the shm backend with buffers from Comm::alloc_buffer (the zero-copy path).
// First line: a STREAM-style copy figure of one core, the ceiling for the copies of the host
// backends. Deliberately not: part of the test suite (figures, no pass/fail).
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include "comm/comm.h"
#include "common/error.h"
#include "common/strings.h"
#include "store/gloo_store_adapter.h"
#include "store/prefix_store.h"
#include "store/tcp_store_client.h"
#include "store/tcp_store_server.h"

using namespace ds;
using namespace ds::rt::comm;

namespace {

struct Args {
  std::vector<int> ranks = {2, 4};
  size_t min_bytes = 4096;
  size_t max_bytes = size_t{256} << 20;
  std::vector<std::string> ops = {"all_reduce", "reduce_scatter", "all_gather"};
  std::vector<std::string> backends = {"shm-reg", "shm", "gloo", "gloo-native"};
  bool in_place = false;
};

std::vector<std::string> csv(const std::string& s) { return split(s, ','); }

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw invalid_argument("{} needs a value", k);
      return argv[++i];
    };
    if (k == "--ranks") {
      a.ranks.clear();
      for (auto& s : csv(next())) a.ranks.push_back(static_cast<int>(parse_int(s).value_or(0)));
    } else if (k == "--min-bytes") {
      a.min_bytes = static_cast<size_t>(parse_bytes(next()).value_or(4096));
    } else if (k == "--max-bytes") {
      a.max_bytes = static_cast<size_t>(parse_bytes(next()).value_or(1 << 20));
    } else if (k == "--ops") {
      a.ops = csv(next());
    } else if (k == "--backends") {
      a.backends = csv(next());
    } else if (k == "--in-place") {
      a.in_place = true;
    } else {
      throw invalid_argument("unknown argument {} (see the comment at the top of comm_bench.cpp)", k);
    }
  }
  return a;
}

double cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

// Iterations per size: enough to average small-message latency, few for 256 MiB.
int iterations(size_t bytes) {
  const size_t budget = size_t{256} << 20;
  return static_cast<int>(std::clamp<size_t>(budget / bytes, 3, 200));
}

double bus_factor(const std::string& op, int n) {
  return op == "all_reduce" ? 2.0 * (n - 1) / n : 1.0 * (n - 1) / n;
}

// One rank: runs every (op, size, backend) and writes its per-iteration times into `out`
// (a pipe to the parent) as text lines "op backend bytes seconds"; rank 0's lines are printed.
int rank_main(int rank, int n, int port, const Args& a, int out_fd) {
  store::TcpStoreClientOptions co;
  co.host = "127.0.0.1";
  co.port = port;
  co.token = "bench";
  auto client = std::make_shared<store::TcpStoreClient>(co);
  CommOptions o;
  o.timeout = Millis(600000);
  std::map<std::string, CommPtr> comms;
  for (auto& b : a.backends) {
    if (b == "gloo-native") continue;
    const std::string kind = b == "shm-reg" ? "shm" : b;
    if (comms.count(kind)) {
      comms[b] = comms[kind];
      continue;
    }
    o.name = kind;
    o.backend = parse_backend(kind, "--backends");
    comms[b] = comms[kind] = make_world_comm(client, rank, n, o);
  }
  // Gloo's own algorithms on their own context (the peer).
  std::shared_ptr<gloo::rendezvous::Context> native;
  if (std::find(a.backends.begin(), a.backends.end(), "gloo-native") != a.backends.end()) {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    native = std::make_shared<gloo::rendezvous::Context>(rank, n);
    native->setTimeout(Millis(600000));
    store::PrefixStore ps("native/", *client);
    store::GlooStoreAdapter adapter(ps);
    native->connectFullMesh(adapter, dev);
  }
  // A comm to agree on the slowest rank's time (shm if present, else the first).
  Comm& ctl = *comms.begin()->second;

  const size_t max_elems = a.max_bytes / 4;
  std::vector<float> in(max_elems), out(max_elems);
  for (size_t i = 0; i < max_elems; ++i) in[i] = static_cast<float>(rank + 1 + i % 7);
  std::fill(out.begin(), out.end(), 0.0f);
  // shm-reg: the same shm Comm with buffers from alloc_buffer (zero-copy path).
  float* reg_in = nullptr;
  float* reg_out = nullptr;
  if (comms.count("shm-reg")) {
    reg_in = static_cast<float*>(comms["shm-reg"]->alloc_buffer(max_elems * 4));
    reg_out = static_cast<float*>(comms["shm-reg"]->alloc_buffer(max_elems * 4));
    std::memcpy(reg_in, in.data(), max_elems * 4);
  }

  for (auto& op : a.ops) {
    for (size_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= 4) {
      const size_t elems = bytes / 4;
      const size_t per_rank = elems / static_cast<size_t>(n);
      for (auto& b : a.backends) {
        std::function<void()> fn;
        if (b == "gloo-native") {
          if (op == "all_reduce") {
            fn = [&] {
              gloo::AllreduceOptions go(native);
              go.setOutput(out.data(), elems);
              go.setReduceFunction(
                  static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
              go.setTag(1);
              gloo::allreduce(go);
            };
          } else if (op == "all_gather") {
            fn = [&] {
              gloo::AllgatherOptions go(native);
              if (!a.in_place) go.setInput(in.data(), per_rank);  // in place: no input
              go.setOutput(out.data(), per_rank * static_cast<size_t>(n));
              go.setTag(2);
              gloo::allgather(go);
            };
          } else {
            continue;  // Gloo has no unbound-buffer reduce_scatter
          }
        } else {
          Comm& c = *comms[b];
          float* bin = b == "shm-reg" ? reg_in : in.data();
          float* bout = b == "shm-reg" ? reg_out : out.data();
          if (a.in_place && op == "reduce_scatter") bout = bin + static_cast<size_t>(rank) * per_rank;
          if (a.in_place && op == "all_gather") bin = bout + static_cast<size_t>(rank) * per_rank;
          if (op == "all_reduce") {
            fn = [&c, bout, elems] {
              c.all_reduce(bout, elems, DataType::kFloat32, ReduceOp::kSum);
            };
          } else if (op == "reduce_scatter") {
            fn = [&c, bin, bout, per_rank] {
              c.reduce_scatter(bin, bout, per_rank, DataType::kFloat32, ReduceOp::kSum);
            };
          } else if (op == "all_gather") {
            fn = [&c, bin, bout, per_rank] {
              c.all_gather(bin, bout, per_rank, DataType::kFloat32);
            };
          } else {
            throw invalid_argument("unknown op {}", op);
          }
        }
        const int iters = iterations(bytes);
        fn();  // warm-up
        ctl.barrier();
        const double cpu0 = cpu_seconds();
        const auto t0 = std::chrono::steady_clock::now();
        for (int it = 0; it < iters; ++it) fn();
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                      iters;
        // CPU time of this process (all its threads, user + system: Gloo's TCP work shows up as
        // system time), summed over the ranks: the cost per operation independent of how busy
        // the machine is.
        double cpu = (cpu_seconds() - cpu0) / iters;
        // The max of positive doubles is the max of their bit patterns as int64.
        ctl.all_reduce(&secs, 1, DataType::kInt64, ReduceOp::kMax);
        std::vector<double> cpus(static_cast<size_t>(n));
        ctl.all_gather(&cpu, cpus.data(), 1, DataType::kInt64);
        cpu = 0;
        for (double x : cpus) cpu += x;
        if (rank == 0) {
          std::string line = fmt::format("{} {} {} {:.9f} {:.9f}\n", op, b, bytes, secs, cpu);
          if (::write(out_fd, line.data(), line.size()) < 0) return 3;
        }
      }
    }
  }
  ctl.barrier();
  return 0;
}

std::string human(size_t b) {
  if (b >= (size_t{1} << 20)) return fmt::format("{} MiB", b >> 20);
  return fmt::format("{} KiB", b >> 10);
}

// STREAM-style copy on one core (a rank's collectives run on one thread): the median of 10
// memcpys of 64 MiB between buffers touched beforehand, as STREAM counts it (bytes read + bytes
// written, per second). The ceiling a host-memory collective's copies work against.
void print_copy_bandwidth() {
  const size_t bytes = size_t{64} << 20;
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);
  std::vector<double> s;
  for (int i = 0; i < 10; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  std::printf("memory: STREAM-style copy on one core, 64 MiB: %.2f GB/s (read + write; median of 10 memcpys)\n",
              2.0 * static_cast<double>(bytes) / s[s.size() / 2] / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Args a = parse(argc, argv);
    print_copy_bandwidth();
    for (int n : a.ranks) {
      store::TcpStoreServerOptions so;
      so.host = "127.0.0.1";
      so.token = "bench";
      store::TcpStoreServer server(so);
      server.start();
      int fds[2];
      if (::pipe(fds) != 0) throw system_error("pipe: {}", errno_string(errno));
      std::fflush(nullptr);
      std::vector<pid_t> pids;
      for (int r = 0; r < n; ++r) {
        pid_t pid = ::fork();
        if (pid == 0) {
          ::close(fds[0]);
          int code = 1;
          try {
            code = rank_main(r, n, server.port(), a, fds[1]);
          } catch (const std::exception& e) {
            std::fprintf(stderr, "rank %d: %s\n", r, e.what());
          }
          ::_exit(code);
        }
        pids.push_back(pid);
      }
      ::close(fds[1]);
      std::string text;
      char buf[4096];
      ssize_t got;
      while ((got = ::read(fds[0], buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(got));
      ::close(fds[0]);
      int failures = 0;
      for (pid_t p : pids) {
        int st = 0;
        ::waitpid(p, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++failures;
      }
      server.stop();
      if (failures) throw remote_error("{} of {} benchmark ranks failed", failures, n);
      // op -> bytes -> backend -> seconds
      struct Cell {
        double seconds = 0;  // slowest rank's mean time per operation
        double cpu = 0;      // CPU seconds per operation, summed over the ranks
      };
      std::map<std::string, std::map<size_t, std::map<std::string, Cell>>> res;
      for (auto& line : split(text, '\n')) {
        auto f = split(line, ' ');
        if (f.size() != 5) continue;
        res[f[0]][static_cast<size_t>(parse_int(f[2]).value_or(0))][f[1]] = {std::stod(f[3]),
                                                                             std::stod(f[4])};
      }
      for (auto& op : a.ops) {
        std::printf("\n%s, %d ranks (processes), fp32 sum, %s. us: slowest rank's mean time; "
                    "busbw: GB/s as nccl-tests; cpu: CPU ms per op, all ranks\n", op.c_str(), n,
                    op == "all_reduce" || a.in_place ? "in place" : "out of place");
        std::printf("%10s", "size");
        for (auto& b : a.backends) std::printf(" | %-11s %9s %6s %8s", b.c_str(), "us", "busbw", "cpu");
        std::printf("\n");
        for (auto& [bytes, row] : res[op]) {
          std::printf("%10s", human(bytes).c_str());
          for (auto& b : a.backends) {
            auto it = row.find(b);
            if (it == row.end()) {
              std::printf(" | %-11s %9s %6s %8s", "", "-", "-", "-");
              continue;
            }
            const double s = it->second.seconds;
            const double busbw = bytes / s * bus_factor(op, n) / 1e9;
            std::printf(" | %-11s %9.1f %6.2f %8.3f", "", s * 1e6, busbw, it->second.cpu * 1e3);
          }
          std::printf("\n");
        }
      }
      std::fflush(stdout);
    }
    return 0;
  } catch (const ds::Error& e) {
    std::fprintf(stderr, "comm_bench: %s\n", e.what());
    return e.exit_code();
  }
}
