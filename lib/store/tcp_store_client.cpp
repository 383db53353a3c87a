// TcpStoreClient: one request at a time over one socket (a mutex serializes callers). Blocking
// get/wait park on the server; when the caller's deadline passes the client sends kCancelWait and
// reads until the server's kCanceled, which lists the keys that were still missing.
#include "store/tcp_store_client.h"

#include <thread>

#include "common/env.h"
#include "common/error.h"
#include "store/tcp_store_protocol.h"

namespace ds::store {

using proto::ErrorCode;
using proto::Type;

struct TcpStoreClient::Reply {
  Type type = Type::kError;
  std::vector<uint8_t> body;  // after the type byte
  proto::Reader reader() const { return proto::Reader(body.data(), body.size()); }
};

namespace {

// Time allowed for the server to answer a kCancelWait once our own deadline passed.
constexpr Millis kCancelGrace{10000};

std::string error_text(const std::vector<uint8_t>& body, ErrorCode* code) {
  proto::Reader r(body.data(), body.size());
  auto c = r.u8();
  auto msg = r.str();
  *code = static_cast<ErrorCode>(c.value_or(0));
  return msg.value_or("(unreadable error message)");
}

}  // namespace

TcpStoreClient::TcpStoreClient(TcpStoreClientOptions options) : options_(std::move(options)) {
  if (options_.port <= 0 || options_.port > 65535) {
    throw invalid_argument("store client: port {} of {} is not in 1..65535", options_.port,
                           options_.host);
  }
  set_default_timeout(options_.timeout);
  connect_and_authenticate();
}

TcpStoreClient::~TcpStoreClient() = default;

std::string TcpStoreClient::describe() const {
  return fmt::format("store at {}", net::HostPort{options_.host, options_.port}.str());
}

std::string TcpStoreClient::who() const {
  if (options_.rank < 0) return {};
  if (options_.world_size > 0) return fmt::format(" (rank {} of {})", options_.rank, options_.world_size);
  return fmt::format(" (rank {})", options_.rank);
}

void TcpStoreClient::connect_and_authenticate() {
  Deadline deadline = Deadline::after(options_.connect_timeout);
  const std::string peer = describe();
  for (;;) {
    fd_ = net::connect_tcp(options_.host, options_.port, deadline,
                           net::ConnectOptions{Millis(20), Millis(1000), "store"});
    // The server speaks first (kHello with a nonce). A server that accepted and closed at once
    // (still starting, or shedding load) is retried until the deadline.
    Reply hello;
    try {
      hello = read_reply(deadline, "handshake");
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kRemote || deadline.expired()) throw;
      fd_.reset();
      std::this_thread::sleep_for(Millis(50));
      continue;
    }
    if (hello.type == Type::kError) {
      ErrorCode code;
      std::string msg = error_text(hello.body, &code);
      throw Error(ErrorKind::kRemote, fmt::format("{} refused the connection{}: {}", peer, who(), msg),
                  "the store has too many clients; raise its max_clients or use fewer clients");
    }
    proto::Reader r = hello.reader();
    auto magic = r.u32();
    auto version = r.u16();
    auto nonce = r.bytes();
    if (hello.type != Type::kHello || !magic || *magic != proto::kMagic) {
      throw remote_error("{} is not a dstrain store (unexpected greeting); check DSTRAIN_STORE",
                         peer);
    }
    if (!version || *version != proto::kVersion || !nonce || nonce->size() != proto::kNonceBytes) {
      throw remote_error("{} speaks store protocol version {}, this client version {}", peer,
                         version.value_or(0), proto::kVersion);
    }
    auto frame = proto::Writer(Type::kAuth)
                     .u32(proto::kMagic)
                     .u16(proto::kVersion)
                     .bytes(proto::auth_mac(options_.token, *nonce))
                     .i64(options_.rank)
                     .i64(options_.world_size)
                     .finish();
    net::write_exact(fd_.get(), frame.data(), frame.size(), deadline, peer);
    Reply ok = read_reply(deadline, "authentication");
    if (ok.type == Type::kAuthOk) return;
    if (ok.type == Type::kError) {
      ErrorCode code;
      std::string msg = error_text(ok.body, &code);
      fd_.reset();
      if (code == ErrorCode::kAuthFailed) {
        throw Error(ErrorKind::kRemote,
                    fmt::format("{} refused authentication{}: wrong job token", peer, who()),
                    "DSTRAIN_JOB_TOKEN must be the token of the job whose launcher started this "
                    "store; is another job's store at that address?");
      }
      throw remote_error("{} refused the connection{}: {}", peer, who(), msg);
    }
    throw remote_error("{}: unexpected {} reply to authentication", peer, proto::type_name(ok.type));
  }
}

