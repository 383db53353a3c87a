// Control connections: the handshake of controller.h on both sides, and the socket channel.
#include "launch/controller.h"

#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/error.h"
#include "store/tcp_store_protocol.h"

namespace ds::launch {

namespace sp = store::proto;

bool SocketChannel::read(int stream, std::string* out) {
  if (stream != 0) return !eof_;
  char buf[16384];
  for (;;) {
    ssize_t n = ::recv(fd_.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      out->append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) {
      eof_ = true;
      return false;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    throw remote_error("{}: connection lost: {}", name_, errno_string(errno));
  }
}

size_t SocketChannel::write(const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n =
        ::send(fd_.get(), data.data() + done, data.size() - done, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    throw remote_error("{}: connection lost: {}", name_, errno_string(errno));
  }
  return done;
}

void SocketChannel::send_eof() {
  ::shutdown(fd_.get(), SHUT_WR);
}

ControlServer::ControlServer(int port) : listener_(net::listen_tcp("0.0.0.0", port)) {
  port_ = net::local_port(listener_.get());
}

std::optional<std::pair<int, std::unique_ptr<AgentChannel>>> ControlServer::accept_one(
    const std::string& token, int num_nodes) {
  sockaddr_storage peer{};
  socklen_t len = sizeof peer;
  int raw = ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&peer), &len,
                      SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (raw < 0) return std::nullopt;  // EAGAIN: someone else's connect gave up
  net::Fd fd(raw);
  net::set_nodelay(fd.get());
  const std::string who = "an agent connecting to the launcher";
  try {
    Deadline deadline = Deadline::after(kControlHandshakeTimeout);
    auto nonce = sp::random_bytes(sp::kNonceBytes);
    net::write_exact(fd.get(), nonce.data(), nonce.size(), deadline, who);
    uint8_t reply[4 + sp::kMacBytes];
    if (!net::read_exact(fd.get(), reply, sizeof reply, deadline, who)) return std::nullopt;
    const uint32_t rank = sp::get_u32le(reply);
    std::vector<uint8_t> mac(reply + 4, reply + sizeof reply);
    const bool ok = sp::mac_equal(mac, sp::auth_mac(token, nonce, kControlContext)) &&
                    rank < static_cast<uint32_t>(num_nodes);
    const uint8_t verdict = ok ? 1 : 0;
    net::write_exact(fd.get(), &verdict, 1, deadline, who);
    if (!ok) {
      spdlog::warn("refused a control connection: {}",
                   rank < static_cast<uint32_t>(num_nodes)
                       ? "wrong job token"
                       : fmt::format("node rank {} outside 0..{}", rank, num_nodes - 1));
      return std::nullopt;
    }
    return std::make_pair(
        static_cast<int>(rank),
        std::make_unique<SocketChannel>(std::move(fd), fmt::format("the agent of node {}", rank)));
  } catch (const Error& e) {
    spdlog::warn("dropped a control connection during its handshake: {}", e.what());
    return std::nullopt;
  }
}

net::Fd dial_controller(const net::HostPort& at, const std::string& token, int node_rank,
                        Deadline deadline) {
  net::ConnectOptions co;
  co.peer_name = "the launcher at " + at.str();
  net::Fd fd = net::connect_tcp(at.host, at.port, deadline, co);
  std::vector<uint8_t> nonce(sp::kNonceBytes);
  if (!net::read_exact(fd.get(), nonce.data(), nonce.size(), deadline, co.peer_name)) {
    throw remote_error("{} closed the connection before its handshake", co.peer_name);
  }
  uint8_t msg[4 + sp::kMacBytes];
  sp::put_u32le(msg, static_cast<uint32_t>(node_rank));
  auto mac = sp::auth_mac(token, nonce, kControlContext);
  std::copy(mac.begin(), mac.end(), msg + 4);
  net::write_exact(fd.get(), msg, sizeof msg, deadline, co.peer_name);
  uint8_t verdict = 0;
  if (!net::read_exact(fd.get(), &verdict, 1, deadline, co.peer_name) || verdict != 1) {
    throw Error(ErrorKind::kRemote,
                fmt::format("{} refused node {}'s control connection", co.peer_name, node_rank),
                "the agent must run with the launcher's DSTRAIN_JOB_TOKEN in its environment "
                "(srun passes it on; mpirun needs -x DSTRAIN_JOB_TOKEN)");
  }
  return fd;
}

}  // namespace ds::launch
