// Encoding helpers and the HMAC of the handshake; the format itself is documented in the header.
#include "store/tcp_store_protocol.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "common/check.h"
#include "common/error.h"

namespace ds::store::proto {

const char* type_name(Type t) {
  switch (t) {
    case Type::kHello: return "hello";
    case Type::kAuth: return "auth";
    case Type::kAuthOk: return "auth-ok";
    case Type::kSet: return "set";
    case Type::kGet: return "get";
    case Type::kAdd: return "add";
    case Type::kCompareSet: return "compare_set";
    case Type::kWait: return "wait";
    case Type::kCheck: return "check";
    case Type::kDelete: return "delete";
    case Type::kNumKeys: return "num_keys";
    case Type::kCancelWait: return "cancel-wait";
    case Type::kOk: return "ok";
    case Type::kValue: return "value";
    case Type::kInt: return "int";
    case Type::kBool: return "bool";
    case Type::kCanceled: return "canceled";
    case Type::kError: return "error";
  }
  return "unknown";
}

bool is_request(uint8_t t) {
  return t >= static_cast<uint8_t>(Type::kSet) && t <= static_cast<uint8_t>(Type::kCancelWait);
}

void put_u32le(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

uint32_t get_u32le(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

Writer::Writer(Type type) {
  buf_.resize(kLengthBytes);
  buf_.push_back(static_cast<uint8_t>(type));
}

Writer& Writer::u8(uint8_t v) {
  buf_.push_back(v);
  return *this;
}

Writer& Writer::u16(uint16_t v) {
  buf_.push_back(static_cast<uint8_t>(v));
  buf_.push_back(static_cast<uint8_t>(v >> 8));
  return *this;
}

Writer& Writer::u32(uint32_t v) {
  size_t at = buf_.size();
  buf_.resize(at + 4);
  put_u32le(buf_.data() + at, v);
  return *this;
}

Writer& Writer::i64(int64_t v) {
  auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) buf_.push_back(static_cast<uint8_t>(u >> (8 * i)));
  return *this;
}

Writer& Writer::bytes(const void* data, size_t n) {
  if (n > UINT32_MAX) throw invalid_argument("store value of {} bytes is too large to send", n);
  u32(static_cast<uint32_t>(n));
  const auto* p = static_cast<const uint8_t*>(data);
  buf_.insert(buf_.end(), p, p + n);
  return *this;
}

Writer& Writer::keys(const std::vector<std::string>& ks) {
  u32(static_cast<uint32_t>(ks.size()));
  for (const auto& k : ks) str(k);
  return *this;
}

std::vector<uint8_t> Writer::finish() {
  size_t body = buf_.size() - kLengthBytes;
  if (body > UINT32_MAX) throw invalid_argument("store message of {} bytes is too large", body);
  put_u32le(buf_.data(), static_cast<uint32_t>(body));
  return std::move(buf_);
}

std::optional<uint8_t> Reader::u8() {
  if (left() < 1) return std::nullopt;
  return *p_++;
}

std::optional<uint16_t> Reader::u16() {
  if (left() < 2) return std::nullopt;
  uint16_t v = static_cast<uint16_t>(p_[0] | (p_[1] << 8));
  p_ += 2;
  return v;
}

std::optional<uint32_t> Reader::u32() {
  if (left() < 4) return std::nullopt;
  uint32_t v = get_u32le(p_);
  p_ += 4;
  return v;
}

std::optional<int64_t> Reader::i64() {
  if (left() < 8) return std::nullopt;
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p_[i]) << (8 * i);
  p_ += 8;
  return static_cast<int64_t>(v);
}

std::optional<std::vector<uint8_t>> Reader::bytes() {
  auto n = u32();
  if (!n || left() < *n) return std::nullopt;
  std::vector<uint8_t> out(p_, p_ + *n);
  p_ += *n;
  return out;
}

std::optional<std::string> Reader::str() {
  auto n = u32();
  if (!n || left() < *n) return std::nullopt;
  std::string out(reinterpret_cast<const char*>(p_), *n);
  p_ += *n;
  return out;
}

std::optional<std::vector<std::string>> Reader::keys(size_t max_count) {
  auto n = u32();
  // Each key takes at least its 4-byte length: a count the body cannot hold is malformed.
  if (!n || *n > max_count || static_cast<size_t>(*n) > left() / 4) return std::nullopt;
  std::vector<std::string> out;
  out.reserve(*n);
  for (uint32_t i = 0; i < *n; ++i) {
    auto k = str();
    if (!k) return std::nullopt;
    out.push_back(std::move(*k));
  }
  return out;
}

std::vector<uint8_t> auth_mac(std::string_view token, const std::vector<uint8_t>& nonce,
                              std::string_view context) {
  std::vector<uint8_t> msg(context.begin(), context.end());
  msg.insert(msg.end(), nonce.begin(), nonce.end());
  std::vector<uint8_t> mac(EVP_MAX_MD_SIZE);
  unsigned int len = 0;
  // An empty key is valid for HMAC; OpenSSL wants a non-null pointer even then.
  static const char kEmpty = 0;
  const void* key = token.empty() ? static_cast<const void*>(&kEmpty) : token.data();
  if (!HMAC(EVP_sha256(), key, static_cast<int>(token.size()), msg.data(), msg.size(), mac.data(),
            &len)) {
    throw system_error("HMAC-SHA256 failed in OpenSSL");
  }
  DS_CHECK(len == kMacBytes, "HMAC-SHA256 gave {} bytes", len);
  mac.resize(len);
  return mac;
}

bool mac_equal(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::vector<uint8_t> random_bytes(size_t n) {
  // The kernel's CSPRNG: no library locks, so a process hosting the server can fork safely.
  std::vector<uint8_t> out(n);
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::getrandom(out.data() + done, n - done, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw system_error("getrandom({} bytes): {}", n, errno_string(errno));
    done += static_cast<size_t>(r);
  }
  return out;
}

}  // namespace ds::store::proto
