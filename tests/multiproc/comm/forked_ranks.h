// Real forked ranks for the multi-process tests of runtime/comm and runtime/parallel: a TCP store
// in a process of its own, N children forked from a thread-free parent, each connecting its world
// Comm through the store, and their exit statuses collected under a timeout (a hung rank is
// killed and reported). CHILD_CHECK returns 10 from a child on a wrong value.
#pragma once

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "common/error.h"
#include "store/tcp_store_client.h"
#include "store/tcp_store_server.h"

namespace ds::rt::comm::test {

inline constexpr const char* kToken = "comm-test-token";

inline pid_t fork_child(const std::function<int()>& fn) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    int code = 98;
    try {
      code = fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", static_cast<int>(::getpid()), e.what());
      code = 99;
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  return pid;
}

inline std::vector<int> wait_all(const std::vector<pid_t>& pids, Millis timeout) {
  std::vector<int> status(pids.size(), -1);
  Deadline d = Deadline::after(timeout);
  size_t left = pids.size();
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (status[i] != -1) continue;
      int st = 0;
      if (::waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        status[i] = st;
        --left;
      }
    }
    if (left == 0) break;
    if (d.expired()) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (status[i] == -1) {
          ::kill(pids[i], SIGKILL);
          ::waitpid(pids[i], &status[i], 0);
          ADD_FAILURE() << "rank " << i << " hung and was killed";
        }
      }
      break;
    }
    std::this_thread::sleep_for(Millis(5));
  }
  return status;
}

// The fixture: a store for the test, and ranks forked against it. Param: what the tests vary.
template <typename Param>
class ForkedRanksTest : public ::testing::TestWithParam<Param> {
 protected:
  // The store runs in a process of its own, so that this process has no threads when it forks
  // the ranks (a fork next to a running thread can inherit a held lock, e.g. in ASan's
  // allocator, and hang the child).
  void SetUp() override {
    int port_pipe[2], stop_pipe[2];
    ASSERT_EQ(::pipe(port_pipe), 0);
    ASSERT_EQ(::pipe(stop_pipe), 0);
    std::fflush(nullptr);
    server_pid_ = ::fork();
    ASSERT_GE(server_pid_, 0);
    if (server_pid_ == 0) {
      ::close(port_pipe[0]);
      ::close(stop_pipe[1]);
      int code = 0;
      try {
        store::TcpStoreServerOptions o;
        o.host = "127.0.0.1";
        o.token = kToken;
        store::TcpStoreServer server(o);
        server.start();
        const int port = server.port();
        if (::write(port_pipe[1], &port, sizeof(port)) != sizeof(port)) code = 2;
        ::close(port_pipe[1]);
        char c;
        while (::read(stop_pipe[0], &c, 1) > 0) {
        }
        server.stop();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "store server: %s\n", e.what());
        code = 1;
      }
      ::_exit(code);
    }
    ::close(port_pipe[1]);
    ::close(stop_pipe[0]);
    stop_fd_ = stop_pipe[1];
    ASSERT_EQ(::read(port_pipe[0], &port_, sizeof(port_)), static_cast<ssize_t>(sizeof(port_)));
    ::close(port_pipe[0]);
  }
  void TearDown() override {
    if (stop_fd_ >= 0) ::close(stop_fd_);
    if (server_pid_ > 0) ::waitpid(server_pid_, nullptr, 0);
  }

  // In the child: the rank's world Comm over its own TCP store client.
  CommPtr connect(int rank, int size, Millis timeout, Backend backend) {
    store::TcpStoreClientOptions c;
    c.host = "127.0.0.1";
    c.port = port_;
    c.token = kToken;
    c.rank = rank;
    c.world_size = size;
    auto client = std::make_shared<store::TcpStoreClient>(c);
    CommOptions o;
    o.backend = backend;
    o.timeout = timeout;
    return make_world_comm(client, rank, size, o);
  }

  std::vector<int> run_ranks(int n, const std::function<int(int)>& fn, Millis timeout) {
    std::vector<pid_t> pids;
    for (int r = 0; r < n; ++r) pids.push_back(fork_child([&, r] { return fn(r); }));
    return wait_all(pids, timeout);
  }

  pid_t server_pid_ = -1;
  int stop_fd_ = -1;
  int port_ = 0;
};


// Exit codes from the children: 0 ok, 10+ a wrong value (the line of the check).
#define CHILD_CHECK(cond)                                                           \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "rank check failed at line %d: %s\n", __LINE__, #cond); \
      return 10;                                                                    \
    }                                                                               \
  } while (0)

}  // namespace ds::rt::comm::test
