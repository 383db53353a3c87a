// Fuzzes the rendezvous store's server (lib/store/tcp_store_server.h) with the frames one client
// sends, in-process: one real TcpStoreServer on a loopback port for the whole run, one real TCP
// connection per input. Input byte 0 chooses how the rest is sent:
//   bit 0   authenticate first (the real handshake), else the bytes replace the kAuth frame;
//   bit 1   framed: the rest is chunks (u8 n, then n bytes), each sent as one frame with a
//           correct length prefix (so mutations reach the fields); else sent raw as it is.
// Then the client ends its side and reads until the server closes the connection.
// Invariants: the server closes a connection whose client is done (no hang, 10 s), and keeps
// serving everyone else (a real client's set/get round trip after every 64 inputs).
#include <sys/socket.h>

#include <memory>
#include <string>

#include "common/socket.h"
#include "fuzz_support.h"
#include "store/tcp_store_client.h"
#include "store/tcp_store_protocol.h"
#include "store/tcp_store_server.h"

using namespace ds;
namespace proto = ds::store::proto;

namespace {

constexpr const char* kToken = "fuzz-job-token";

store::TcpStoreServer& server() {
  static std::unique_ptr<store::TcpStoreServer> s = [] {
    store::TcpStoreServerOptions o;
    o.host = "127.0.0.1";
    o.token = kToken;
    o.max_frame_bytes = 1 << 16;
    o.max_key_bytes = 256;
    o.max_keys = 4096;
    auto srv = std::make_unique<store::TcpStoreServer>(o);
    srv->start();
    return srv;
  }();
  return *s;
}

std::vector<uint8_t> read_frame(int fd) {
  uint8_t len[4];
  if (!net::read_exact(fd, len, 4, Deadline::after(Millis(10000)), "store")) return {};
  std::vector<uint8_t> body(proto::get_u32le(len));
  if (!net::read_exact(fd, body.data(), body.size(), Deadline::after(Millis(10000)), "store")) return {};
  return body;
}

void authenticate(int fd) {
  auto hello = read_frame(fd);
  DS_FUZZ_CHECK(!hello.empty() && hello[0] == static_cast<uint8_t>(proto::Type::kHello));
  proto::Reader r(hello.data() + 1, hello.size() - 1);
  r.u32();
  r.u16();
  auto nonce = r.bytes();
  DS_FUZZ_CHECK(nonce.has_value());
  auto auth = proto::Writer(proto::Type::kAuth)
                  .u32(proto::kMagic)
                  .u16(proto::kVersion)
                  .bytes(proto::auth_mac(kToken, *nonce))
                  .i64(-1)
                  .i64(-1)
                  .finish();
  net::write_exact(fd, auth.data(), auth.size(), Deadline::after(Millis(10000)), "store");
  auto ok = read_frame(fd);
  DS_FUZZ_CHECK(!ok.empty() && ok[0] == static_cast<uint8_t>(proto::Type::kAuthOk));
}

// The bytes on the wire: as given, or each chunk framed with its length.
std::vector<uint8_t> wire_bytes(const uint8_t* p, size_t n, bool framed) {
  if (!framed) return {p, p + n};
  std::vector<uint8_t> out;
  while (n > 0) {
    size_t k = std::min<size_t>(p[0], n - 1);
    if (k > 0) {
      uint8_t len[4];
      proto::put_u32le(len, static_cast<uint32_t>(k));
      out.insert(out.end(), len, len + 4);
      out.insert(out.end(), p + 1, p + 1 + k);
    }
    p += 1 + k;
    n -= 1 + k;
  }
  return out;
}

// Sends, ends the client's side, and reads until the server closes (or resets) the connection.
void exchange(int fd, const std::vector<uint8_t>& bytes) {
  try {
    net::write_exact(fd, bytes.data(), bytes.size(), Deadline::after(Millis(10000)), "store");
  } catch (const ds::Error&) {
    return;  // the server closed on a protocol error before taking everything
  }
  ::shutdown(fd, SHUT_WR);
  Deadline d = Deadline::after(Millis(10000));
  for (;;) {
    DS_FUZZ_CHECK(net::wait_readable(fd, d));  // else: the server never closed the connection
    uint8_t buf[4096];
    ssize_t r = ::recv(fd, buf, sizeof buf, 0);
    if (r <= 0) return;  // closed (0) or reset
  }
}

void check_serving() {
  store::TcpStoreClientOptions o;
  o.host = "127.0.0.1";
  o.port = server().port();
  o.token = kToken;
  o.connect_timeout = Millis(10000);
  o.timeout = Millis(10000);
  store::TcpStoreClient c(o);
  c.set("fuzz/alive", store::to_bytes("yes"));
  DS_FUZZ_CHECK(store::to_string(c.get("fuzz/alive")) == "yes");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::quiet_logging();
  server();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static uint64_t runs = 0;
  if (size == 0) return 0;
  const bool auth = data[0] & 1, framed = data[0] & 2;
  net::Fd fd = net::connect_tcp("127.0.0.1", server().port(), Deadline::after(Millis(10000)));
  linger lg{1, 0};  // close with a reset: no TIME_WAIT, so ports never run out
  ::setsockopt(fd.get(), SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  if (auth) {
    authenticate(fd.get());
  } else {
    DS_FUZZ_CHECK(!read_frame(fd.get()).empty());  // the hello
  }
  exchange(fd.get(), wire_bytes(data + 1, size - 1, framed));
  if (++runs % 64 == 0) check_serving();
  return 0;
}
