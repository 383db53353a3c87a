// TcpStoreServer's poll loop.
//
// How it works: one thread owns every piece of state (the key map, the connections, the parked
// waiters), so there are no locks beyond the stats counters. It waits in epoll (level-triggered,
// so the cost of a turn is the number of ready sockets, not of open ones: thousands of idle
// connections cost nothing) on the shutdown pipe, the listening socket and every connection.
// A connection with a lot of unsent output stops being read (backpressure). Every so often (a
// quarter of the shorter of the handshake and frame timeouts) a sweep closes connections whose
// handshake or half-sent frame is overdue. Readable connections append to their input buffer and
// complete frames are handled in order. A kGet/kWait whose keys are missing parks the connection: it is registered under
// each missing key in `waiters_`, and every write of a key (set, add, compare_set) wakes the
// connections registered under it, which reply if all their keys now exist. Replies go into the
// connection's output buffer and are sent as far as the socket takes them; the rest waits for
// POLLOUT. Anything malformed closes that one connection.
#include "store/tcp_store_server.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "common/check.h"
#include "common/error.h"
#include "common/socket.h"
#include "store/store.h"

namespace ds::store {

using proto::ErrorCode;
using proto::Type;

namespace {

// An unauthenticated client may send only a small kAuth frame.
constexpr size_t kMaxHandshakeFrame = 1024;
// Read budget per connection per poll turn, so one busy client cannot starve the others.
constexpr size_t kReadBudget = 1u << 20;
// Stop reading from a connection while this much output is queued (it is not reading replies).
constexpr size_t kOutputHighWater = 1u << 20;

std::string peer_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[INET6_ADDRSTRLEN] = {0};
  int port = 0;
  if (ss.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    port = ntohs(in->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    port = ntohs(in6->sin6_port);
  }
  return net::HostPort{host, port}.str();
}

// A frame that must close the connection (after a best-effort kError reply).
struct ProtocolError {
  ErrorCode code;
  std::string message;
};

}  // namespace

class TcpStoreServer::Impl {
 public:
  Impl(const TcpStoreServerOptions& options, net::Fd listener, net::Fd wake_read)
      : opt_(options), listener_(std::move(listener)), wake_read_(std::move(wake_read)) {}

  void run();
  // Closes every connection and the listener (after run() returned).
  void close_all() {
    conns_.clear();
    waiters_.clear();
    listener_.reset();
    open_connections = 0;
  }

  // Stats, readable from other threads.
  std::atomic<uint64_t> accepted{0}, authenticated{0}, auth_failures{0}, protocol_errors{0},
      rejected_clients{0}, requests{0}, open_connections{0};

 private:
  struct Conn {
    uint64_t id = 0;
    net::Fd fd;
    std::string peer;
    bool authed = false;
    std::vector<uint8_t> nonce;
    std::vector<uint8_t> in;
    std::vector<uint8_t> out;
    size_t out_off = 0;
    Clock::time_point accepted_at;
    std::optional<Clock::time_point> frame_started;  // first byte of an incomplete frame
    int64_t rank = -1, world_size = -1;
    // A parked kGet/kWait.
    bool parked = false;
    Type parked_type = Type::kWait;
    std::vector<std::string> parked_keys;
    bool closing = false;
    uint32_t events = 0;  // the epoll interest registered now
  };
  static constexpr uint64_t kWakeTag = 1;
  static constexpr uint64_t kListenerTag = 2;

  void accept_all();
  void sweep(Clock::time_point now);
  void update_interest(Conn& c);
  void mark_failed(Conn& c);
  void read_from(Conn& c);
  void handle_frames(Conn& c);
  void handle_frame(Conn& c, const uint8_t* body, size_t n);
  void handle_auth(Conn& c, proto::Reader& r);
  void handle_request(Conn& c, Type type, proto::Reader& r);
  void send(Conn& c, std::vector<uint8_t> frame);
  void flush(Conn& c);
  void close_conn(Conn& c, const std::string& why);
  void protocol_error(Conn& c, const ProtocolError& e);
  void send_error(Conn& c, ErrorCode code, const std::string& message);
  void check_key(const std::string& key) const;

