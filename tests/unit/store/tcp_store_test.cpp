// The TCP store with real sockets on loopback: many clients, authentication, limits, hostile
// input (garbage, oversized, truncated and half-sent frames), thousands of connections, and
// waits cancelled at their deadline.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <atomic>
#include <random>
#include <set>
#include <thread>

#include "store/prefix_store.h"
#include "store_test_util.h"

namespace ds::store {
namespace {

using proto::Type;
using test::client_options;
using test::connect;
using test::RawClient;
using test::start_server;

std::string what_of(const std::function<void()>& f, ErrorKind* kind = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (kind) *kind = e.kind();
    return e.what();
  }
  return "(no error)";
}

TEST(TcpStore, CounterIsExactAfterThousandsOfAddsFromManyClients) {
  auto server = start_server();
  constexpr int kThreads = 16, kAdds = 500;
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      auto c = connect(*server, t, kThreads);
      for (int i = 0; i < kAdds; ++i) seen[t].push_back(c->add("counter", 1));
    });
  }
  for (auto& t : ts) t.join();
  auto c = connect(*server);
  EXPECT_EQ(c->add("counter", 0), kThreads * kAdds);
  // Every add saw a distinct value: the increments were atomic.
  std::set<int64_t> all;
  for (auto& v : seen) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kAdds));
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kAdds);
}

TEST(TcpStore, OneClientSharedByThreadsIsSerialized) {
  auto server = start_server();
  auto c = connect(*server);
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        std::string k = fmt::format("t{}/{}", t, i);
        c->set(k, to_bytes(k));
        EXPECT_EQ(to_string(c->get(k)), k);
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(c->num_keys(), 1600);
}

TEST(TcpStore, LargeValueRoundTrips) {
  auto server = start_server();
  auto c = connect(*server);
  Bytes big(3 << 20);
  std::mt19937 rng(1);
  for (auto& b : big) b = static_cast<uint8_t>(rng());
  c->set("big", big);
  EXPECT_EQ(connect(*server)->get("big"), big);
}

