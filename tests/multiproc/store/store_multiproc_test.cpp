// The TCP store with real processes: forked workers count, pass barriers and rendezvous a Gloo
// context through the store; a worker killed mid-wait or mid-frame disturbs nobody else.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <cstdio>
#include <functional>
#include <thread>

#include "store/gloo_store_adapter.h"
#include "store/prefix_store.h"
#include "unit/store/store_test_util.h"

namespace ds::store {
namespace {

using test::client_options;
using test::start_server;

// Forks one child running `fn` (its return value is the exit code; an exception is exit 99 with
// the message on stderr).
pid_t fork_child(const std::function<int()>& fn) {
  fflush(nullptr);
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

// Waits for every child up to `timeout`, then SIGKILLs the rest. Returns raw wait statuses.
std::vector<int> wait_all(const std::vector<pid_t>& pids, Millis timeout = Millis(30000)) {
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
          ADD_FAILURE() << "child " << i << " timed out";
        }
      }
      break;
    }
    std::this_thread::sleep_for(Millis(5));
  }
  return status;
}

void expect_all_exit_zero(const std::vector<int>& status) {
  for (size_t i = 0; i < status.size(); ++i) {
    EXPECT_TRUE(WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0)
        << "child " << i << " status " << status[i];
  }
}

TEST(StoreMultiproc, ForkedWorkersCountAndPassBarriers) {
  auto server = start_server();
  constexpr int kWorld = 8, kAdds = 400;
  std::vector<pid_t> pids;
  for (int r = 0; r < kWorld; ++r) {
    pids.push_back(fork_child([&, r] {
      TcpStoreClient c(client_options(*server, r, kWorld));
      for (int i = 0; i < kAdds; ++i) c.add("counter", 1);
      barrier(c, "counted", kWorld, Millis(20000));
      // Everyone sees the final count after the barrier.
      if (c.add("counter", 0) != kWorld * kAdds) return 1;
      c.set(fmt::format("rank/{}", r), to_bytes(std::to_string(::getpid())));
      barrier(c, "done", kWorld, Millis(20000));
      return 0;
    }));
  }
  expect_all_exit_zero(wait_all(pids));
  auto c = test::connect(*server);
  EXPECT_EQ(c->add("counter", 0), kWorld * kAdds);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(to_string(c->get(fmt::format("rank/{}", r))), std::to_string(pids[r]));
  }
}

TEST(StoreMultiproc, GlooAllreduceAcrossProcessesThroughTheStore) {
  auto server = start_server();
  constexpr int kWorld = 4;
  constexpr size_t kN = 10000;
  std::vector<pid_t> pids;
  for (int r = 0; r < kWorld; ++r) {
    pids.push_back(fork_child([&, r] {
      auto client = std::make_shared<TcpStoreClient>(client_options(*server, r, kWorld));
      PrefixStore scoped("gen0/gloo/", client);
      GlooStoreAdapter adapter(scoped);
      gloo::transport::tcp::attr attr;
      attr.hostname = "127.0.0.1";
      auto dev = gloo::transport::tcp::CreateDevice(attr);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(r, kWorld);
      ctx->setTimeout(std::chrono::seconds(20));
      ctx->connectFullMesh(adapter, dev);
      std::vector<double> v(kN);
      for (size_t i = 0; i < kN; ++i) v[i] = (r + 1) * 0.5 + static_cast<double>(i);
      gloo::AllreduceOptions opts(ctx);
      opts.setOutput(v.data(), v.size());
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<double>));
      gloo::allreduce(opts);
      // sum over ranks of (r+1)*0.5 = 0.5 * 10 = 5; plus 4*i
      for (size_t i = 0; i < kN; ++i) {
        double want = 5.0 + 4.0 * static_cast<double>(i);
        if (std::abs(v[i] - want) > 1e-9) {
          std::fprintf(stderr, "rank %d: v[%zu] = %f, want %f\n", r, i, v[i], want);
          return 1;
        }
      }
      return 0;
    }));
  }
  expect_all_exit_zero(wait_all(pids));
}

TEST(StoreMultiproc, KilledWorkersDoNotDisturbTheOthers) {
  auto server = start_server();
  // One worker parks in a get, one half-sends a frame; both are SIGKILLed.
  pid_t parked = fork_child([&] {
    TcpStoreClient c(client_options(*server, 0, 2));
    c.set("parked/ready", {});
    c.get("never", Millis(60000));
    return 0;
  });
  pid_t half = fork_child([&] {
    test::RawClient r(server->port());
    auto frame = proto::Writer(proto::Type::kSet).str("k").bytes(Bytes(1000)).finish();
    frame.resize(500);
    r.send(frame);
    TcpStoreClient c(client_options(*server, 1, 2));
    c.set("half/ready", {});
    ::pause();
    return 0;
  });
  auto c = test::connect(*server);
  c->wait({"parked/ready", "half/ready"}, Millis(20000));
  ::kill(parked, SIGKILL);
  ::kill(half, SIGKILL);
  auto st = wait_all({parked, half});
  EXPECT_TRUE(WIFSIGNALED(st[0]));
  EXPECT_TRUE(WIFSIGNALED(st[1]));
  // The server noticed: only our own connection is left.
  for (int i = 0; i < 500 && server->stats().open_connections != 1; ++i) {
    std::this_thread::sleep_for(Millis(10));
  }
  EXPECT_EQ(server->stats().open_connections, 1u);
  // Fresh workers carry on.
  std::vector<pid_t> pids;
  for (int r = 0; r < 3; ++r) {
    pids.push_back(fork_child([&, r] {
      TcpStoreClient w(client_options(*server, r, 3));
      barrier(w, "after-kill", 3, Millis(20000));
      return 0;
    }));
  }
  expect_all_exit_zero(wait_all(pids));
  c->set("never", to_bytes("late"));  // nobody is parked on it any more: no crash, no reply
  EXPECT_EQ(to_string(c->get("never")), "late");
}

TEST(StoreMultiproc, WorkerTimeoutMessageNamesRankAndMissingKeys) {
  auto server = start_server();
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = fork_child([&] {
    ::close(fds[0]);
    TcpStoreClient c(client_options(*server, 5, 8));
    std::string msg;
    try {
      c.wait({"addr/0", "addr/1"}, Millis(200));
    } catch (const Error& e) {
      msg = e.what();
    }
    ssize_t w = ::write(fds[1], msg.data(), msg.size());
    return w == static_cast<ssize_t>(msg.size()) ? 0 : 1;
  });
  ::close(fds[1]);
  std::string msg;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) msg.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  expect_all_exit_zero(wait_all({pid}));
  EXPECT_NE(msg.find(fmt::format("store at 127.0.0.1:{}: wait for 2 keys timed out after 0.2 s "
                                 "(rank 5 of 8); missing keys: 'addr/0', 'addr/1' (2 of 2)",
                                 server->port())),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace ds::store