  // Key map operations.
  void write_key(const std::string& key, std::vector<uint8_t> value);
  void wake(const std::string& key);
  bool all_present(const std::vector<std::string>& keys) const;
  void park(Conn& c, Type type, std::vector<std::string> keys);
  void unpark(Conn& c);
  void answer_parked(Conn& c);
  std::string label(const Conn& c) const;

  const TcpStoreServerOptions& opt_;
  net::Fd listener_;
  net::Fd wake_read_;
  net::Fd epoll_;
  bool listener_paused_ = false;
  std::vector<uint64_t> failed_;  // connections to close at the end of this turn
  uint64_t next_id_ = 16;         // ids below are epoll tags of the pipe and the listener
  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::unordered_map<std::string, std::vector<uint8_t>> map_;
  std::unordered_map<std::string, std::vector<uint64_t>> waiters_;  // key -> parked conn ids
};

std::string TcpStoreServer::Impl::label(const Conn& c) const {
  if (c.rank >= 0) return fmt::format("{} (rank {} of {})", c.peer, c.rank, c.world_size);
  return c.peer;
}

void TcpStoreServer::Impl::run() {
  epoll_ = net::Fd(::epoll_create1(EPOLL_CLOEXEC));
  DS_SYSCHECK(epoll_.get(), "epoll_create1");
  auto add = [&](int fd, uint64_t tag) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = tag;
    DS_SYSCHECK(::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev), "epoll_ctl(ADD)");
  };
  add(wake_read_.get(), kWakeTag);
  add(listener_.get(), kListenerTag);

  Millis sweep_every = std::clamp<Millis>(std::min(opt_.handshake_timeout, opt_.frame_timeout) / 4,
                                          Millis(10), Millis(1000));
  auto next_sweep = Clock::now() + sweep_every;
  std::vector<epoll_event> events(1024);
  for (;;) {
    auto now = Clock::now();
    if (now >= next_sweep) {
      sweep(now);
      next_sweep = now + sweep_every;
    }
    int timeout_ms = static_cast<int>(
        std::chrono::duration_cast<Millis>(next_sweep - now).count() + 1);
    int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      spdlog::error("store: epoll_wait failed: {}; the store stops", errno_string(errno));
      return;
    }
    for (int i = 0; i < n; ++i) {
      uint64_t tag = events[i].data.u64;
      if (tag == kWakeTag) return;  // stop()
      if (tag == kListenerTag) {
        accept_all();
        continue;
      }
      auto it = conns_.find(tag);
      if (it == conns_.end()) continue;  // closed earlier in this turn
      Conn& c = *it->second;
      uint32_t ev = events[i].events;
      if (ev & EPOLLOUT) flush(c);
      if (!c.closing && (ev & (EPOLLIN | EPOLLHUP | EPOLLERR))) read_from(c);
      if (conns_.count(tag)) update_interest(*conns_[tag]);
    }
    // Connections whose socket failed while we were writing to them (possibly from another
    // connection's request, when a write woke their wait).
    for (uint64_t id : failed_) {
      auto it = conns_.find(id);
      if (it != conns_.end()) close_conn(*it->second, "the client is gone");
    }
    failed_.clear();
  }
}

void TcpStoreServer::Impl::sweep(Clock::time_point now) {
  if (listener_paused_) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenerTag;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &ev) == 0) {
      listener_paused_ = false;
    }
  }
  std::vector<std::pair<uint64_t, std::string>> overdue;
  for (auto& [id, cp] : conns_) {
    const Conn& c = *cp;
    if (!c.authed && now - c.accepted_at >= opt_.handshake_timeout) {
      overdue.emplace_back(id, fmt::format("handshake not finished within {}",
                                           net::format_seconds(opt_.handshake_timeout)));
    } else if (c.frame_started && now - *c.frame_started >= opt_.frame_timeout) {
      overdue.emplace_back(id, fmt::format("incomplete frame not finished within {}",
                                           net::format_seconds(opt_.frame_timeout)));
    }
  }
  for (auto& [id, why] : overdue) {
    auto it = conns_.find(id);
    if (it != conns_.end()) protocol_error(*it->second, {ErrorCode::kProtocol, why});
  }
}

void TcpStoreServer::Impl::update_interest(Conn& c) {
  if (c.closing) return;
  uint32_t want = 0;
  bool pending = c.out_off < c.out.size();
  if (c.out.size() - c.out_off < kOutputHighWater) want |= EPOLLIN;
  if (pending) want |= EPOLLOUT;
  if (want == c.events) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = c.id;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev) != 0) {
    mark_failed(c);
    return;
  }
  c.events = want;
}

