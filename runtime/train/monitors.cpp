// The TensorBoard and CSV monitors (monitors.h).
#include "train/monitors.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "common/error.h"
#include "common/strings.h"
#include "train/tfevents.h"

namespace ds::rt::train {

namespace fs = std::filesystem;

std::vector<Scalar> monitor_scalars(const StepRecord& r, bool fp16) {
  const std::string p = "Train/Samples/";
  std::vector<Scalar> s = {{p + "train_loss", r.loss}, {p + "lr", r.lr}};
  if (r.aux_loss) s.push_back({p + "aux_loss", *r.aux_loss});
  if (fp16) s.push_back({p + "loss_scale", r.loss_scale});
  if (r.breakdown) {
    const StepBreakdown& b = *r.breakdown;
    s.push_back({p + "elapsed_time_ms_forward", b[Phase::kForward]});
    s.push_back({p + "elapsed_time_ms_backward", b[Phase::kBackward] + b[Phase::kReduce]});
    s.push_back({p + "elapsed_time_ms_backward_inner", b[Phase::kBackward]});
    s.push_back({p + "elapsed_time_ms_backward_allreduce", b[Phase::kReduce]});
    s.push_back({p + "elapsed_time_ms_step", b[Phase::kOptimizer]});
  }
  s.push_back({p + "grad_norm", r.grad_norm});
  s.push_back({p + "tokens_per_s", r.tokens_per_s});
  s.push_back({p + "tflops", r.tflops});
  if (r.mfu) s.push_back({p + "mfu", *r.mfu});
  if (r.val_loss) s.push_back({p + "val_loss", *r.val_loss});
  // training.eval_tasks' scores: eval_<task>_acc, eval_<task>_acc_norm / _ppl
  for (const auto& [k, v] : r.extra.items()) {
    if (k.rfind("eval_", 0) == 0 && v.is_number()) s.push_back({p + k, v.get<double>()});
  }
  for (const auto& [tag, bytes] : r.peak_bytes) s.push_back({p + "peak_bytes_" + tag, static_cast<double>(bytes)});
  return s;
}

namespace {

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

// output_path/job_name, created; the error names the config key.
std::string monitor_dir(const config::MonitorConfig& m, const std::string& key, const std::string& cfg_path) {
  const fs::path dir = fs::path(m.output_path) / m.job_name;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}: $.{}.output_path: cannot create the directory {}: {}", cfg_path, key, dir.string(),
                            ec ? ec.message() : "not a directory"),
                fmt::format("set {}.output_path to a writable directory", key));
  }
  return dir.string();
}

FILE* open_file(const std::string& path, const char* mode, const std::string& key, const std::string& cfg_path) {
  FILE* f = std::fopen(path.c_str(), mode);
  if (!f) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}: $.{}.output_path: cannot write {}: {}", cfg_path, key, path, errno_string(errno)),
                fmt::format("set {}.output_path to a writable directory", key));
  }
  return f;
}

