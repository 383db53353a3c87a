// Shards as one stream: glob expansion, sorted order, copies across shard boundaries.
#include "data/corpus.h"

#include <glob.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "common/check.h"
#include "common/error.h"

namespace ds::rt::data {

namespace {

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> glob_paths(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  if (rc == GLOB_NOMATCH || (rc == 0 && out.empty())) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("token files {}: the pattern matches no file", pattern),
                "check the path (relative paths resolve against the config file's directory), "
                "or prepare shards with `dstrain data prepare --shard-tokens N`");
  }
  if (rc != 0) throw system_error("token files {}: glob failed (code {})", pattern, rc);
  return out;
}

}  // namespace

std::vector<std::string> expand_sources(const std::vector<std::string>& sources) {
  if (sources.empty()) throw invalid_argument("token files: no file given");
  std::vector<std::string> paths;
  for (const auto& s : sources) {
    if (!has_glob_chars(s)) {
      paths.push_back(s);
      continue;
    }
    auto m = glob_paths(s);
    paths.insert(paths.end(), m.begin(), m.end());
  }
  std::sort(paths.begin(), paths.end());
  for (size_t i = 1; i < paths.size(); ++i) {
    if (paths[i] == paths[i - 1]) {
      throw invalid_argument("token files: {} is named twice (by a path or a glob)", paths[i]);
    }
  }
  return paths;
}

TokenCorpus::TokenCorpus(const std::vector<std::string>& sources, int64_t vocab_size) {
  const auto paths = expand_sources(sources);
  offsets_.push_back(0);
  for (const auto& p : paths) {
    files_.emplace_back(p, vocab_size);
    total_ += files_.back().size();
    offsets_.push_back(total_);
  }
  description_ = paths.size() == 1 ? paths[0]
                                   : fmt::format("{} (+{} more shards: {} .. {})", paths.front(),
                                                 paths.size() - 1, paths.front(), paths.back());
  // Loss masks: all files have one or none.
  size_t with = 0;
  for (const auto& f : files_) with += std::filesystem::exists(mask_path_for(f.path())) ? 1 : 0;
  if (with == 0) return;
  mask_.reserve(static_cast<size_t>(total_));
  for (const auto& f : files_) {
    const std::string mp = mask_path_for(f.path());
    if (!std::filesystem::exists(mp)) {
      throw invalid_argument("token file {}: no loss mask {} beside it, but {} of the corpus's {} files have one",
                             f.path(), mp, with, files_.size());
    }
    const MaskFile m(mp, f.size());
    mask_.insert(mask_.end(), m.mask().begin(), m.mask().end());
  }
}

void TokenCorpus::apply_mask(int64_t start, int64_t count, int32_t* targets) const {
  if (mask_.empty()) return;
  DS_CHECK(start >= 0 && count >= 0 && start + count <= total_, "[{}, +{}) in {} tokens", start, count, total_);
  const uint8_t* m = mask_.data() + start;
  for (int64_t k = 0; k < count; ++k) {
    if (m[k] == 0) targets[k] = -1;
  }
}

int64_t TokenCorpus::counted(int64_t start, int64_t count) const {
  if (mask_.empty()) return count;
  DS_CHECK(start >= 0 && count >= 0 && start + count <= total_, "[{}, +{}) in {} tokens", start, count, total_);
  int64_t n = 0;
  const uint8_t* m = mask_.data() + start;
  for (int64_t k = 0; k < count; ++k) n += m[k];
  return n;
}

void TokenCorpus::copy(int64_t start, int64_t count, int32_t* out) const {
  DS_CHECK(start >= 0 && count >= 0 && start + count <= total_, "[{}, +{}) in {} tokens", start,
           count, total_);
  // The shard holding `start`: the last offset <= start.
  auto it = std::upper_bound(offsets_.begin(), offsets_.end(), start);
  size_t f = static_cast<size_t>(it - offsets_.begin()) - 1;
  while (count > 0) {
    const int64_t local = start - offsets_[f];
    const int64_t n = std::min(count, files_[f].size() - local);
    files_[f].copy(local, n, out);
    out += n;
    start += n;
    count -= n;
    ++f;
  }
}

ShardWriter::ShardWriter(std::string dir, std::string stem, TokenFormat format,
                         int64_t shard_tokens, bool with_masks)
    : dir_(std::move(dir)), stem_(std::move(stem)), format_(format), shard_tokens_(shard_tokens),
      with_masks_(with_masks) {}

ShardWriter::~ShardWriter() = default;

// Finishes the open file (and its mask); without masks, removes a stale mask beside it.
void ShardWriter::finish_current() {
  current_->finish();
  if (current_mask_) {
    current_mask_->finish();
    current_mask_.reset();
  } else {
    std::remove(mask_path_for(current_->path()).c_str());
  }
  done_.emplace_back(current_->path(), current_->count());
  current_.reset();
}

std::string ShardWriter::shard_path(int64_t index) const {
  if (shard_tokens_ <= 0) return fmt::format("{}/{}.bin", dir_, stem_);
  return fmt::format("{}/{}_{:06d}.bin", dir_, stem_, index);
}

void ShardWriter::append(std::span<const uint32_t> tokens, std::span<const uint8_t> mask) {
  DS_CHECK(with_masks_ ? mask.size() == tokens.size() : mask.empty(), "{} mask bytes for {} tokens",
           mask.size(), tokens.size());
  while (!tokens.empty()) {
    if (!current_) {
      current_ = std::make_unique<TokenFileWriter>(shard_path(static_cast<int64_t>(done_.size())),
                                                   format_);
      if (with_masks_) current_mask_ = std::make_unique<MaskFileWriter>(mask_path_for(current_->path()));
    }
    size_t n = tokens.size();
    if (shard_tokens_ > 0) {
      n = std::min<size_t>(n, static_cast<size_t>(shard_tokens_ - current_->count()));
    }
    current_->append(tokens.first(n));
    if (current_mask_) {
      current_mask_->append(mask.first(n));
      mask = mask.subspan(n);
    }
    total_ += static_cast<int64_t>(n);
    tokens = tokens.subspan(n);
    if (shard_tokens_ > 0 && current_->count() == shard_tokens_) finish_current();
  }
}

std::vector<std::pair<std::string, int64_t>> ShardWriter::finish(std::vector<std::string>* removed) {
  if (current_) finish_current();
  if (shard_tokens_ > 0) {
    for (auto i = static_cast<int64_t>(done_.size());; ++i) {
      const std::string stale = shard_path(i);
      if (std::remove(stale.c_str()) != 0) break;
      std::remove(mask_path_for(stale).c_str());
      if (removed != nullptr) removed->push_back(stale);
    }
  }
  return done_;
}

}  // namespace ds::rt::data