void TcpStoreServer::Impl::mark_failed(Conn& c) {
  if (c.closing) return;
  c.closing = true;
  failed_.push_back(c.id);
}

void TcpStoreServer::Impl::accept_all() {
  for (;;) {
    int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: stop watching the listener (level-triggered epoll would spin)
        // until the next sweep; pending connects wait in the backlog meanwhile.
        spdlog::warn("store: cannot accept more connections: {} (open: {})", errno_string(errno),
                     conns_.size());
        ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, listener_.get(), nullptr);
        listener_paused_ = true;
        return;
      }
      if (errno == ECONNABORTED) continue;
      spdlog::warn("store: accept failed: {}", errno_string(errno));
      return;
    }
    accepted++;
    auto c = std::make_unique<Conn>();
    c->id = next_id_++;
    c->fd = net::Fd(fd);
    try {
      net::set_nodelay(fd);
    } catch (const Error&) {
      // not fatal: only latency
    }
    c->peer = peer_address(fd);
    c->accepted_at = Clock::now();
    if (conns_.size() >= opt_.max_clients) {
      rejected_clients++;
      auto frame = proto::Writer(Type::kError)
                       .u8(static_cast<uint8_t>(ErrorCode::kTooManyClients))
                       .str(fmt::format("too many clients (limit {})", opt_.max_clients))
                       .finish();
      ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
      spdlog::warn("store: refused {}: already {} clients (max_clients)", c->peer, conns_.size());
      continue;  // Fd closes
    }
    c->nonce = proto::random_bytes(proto::kNonceBytes);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = c->id;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      spdlog::warn("store: cannot watch the connection of {}: {}", c->peer, errno_string(errno));
      continue;
    }
    c->events = EPOLLIN;
    Conn& ref = *c;
    conns_.emplace(c->id, std::move(c));
    open_connections = conns_.size();
    send(ref, proto::Writer(Type::kHello)
                  .u32(proto::kMagic)
                  .u16(proto::kVersion)
                  .bytes(ref.nonce)
                  .finish());
    if (ref.closing) {
      failed_.erase(std::remove(failed_.begin(), failed_.end(), ref.id), failed_.end());
      close_conn(ref, "hello could not be sent");
    }
  }
}

void TcpStoreServer::Impl::read_from(Conn& c) {
  size_t budget = kReadBudget;
  uint8_t buf[65536];
  uint64_t id = c.id;
  while (budget > 0) {
    ssize_t r = ::recv(c.fd.get(), buf, std::min(sizeof buf, budget), 0);
    if (r > 0) {
      c.in.insert(c.in.end(), buf, buf + r);
      budget -= static_cast<size_t>(r);
      if (!c.frame_started) c.frame_started = Clock::now();
      handle_frames(c);
      if (!conns_.count(id)) return;  // closed by a protocol error
      continue;
    }
    if (r == 0) {
      if (!c.in.empty()) {
        protocol_errors++;
        spdlog::warn("store: {} closed the connection in the middle of a frame ({} bytes sent)",
                     label(c), c.in.size());
      }
      close_conn(c, "closed by the client");
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    close_conn(c, errno_string(errno));
    return;
  }
}

void TcpStoreServer::Impl::handle_frames(Conn& c) {
  uint64_t id = c.id;
  size_t off = 0;
  while (c.in.size() - off >= proto::kLengthBytes) {
    uint32_t len = proto::get_u32le(c.in.data() + off);
    size_t limit = c.authed ? opt_.max_frame_bytes : kMaxHandshakeFrame;
    if (len == 0 || len > limit) {
      protocol_error(c, {ErrorCode::kProtocol,
                         len == 0 ? std::string("empty frame")
                                  : fmt::format("frame of {} bytes exceeds the limit of {} bytes",
                                                len, limit)});
      return;
    }
    if (c.in.size() - off - proto::kLengthBytes < len) break;
    handle_frame(c, c.in.data() + off + proto::kLengthBytes, len);
    if (!conns_.count(id)) return;
    off += proto::kLengthBytes + len;
  }
  c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(off));
  if (c.in.empty()) {
    c.frame_started.reset();
  } else if (off > 0) {
    c.frame_started = Clock::now();  // a new frame began within what we just read
  }
}

