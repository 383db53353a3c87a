// lib/common/socket.h: host:port parsing, listening on port 0, port checks, exact reads/writes.
#include <gtest/gtest.h>

#include <sys/socket.h>

#include <thread>

#include "common/error.h"
#include "common/socket.h"

namespace ds::net {
namespace {

TEST(Socket, ParseHostPort) {
  auto hp = parse_host_port("10.0.0.1:29400", "DSTRAIN_STORE");
  EXPECT_EQ(hp.host, "10.0.0.1");
  EXPECT_EQ(hp.port, 29400);
  EXPECT_EQ(hp.str(), "10.0.0.1:29400");
  auto v6 = parse_host_port("[::1]:80", "x");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.str(), "[::1]:80");
  EXPECT_EQ(parse_host_port(" node-1:0 ", "x").host, "node-1");
  for (const char* bad : {"host", "host:", ":80", "host:65536", "host:-1", "::1:80", "[::1]80"}) {
    try {
      parse_host_port(bad, "DSTRAIN_STORE");
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("DSTRAIN_STORE"), std::string::npos) << e.what();
    }
  }
}

TEST(Socket, ListenOnPortZeroAndReportInUse) {
  Fd l = listen_tcp("127.0.0.1", 0);
  int port = local_port(l.get());
  EXPECT_GT(port, 0);
  EXPECT_FALSE(port_is_free("127.0.0.1", port));
  try {
    listen_tcp("127.0.0.1", port);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("cannot listen on 127.0.0.1:{}", port)),
              std::string::npos)
        << e.what();
    EXPECT_FALSE(e.hint().empty());
  }
  l.reset();
  EXPECT_TRUE(port_is_free("127.0.0.1", port));
}

TEST(Socket, ExactReadWriteAndTimeouts) {
  Fd l = listen_tcp("127.0.0.1", 0);
  int port = local_port(l.get());
  Fd client = connect_tcp("127.0.0.1", port, Deadline::after(Millis(5000)));
  ASSERT_TRUE(wait_readable(l.get(), Deadline::after(Millis(5000))));
  Fd server(::accept(l.get(), nullptr, nullptr));
  ASSERT_TRUE(server.valid());
  std::vector<uint8_t> big(8 << 20, 7), got(big.size());
  std::thread writer([&] { write_exact(client.get(), big.data(), big.size(), Deadline::after(Millis(10000)), "peer"); });
  ASSERT_TRUE(read_exact(server.get(), got.data(), got.size(), Deadline::after(Millis(10000)), "peer"));
  writer.join();
  EXPECT_EQ(got, big);
  // Nothing to read: a timeout naming the peer.
  uint8_t b;
  try {
    read_exact(server.get(), &b, 1, Deadline::after(Millis(50)), "worker 3");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
    EXPECT_NE(std::string(e.what()).find("worker 3"), std::string::npos);
  }
  // Clean EOF at a boundary -> false; EOF mid-message -> remote error.
  uint8_t two[2] = {1, 2};
  write_exact(client.get(), two, 1, Deadline::after(Millis(1000)), "peer");
  client.reset();
  try {
    read_exact(server.get(), two, 2, Deadline::after(Millis(1000)), "peer");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRemote);
  }
  EXPECT_FALSE(read_exact(server.get(), two, 1, Deadline::after(Millis(1000)), "peer"));
}

TEST(Socket, RaiseOpenFileLimit) { EXPECT_GE(raise_open_file_limit(), 1024u); }

}  // namespace
}  // namespace ds::net
