// TensorBoard's event file format, encoded by hand (no protobuf library): what TensorBoard's
// `--logdir` reader (and tf.summary / torch's SummaryWriter) read and write.
//
// A file is a sequence of TFRecords:
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data
// (masked: crc32c_masked in common/crc32c.h). Each record's data is one serialized `Event`
// (tensorflow/core/util/event.proto), of which we write these fields:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// The first record is the Event { wall_time, file_version: "brain.Event:2" }; every later one
// carries one step's scalars. Protobuf's wire format: each field is a key varint
// (field_number << 3 | wire_type) then the value: wire type 0 a varint (step), 1 eight bytes
// little-endian (the double), 2 a varint length then the bytes (strings, nested messages),
// 5 four bytes little-endian (the float).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ds::rt::train::tfevents {

inline constexpr const char* kFileVersion = "brain.Event:2";

// The serialized Event with file_version kFileVersion.
std::string file_version_event(double wall_time);
// The serialized Event of one step's scalars (tag, value), in order.
std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& scalars);
// `data` framed as one TFRecord.
std::string tfrecord(std::string_view data);
// "events.out.tfevents.<unix seconds>.<host>.<pid>", TensorBoard's pattern.
std::string event_file_name(int64_t unix_seconds, const std::string& host, int64_t pid);

}  // namespace ds::rt::train::tfevents
