// libssh2 in two phases: blocking with a timeout for connect, host key check, authentication
// and exec (each node in its own thread, so N nodes take as long as the slowest); then
// non-blocking, driven by the launcher's poll() loop.
#include "launch/ssh.h"

#include <errno.h>
#include <fcntl.h>
#include <libssh2.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/file.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <mutex>

#include <fmt/format.h>

#include "common/error.h"

namespace ds::launch {

std::string shell_quote(const std::string& w) {
  if (!w.empty() && w.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789_-./=:,@+") == std::string::npos) {
    return w;
  }
  std::string out = "'";
  for (char c : w) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out.push_back(c);
    }
  }
  return out + "'";
}

std::string shell_join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) {
    if (!out.empty()) out.push_back(' ');
    out += shell_quote(w);
  }
  return out;
}

namespace {

std::once_flag g_init_once;

std::string home_dir() {
  const char* h = ::getenv("HOME");
  if (h != nullptr && *h != '\0') return h;
  struct passwd* pw = ::getpwuid(::getuid());
  return pw != nullptr && pw->pw_dir != nullptr ? pw->pw_dir : "/";
}

std::string local_user() {
  struct passwd* pw = ::getpwuid(::getuid());
  if (pw != nullptr && pw->pw_name != nullptr) return pw->pw_name;
  const char* u = ::getenv("USER");
  return u != nullptr ? u : "root";
}

std::string last_error(LIBSSH2_SESSION* s) {
  char* msg = nullptr;
  int len = 0;
  libssh2_session_last_error(s, &msg, &len, 0);
  return msg != nullptr ? std::string(msg, static_cast<size_t>(len)) : "unknown libssh2 error";
}

// One TCP connection attempt per resolved address, bounded by the deadline. Refused is reported
// at once (a closed port does not become open by waiting).
int tcp_connect(const std::string& host, int port, Deadline deadline, const std::string& name) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("ssh to {}: cannot resolve host '{}': {}", name, host, gai_strerror(rc)),
                "check the hostfile's host names");
  }
  int last_err = 0;
  bool timed_out = false;
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      last_err = errno;
      continue;
    }
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      ::freeaddrinfo(res);
      return fd;
    }
    if (errno != EINPROGRESS) {
      last_err = errno;
      ::close(fd);
      continue;
    }
    pollfd p{fd, POLLOUT, 0};
    int n;
    do {
      n = ::poll(&p, 1, deadline.remaining_ms());
    } while (n < 0 && errno == EINTR);
    if (n == 0) {
      timed_out = true;
      ::close(fd);
      break;
    }
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err == 0) {
      ::freeaddrinfo(res);
      return fd;
    }
    last_err = err;
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (timed_out) {
    throw Error(ErrorKind::kTimeout, fmt::format("ssh to {}: no answer to the TCP connect", name),
                "is the host up and the port right (--ssh-port)? raise --ssh-timeout for slow links");
  }
  throw Error(ErrorKind::kSystem,
              fmt::format("ssh to {}: cannot connect: {}", name, errno_string(last_err)),
              "is sshd running on that host and port (--ssh-port)?");
}

int knownhost_key_type(int hostkey_type) {
  switch (hostkey_type) {
    case LIBSSH2_HOSTKEY_TYPE_RSA: return LIBSSH2_KNOWNHOST_KEY_SSHRSA;
    case LIBSSH2_HOSTKEY_TYPE_DSS: return LIBSSH2_KNOWNHOST_KEY_SSHDSS;
    case LIBSSH2_HOSTKEY_TYPE_ECDSA_256: return LIBSSH2_KNOWNHOST_KEY_ECDSA_256;
    case LIBSSH2_HOSTKEY_TYPE_ECDSA_384: return LIBSSH2_KNOWNHOST_KEY_ECDSA_384;
    case LIBSSH2_HOSTKEY_TYPE_ECDSA_521: return LIBSSH2_KNOWNHOST_KEY_ECDSA_521;
    case LIBSSH2_HOSTKEY_TYPE_ED25519: return LIBSSH2_KNOWNHOST_KEY_ED25519;
    default: return LIBSSH2_KNOWNHOST_KEY_UNKNOWN;
  }
}

}  // namespace