void TcpStoreServer::Impl::handle_frame(Conn& c, const uint8_t* body, size_t n) {
  proto::Reader r(body, n);
  uint8_t type = *r.u8();
  try {
    if (!c.authed) {
      if (type != static_cast<uint8_t>(Type::kAuth)) {
        throw ProtocolError{ErrorCode::kProtocol,
                            fmt::format("expected an auth frame first, got type {}", type)};
      }
      handle_auth(c, r);
      return;
    }
    if (!proto::is_request(type)) {
      throw ProtocolError{ErrorCode::kProtocol, fmt::format("unknown request type {}", type)};
    }
    requests++;
    handle_request(c, static_cast<Type>(type), r);
  } catch (const ProtocolError& e) {
    protocol_error(c, e);
  }
}

void TcpStoreServer::Impl::handle_auth(Conn& c, proto::Reader& r) {
  auto magic = r.u32();
  auto version = r.u16();
  if (!magic || *magic != proto::kMagic || !version || *version != proto::kVersion) {
    auth_failures++;
    std::string msg = fmt::format(
        "this is a dstrain store speaking protocol version {}; the client sent magic {:#x} "
        "version {}",
        proto::kVersion, magic.value_or(0), version.value_or(0));
    send_error(c, ErrorCode::kVersionMismatch, msg);
    spdlog::warn("store: refused {}: {}", c.peer, msg);
    close_conn(c, "version mismatch");
    return;
  }
  auto mac = r.bytes();
  auto rank = r.i64();
  auto world = r.i64();
  if (!mac || !rank || !world || !r.done()) {
    throw ProtocolError{ErrorCode::kProtocol, "malformed auth frame"};
  }
  c.rank = *rank;
  c.world_size = *world;
  if (!proto::mac_equal(*mac, proto::auth_mac(opt_.token, c.nonce))) {
    auth_failures++;
    send_error(c, ErrorCode::kAuthFailed, "wrong job token");
    spdlog::warn("store: refused {}: wrong job token", label(c));
    close_conn(c, "wrong job token");
    return;
  }
  c.authed = true;
  c.nonce.clear();
  authenticated++;
  send(c, proto::Writer(Type::kAuthOk).finish());
}

void TcpStoreServer::Impl::check_key(const std::string& key) const {
  if (key.size() > opt_.max_key_bytes) {
    throw invalid_argument("key of {} bytes exceeds the store's limit of {} bytes", key.size(),
                           opt_.max_key_bytes);
  }
}

