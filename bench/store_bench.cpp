// store_bench: figures for the rendezvous store on this machine (server and clients on
// loopback): connect+authenticate latency, request round trips, add throughput from many
// clients, and the time for N worker processes (store_barrier_worker) to start, connect and pass
// one barrier.
//
// Run: build/bin/store_bench [max_world]   (default 512). Prints a table; never fails on numbers.
// Deliberately not: a launch benchmark (that is the launcher's, with dstrain launch vs torchrun).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "store/tcp_store_client.h"
#include "store/tcp_store_server.h"

namespace {

using ds::Millis;
using namespace ds::store;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

TcpStoreClientOptions opts(const TcpStoreServer& s, int rank = -1, int world = -1) {
  TcpStoreClientOptions o;
  o.host = "127.0.0.1";
  o.port = s.port();
  o.token = "bench-token";
  o.rank = rank;
  o.world_size = world;
  o.timeout = Millis(120000);
  o.connect_timeout = Millis(60000);
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int max_world = argc > 1 ? std::atoi(argv[1]) : 512;
  TcpStoreServerOptions so;
  so.host = "127.0.0.1";
  so.token = "bench-token";
  TcpStoreServer server(so);
  server.start();
  std::printf("store_bench: server on 127.0.0.1:%d, %u hardware threads\n", server.port(),
              std::thread::hardware_concurrency());

  {  // connect + authenticate
    std::vector<double> t;
    for (int i = 0; i < 200; ++i) {
      auto s = Clock::now();
      TcpStoreClient c(opts(server));
      t.push_back(ms_since(s));
    }
    std::printf("%-44s %10.3f ms (median of 200)\n", "connect + authenticate", median(t));
  }
  {  // round trips
    TcpStoreClient c(opts(server));
    const int n = 20000;
    auto s = Clock::now();
    for (int i = 0; i < n; ++i) c.add("rt", 1);
    double ms = ms_since(s);
    std::printf("%-44s %10.1f us (%d adds, one client)\n", "add round trip", ms * 1000 / n, n);
    Bytes v(100, 1);
    s = Clock::now();
    for (int i = 0; i < n; ++i) c.set("k", v);
    ms = ms_since(s);
    std::printf("%-44s %10.1f us\n", "set of 100 B round trip", ms * 1000 / n);
    s = Clock::now();
    for (int i = 0; i < n; ++i) c.get("k");
    ms = ms_since(s);
    std::printf("%-44s %10.1f us\n", "get of an existing key round trip", ms * 1000 / n);
  }
  {  // add throughput from many clients
    const int threads = 16, per = 2000;
    std::vector<std::thread> ts;
    auto s = Clock::now();
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&] {
        TcpStoreClient c(opts(server));
        for (int i = 0; i < per; ++i) c.add("tp", 1);
      });
    }
    for (auto& t : ts) t.join();
    double ms = ms_since(s);
    std::printf("%-44s %10.0f ops/s (%d clients x %d adds)\n", "add throughput", threads * per / ms * 1000,
                threads, per);
  }
  // N worker processes (store_barrier_worker, spawned with posix_spawn as a launcher would:
  // this process hosts a running server thread, so it must not fork without exec): each joins
  // the store from its environment, passes one barrier and exits.
  std::string worker = std::filesystem::path(std::filesystem::read_symlink("/proc/self/exe"))
                           .replace_filename("store_barrier_worker")
                           .string();
  for (int world = 2; world <= max_world; world *= 4) {
    auto s = Clock::now();
    std::vector<pid_t> pids;
    for (int r = 0; r < world; ++r) {
      // A fresh barrier name per N (one store serves every N).
      std::vector<std::string> env = {
          fmt::format("DSTRAIN_STORE=127.0.0.1:{}", server.port()),
          "DSTRAIN_JOB_TOKEN=bench-token", fmt::format("RANK={}", r),
          fmt::format("WORLD_SIZE={}", world)};
      std::vector<char*> envp;
      for (auto& e : env) envp.push_back(e.data());
      envp.push_back(nullptr);
      std::string flag = "--name", name = fmt::format("n{}/barrier", world);
      char* argv_w[] = {worker.data(), flag.data(), name.data(), nullptr};
      pid_t pid = 0;
      if (::posix_spawn(&pid, worker.c_str(), nullptr, nullptr, argv_w, envp.data()) != 0) {
        std::fprintf(stderr, "cannot start %s\n", worker.c_str());
        return 1;
      }
      pids.push_back(pid);
    }
    int failed = 0;
    for (pid_t p : pids) {
      int st = 0;
      ::waitpid(p, &st, 0);
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed++;
    }
    double ms = ms_since(s);
    std::printf("%-44s %10.1f ms%s\n",
                ("spawn " + std::to_string(world) + " workers, connect, barrier, exit").c_str(), ms,
                failed ? " (SOME FAILED)" : "");
  }
  auto st = server.stats();
  std::printf("server: %llu connections accepted, %llu requests, %llu protocol errors\n",
              static_cast<unsigned long long>(st.accepted), static_cast<unsigned long long>(st.requests),
              static_cast<unsigned long long>(st.protocol_errors));
  server.stop();
  return 0;
}