struct SshConnection::Impl {
  LIBSSH2_SESSION* session = nullptr;
  LIBSSH2_CHANNEL* channel = nullptr;
  ~Impl() {
    if (channel != nullptr) {
      libssh2_session_set_blocking(session, 0);
      libssh2_channel_free(channel);
    }
    if (session != nullptr) {
      libssh2_session_set_blocking(session, 0);
      libssh2_session_disconnect(session, "dstrain: done");
      libssh2_session_free(session);
    }
  }
};

namespace {

// Appends one known-hosts line for `entry`. Several connections of one launch (threads) and
// several launches (processes) may record keys in the same file at once, so the file is never
// rewritten: under an in-process mutex and an flock, one line is appended with O_APPEND.
void record_host_key(LIBSSH2_SESSION* s, const std::string& entry, const char* key, size_t len,
                     int typemask, const std::string& path, const std::string& name) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  LIBSSH2_KNOWNHOSTS* kh = libssh2_knownhost_init(s);
  if (kh == nullptr) throw system_error("ssh to {}: libssh2_knownhost_init failed", name);
  struct Guard {
    LIBSSH2_KNOWNHOSTS* kh;
    ~Guard() { libssh2_knownhost_free(kh); }
  } guard{kh};
  std::string comment = "added by dstrain";
  libssh2_knownhost* added = nullptr;
  char line[8192];
  size_t line_len = 0;
  if (libssh2_knownhost_addc(kh, entry.c_str(), nullptr, key, len, comment.c_str(), comment.size(),
                             typemask, &added) != 0 ||
      libssh2_knownhost_writeline(kh, added, line, sizeof(line), &line_len,
                                  LIBSSH2_KNOWNHOST_FILE_OPENSSH) != 0) {
    throw system_error("ssh to {}: could not format the new host key for {}: {}", name, path,
                       last_error(s));
  }
  std::error_code ec;
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty() && !std::filesystem::exists(parent, ec)) {
    std::filesystem::create_directories(parent, ec);
    if (!ec) std::filesystem::permissions(parent, std::filesystem::perms::owner_all, ec);
  }
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw system_error("ssh to {}: could not record the new host key in {}: {}", name, path,
                       strerror(errno));
  }
  ::flock(fd, LOCK_EX);
  bool ok = ::write(fd, line, line_len) == static_cast<ssize_t>(line_len);
  int saved = errno;
  ::close(fd);
  if (!ok) {
    throw system_error("ssh to {}: could not record the new host key in {}: {}", name, path,
                       strerror(saved));
  }
}

void check_host_key(LIBSSH2_SESSION* s, const std::string& host, const SshOptions& o,
                    const std::string& name) {
  size_t len = 0;
  int type = 0;
  const char* key = libssh2_session_hostkey(s, &len, &type);
  if (key == nullptr) throw remote_error("ssh to {}: the server sent no host key", name);
  std::string path = o.known_hosts.empty() ? home_dir() + "/.ssh/known_hosts" : o.known_hosts;
  LIBSSH2_KNOWNHOSTS* kh = libssh2_knownhost_init(s);
  if (kh == nullptr) throw system_error("ssh to {}: libssh2_knownhost_init failed", name);
  struct Guard {
    LIBSSH2_KNOWNHOSTS* kh;
    ~Guard() { libssh2_knownhost_free(kh); }
  } guard{kh};
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) {
    if (libssh2_knownhost_readfile(kh, path.c_str(), LIBSSH2_KNOWNHOST_FILE_OPENSSH) < 0) {
      throw invalid_argument("ssh to {}: cannot read known hosts file {}: {}", name, path,
                             last_error(s));
    }
  }
  int typemask = LIBSSH2_KNOWNHOST_TYPE_PLAIN | LIBSSH2_KNOWNHOST_KEYENC_RAW |
                 knownhost_key_type(type);
  libssh2_knownhost* found = nullptr;
  int rc = libssh2_knownhost_checkp(kh, host.c_str(), o.port, key, len, typemask, &found);
  std::string entry = o.port == 22 ? host : fmt::format("[{}]:{}", host, o.port);
  if (rc == LIBSSH2_KNOWNHOST_CHECK_MATCH) return;
  if (rc == LIBSSH2_KNOWNHOST_CHECK_MISMATCH) {
    throw Error(ErrorKind::kRemote,
                fmt::format("ssh to {}: the host key of {} does not match the one in {} "
                            "(the key changed: possibly a reinstalled host, possibly an attack)",
                            name, entry, path),
                fmt::format("if the change is expected, remove the old entry: ssh-keygen -R '{}' -f {}",
                            entry, path));
  }
  if (rc != LIBSSH2_KNOWNHOST_CHECK_NOTFOUND) {
    throw remote_error("ssh to {}: could not check the host key: {}", name, last_error(s));
  }
  if (!o.accept_new_host_keys) {
    throw Error(ErrorKind::kRemote,
                fmt::format("ssh to {}: host {} is not in {} (unknown host key)", name, entry, path),
                "add it (ssh-keyscan -p PORT HOST >> known_hosts, after checking the fingerprint), "
                "or pass --ssh-accept-new-host-keys to trust and record it on first use");
  }
  record_host_key(s, entry, key, len, typemask, path, name);
}

