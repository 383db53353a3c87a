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
#include <set>
#include <stdexcept>
#include <thread>

#include "store/gloo_store_adapter.h"
#include "store/prefix_store.h"
#include "unit/store/store_test_util.h"

namespace ds::store {
namespace {

using test::start_server;

// Forked workers, created BEFORE the server thread starts (a multi-threaded process may only
// fork to exec; see tcp_store_server.h). Each child blocks until release() hands it the server's
// port, then runs fn(rank, port); its return value is the exit code (an exception: exit 99 with
// the message on stderr; no port because the test failed first: exit 97).
class Workers {
 public:
  Workers(int n, const std::function<int(int rank, int port)>& fn) {
    for (int r = 0; r < n; ++r) {
      int p[2];
      if (::pipe(p) != 0) throw std::runtime_error("pipe failed");
      std::fflush(nullptr);
      pid_t pid = ::fork();
      if (pid == 0) {
        ::close(p[1]);
        for (int w : writers_) ::close(w);
        int port = 0;
        int code = 97;
        if (::read(p[0], &port, sizeof port) == static_cast<ssize_t>(sizeof port)) {
          try {
            code = fn(r, port);
          } catch (const std::exception& e) {
            std::fprintf(stderr, "child %d (rank %d): %s\n", static_cast<int>(::getpid()), r,
                         e.what());
            code = 99;
          }
        }
        std::fflush(nullptr);
        ::_exit(code);
      }
      ::close(p[0]);
      writers_.push_back(p[1]);
      pids_.push_back(pid);
    }
  }
  ~Workers() {
    close_writers();
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (!reaped_.count(i)) {
        ::kill(pids_[i], SIGKILL);
        ::waitpid(pids_[i], nullptr, 0);
      }
    }
  }
  void release(int port) {
    for (int w : writers_) {
      if (::write(w, &port, sizeof port) != static_cast<ssize_t>(sizeof port)) {
        ADD_FAILURE() << "cannot release a worker";
      }
    }
    close_writers();
  }
  pid_t pid(int i) const { return pids_[i]; }
  // Waits for children [first, last) up to `timeout`, then SIGKILLs the rest. Raw statuses.
  std::vector<int> wait(size_t first, size_t last, Millis timeout = Millis(30000)) {
    std::vector<int> status(last - first, -1);
    Deadline d = Deadline::after(timeout);
    for (;;) {
      size_t left = 0;
      for (size_t i = first; i < last; ++i) {
        if (reaped_.count(i)) continue;
        int st = 0;
        if (::waitpid(pids_[i], &st, WNOHANG) == pids_[i]) {
          status[i - first] = st;
          reaped_.insert(i);
        } else {
          ++left;
        }
      }
      if (left == 0) return status;
      if (d.expired()) {
        for (size_t i = first; i < last; ++i) {
          if (reaped_.count(i)) continue;
          ::kill(pids_[i], SIGKILL);
          ::waitpid(pids_[i], &status[i - first], 0);
          reaped_.insert(i);
          ADD_FAILURE() << "worker " << i << " timed out";
        }
        return status;
      }
      std::this_thread::sleep_for(Millis(5));
    }
  }
  std::vector<int> wait_all(Millis timeout = Millis(30000)) { return wait(0, pids_.size(), timeout); }