void TcpStoreServer::Impl::handle_request(Conn& c, Type type, proto::Reader& r) {
  auto need = [](auto v) {
    if (!v) throw ProtocolError{ErrorCode::kProtocol, "malformed request: fields cut short"};
    return std::move(*v);
  };
  if (c.parked && type != Type::kCancelWait) {
    throw ProtocolError{ErrorCode::kProtocol,
                        fmt::format("{} request while a {} is still waiting", proto::type_name(type),
                                    proto::type_name(c.parked_type))};
  }
  const size_t max_list = opt_.max_frame_bytes / 4 + 1;
  // Decode everything first, so a malformed frame is a protocol error before any effect.
  std::string key;
  std::vector<uint8_t> a, b;
  std::vector<std::string> keys;
  int64_t delta = 0;
  switch (type) {
    case Type::kSet:
      key = need(r.str());
      a = need(r.bytes());
      break;
    case Type::kGet:
    case Type::kDelete:
      key = need(r.str());
      break;
    case Type::kAdd:
      key = need(r.str());
      delta = need(r.i64());
      break;
    case Type::kCompareSet:
      key = need(r.str());
      a = need(r.bytes());
      b = need(r.bytes());
      break;
    case Type::kWait:
    case Type::kCheck:
      keys = need(r.keys(max_list));
      break;
    case Type::kNumKeys:
    case Type::kCancelWait:
      break;
    default:
      throw ProtocolError{ErrorCode::kProtocol, "not a request"};
  }
  if (!r.done()) {
    throw ProtocolError{ErrorCode::kProtocol,
                        fmt::format("malformed {} request: {} trailing bytes",
                                    proto::type_name(type), r.left())};
  }

  const std::string where;  // the client names the store in its message
  try {
    switch (type) {
      case Type::kSet:
        check_key(key);
        write_key(key, std::move(a));
        send(c, proto::Writer(Type::kOk).finish());
        break;
      case Type::kGet:
        check_key(key);
        if (map_.count(key)) {
          send(c, proto::Writer(Type::kValue).bytes(map_[key]).finish());
        } else {
          park(c, Type::kGet, {key});
        }
        break;
      case Type::kAdd: {
        check_key(key);
        auto it = map_.find(key);
        int64_t v = detail::apply_add(where, key, it == map_.end() ? nullptr : &it->second, delta);
        std::string text = std::to_string(v);
        write_key(key, std::vector<uint8_t>(text.begin(), text.end()));
        send(c, proto::Writer(Type::kInt).i64(v).finish());
        break;
      }
      case Type::kCompareSet: {
        check_key(key);
        auto it = map_.find(key);
        const std::vector<uint8_t>* cur = it == map_.end() ? nullptr : &it->second;
        if (detail::compare_set_applies(cur, a)) {
          write_key(key, b);
          send(c, proto::Writer(Type::kValue).bytes(b).finish());
        } else {
          send(c, proto::Writer(Type::kValue).bytes(cur ? *cur : a).finish());
        }
        break;
      }
      case Type::kWait:
        for (const auto& k : keys) check_key(k);
        if (all_present(keys)) {
          send(c, proto::Writer(Type::kOk).finish());
        } else {
          park(c, Type::kWait, std::move(keys));
        }
        break;
      case Type::kCheck:
        send(c, proto::Writer(Type::kBool).u8(all_present(keys) ? 1 : 0).finish());
        break;
      case Type::kDelete:
        send(c, proto::Writer(Type::kBool).u8(map_.erase(key) ? 1 : 0).finish());
        break;
      case Type::kNumKeys:
        send(c, proto::Writer(Type::kInt).i64(static_cast<int64_t>(map_.size())).finish());
        break;
      case Type::kCancelWait: {
        std::vector<std::string> missing;
        if (c.parked) {
          for (const auto& k : c.parked_keys) {
            if (!map_.count(k)) missing.push_back(k);
          }
          unpark(c);
        }
        send(c, proto::Writer(Type::kCanceled).keys(missing).finish());
        break;
      }
      default:
        break;
    }
  } catch (const Error& e) {
    // A refused request (bad key, non-integer add, the store full): the connection stays.
    send_error(c, ErrorCode::kInvalidRequest, e.what());
  }
}

void TcpStoreServer::Impl::write_key(const std::string& key, std::vector<uint8_t> value) {
  auto it = map_.find(key);
  if (it == map_.end()) {
    if (map_.size() >= opt_.max_keys) {
      throw invalid_argument("the store holds its maximum of {} keys; key '{}' not added",
                             opt_.max_keys, key);
    }
    map_.emplace(key, std::move(value));
  } else {
    it->second = std::move(value);
  }
  wake(key);
}

bool TcpStoreServer::Impl::all_present(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (!map_.count(k)) return false;
  }
  return true;
}

void TcpStoreServer::Impl::park(Conn& c, Type type, std::vector<std::string> keys) {
  c.parked = true;
  c.parked_type = type;
  c.parked_keys = std::move(keys);
  for (const auto& k : c.parked_keys) {
    if (!map_.count(k)) waiters_[k].push_back(c.id);
  }
}

void TcpStoreServer::Impl::unpark(Conn& c) {
  if (!c.parked) return;
  for (const auto& k : c.parked_keys) {
    auto it = waiters_.find(k);
    if (it == waiters_.end()) continue;
    auto& v = it->second;
    v.erase(std::remove(v.begin(), v.end(), c.id), v.end());
    if (v.empty()) waiters_.erase(it);
  }
  c.parked = false;
  c.parked_keys.clear();
}

void TcpStoreServer::Impl::wake(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::vector<uint64_t> ids = std::move(it->second);
  waiters_.erase(it);
  for (uint64_t id : ids) {
    auto ci = conns_.find(id);
    if (ci == conns_.end()) continue;
    Conn& c = *ci->second;
    if (!c.parked || !all_present(c.parked_keys)) continue;  // still registered elsewhere
    answer_parked(c);
  }
}

