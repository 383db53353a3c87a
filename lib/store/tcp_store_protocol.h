// The TCP store's wire format, written down once (after c10d's TCPStore). Both TcpStoreServer
// and TcpStoreClient encode and decode through this header and nothing else.
//
// Deliberately not: versioned negotiation or encryption. A server and client of different
// protocol versions refuse each other with a clear message; traffic is authenticated, not secret.
//
// ## Frames
// Every message, both directions, is one frame:
//     u32 length      bytes after this field (1 .. max_frame_bytes); little-endian
//     u8  type        a Request or Reply value below
//     ... fields      in the order listed for the type
// Field encodings (all integers little-endian):
//     u8, u16, u32, i64   fixed width
//     bytes / string      u32 byte count, then the bytes (strings are not NUL-terminated)
//     keys                u32 count, then `count` strings
// A frame whose fields do not exactly fill its length is malformed.
//
// ## Handshake (authentication by challenge-response; the token never crosses the wire)
// 1. server -> client  kHello:    u32 magic (kMagic), u16 version, bytes nonce (kNonceBytes random)
// 2. client -> server  kAuth:     u32 magic, u16 version, bytes mac, i64 rank, i64 world_size
//      mac = HMAC-SHA256(key = job token, message = kAuthContext || nonce), kMacBytes long.
//      rank/world_size only label the client in the server's logs (-1 when unknown).
// 3. server -> client  kAuthOk, or kError (code kAuthFailed / kVersionMismatch) and then the
//    server closes the connection. Any other frame before kAuthOk is a protocol error.
// A server at its connection limit sends kError(kTooManyClients) instead of kHello and closes.
//
// ## Requests (client -> server) and their replies (server -> client)
//     kSet(string key, bytes value)                  -> kOk
//     kGet(string key)                               -> kValue(bytes)   when the key exists
//     kAdd(string key, i64 delta)                    -> kInt(i64 new value)
//     kCompareSet(string key, bytes exp, bytes des)  -> kValue(bytes)   see Store::compare_set
//     kWait(keys)                                    -> kOk             when all keys exist
//     kCheck(keys)                                   -> kBool(u8 0|1)
//     kDelete(string key)                            -> kBool(u8 existed)
//     kNumKeys()                                     -> kInt(i64)
//     kCancelWait()                                  -> kCanceled(keys still missing)
// kGet and kWait block on the server: it parks the connection as a waiter and replies when the
// keys appear, never polling. One request is outstanding per connection; the only request
// allowed while a kGet/kWait is parked is kCancelWait, which the client sends when its deadline
// passes. The server answers kCancelWait with kCanceled (listing the keys that were still
// missing; empty when the wait had already been answered, in which case that kValue/kOk reply
// comes first). Any other request while parked is a protocol error.
//
// ## Errors
// kError(u8 code, string message). Codes kInvalidRequest (e.g. kAdd on a non-integer value,
// a key over max_key_bytes, the store at max_keys) leave the connection open. Protocol errors
// (an unknown type, a malformed frame, a frame over max_frame_bytes, a request during a parked
// wait) get kError(kProtocol) when the socket allows and then the server closes that connection,
// and only that one. A connection that half-sends a frame and goes quiet is closed after the
// server's frame timeout; one that never finishes the handshake, after its handshake timeout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ds::store::proto {

inline constexpr uint32_t kMagic = 0x53545344;  // "DSTS" as little-endian bytes
inline constexpr uint16_t kVersion = 1;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;  // SHA-256
inline constexpr std::string_view kAuthContext = "dstrain-store-auth-v1:";
inline constexpr size_t kLengthBytes = 4;

// Defaults of TcpStoreServerOptions.
inline constexpr size_t kDefaultMaxFrameBytes = 16u << 20;  // 16 MiB
inline constexpr size_t kDefaultMaxKeyBytes = 4096;
inline constexpr size_t kDefaultMaxKeys = 1u << 20;
inline constexpr size_t kDefaultMaxClients = 65536;
// The client's own bound on a reply (it cannot know the server's setting before the handshake).
inline constexpr size_t kClientMaxFrameBytes = 1u << 30;

enum class Type : uint8_t {
  // handshake
  kHello = 1,
  kAuth = 2,
  kAuthOk = 3,
  // requests
  kSet = 10,
  kGet = 11,
  kAdd = 12,
  kCompareSet = 13,
  kWait = 14,
  kCheck = 15,
  kDelete = 16,
  kNumKeys = 17,
  kCancelWait = 18,
  // replies
  kOk = 40,
  kValue = 41,
  kInt = 42,
  kBool = 43,
  kCanceled = 44,
  kError = 45,
};
const char* type_name(Type t);  // "set", "get", ... ("unknown" for others)
bool is_request(uint8_t t);

enum class ErrorCode : uint8_t {
  kProtocol = 1,         // malformed / oversized / unexpected frame: connection closed
  kAuthFailed = 2,       // wrong job token: connection closed
  kVersionMismatch = 3,  // other magic or version: connection closed
  kTooManyClients = 4,   // server at max_clients: connection closed
  kInvalidRequest = 5,   // well-formed but refused (bad key, non-integer add, max_keys): stays open
};

// Builds one frame: the length prefix is filled in by finish().
class Writer {
 public:
  explicit Writer(Type type);
  Writer& u8(uint8_t v);
  Writer& u16(uint16_t v);
  Writer& u32(uint32_t v);
  Writer& i64(int64_t v);
  Writer& bytes(const void* data, size_t n);
  Writer& bytes(const std::vector<uint8_t>& b) { return bytes(b.data(), b.size()); }
  Writer& str(std::string_view s) { return bytes(s.data(), s.size()); }
  Writer& keys(const std::vector<std::string>& ks);
  // The whole frame, length prefix included.
  std::vector<uint8_t> finish();

 private:
  std::vector<uint8_t> buf_;
};

// Reads the fields of one frame body (the bytes after the length prefix). Every getter returns
// nullopt when the body is too short; done() is true when the body was consumed exactly.
class Reader {
 public:
  Reader(const uint8_t* data, size_t n) : p_(data), end_(data + n) {}
  std::optional<uint8_t> u8();
  std::optional<uint16_t> u16();
  std::optional<uint32_t> u32();
  std::optional<int64_t> i64();
  std::optional<std::vector<uint8_t>> bytes();
  std::optional<std::string> str();
  // At most `max_count` keys (a cheap bound against absurd counts before allocation).
  std::optional<std::vector<std::string>> keys(size_t max_count);
  bool done() const { return p_ == end_; }
  size_t left() const { return static_cast<size_t>(end_ - p_); }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

void put_u32le(uint8_t* p, uint32_t v);
uint32_t get_u32le(const uint8_t* p);

// HMAC-SHA256(token, context || nonce) through OpenSSL's libcrypto. The store uses
// kAuthContext; other handshakes with the job token (the launcher's control connections) use
// their own context, so a MAC made for one can never be replayed to the other.
std::vector<uint8_t> auth_mac(std::string_view token, const std::vector<uint8_t>& nonce,
                              std::string_view context = kAuthContext);
// Constant-time comparison of two MACs.
bool mac_equal(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b);
// Cryptographically random bytes (the kernel's getrandom); throws system_error on failure.
std::vector<uint8_t> random_bytes(size_t n);

}  // namespace ds::store::proto
