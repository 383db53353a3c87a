// A tiny worker for the launcher's tests and bench/launch_bench.sh: joins the job's store through
// the environment contract (connect_from_env), passes a barrier, reports what the tests check,
// then fails, kills itself or sleeps as asked.
//
//   --pid-dir D          write D/rank_<RANK>.pid first (tests check these pids are gone)
//   --barrier            connect_from_env + barrier "start" (under the generation prefix gen<N>/)
//   --print-env          print the contract variables (the token only as its length)
//   --show-env K         print K=<value> (repeatable)
//   --affinity           print this process's CPU list
//   --lines N            print N numbered lines on stdout and on stderr
//   --fail-rank R --fail-code C      rank R exits with C (after the barrier, if any)
//   --kill-self-rank R   rank R sends itself SIGKILL
//   --fail-until-restart K           every rank 0 exits 5 while DSTRAIN_RESTART_COUNT < K
//   --sleep S            then sleep S seconds;  --ignore-sigterm: ignore SIGTERM while sleeping
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "store/prefix_store.h"
#include "store/tcp_store_client.h"

namespace {
std::string env_or(const char* k, const char* d) {
  const char* v = std::getenv(k);
  return v != nullptr ? v : d;
}
}  // namespace

int main(int argc, char** argv) {
  std::string pid_dir;
  bool barrier = false, print_env = false, affinity = false, ignore_term = false;
  std::vector<std::string> show;
  int lines = 0, fail_rank = -1, fail_code = 1, kill_rank = -1, fail_until = -1;
  double sleep_s = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "test_worker: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--pid-dir") pid_dir = next();
    else if (a == "--barrier") barrier = true;
    else if (a == "--print-env") print_env = true;
    else if (a == "--show-env") show.push_back(next());
    else if (a == "--affinity") affinity = true;
    else if (a == "--lines") lines = std::stoi(next());
    else if (a == "--fail-rank") fail_rank = std::stoi(next());
    else if (a == "--fail-code") fail_code = std::stoi(next());
    else if (a == "--kill-self-rank") kill_rank = std::stoi(next());
    else if (a == "--fail-until-restart") fail_until = std::stoi(next());
    else if (a == "--sleep") sleep_s = std::stod(next());
    else if (a == "--ignore-sigterm") ignore_term = true;
    else {
      std::fprintf(stderr, "test_worker: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  int rank = std::atoi(env_or("RANK", "-1").c_str());
  int world = std::atoi(env_or("WORLD_SIZE", "0").c_str());
  int restart = std::atoi(env_or("DSTRAIN_RESTART_COUNT", "0").c_str());
  if (ignore_term) ::signal(SIGTERM, SIG_IGN);
  if (!pid_dir.empty()) {
    std::ofstream(pid_dir + "/rank_" + std::to_string(rank) + ".pid.tmp") << ::getpid() << "\n";
    std::rename((pid_dir + "/rank_" + std::to_string(rank) + ".pid.tmp").c_str(),
                (pid_dir + "/rank_" + std::to_string(rank) + ".pid").c_str());
  }
  if (print_env) {
    for (const char* k : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
                          "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "DSTRAIN_STORE",
                          "DSTRAIN_JOB_ID", "DSTRAIN_RESTART_COUNT", "OMP_NUM_THREADS"}) {
      std::printf("env %s=%s\n", k, env_or(k, "<unset>").c_str());
    }
    std::printf("env DSTRAIN_JOB_TOKEN_LENGTH=%zu\n", env_or("DSTRAIN_JOB_TOKEN", "").size());
  }
  for (const auto& k : show) std::printf("show %s=%s\n", k.c_str(), env_or(k.c_str(), "<unset>").c_str());
  if (affinity) {
    cpu_set_t set;
    CPU_ZERO(&set);
    sched_getaffinity(0, sizeof set, &set);
    std::string cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus += (cpus.empty() ? "" : ",") + std::to_string(c);
    }
    std::printf("affinity %s\n", cpus.c_str());
  }
  std::fflush(stdout);
  for (int i = 0; i < lines; ++i) {
    std::printf("line %d of rank %d\n", i, rank);
    std::fprintf(stderr, "err %d of rank %d\n", i, rank);
  }
  std::fflush(stdout);
  if (barrier) {
    try {
      auto client = ds::store::connect_from_env(std::chrono::milliseconds(30000));
      ds::store::PrefixStore gen("gen" + std::to_string(restart) + "/", client);
      ds::store::barrier(gen, "start", world, std::chrono::milliseconds(60000));
      std::printf("barrier passed by rank %d of %d\n", rank, world);
      std::fflush(stdout);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "test_worker: rank %d: %s\n", rank, e.what());
      return 10;
    }
  }
  if (fail_until >= 0 && rank == 0 && restart < fail_until) {
    std::fprintf(stderr, "rank 0 fails on purpose at restart %d\n", restart);
    return 5;
  }
  if (rank == kill_rank) ::raise(SIGKILL);
  if (rank == fail_rank) return fail_code;
  if (sleep_s > 0) {
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(sleep_s);
    while (std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return 0;
}
