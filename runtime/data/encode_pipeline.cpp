// The streaming, parallel encoder of encode_pipeline.h: rounds of read, cut, encode, emit.
#include "data/encode_pipeline.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <thread>

#include "common/error.h"

namespace ds::rt::data {

namespace {

struct Chunk {
  size_t begin, end;
  int part;
};

int64_t file_size(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw invalid_argument("data: input {}: {}", path, errno_string(errno));
  }
  if (!S_ISREG(st.st_mode)) throw invalid_argument("data: input {}: not a regular file", path);
  return st.st_size;
}

// Threads that live for a whole encode_files call, so that each keeps its tokenizer caches
// (GPT-2's per-thread piece cache) warm across rounds. run() encodes chunks[i] of `text` into
// out[i] on the pool and the calling thread, and rethrows the first error.
class EncodePool {
 public:
  EncodePool(const Tokenizer& tok, int threads) : tok_(tok) {
    for (int t = 1; t < threads; ++t) workers_.emplace_back([this] { loop(); });
  }
  ~EncodePool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }

  void run(std::string_view text, const std::vector<Chunk>& chunks,
           std::vector<std::vector<uint32_t>>& out) {
    out.resize(chunks.size());
    for (auto& o : out) o.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      text_ = text, chunks_ = &chunks, out_ = &out;
      next_ = 0, busy_ = static_cast<int>(workers_.size()), error_ = nullptr;
      ++round_;
    }
    cv_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return busy_ == 0; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void work() {
    for (size_t i; (i = next_.fetch_add(1)) < chunks_->size();) {
      try {
        const Chunk& c = (*chunks_)[i];
        tok_.encode(text_.substr(c.begin, c.end - c.begin), (*out_)[i]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
        next_ = chunks_->size();
      }
    }
  }
  void loop() {
    for (uint64_t seen = 0;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || round_ != seen; });
        if (stop_) return;
        seen = round_;
      }
      work();
      std::lock_guard<std::mutex> lock(mu_);
      if (--busy_ == 0) done_.notify_one();
    }
  }

  const Tokenizer& tok_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_;
  uint64_t round_ = 0;
  bool stop_ = false;
  int busy_ = 0;
  std::atomic<size_t> next_{0};
  std::string_view text_;
  const std::vector<Chunk>* chunks_ = nullptr;
  std::vector<std::vector<uint32_t>>* out_ = nullptr;
  std::exception_ptr error_;
};

// The state of one pass over the inputs.
class Encoder {
 public:
  Encoder(const Tokenizer& tok, const EncodeOptions& o, const TokenSink& sink,
          const ProgressFn& progress)
      : tok_(tok), o_(o), sink_(sink), progress_(progress), pool_(tok, o.threads) {}

  EncodeProgress run(const std::vector<std::string>& files);

 private:
  void encode_file(const std::string& path);
  // Cuts text[0, n) into chunks; returns where the uncut rest starts.
  size_t cut_round(std::string_view text, bool eof, std::vector<Chunk>& chunks);

  const Tokenizer& tok_;
  const EncodeOptions& o_;
  const TokenSink& sink_;
  const ProgressFn& progress_;
  EncodeProgress p_;
  int64_t split_local_ = -1;  // the split byte relative to the round's text, while part_ == 0
  int part_ = 0;
  std::vector<std::vector<uint32_t>> results_;
  EncodePool pool_;
};

size_t Encoder::cut_round(std::string_view text, bool eof, std::vector<Chunk>& chunks) {
  size_t pos = 0;
  const size_t n = text.size();
  while (pos < n) {
    size_t target = pos + o_.chunk_bytes;
    bool split_here = false;
    if (part_ == 0 && split_local_ >= 0) {
      if (split_local_ <= static_cast<int64_t>(pos)) {
        part_ = 1;
      } else if (split_local_ < static_cast<int64_t>(target)) {
        target = static_cast<size_t>(split_local_);
        split_here = true;
      }
    }
    size_t cut = target >= n ? std::string_view::npos : tok_.cut_point(text, target);
    if (cut == std::string_view::npos) {
      if (!eof) break;
      cut = n;
    }
    chunks.push_back({pos, cut, part_});
    if (split_here && static_cast<int64_t>(cut) >= split_local_) part_ = 1;
    pos = cut;
  }
  return pos;
}

void Encoder::encode_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) throw system_error("data: input {}: cannot open: {}", path, errno_string(errno));
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{f};
  const size_t read_bytes =
      o_.read_bytes > 0 ? o_.read_bytes : 4 * static_cast<size_t>(o_.threads) * o_.chunk_bytes;
  const int64_t split_at = o_.split_byte < 0 ? -1 : o_.split_byte - p_.bytes_done;
  int64_t buffer_start = 0;  // file offset of text[0]
  std::string text;
  std::vector<Chunk> chunks;
  for (bool eof = false; !eof || !text.empty();) {
    const size_t have = text.size();
    text.resize(have + read_bytes);
    const size_t got = std::fread(text.data() + have, 1, read_bytes, f);
    if (got < read_bytes && std::ferror(f)) {
      throw system_error("data: input {}: read failed: {}", path, errno_string(errno));
    }
    text.resize(have + got);
    eof = got < read_bytes;
    if (part_ == 0 && split_at >= 0) split_local_ = split_at - buffer_start;
    chunks.clear();
    const size_t rest = cut_round(text, eof, chunks);
    pool_.run(text, chunks, results_);
    for (size_t i = 0; i < chunks.size(); ++i) {
      sink_(results_[i], chunks[i].part);
      p_.tokens += static_cast<int64_t>(results_[i].size());
    }
    p_.bytes_done += static_cast<int64_t>(rest);
    if (progress_) progress_(p_);
    text.erase(0, rest);
    buffer_start += static_cast<int64_t>(rest);
    if (eof && text.empty()) break;
  }
}

EncodeProgress Encoder::run(const std::vector<std::string>& files) {
  for (const auto& f : files) p_.bytes_total += file_size(f);
  for (const auto& f : files) {
    if (part_ == 0 && o_.split_byte >= 0 && o_.split_byte <= p_.bytes_done) part_ = 1;
    if (tok_.document_token() >= 0) {
      const auto doc = static_cast<uint32_t>(tok_.document_token());
      sink_(std::span<const uint32_t>(&doc, 1), part_);
      ++p_.tokens;
    }
    encode_file(f);
  }
  return p_;
}

}  // namespace

EncodeProgress encode_files(const Tokenizer& tok, const std::vector<std::string>& files,
                            const EncodeOptions& options, const TokenSink& sink,
                            const ProgressFn& progress) {
  if (options.threads < 1 || options.chunk_bytes < 1) {
    throw invalid_argument("data: encoder threads ({}) and chunk bytes ({}) must be at least 1",
                           options.threads, options.chunk_bytes);
  }
  if (!tok.can_encode()) {
    throw invalid_argument("data: the {} tokenizer cannot encode", tok.name());
  }
  Encoder e(tok, options, sink, progress);
  return e.run(files);
}

}  // namespace ds::rt::data