// One monitor output file. Writes go to stdio's buffer; the buffer is flushed on the first write
// (so an unwritable file fails at once) and then at most once a second, not every step: with
// csv_monitor's file per tag a flush per write was ~20 write(2)s a step, a measurable part of a
// small model's step. fclose flushes the rest; a flush that fails throws, naming the file.
class MonitorFile {
 public:
  MonitorFile(FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  ~MonitorFile() {
    if (f_ != nullptr) std::fclose(f_);
  }
  MonitorFile(const MonitorFile&) = delete;
  MonitorFile& operator=(const MonitorFile&) = delete;
  const std::string& path() const { return path_; }
  void write(const std::string& bytes) {
    if (std::fwrite(bytes.data(), 1, bytes.size(), f_) != bytes.size()) fail();
    const auto now = std::chrono::steady_clock::now();
    if (!flushed_ || now - last_flush_ >= std::chrono::seconds(1)) {
      if (std::fflush(f_) != 0) fail();
      flushed_ = true;
      last_flush_ = now;
    }
  }

 private:
  [[noreturn]] void fail() { throw system_error("cannot write {}: {}", path_, errno_string(errno)); }
  FILE* f_;
  std::string path_;
  bool flushed_ = false;
  std::chrono::steady_clock::time_point last_flush_;
};

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class TensorBoardWriter final : public Monitor {
 public:
  TensorBoardWriter(const std::string& dir, const std::string& cfg_path) {
    const double now = unix_now();
    const std::string path =
        (fs::path(dir) / tfevents::event_file_name(static_cast<int64_t>(now), host_name(), ::getpid())).string();
    file_ = std::make_unique<MonitorFile>(open_file(path, "wb", "tensorboard", cfg_path), path);
    file_->write(tfevents::tfrecord(tfevents::file_version_event(now)));
  }
  std::string what() const override { return "tensorboard event file " + file_->path(); }
  void write(int64_t samples, const std::vector<Scalar>& scalars) override {
    std::vector<std::pair<std::string, float>> v;
    v.reserve(scalars.size());
    for (const auto& s : scalars) v.emplace_back(s.tag, static_cast<float>(s.value));
    file_->write(tfevents::tfrecord(tfevents::scalars_event(unix_now(), samples, v)));
  }

 private:
  std::unique_ptr<MonitorFile> file_;
};

class CsvMonitor final : public Monitor {
 public:
  CsvMonitor(std::string dir, bool resume, std::string cfg_path)
      : dir_(std::move(dir)), cfg_path_(std::move(cfg_path)), mode_(resume ? "a" : "w") {}
  std::string what() const override { return "csv_monitor files in " + dir_; }
  void write(int64_t samples, const std::vector<Scalar>& scalars) override {
    for (const auto& s : scalars) {
      auto [it, fresh] = files_.try_emplace(s.tag, nullptr);
      if (fresh) it->second = open_tag(s.tag, path_of(s.tag));
      it->second->write(fmt::format("{},{}\n", samples, s.value));
    }
  }

 private:
  std::string path_of(const std::string& tag) const {
    std::string name = tag;
    for (char& c : name) {
      if (c == '/' || c == ' ') c = '_';
    }
    return (fs::path(dir_) / (name + ".csv")).string();
  }
  // DeepSpeed's header: "step," and the tag's last '/'-part; written when the file is new.
  std::unique_ptr<MonitorFile> open_tag(const std::string& tag, const std::string& path) {
    std::error_code ec;
    const bool has_rows = std::string(mode_) == "a" && fs::file_size(path, ec) > 0 && !ec;
    auto f = std::make_unique<MonitorFile>(open_file(path, mode_, "csv_monitor", cfg_path_), path);
    if (!has_rows) {
      const size_t slash = tag.rfind('/');
      f->write(fmt::format("step,{}\n", slash == std::string::npos ? tag : tag.substr(slash + 1)));
    }
    return f;
  }

  std::string dir_, cfg_path_;
  const char* mode_;
  std::map<std::string, std::unique_ptr<MonitorFile>> files_;
};

}  // namespace

std::vector<std::unique_ptr<Monitor>> open_monitors(const config::JobConfig& cfg, bool resume) {
  std::vector<std::unique_ptr<Monitor>> out;
  if (cfg.tensorboard.enabled) {
    out.push_back(std::make_unique<TensorBoardWriter>(monitor_dir(cfg.tensorboard, "tensorboard", cfg.path), cfg.path));
  }
  if (cfg.csv_monitor.enabled) {
    const std::string dir = monitor_dir(cfg.csv_monitor, "csv_monitor", cfg.path);
    // Fail now, not after the first step, when the directory takes no files.
    const std::string probe = (fs::path(dir) / ".dstrain_write_test").string();
    std::fclose(open_file(probe, "w", "csv_monitor", cfg.path));
    std::remove(probe.c_str());
    out.push_back(std::make_unique<CsvMonitor>(dir, resume, cfg.path));
  }
  return out;
}

}  // namespace ds::rt::train