TEST(TcpStore, WrongTokenIsRefusedClearly) {
  auto server = start_server();
  auto o = client_options(*server, 3, 4);
  o.token = "not-the-token";
  ErrorKind kind{};
  std::string m = what_of([&] { TcpStoreClient c(o); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kRemote);
  EXPECT_NE(m.find(fmt::format("store at 127.0.0.1:{} refused authentication (rank 3 of 4): "
                               "wrong job token",
                               server->port())),
            std::string::npos)
      << m;
  EXPECT_EQ(m.find("not-the-token"), std::string::npos) << "the token must not be echoed";
  EXPECT_EQ(server->stats().auth_failures, 1u);
  // The right token still works.
  EXPECT_EQ(connect(*server)->add("x", 1), 1);
}

TEST(TcpStore, EmptyTokenOnlyMatchesEmptyToken) {
  TcpStoreServerOptions so;
  so.host = "127.0.0.1";
  TcpStoreServer server(so);  // empty token
  server.start();
  auto o = client_options(server);
  o.token = "";
  EXPECT_EQ(TcpStoreClient(o).add("x", 1), 1);
  o.token = "something";
  EXPECT_NE(what_of([&] { TcpStoreClient c(o); }).find("wrong job token"), std::string::npos);
}

TEST(TcpStore, ConnectTimesOutWhenNobodyListens) {
  int port = 0;
  {
    net::Fd l = net::listen_tcp("127.0.0.1", 0);
    port = net::local_port(l.get());
  }
  TcpStoreClientOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.connect_timeout = Millis(300);
  ErrorKind kind{};
  std::string m = what_of([&] { TcpStoreClient c(o); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kTimeout);
  EXPECT_NE(m.find(fmt::format("could not connect to store at 127.0.0.1:{} within", port)),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("Connection refused"), std::string::npos) << m;
}

TEST(TcpStore, ClientRetriesUntilTheServerStarts) {
  int port = 0;
  {
    net::Fd l = net::listen_tcp("127.0.0.1", 0);
    port = net::local_port(l.get());
  }
  TcpStoreServerOptions so;
  so.host = "127.0.0.1";
  so.port = port;
  so.token = test::kToken;
  TcpStoreServer server(so);
  std::thread late([&] {
    std::this_thread::sleep_for(Millis(300));
    server.start();
  });
  TcpStoreClientOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.token = test::kToken;
  o.connect_timeout = Millis(10000);
  TcpStoreClient c(o);  // first attempts are refused; a later one succeeds
  late.join();
  EXPECT_EQ(c.add("n", 7), 7);
}

TEST(TcpStore, HostileInputClosesOnlyThatConnection) {
  auto server = start_server();
  auto good = connect(*server);
  good->set("k", to_bytes("v"));
  std::mt19937 rng(42);

  auto garbage = [&](size_t n) {
    std::vector<uint8_t> g(n);
    for (auto& b : g) b = static_cast<uint8_t>(rng());
    return g;
  };
  int expected_protocol_errors = 0;

  // 1. Random garbage before authenticating (a random length header is almost surely too big
  //    for the handshake limit).
  for (int i = 0; i < 20; ++i) {
    RawClient r(server->port(), /*authenticate=*/false);
    auto g = garbage(64);
    g[0] = 0xff;  // length far over the handshake limit
    r.send(g);
    EXPECT_TRUE(r.closed_by_server());
    expected_protocol_errors++;
  }
  // 2. Random garbage after authenticating.
  for (int i = 0; i < 20; ++i) {
    RawClient r(server->port());
    auto g = garbage(256);
    g[3] = 0x7f;  // length ~2 GiB: over max_frame_bytes
    r.send(g);
    EXPECT_TRUE(r.closed_by_server());
    expected_protocol_errors++;
  }
  // 3. An oversized frame header, with an error frame saying why.
  {
    RawClient r(server->port());
    std::vector<uint8_t> hdr(5);
    proto::put_u32le(hdr.data(), 64u << 20);
    hdr[4] = static_cast<uint8_t>(Type::kSet);
    r.send(hdr);
    auto f = r.read_frame();
    ASSERT_FALSE(f.empty());
    EXPECT_EQ(f[0], static_cast<uint8_t>(Type::kError));
    std::string msg(f.begin() + 6, f.end());
    EXPECT_NE(msg.find("exceeds the limit"), std::string::npos) << msg;
    EXPECT_TRUE(r.closed_by_server());
    expected_protocol_errors++;
  }
  // 4. A zero-length frame, an unknown type, a set whose fields are cut short, trailing bytes.
  std::vector<std::vector<uint8_t>> bad = {
      {0, 0, 0, 0},
      proto::Writer(static_cast<Type>(200)).finish(),
      proto::Writer(Type::kSet).u32(100).finish(),
      proto::Writer(Type::kNumKeys).u8(1).finish(),
      proto::Writer(Type::kWait).u32(0xffffffffu).finish(),
      proto::Writer(Type::kAuth).finish(),  // auth again after authenticating
  };
  for (const auto& frame : bad) {
    RawClient r(server->port());
    r.send(frame);
    EXPECT_TRUE(r.closed_by_server());
    expected_protocol_errors++;
  }
  // 5. A request while a wait is parked.
  {
    RawClient r(server->port());
    r.send(proto::Writer(Type::kWait).keys({"never"}).finish());
    r.send(proto::Writer(Type::kNumKeys).finish());
    EXPECT_TRUE(r.closed_by_server());
    expected_protocol_errors++;
  }
  // 6. Truncated frames, then close.
  for (int i = 0; i < 10; ++i) {
    RawClient r(server->port());
    auto frame = proto::Writer(Type::kSet).str("key").bytes(garbage(100)).finish();
    frame.resize(frame.size() / 2);
    r.send(frame);
    expected_protocol_errors++;
  }  // closes here

  // The well-behaved client was never disturbed; the server counted every bad connection.
  EXPECT_EQ(to_string(good->get("k")), "v");
  EXPECT_EQ(good->add("n", 1), 1);
  for (int i = 0; i < 100 && server->stats().protocol_errors <
                                 static_cast<uint64_t>(expected_protocol_errors);
       ++i) {
    std::this_thread::sleep_for(Millis(10));
  }
  EXPECT_EQ(server->stats().protocol_errors, static_cast<uint64_t>(expected_protocol_errors));
  EXPECT_EQ(connect(*server)->num_keys(), 2);
}

TEST(TcpStore, FuzzedFramesNeverCrashTheServer) {
  // Well-framed bodies with random types and random field bytes, so the decoders (not only the
  // length check) see hostile input. Each connection sends frames until the server closes it.
  TcpStoreServerOptions o;
  o.max_frame_bytes = 4096;
  auto server = start_server(o);
  auto good = connect(*server);
  std::mt19937 rng(20240520);
  int frames = 0;
  for (int conn = 0; conn < 150; ++conn) {
    RawClient r(server->port());
    for (int f = 0; f < 20; ++f) {
      size_t n = 1 + rng() % 64;
      std::vector<uint8_t> frame(4 + n);
      proto::put_u32le(frame.data(), static_cast<uint32_t>(n));
      for (size_t i = 4; i < frame.size(); ++i) frame[i] = static_cast<uint8_t>(rng());
      // Mostly request types, with small field lengths, so decoding gets somewhere.
      frame[4] = static_cast<uint8_t>(rng() % 4 ? 10 + rng() % 9 : rng());
      for (size_t i = 5; i + 4 <= frame.size(); i += 4 + rng() % 8) {
        if (rng() % 2) proto::put_u32le(frame.data() + i, static_cast<uint32_t>(rng() % 16));
      }
      try {
        r.send(frame);
      } catch (const Error&) {
        break;  // the server already closed this connection
      }
      ++frames;
      // Skip any reply; stop when the server has closed this connection.
      if (!net::wait_readable(r.fd(), Deadline::after(Millis(20)))) continue;
      try {
        if (r.read_frame(Millis(1000)).empty()) break;
      } catch (const Error&) {
        break;
      }
    }
  }
  EXPECT_GT(frames, 150);
  EXPECT_EQ(good->add("alive", 1), 1);
  EXPECT_TRUE(server->running());
}

TEST(TcpStore, HalfSentFrameAndSilentHandshakeAreTimedOut) {
  TcpStoreServerOptions o;
  o.frame_timeout = Millis(200);
  o.handshake_timeout = Millis(200);
  auto server = start_server(o);
  RawClient silent(server->port(), /*authenticate=*/false);
  RawClient half(server->port());
  auto frame = proto::Writer(Type::kSet).str("key").str("value").finish();
  frame.resize(7);
  half.send(frame);
  EXPECT_TRUE(silent.closed_by_server(Millis(5000)));
  EXPECT_TRUE(half.closed_by_server(Millis(5000)));
  EXPECT_EQ(connect(*server)->add("n", 1), 1);
}

TEST(TcpStore, VersionMismatchIsRefused) {
  auto server = start_server();
  RawClient r(server->port(), /*authenticate=*/false);
  r.send(proto::Writer(Type::kAuth).u32(proto::kMagic).u16(99).finish());
  auto f = r.read_frame();
  ASSERT_GE(f.size(), 2u);
  EXPECT_EQ(f[0], static_cast<uint8_t>(Type::kError));
  EXPECT_EQ(f[1], static_cast<uint8_t>(proto::ErrorCode::kVersionMismatch));
  EXPECT_TRUE(r.closed_by_server());
}

TEST(TcpStore, KeyAndKeyCountLimitsRefuseTheRequestNotTheConnection) {
  TcpStoreServerOptions o;
  o.max_key_bytes = 16;
  o.max_keys = 3;
  auto server = start_server(o);
  auto c = connect(*server);
  ErrorKind kind{};
  std::string m = what_of([&] { c->set(std::string(17, 'k'), {}); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kInvalidArgument);
  EXPECT_NE(m.find("key of 17 bytes exceeds the store's limit of 16 bytes"), std::string::npos)
      << m;
  c->set("a", {});
  c->set("b", {});
  c->add("c", 1);
  m = what_of([&] { c->set("d", {}); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kInvalidArgument);
  EXPECT_NE(m.find("maximum of 3 keys"), std::string::npos) << m;
  c->set("a", to_bytes("overwrite is fine"));
  EXPECT_TRUE(c->delete_key("b"));
  c->set("d", {});
  EXPECT_EQ(c->num_keys(), 3);
}

TEST(TcpStore, OversizedFrameFromClientLosesOnlyThatClient) {
  TcpStoreServerOptions o;
  o.max_frame_bytes = 1024;
  auto server = start_server(o);
  auto c = connect(*server);
  auto other = connect(*server);
  ErrorKind kind{};
  what_of([&] { c->set("big", Bytes(4096)); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kRemote);
  std::string m = what_of([&] { c->add("n", 1); });
  EXPECT_NE(m.find("connection was lost earlier"), std::string::npos) << m;
  EXPECT_EQ(other->add("n", 1), 1);
}

TEST(TcpStore, MaxClientsRefusesTheExtraClient) {
  TcpStoreServerOptions o;
  o.max_clients = 2;
  auto server = start_server(o);
  auto a = connect(*server);
  auto b = connect(*server);
  ErrorKind kind{};
  std::string m = what_of([&] { connect(*server); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kRemote);
  EXPECT_NE(m.find("too many clients (limit 2)"), std::string::npos) << m;
  a.reset();  // frees a slot
  for (int i = 0; i < 100 && server->stats().open_connections > 1; ++i) {
    std::this_thread::sleep_for(Millis(10));
  }
  EXPECT_EQ(connect(*server)->add("n", 1), 1);
}

TEST(TcpStore, ThousandsOfParkedConnectionsAreAllAnswered) {
  auto server = start_server();
  constexpr int kConns = 1500;
  std::vector<std::unique_ptr<RawClient>> raws;
  raws.reserve(kConns);
  for (int i = 0; i < kConns; ++i) {
    raws.push_back(std::make_unique<RawClient>(server->port()));
    if (i % 2 == 0) {
      raws.back()->send(proto::Writer(Type::kGet).str("go").finish());
    } else {
      raws.back()->send(proto::Writer(Type::kWait).keys({"go", "go2"}).finish());
    }
  }
  EXPECT_EQ(server->stats().open_connections, static_cast<uint64_t>(kConns));
  auto c = connect(*server);
  c->set("go", to_bytes("v"));
  c->set("go2", {});
  for (int i = 0; i < kConns; ++i) {
    auto f = raws[i]->read_frame();
    ASSERT_FALSE(f.empty()) << "connection " << i;
    if (i % 2 == 0) {
      ASSERT_EQ(f[0], static_cast<uint8_t>(Type::kValue)) << i;
      proto::Reader r(f.data() + 1, f.size() - 1);
      EXPECT_EQ(to_string(*r.bytes()), "v");
    } else {
      EXPECT_EQ(f[0], static_cast<uint8_t>(Type::kOk)) << i;
    }
  }
}

TEST(TcpStore, ThousandClientsPassABarrier) {
  auto server = start_server();
  constexpr int kWorld = 1024, kThreads = 8;
  // Each thread owns kWorld/kThreads clients: all join, then all wait through raw parking is
  // impossible with blocking clients, so each thread joins its clients' adds first and then
  // waits on "done" with every one of them in turn (each wait returns at once once all joined).
  std::vector<std::vector<std::unique_ptr<TcpStoreClient>>> clients(kThreads);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kWorld / kThreads; ++i) clients[t].push_back(connect(*server));
    });
  }
  for (auto& t : ts) t.join();
  ts.clear();
  EXPECT_EQ(server->stats().open_connections, static_cast<uint64_t>(kWorld));
  std::atomic<int> done{0};
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (auto& c : clients[t]) {
        if (c->add("b/count", 1) == kWorld) c->set("b/done", {});
      }
      for (auto& c : clients[t]) {
        c->wait({"b/done"}, Millis(20000));
        done++;
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(done.load(), kWorld);
}

TEST(TcpStore, CancelledWaitsRacingWritesKeepTheConnectionInStep) {
  auto server = start_server();
  auto waiter = connect(*server);
  auto writer = connect(*server);
  int answered = 0, timed_out = 0;
  std::thread w([&] {
    for (int i = 0; i < 300; ++i) writer->set(fmt::format("k{}", i), to_bytes(std::to_string(i)));
  });
  for (int i = 0; i < 300; ++i) {
    try {
      EXPECT_EQ(to_string(waiter->get(fmt::format("k{}", i), Millis(1))), std::to_string(i));
      answered++;
    } catch (const Error& e) {
      ASSERT_EQ(e.kind(), ErrorKind::kTimeout) << e.what();
      timed_out++;
    }
  }
  w.join();
  EXPECT_EQ(answered + timed_out, 300);
  // Replies never got out of step with requests.
  for (int i = 0; i < 300; i += 37) {
    EXPECT_EQ(to_string(waiter->get(fmt::format("k{}", i))), std::to_string(i));
  }
  EXPECT_EQ(waiter->num_keys(), 300);
}

TEST(TcpStore, StoppingTheServerFailsBlockedAndLaterCalls) {
  auto server = start_server();
  auto c = connect(*server);
  ErrorKind kind{};
  std::string m;
  std::thread blocked([&] { m = what_of([&] { c->get("never", Millis(20000)); }, &kind); });
  std::this_thread::sleep_for(Millis(100));
  server->stop();
  blocked.join();
  EXPECT_EQ(kind, ErrorKind::kRemote) << m;
  EXPECT_NE(m.find("closed the connection"), std::string::npos) << m;
  EXPECT_THROW(c->add("n", 1), Error);
}

TEST(TcpStore, ConnectFromEnv) {
  auto server = start_server();
  ::unsetenv("DSTRAIN_STORE");
  ErrorKind kind{};
  std::string m = what_of([&] { connect_from_env(); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kInvalidUsage);
  EXPECT_NE(m.find("DSTRAIN_STORE is not set"), std::string::npos) << m;
  ::setenv("DSTRAIN_STORE", fmt::format("127.0.0.1:{}", server->port()).c_str(), 1);
  ::setenv("DSTRAIN_JOB_TOKEN", test::kToken, 1);
  ::setenv("RANK", "2", 1);
  ::setenv("WORLD_SIZE", "4", 1);
  auto c = connect_from_env(Millis(5000));
  EXPECT_EQ(c->options().rank, 2);
  EXPECT_EQ(c->add("n", 1), 1);
  ::setenv("DSTRAIN_JOB_TOKEN", "wrong", 1);
  m = what_of([&] { connect_from_env(Millis(5000)); });
  EXPECT_NE(m.find("refused authentication (rank 2 of 4): wrong job token"), std::string::npos)
      << m;
  ::setenv("DSTRAIN_STORE", "no-port-here", 1);
  m = what_of([&] { connect_from_env(Millis(5000)); }, &kind);
  EXPECT_EQ(kind, ErrorKind::kInvalidArgument);
  EXPECT_NE(m.find("DSTRAIN_STORE: 'no-port-here' is not host:port"), std::string::npos) << m;
  for (const char* v : {"DSTRAIN_STORE", "DSTRAIN_JOB_TOKEN", "RANK", "WORLD_SIZE"}) ::unsetenv(v);
}

}  // namespace
}  // namespace ds::store
