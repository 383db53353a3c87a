// Scratch files and logging for the fuzz targets (fuzz_support.h).
#include "fuzz_support.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include <spdlog/spdlog.h>

namespace ds::fuzz {

namespace fs = std::filesystem;

namespace {
// Never destroyed: the exit handler that removes the directory runs after static destructors.
const std::string* g_scratch = nullptr;
}  // namespace

const std::string& scratch_dir() {
  if (g_scratch == nullptr) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/dstrain-fuzz-XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) invariant_failed("mkdtemp for the scratch directory");
    g_scratch = new std::string(buf.data());
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(*g_scratch, ec);
    });
  }
  return *g_scratch;
}

std::string write_scratch(const std::string& name, const uint8_t* data, size_t size) {
  std::string path = scratch_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) invariant_failed("writing a scratch file");
  return path;
}

void quiet_logging() { spdlog::set_level(spdlog::level::off); }

std::vector<std::string_view> split_nul(std::string_view in, size_t max_parts) {
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    size_t z = in.find('\0');
    if (z == std::string_view::npos) break;
    parts.push_back(in.substr(0, z));
    in.remove_prefix(z + 1);
  }
  parts.push_back(in);
  return parts;
}

}  // namespace ds::fuzz
