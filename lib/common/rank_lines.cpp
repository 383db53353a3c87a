// The rank-to-launcher lines (rank_lines.h).
#include "common/rank_lines.h"

#include <unistd.h>

#include <charconv>

#include <fmt/format.h>

namespace ds::rank_lines {

namespace {

bool starts_with(std::string_view text, std::string_view prefix) { return text.substr(0, prefix.size()) == prefix; }

void write_line(const std::string& line) {
  const std::string s = line + "\n";
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(2, s.data() + done, s.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace

std::string hung_line(const HungRank& r) { return fmt::format("{}{} {} {}", kHungPrefix, r.world_rank, r.host, r.what); }

std::optional<HungRank> parse_hung_line(std::string_view text) {
  if (!starts_with(text, kHungPrefix)) return std::nullopt;
  text.remove_prefix(kHungPrefix.size());
  HungRank r;
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

std::string step_line(int64_t step) { return fmt::format("{}{}", kStepPrefix, step); }

std::optional<int64_t> parse_step_line(std::string_view text) {
  if (!starts_with(text, kStepPrefix)) return std::nullopt;
  text.remove_prefix(kStepPrefix.size());
  int64_t step = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), step);
  if (ec != std::errc() || end != text.data() + text.size() || step < 0) return std::nullopt;
  return step;
}

bool is_rank_line(std::string_view text) { return starts_with(text, kHungPrefix) || starts_with(text, kStepPrefix); }

void announce_hung(const HungRank& r) { write_line(hung_line(r)); }
void announce_failed_step(int64_t step) { write_line(step_line(step)); }

}  // namespace ds::rank_lines
