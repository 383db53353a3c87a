// Helpers for the store tests: a server on a free loopback port, client options for it, and a
// raw protocol client that can speak the handshake and then misbehave on purpose.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/socket.h"
#include "store/tcp_store_client.h"
#include "store/tcp_store_protocol.h"
#include "store/tcp_store_server.h"

namespace ds::store::test {

inline constexpr const char* kToken = "s3cret-job-token";

inline std::unique_ptr<TcpStoreServer> start_server(TcpStoreServerOptions o = {}) {
  o.host = "127.0.0.1";
  o.port = 0;
  if (o.token.empty()) o.token = kToken;
  auto s = std::make_unique<TcpStoreServer>(std::move(o));
  s->start();
  return s;
}

inline TcpStoreClientOptions client_options(const TcpStoreServer& s, int rank = -1,
                                            int world = -1) {
  TcpStoreClientOptions o;
  o.host = "127.0.0.1";
  o.port = s.port();
  o.token = kToken;
  o.rank = rank;
  o.world_size = world;
  o.connect_timeout = Millis(10000);
  o.timeout = Millis(20000);
  return o;
}

inline std::unique_ptr<TcpStoreClient> connect(const TcpStoreServer& s, int rank = -1,
                                               int world = -1) {
  return std::make_unique<TcpStoreClient>(client_options(s, rank, world));
}

// Speaks the protocol by hand: handshake, then any bytes the test wants.
class RawClient {
 public:
  explicit RawClient(int port, bool authenticate = true, const std::string& token = kToken) {
    fd_ = net::connect_tcp("127.0.0.1", port, Deadline::after(Millis(10000)));
    auto hello = read_frame();
    EXPECT_EQ(hello.at(0), static_cast<uint8_t>(proto::Type::kHello));
    proto::Reader r(hello.data() + 1, hello.size() - 1);
    r.u32();
    r.u16();
    nonce_ = *r.bytes();
    if (authenticate) {
      send(proto::Writer(proto::Type::kAuth)
               .u32(proto::kMagic)
               .u16(proto::kVersion)
               .bytes(proto::auth_mac(token, nonce_))
               .i64(-1)
               .i64(-1)
               .finish());
      auto ok = read_frame();
      EXPECT_EQ(ok.at(0), static_cast<uint8_t>(proto::Type::kAuthOk));
    }
  }
  void send(const std::vector<uint8_t>& bytes) {
    net::write_exact(fd_.get(), bytes.data(), bytes.size(), Deadline::after(Millis(10000)), "srv");
  }
  // A whole frame body (type byte first); empty when the server closed the connection.
  std::vector<uint8_t> read_frame(Millis timeout = Millis(10000)) {
    uint8_t len[4];
    if (!net::read_exact(fd_.get(), len, 4, Deadline::after(timeout), "srv")) return {};
    std::vector<uint8_t> body(proto::get_u32le(len));
    if (!net::read_exact(fd_.get(), body.data(), body.size(), Deadline::after(timeout), "srv")) {
      return {};
    }
    return body;
  }
  // True when the server closes this connection (possibly after an error frame) in time.
  bool closed_by_server(Millis timeout = Millis(10000)) {
    Deadline d = Deadline::after(timeout);
    for (;;) {
      try {
        auto f = read_frame(Millis(d.remaining_ms()));
        if (f.empty()) return true;
      } catch (const Error& e) {
        return e.kind() == ErrorKind::kRemote;  // reset, or EOF mid-frame
      }
    }
  }
  int fd() const { return fd_.get(); }

 private:
  net::Fd fd_;
  std::vector<uint8_t> nonce_;
};

}  // namespace ds::store::test
