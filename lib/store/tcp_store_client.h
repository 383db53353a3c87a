// TcpStoreClient: a Store over one authenticated TCP connection to a TcpStoreServer. Workers get
// theirs from connect_from_env() (DSTRAIN_STORE, DSTRAIN_JOB_TOKEN, RANK, WORLD_SIZE).
//
// Deliberately not: reconnecting. A lost connection fails the call (kRemote) and the client stays
// failed; the job's supervision (the agent) handles a dead store.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "common/socket.h"
#include "store/store.h"

namespace ds::store {

struct TcpStoreClientOptions {
  std::string host;
  int port = 0;
  std::string token;  // the job token (DSTRAIN_JOB_TOKEN); never sent, only proven
  Millis connect_timeout{30000};  // connect retries (jittered backoff) + handshake
  Millis timeout{kDefaultStoreTimeout};  // default for get/wait (Store::default_timeout)
  int rank = -1;        // only for messages and the server's log
  int world_size = -1;  // only for messages and the server's log
};

// Construction connects and authenticates (or throws: timeout_error when the server is not
// reachable by connect_timeout; remote_error "store at h:p refused authentication: wrong job
// token" for a bad token). All calls are thread-safe and serialized over the one connection.
// Every call other than get/wait is bounded by the default timeout too (a dead server is a
// timeout, not a hang).
class TcpStoreClient : public Store {
 public:
  explicit TcpStoreClient(TcpStoreClientOptions options);
  ~TcpStoreClient() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, std::optional<Millis> timeout = {}) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, std::optional<Millis> timeout = {}) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  std::string describe() const override;  // "store at host:port"

  const TcpStoreClientOptions& options() const { return options_; }

 private:
  struct Reply;
  void connect_and_authenticate();
  Reply round_trip(const std::vector<uint8_t>& frame, const std::string& what);
  Reply read_reply(Deadline deadline, const std::string& what);
  // kGet / kWait: parks on the server; on deadline sends kCancelWait and reports missing keys.
  Reply blocking_call(const std::vector<uint8_t>& frame, const std::vector<std::string>& keys,
                      std::optional<Millis> timeout, const std::string& what);
  [[noreturn]] void fail(const std::string& what, const std::exception& e);
  std::string who() const;  // " (rank 3 of 4)" or ""

  TcpStoreClientOptions options_;
  std::mutex mu_;
  net::Fd fd_;
  bool broken_ = false;
  std::string broken_reason_;
};

// The worker's store: DSTRAIN_STORE=host:port, DSTRAIN_JOB_TOKEN, RANK and WORLD_SIZE from the
// environment (lib/common/env.h). Throws invalid_usage when DSTRAIN_STORE is unset, with a hint
// to run under `dstrain launch`.
std::shared_ptr<TcpStoreClient> connect_from_env(Millis connect_timeout = Millis(30000));

}  // namespace ds::store
