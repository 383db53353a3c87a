// store_barrier_worker: the smallest real worker for launch benchmarks. Joins the job's store
// (DSTRAIN_STORE, DSTRAIN_JOB_TOKEN, RANK, WORLD_SIZE), passes one barrier, exits 0. With
// --print it prints "rank R of W passed the barrier in X ms" (from process start to barrier);
// --name NAME names the barrier (default "bench/barrier").
//
// Run under the launcher: dstrain launch --nproc-per-node 8 -- build/bin/store_barrier_worker
// Deliberately not a test: it only measures; failures exit with the error's exit code.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/error.h"
#include "store/tcp_store_client.h"

int main(int argc, char** argv) {
  auto start = std::chrono::steady_clock::now();
  bool print = false;
  std::string name = "bench/barrier";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--print") == 0) {
      print = true;
    } else if (std::strcmp(argv[i], "--name") == 0 && i + 1 < argc) {
      name = argv[++i];  // several worlds on one store (store_bench) need distinct barriers
    } else {
      std::fprintf(stderr, "usage: store_barrier_worker [--print] [--name BARRIER]\n");
      return 2;
    }
  }
  try {
    auto store = ds::store::connect_from_env();
    int world = store->options().world_size;
    ds::store::barrier(*store, name, world, ds::Millis(120000));
    if (print) {
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                      .count();
      std::printf("rank %d of %d passed the barrier in %.2f ms\n", store->options().rank, world, ms);
    }
    return 0;
  } catch (const ds::Error& e) {
    std::fprintf(stderr, "store_barrier_worker: %s\n", e.what());
    if (!e.hint().empty()) std::fprintf(stderr, "hint: %s\n", e.hint().c_str());
    return e.exit_code();
  }
}