TcpStoreClient::Reply TcpStoreClient::read_reply(Deadline deadline, const std::string& what) {
  const std::string peer = describe();
  uint8_t len_buf[proto::kLengthBytes];
  if (!net::read_exact(fd_.get(), len_buf, sizeof len_buf, deadline, peer)) {
    throw remote_error("{} closed the connection during {}", peer, what);
  }
  uint32_t len = proto::get_u32le(len_buf);
  if (len == 0 || len > proto::kClientMaxFrameBytes) {
    throw remote_error("{} sent a malformed reply ({} bytes) during {}", peer, len, what);
  }
  std::vector<uint8_t> body(len);
  if (!net::read_exact(fd_.get(), body.data(), len, deadline, peer)) {
    throw remote_error("{} closed the connection during {}", peer, what);
  }
  Reply reply;
  reply.type = static_cast<Type>(body[0]);
  reply.body.assign(body.begin() + 1, body.end());
  return reply;
}

void TcpStoreClient::fail(const std::string& what, const std::exception& e) {
  broken_ = true;
  broken_reason_ = e.what();
  fd_.reset();
  // Socket errors already name the peer: say "the store" instead of repeating the address.
  std::string inner = e.what();
  const std::string me = describe();
  if (inner.rfind(me, 0) == 0) inner = "the store" + inner.substr(me.size());
  broken_reason_ = inner;
  auto* err = dynamic_cast<const Error*>(&e);
  ErrorKind kind = err ? err->kind() : ErrorKind::kRemote;
  std::string hint = err && !err->hint().empty()
                         ? err->hint()
                         : "the store is hosted by node 0's dstrain agent; it goes away when the "
                           "job is torn down or that agent dies";
  throw Error(kind, fmt::format("{}{}: {} failed: {}", me, who(), what, inner), hint);
}

TcpStoreClient::Reply TcpStoreClient::round_trip(const std::vector<uint8_t>& frame,
                                                 const std::string& what) {
  if (broken_) {
    throw remote_error("{}{}: {}: the connection was lost earlier ({})", describe(), who(), what,
                       broken_reason_);
  }
  Reply reply;
  try {
    Deadline deadline = deadline_for(std::nullopt);
    net::write_exact(fd_.get(), frame.data(), frame.size(), deadline, describe());
    reply = read_reply(deadline, what);
  } catch (const std::exception& e) {
    fail(what, e);
  }
  if (reply.type == Type::kError) {
    ErrorCode code;
    std::string msg = error_text(reply.body, &code);
    if (code == ErrorCode::kInvalidRequest) {
      throw invalid_argument("{}{}: {}: {}", describe(), who(), what, msg);
    }
    broken_ = true;
    broken_reason_ = msg;
    fd_.reset();
    throw remote_error("{}{}: {}: the server closed the connection: {}", describe(), who(), what,
                       msg);
  }
  return reply;
}

TcpStoreClient::Reply TcpStoreClient::blocking_call(const std::vector<uint8_t>& frame,
                                                    const std::vector<std::string>& keys,
                                                    std::optional<Millis> timeout,
                                                    const std::string& what) {
  if (broken_) {
    throw remote_error("{}{}: {}: the connection was lost earlier ({})", describe(), who(), what,
                       broken_reason_);
  }
  Deadline deadline = deadline_for(timeout);
  const std::string peer = describe();
  std::optional<Reply> early;
  std::vector<std::string> missing;
  try {
    net::write_exact(fd_.get(), frame.data(), frame.size(), deadline_for(std::nullopt), peer);
    if (net::wait_readable(fd_.get(), deadline)) {
      // The reply has started: the rest follows promptly.
      early = read_reply(deadline_for(std::nullopt), what);
    } else {
      auto cancel = proto::Writer(Type::kCancelWait).finish();
      Deadline grace = Deadline::after(kCancelGrace);
      net::write_exact(fd_.get(), cancel.data(), cancel.size(), grace, peer);
      for (;;) {
        Reply r = read_reply(grace, what + " (cancelling)");
        if (r.type == Type::kCanceled) {
          proto::Reader rd = r.reader();
          auto m = rd.keys(keys.size());
          if (!m) throw remote_error("{} sent a malformed cancel reply", peer);
          missing = std::move(*m);
          break;
        }
        if (early) throw remote_error("{} sent two replies to one {}", peer, what);
        early = std::move(r);  // answered just before our cancel arrived
      }
    }
  } catch (const std::exception& e) {
    fail(what, e);
  }
  if (early) {
    if (early->type == Type::kError) {
      ErrorCode code;
      std::string msg = error_text(early->body, &code);
      if (code == ErrorCode::kInvalidRequest) {
        throw invalid_argument("{}{}: {}: {}", describe(), who(), what, msg);
      }
      broken_ = true;
      broken_reason_ = msg;
      fd_.reset();
      throw remote_error("{}{}: {}: the server closed the connection: {}", describe(), who(), what,
                         msg);
    }
    return std::move(*early);
  }
  throw detail::wait_timeout(describe(), what, missing, keys.size(), resolve_timeout(timeout),
                             who());
}