void authenticate(LIBSSH2_SESSION* s, const SshOptions& o, const std::string& user,
                  const std::string& name) {
  std::vector<std::string> tried;
  const char* methods = libssh2_userauth_list(s, user.c_str(), static_cast<unsigned>(user.size()));
  if (methods == nullptr) {
    if (libssh2_userauth_authenticated(s)) return;
    throw remote_error("ssh to {}: the server refused to list authentication methods: {}", name,
                       last_error(s));
  }
  if (std::string(methods).find("publickey") == std::string::npos) {
    throw Error(ErrorKind::kRemote,
                fmt::format("ssh to {}: the server does not accept public keys (it offers: {})",
                            name, methods),
                "enable PubkeyAuthentication in that host's sshd_config");
  }
  std::vector<std::string> keys = o.keys;
  if (keys.empty()) {
    const char* sock = ::getenv("SSH_AUTH_SOCK");
    if (sock != nullptr && *sock != '\0') {
      tried.push_back("ssh-agent");
      LIBSSH2_AGENT* agent = libssh2_agent_init(s);
      if (agent != nullptr && libssh2_agent_connect(agent) == 0 &&
          libssh2_agent_list_identities(agent) == 0) {
        libssh2_agent_publickey* id = nullptr;
        libssh2_agent_publickey* prev = nullptr;
        while (libssh2_agent_get_identity(agent, &id, prev) == 0) {
          if (libssh2_agent_userauth(agent, user.c_str(), id) == 0) {
            libssh2_agent_disconnect(agent);
            libssh2_agent_free(agent);
            return;
          }
          prev = id;
        }
      }
      if (agent != nullptr) {
        libssh2_agent_disconnect(agent);
        libssh2_agent_free(agent);
      }
    }
    for (const char* k : {"id_ed25519", "id_ecdsa", "id_rsa"}) {
      std::string p = home_dir() + "/.ssh/" + k;
      std::error_code ec;
      if (std::filesystem::exists(p, ec)) keys.push_back(p);
    }
  }
  for (const auto& k : keys) {
    std::error_code ec;
    if (!std::filesystem::exists(k, ec)) {
      throw invalid_argument("ssh to {}: key file {} does not exist (--ssh-key)", name, k);
    }
    tried.push_back(k);
    std::string pub = k + ".pub";
    bool has_pub = std::filesystem::exists(pub, ec);
    int rc = libssh2_userauth_publickey_fromfile_ex(s, user.c_str(),
                                                    static_cast<unsigned>(user.size()),
                                                    has_pub ? pub.c_str() : nullptr, k.c_str(), nullptr);
    if (rc == 0) return;
    if (rc == LIBSSH2_ERROR_TIMEOUT) throw timeout_error("ssh to {}: authentication timed out", name);
  }
  std::string list;
  for (const auto& t : tried) list += (list.empty() ? "" : ", ") + t;
  throw Error(ErrorKind::kRemote,
              fmt::format("ssh to {}: public key authentication failed (tried: {})", name,
                          list.empty() ? "no keys found" : list),
              "pass the right key with --ssh-key, load it into ssh-agent, check --ssh-user, and "
              "that the public key is in the remote ~/.ssh/authorized_keys");
}

}  // namespace

