// Writing files so that a crash never leaves a half-written one under the final name: write to
// "<path>.tmp.<pid>", fsync, rename over the final path, fsync the directory.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace ds::rt::ckpt {

// Writes `data` to `path` atomically. Throws ds::Error (system) naming the path on failure.
void write_file_atomic(const std::string& path, std::string_view data);
// The same for a file made of `parts` one after another, written straight from where they lie
// (a checkpoint shard's tensors: no copy of the whole file in memory).
void write_file_atomic(const std::string& path, std::span<const std::string_view> parts);
// Reads a whole file; a missing or unreadable file is an error naming it and `what` it is.
std::string read_file(const std::string& path, const char* what);
// fsync a directory so a rename inside it is durable.
void sync_dir(const std::string& dir);

}  // namespace ds::rt::ckpt
