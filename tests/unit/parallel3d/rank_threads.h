// Test helper: N ranks as threads over comm::make_thread_comms, each running fn(rank, world) with
// one OpenMP thread; rethrows the first rank's exception after every thread joined.
#pragma once

#include <omp.h>

#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "comm/comm.h"

namespace ds::test {

inline void run_ranks(int n, const std::function<void(int, ds::rt::comm::CommPtr)>& fn) {
  ds::rt::comm::CommOptions o;
  o.timeout = ds::Millis(60000);
  auto world = ds::rt::comm::make_thread_comms(n, o);
  std::vector<std::exception_ptr> err(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      omp_set_num_threads(1);
      try {
        fn(r, world[static_cast<size_t>(r)]);
      } catch (...) {
        err[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : err) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace ds::test