std::unique_ptr<SshConnection> SshConnection::open(const std::string& host,
                                                   const SshOptions& o,
                                                   const std::string& command) {
  std::call_once(g_init_once, [] { libssh2_init(0); });
  std::string user = o.user.empty() ? local_user() : o.user;
  std::unique_ptr<SshConnection> c(new SshConnection());
  c->name_ = fmt::format("{}@{}:{}", user, host, o.port);
  c->impl_ = std::make_unique<Impl>();
  Deadline deadline = Deadline::after(o.connect_timeout);
  c->sock_ = tcp_connect(host, o.port, deadline, c->name_);
  int one = 1;
  ::setsockopt(c->sock_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // libssh2 works on a blocking socket in blocking mode; its own timeout bounds every call.
  ::fcntl(c->sock_, F_SETFL, ::fcntl(c->sock_, F_GETFL) & ~O_NONBLOCK);

  LIBSSH2_SESSION* s = libssh2_session_init();
  if (s == nullptr) throw system_error("ssh to {}: libssh2_session_init failed", c->name_);
  c->impl_->session = s;
  libssh2_session_set_blocking(s, 1);
  auto timed = [&](const char* step) {
    int left = deadline.remaining_ms();
    if (left <= 0) {
      throw Error(ErrorKind::kTimeout,
                  fmt::format("ssh to {}: timed out after {} ms during {}", c->name_,
                              o.connect_timeout.count(), step),
                  "is it an SSH server on that port? raise --ssh-timeout for slow links");
    }
    libssh2_session_set_timeout(s, left);
  };
  auto fail_step = [&](const char* step, int rc) -> Error {
    if (rc == LIBSSH2_ERROR_TIMEOUT) {
      return Error(ErrorKind::kTimeout,
                   fmt::format("ssh to {}: timed out after {} ms during {}", c->name_,
                               o.connect_timeout.count(), step),
                   "is it an SSH server on that port? raise --ssh-timeout for slow links");
    }
    return remote_error("ssh to {}: {} failed: {}", c->name_, step, last_error(s));
  };

  timed("the SSH handshake");
  int rc = libssh2_session_handshake(s, c->sock_);
  if (rc != 0) throw fail_step("the SSH handshake", rc);
  check_host_key(s, host, o, c->name_);
  timed("authentication");
  authenticate(s, o, user, c->name_);
  timed("opening a channel");
  LIBSSH2_CHANNEL* ch = libssh2_channel_open_session(s);
  if (ch == nullptr) throw fail_step("opening a session channel", libssh2_session_last_errno(s));
  c->impl_->channel = ch;
  timed("starting the remote command");
  rc = libssh2_channel_exec(ch, command.c_str());
  if (rc != 0) throw fail_step("starting the remote command", rc);
  libssh2_session_set_blocking(s, 0);
  return c;
}

SshConnection::~SshConnection() {
  impl_.reset();
  if (sock_ >= 0) ::close(sock_);
}

bool SshConnection::wants_read() const {
  return (libssh2_session_block_directions(impl_->session) & LIBSSH2_SESSION_BLOCK_INBOUND) != 0;
}
bool SshConnection::wants_write() const {
  return (libssh2_session_block_directions(impl_->session) & LIBSSH2_SESSION_BLOCK_OUTBOUND) != 0;
}

bool SshConnection::read(int stream, std::string* out) {
  char buf[16384];
  for (;;) {
    ssize_t n = libssh2_channel_read_ex(impl_->channel, stream, buf, sizeof buf);
    if (n > 0) {
      out->append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == LIBSSH2_ERROR_EAGAIN) return true;
    if (n == 0) return !libssh2_channel_eof(impl_->channel);
    throw remote_error("ssh to {}: connection lost: {}", name_, last_error(impl_->session));
  }
}

size_t SshConnection::write(const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = libssh2_channel_write_ex(impl_->channel, 0, data.data() + done, data.size() - done);
    if (n == LIBSSH2_ERROR_EAGAIN) break;
    if (n < 0) throw remote_error("ssh to {}: connection lost: {}", name_, last_error(impl_->session));
    done += static_cast<size_t>(n);
  }
  return done;
}

void SshConnection::send_eof() { libssh2_channel_send_eof(impl_->channel); }

bool SshConnection::eof() const { return libssh2_channel_eof(impl_->channel) != 0; }

int SshConnection::exit_status() {
  char* sig = nullptr;
  size_t siglen = 0;
  libssh2_channel_get_exit_signal(impl_->channel, &sig, &siglen, nullptr, nullptr, nullptr, nullptr);
  if (sig != nullptr) {
    std::string name(sig, siglen);
    libssh2_free(impl_->session, sig);
    for (int s = 1; s < 65; ++s) {
      const char* abbrev = sigabbrev_np(s);
      if (abbrev != nullptr && name == abbrev) return 128 + s;
    }
    return 128 + SIGTERM;
  }
  return libssh2_channel_get_exit_status(impl_->channel);
}

}  // namespace ds::launch
