#include "launch/output.h"

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"

namespace ds::launch {

void LineSplitter::feed(std::string_view bytes, const Sink& sink) {
  while (!bytes.empty()) {
    auto nl = bytes.find('\n');
    if (nl == std::string_view::npos) {
      partial_.append(bytes);
      while (partial_.size() >= kMaxLine) {
        sink(std::string_view(partial_).substr(0, kMaxLine));
        partial_.erase(0, kMaxLine);
      }
      return;
    }
    if (partial_.empty()) {
      sink(bytes.substr(0, nl));
    } else {
      partial_.append(bytes.substr(0, nl));
      sink(partial_);
      partial_.clear();
    }
    bytes.remove_prefix(nl + 1);
  }
}

void LineSplitter::finish(const Sink& sink) {
  if (!partial_.empty()) sink(partial_);
  partial_.clear();
}

std::set<int> parse_rank_set(std::string_view text, int world_size, std::string_view what) {
  std::set<int> out;
  auto check = [&](int64_t r, std::string_view tok) {
    if (r < 0 || r >= world_size) {
      throw invalid_argument("{}: rank {} in '{}' is outside 0..{} (the job has {} rank(s))", what,
                             r, tok, world_size - 1, world_size);
    }
  };
  for (const auto& raw : split(text, ',')) {
    std::string_view tok = trim(raw);
    if (tok.empty()) throw invalid_argument("{}: empty entry in '{}' (expected e.g. 0,2,4-7)", what, text);
    auto dash = tok.find('-');
    if (dash == std::string_view::npos) {
      auto r = parse_int(tok);
      if (!r) throw invalid_argument("{}: '{}' is not a rank (expected e.g. 0,2,4-7)", what, tok);
      check(*r, tok);
      out.insert(static_cast<int>(*r));
    } else {
      auto a = parse_int(trim(tok.substr(0, dash)));
      auto b = parse_int(trim(tok.substr(dash + 1)));
      if (!a || !b || *a > *b) {
        throw invalid_argument("{}: '{}' is not a rank range (expected LOW-HIGH, e.g. 4-7)", what,
                               tok);
      }
      check(*a, tok);
      check(*b, tok);
      for (int64_t r = *a; r <= *b; ++r) out.insert(static_cast<int>(r));
    }
  }
  return out;
}

OutputMux::OutputMux(OutputOptions options, int out_fd, int err_fd)
    : options_(std::move(options)), out_fd_(out_fd), err_fd_(err_fd) {
  if (!options_.log_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options_.log_dir, ec);
    if (ec) throw system_error("--log-dir {}: cannot create it: {}", options_.log_dir, ec.message());
  }
}

OutputMux::~OutputMux() = default;

void OutputMux::write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = ::write(fd, s.data(), s.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // console gone (EPIPE): keep supervising, the log files still get the lines
    }
    s.remove_prefix(static_cast<size_t>(n));
  }
}

std::ofstream& OutputMux::log_for(int rank) {
  auto& slot = logs_[rank];
  if (!slot) {
    auto path = std::filesystem::path(options_.log_dir) / fmt::format("rank_{}.log", rank);
    slot = std::make_unique<std::ofstream>(path, std::ios::app);
    if (!*slot) throw system_error("--log-dir: cannot open {}", path.string());
  }
  return *slot;
}

void OutputMux::line(int rank, int stream, std::string_view text) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!options_.log_dir.empty()) {
    auto& f = log_for(rank);
    f << text << '\n';
    f.flush();
  }
  if (stream == 2 && rank_lines::is_rank_line(text)) {
    if (!hung_) hung_ = rank_lines::parse_hung_line(text);
    if (const auto step = rank_lines::parse_step_line(text)) {
      failed_at_step_ = std::max(failed_at_step_.value_or(*step), *step);
    }
    return;
  }
  if (options_.console_ranks && options_.console_ranks->count(rank) == 0) return;
  std::string buf;
  buf.reserve(text.size() + 16);
  if (options_.prefix) buf += fmt::format("[rank {}] ", rank);
  buf.append(text);
  buf.push_back('\n');
  write_all(stream == 2 ? err_fd_ : out_fd_, buf);
}

void OutputMux::note(std::string_view text) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string buf(text);
  buf.push_back('\n');
  write_all(err_fd_, buf);
}

std::optional<rank_lines::HungRank> OutputMux::hung_rank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hung_;
}

std::optional<int64_t> OutputMux::failed_at_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_at_step_;
}

void OutputMux::restart_marker(int restart_count) {
  std::lock_guard<std::mutex> lock(mu_);
  hung_.reset();
  failed_at_step_.reset();
  for (auto& [rank, f] : logs_) {
    *f << fmt::format("----- dstrain: restart {} -----\n", restart_count);
    f->flush();
  }
}

}  // namespace ds::launch
