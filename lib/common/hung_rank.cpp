// The hung-rank line (hung_rank.h).
#include "common/hung_rank.h"

#include <unistd.h>

#include <charconv>

#include <fmt/format.h>

namespace ds::hung {

std::string line(const Report& r) { return fmt::format("{}{} {} {}", kLinePrefix, r.world_rank, r.host, r.what); }

std::optional<Report> parse_line(std::string_view text) {
  if (text.substr(0, kLinePrefix.size()) != kLinePrefix) return std::nullopt;
  text.remove_prefix(kLinePrefix.size());
  Report r;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), r.world_rank);
  if (ec != std::errc() || r.world_rank < 0) return std::nullopt;
  text.remove_prefix(static_cast<size_t>(end - text.data()));
  if (text.empty() || text.front() != ' ') return std::nullopt;
  text.remove_prefix(1);
  const size_t sp = text.find(' ');
  if (sp == 0 || sp == std::string_view::npos) return std::nullopt;
  r.host = std::string(text.substr(0, sp));
  r.what = std::string(text.substr(sp + 1));
  return r;
}

void announce(const Report& r) {
  const std::string s = line(r) + "\n";
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(2, s.data() + done, s.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace ds::hung
