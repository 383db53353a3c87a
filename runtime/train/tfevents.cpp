// TensorBoard event records (tfevents.h): a few protobuf wire-format primitives and the framing.
#include "train/tfevents.h"

#include <cstring>

#include <fmt/format.h>

#include "common/crc32c.h"

namespace ds::rt::train::tfevents {

namespace {

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

template <typename T>
void put_le(std::string& out, T v) {  // the host is little-endian (x86-64, aarch64)
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void put_key(std::string& out, int field, int wire_type) { put_varint(out, static_cast<uint64_t>(field << 3 | wire_type)); }

void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

void put_wall_time(std::string& out, double wall_time) {
  put_key(out, 1, 1);
  put_le(out, wall_time);
}

}  // namespace

std::string file_version_event(double wall_time) {
  std::string e;
  put_wall_time(e, wall_time);
  put_bytes(e, 3, kFileVersion);
  return e;
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);
    put_key(v, 2, 5);
    put_le(v, value);
    put_bytes(summary, 1, v);
  }
  std::string e;
  put_wall_time(e, wall_time);
  put_key(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(step));
  put_bytes(e, 5, summary);
  return e;
}

std::string tfrecord(std::string_view data) {
  std::string r;
  put_le(r, static_cast<uint64_t>(data.size()));
  put_le(r, crc32c_masked(crc32c(r.data(), 8)));
  r.append(data);
  put_le(r, crc32c_masked(crc32c(data)));
  return r;
}

std::string event_file_name(int64_t unix_seconds, const std::string& host, int64_t pid) {
  return fmt::format("events.out.tfevents.{}.{}.{}", unix_seconds, host, pid);
}

}  // namespace ds::rt::train::tfevents