void TcpStoreServer::Impl::answer_parked(Conn& c) {
  Type type = c.parked_type;
  std::string first = c.parked_keys.empty() ? std::string() : c.parked_keys[0];
  unpark(c);
  if (type == Type::kGet) {
    send(c, proto::Writer(Type::kValue).bytes(map_.at(first)).finish());
  } else {
    send(c, proto::Writer(Type::kOk).finish());
  }
  // A failed send marks the connection closing; the poll loop closes it.
}

void TcpStoreServer::Impl::send(Conn& c, std::vector<uint8_t> frame) {
  if (c.out_off == c.out.size()) {
    c.out = std::move(frame);
    c.out_off = 0;
  } else {
    c.out.insert(c.out.end(), frame.begin(), frame.end());
  }
  flush(c);
}

void TcpStoreServer::Impl::flush(Conn& c) {
  while (c.out_off < c.out.size()) {
    ssize_t w = ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off,
                       MSG_NOSIGNAL);
    if (w > 0) {
      c.out_off += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      update_interest(c);
      return;
    }
    mark_failed(c);  // peer gone; closed by the loop (we may be inside wake())
    return;
  }
  c.out.clear();
  c.out_off = 0;
  update_interest(c);
}

void TcpStoreServer::Impl::send_error(Conn& c, ErrorCode code, const std::string& message) {
  send(c, proto::Writer(Type::kError).u8(static_cast<uint8_t>(code)).str(message).finish());
}

void TcpStoreServer::Impl::protocol_error(Conn& c, const ProtocolError& e) {
  protocol_errors++;
  spdlog::warn("store: closing the connection of {}: {}", label(c), e.message);
  send_error(c, e.code, e.message);
  close_conn(c, e.message);
}

void TcpStoreServer::Impl::close_conn(Conn& c, const std::string& why) {
  spdlog::debug("store: connection of {} closed: {}", label(c), why);
  unpark(c);
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
  conns_.erase(c.id);  // destroys c (and closes its fd)
  open_connections = conns_.size();
}

TcpStoreServer::TcpStoreServer(TcpStoreServerOptions options) : options_(std::move(options)) {}

TcpStoreServer::~TcpStoreServer() { stop(); }

void TcpStoreServer::start() {
  if (running_.load()) throw invalid_usage("TcpStoreServer::start: already running on port {}", port_);
  if (options_.max_frame_bytes < 64 || options_.max_key_bytes == 0 || options_.max_clients == 0) {
    throw invalid_argument("TcpStoreServer: limits must be positive (max_frame_bytes >= 64)");
  }
  uint64_t nofile = net::raise_open_file_limit();
  spdlog::debug("store: open file limit {}", nofile);
  net::Fd listener = net::listen_tcp(options_.host, options_.port);
  port_ = net::local_port(listener.get());
  int pipefd[2];
  DS_SYSCHECK(::pipe2(pipefd, O_CLOEXEC | O_NONBLOCK), "pipe2");
  net::Fd wake_read(pipefd[0]);
  wake_write_ = net::Fd(pipefd[1]);
  impl_ = std::make_unique<Impl>(options_, std::move(listener), std::move(wake_read));
  running_ = true;
  thread_ = std::thread([this] {
    try {
      impl_->run();
    } catch (const std::exception& e) {
      spdlog::error("store: server thread failed: {}", e.what());
    }
  });
  spdlog::debug("store: listening on {}", net::HostPort{options_.host, port_}.str());
}

void TcpStoreServer::stop() {
  if (!running_.exchange(false)) return;
  char b = 1;
  while (::write(wake_write_.get(), &b, 1) < 0 && errno == EINTR) {
  }
  if (thread_.joinable()) thread_.join();
  impl_->close_all();
  wake_write_.reset();
}

TcpStoreServerStats TcpStoreServer::stats() const {
  TcpStoreServerStats s;
  if (!impl_) return s;
  s.accepted = impl_->accepted;
  s.authenticated = impl_->authenticated;
  s.auth_failures = impl_->auth_failures;
  s.protocol_errors = impl_->protocol_errors;
  s.rejected_clients = impl_->rejected_clients;
  s.requests = impl_->requests;
  s.open_connections = impl_->open_connections;
  return s;
}

}  // namespace ds::store