 private:
  void close_writers() {
    for (int w : writers_) ::close(w);
    writers_.clear();
  }
  std::vector<pid_t> pids_;
  std::vector<int> writers_;
  std::set<size_t> reaped_;
};

TcpStoreClientOptions options_for(int port, int rank, int world) {
  TcpStoreClientOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.token = test::kToken;
  o.rank = rank;
  o.world_size = world;
  o.connect_timeout = Millis(10000);
  o.timeout = Millis(20000);
  return o;
}

void expect_all_exit_zero(const std::vector<int>& status) {
  for (size_t i = 0; i < status.size(); ++i) {
    EXPECT_TRUE(WIFEXITED(status[i]) && WEXITSTATUS(status[i]) == 0)
        << "worker " << i << " status " << status[i];
  }
}

TEST(StoreMultiproc, ForkedWorkersCountAndPassBarriers) {
  constexpr int kWorld = 8, kAdds = 400;
  Workers workers(kWorld, [&](int r, int port) {
      TcpStoreClient c(options_for(port, r, kWorld));
      for (int i = 0; i < kAdds; ++i) c.add("counter", 1);
      barrier(c, "counted", kWorld, Millis(20000));
      // Everyone sees the final count after the barrier.
      if (c.add("counter", 0) != kWorld * kAdds) return 1;
      c.set(fmt::format("rank/{}", r), to_bytes(std::to_string(::getpid())));
      barrier(c, "done", kWorld, Millis(20000));
      return 0;
  });
  auto server = start_server();
  workers.release(server->port());
  expect_all_exit_zero(workers.wait_all());
  auto c = test::connect(*server);
  EXPECT_EQ(c->add("counter", 0), kWorld * kAdds);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(to_string(c->get(fmt::format("rank/{}", r))), std::to_string(workers.pid(r)));
  }
}

TEST(StoreMultiproc, GlooAllreduceAcrossProcessesThroughTheStore) {
  constexpr int kWorld = 4;
  constexpr size_t kN = 10000;
  Workers workers(kWorld, [&](int r, int port) {
      auto client = std::make_shared<TcpStoreClient>(options_for(port, r, kWorld));
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
  });
  auto server = start_server();
  workers.release(server->port());
  expect_all_exit_zero(workers.wait_all());
}

TEST(StoreMultiproc, KilledWorkersDoNotDisturbTheOthers) {
  // Worker 0 parks in a get, worker 1 half-sends a frame; both get SIGKILLed. Workers 2-4 then
  // pass a barrier.
  Workers workers(5, [&](int r, int port) {
    if (r == 0) {
      TcpStoreClient c(options_for(port, 0, 2));
      c.set("parked/ready", {});
      c.get("never", Millis(60000));
      return 0;
    }
    if (r == 1) {
      test::RawClient raw(port);
      auto frame = proto::Writer(proto::Type::kSet).str("k").bytes(Bytes(1000)).finish();
      frame.resize(500);
      raw.send(frame);
      TcpStoreClient c(options_for(port, 1, 2));
      c.set("half/ready", {});
      ::pause();
      return 0;
    }
    TcpStoreClient w(options_for(port, r, 3));
    w.wait({"victims/killed"}, Millis(20000));
    barrier(w, "after-kill", 3, Millis(20000));
    return 0;
  });
  auto server = start_server();
  workers.release(server->port());
  auto c = test::connect(*server);
  c->wait({"parked/ready", "half/ready"}, Millis(20000));
  ::kill(workers.pid(0), SIGKILL);
  ::kill(workers.pid(1), SIGKILL);
  auto st = workers.wait(0, 2);
  EXPECT_TRUE(WIFSIGNALED(st[0]));
  EXPECT_TRUE(WIFSIGNALED(st[1]));
  // The server noticed: the victims' three connections are gone; ours and the 3 workers' remain.
  for (int i = 0; i < 500 && server->stats().open_connections != 4; ++i) {
    std::this_thread::sleep_for(Millis(10));
  }
  EXPECT_EQ(server->stats().open_connections, 4u);
  c->set("victims/killed", {});
  expect_all_exit_zero(workers.wait(2, 5));
  c->set("never", to_bytes("late"));  // nobody is parked on it any more: no crash, no reply
  EXPECT_EQ(to_string(c->get("never")), "late");
}

TEST(StoreMultiproc, WorkerTimeoutMessageNamesRankAndMissingKeys) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  Workers workers(1, [&](int, int port) {
    ::close(fds[0]);
    TcpStoreClient c(options_for(port, 5, 8));
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
  auto server = start_server();
  workers.release(server->port());
  std::string msg;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) msg.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  expect_all_exit_zero(workers.wait_all());
  EXPECT_NE(msg.find(fmt::format("store at 127.0.0.1:{}: wait for 2 keys timed out after 0.2 s "
                                 "(rank 5 of 8); missing keys: 'addr/0', 'addr/1' (2 of 2)",
                                 server->port())),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace ds::store