namespace {
[[noreturn]] void bad_reply(const std::string& store, const std::string& what, Type got) {
  throw remote_error("{}: {}: unexpected {} reply", store, what, proto::type_name(got));
}
}  // namespace

void TcpStoreClient::set(const std::string& key, const Bytes& value) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string what = fmt::format("set of key '{}'", key);
  Reply r = round_trip(proto::Writer(Type::kSet).str(key).bytes(value).finish(), what);
  if (r.type != Type::kOk) bad_reply(describe(), what, r.type);
}

Bytes TcpStoreClient::get(const std::string& key, std::optional<Millis> timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string what = fmt::format("get of key '{}'", key);
  Reply r = blocking_call(proto::Writer(Type::kGet).str(key).finish(), {key}, timeout, what);
  auto v = r.reader().bytes();
  if (r.type != Type::kValue || !v) bad_reply(describe(), what, r.type);
  return std::move(*v);
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string what = fmt::format("add to key '{}'", key);
  Reply r = round_trip(proto::Writer(Type::kAdd).str(key).i64(delta).finish(), what);
  auto v = r.reader().i64();
  if (r.type != Type::kInt || !v) bad_reply(describe(), what, r.type);
  return *v;
}

Bytes TcpStoreClient::compare_set(const std::string& key, const Bytes& expected,
                                  const Bytes& desired) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string what = fmt::format("compare_set of key '{}'", key);
  Reply r = round_trip(
      proto::Writer(Type::kCompareSet).str(key).bytes(expected).bytes(desired).finish(), what);
  auto v = r.reader().bytes();
  if (r.type != Type::kValue || !v) bad_reply(describe(), what, r.type);
  return std::move(*v);
}

void TcpStoreClient::wait(const std::vector<std::string>& keys, std::optional<Millis> timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string what = keys.size() == 1 ? fmt::format("wait for key '{}'", keys[0])
                                      : fmt::format("wait for {} keys", keys.size());
  Reply r = blocking_call(proto::Writer(Type::kWait).keys(keys).finish(), keys, timeout, what);
  if (r.type != Type::kOk) bad_reply(describe(), what, r.type);
}

bool TcpStoreClient::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string what = fmt::format("check of {} keys", keys.size());
  Reply r = round_trip(proto::Writer(Type::kCheck).keys(keys).finish(), what);
  auto v = r.reader().u8();
  if (r.type != Type::kBool || !v) bad_reply(describe(), what, r.type);
  return *v != 0;
}

bool TcpStoreClient::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string what = fmt::format("delete of key '{}'", key);
  Reply r = round_trip(proto::Writer(Type::kDelete).str(key).finish(), what);
  auto v = r.reader().u8();
  if (r.type != Type::kBool || !v) bad_reply(describe(), what, r.type);
  return *v != 0;
}

int64_t TcpStoreClient::num_keys() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string what = "num_keys";
  Reply r = round_trip(proto::Writer(Type::kNumKeys).finish(), what);
  auto v = r.reader().i64();
  if (r.type != Type::kInt || !v) bad_reply(describe(), what, r.type);
  return *v;
}

std::shared_ptr<TcpStoreClient> connect_from_env(Millis connect_timeout) {
  auto addr = env::get("DSTRAIN_STORE");
  if (!addr || addr->empty()) {
    throw Error(ErrorKind::kInvalidUsage, "DSTRAIN_STORE is not set: no rendezvous store to join",
                "run this program under `dstrain launch`, which starts the store and sets "
                "DSTRAIN_STORE, DSTRAIN_JOB_TOKEN, RANK and WORLD_SIZE");
  }
  net::HostPort hp = net::parse_host_port(*addr, "DSTRAIN_STORE");
  TcpStoreClientOptions o;
  o.host = hp.host;
  o.port = hp.port;
  o.token = env::get_or_default("DSTRAIN_JOB_TOKEN");
  o.rank = static_cast<int>(env::get_int("RANK"));
  o.world_size = static_cast<int>(env::get_int("WORLD_SIZE"));
  o.connect_timeout = connect_timeout;
  return std::make_shared<TcpStoreClient>(std::move(o));
}

}  // namespace ds::store
