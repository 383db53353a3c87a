#include "train/trainer.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <limits>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/llmc_format.h"
#include "checkpoint/shard_file.h"
#include "common/env.h"
#include "common/error.h"
#include "core/allocator.h"
#include "core/dtype.h"
#include "data/loader.h"
#include "data/token_file.h"
#include "kernels/cpu/kernels.h"
#include "model/gpt2.h"
#include "optim/adamw.h"
#include "optim/clip.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "train/metrics.h"

namespace ds::rt::train {

namespace ms = ds::model_spec;
using Clock = std::chrono::steady_clock;

namespace {

ms::Gpt2Shape shape_of(const config::ModelConfig& m) {
  ms::Gpt2Shape s;
  s.n_layer = m.n_layer;
  s.n_head = m.n_head;
  s.n_embd = m.n_embd;
  s.vocab_size = m.vocab_size;
  s.padded_vocab_size = m.padded_vocab_size;
  s.seq_len = m.seq_len;
  return s;
}

optim::LrScheduleConfig schedule_of(const config::JobConfig& c) {
  optim::LrScheduleConfig s;
  const auto& sc = c.scheduler;
  s.base_lr = c.optimizer.lr;
  if (sc.type.empty()) s.type = optim::LrScheduleType::kConstant;
  else if (sc.type == "WarmupLR") s.type = optim::LrScheduleType::kWarmupLR;
  else if (sc.type == "WarmupDecayLR") s.type = optim::LrScheduleType::kWarmupDecayLR;
  else if (sc.type == "WarmupCosineLR") s.type = optim::LrScheduleType::kWarmupCosineLR;
  else throw invalid_argument("{}: $.scheduler.type: unsupported scheduler '{}'", c.path, sc.type);
  s.warmup_min_lr = sc.warmup_min_lr;
  s.warmup_max_lr = sc.warmup_max_lr;
  s.warmup_num_steps = sc.warmup_num_steps;
  s.warmup_type = sc.warmup_type == "linear" ? optim::WarmupType::kLinear : optim::WarmupType::kLog;
  s.total_num_steps = sc.total_num_steps > 0 ? sc.total_num_steps : c.training.steps;
  s.warmup_min_ratio = sc.warmup_min_ratio;
  s.cos_min_ratio = sc.cos_min_ratio;
  return s;
}

// GPT-2 / llm.c practice: matrices and embeddings decay, biases and LayerNorm weights do not.
std::vector<optim::DecayRange> decay_ranges(const ms::Gpt2Shape& shape,
                                            const ms::ParamLayout& layout) {
  auto all = ms::gpt2_params(shape);
  std::vector<optim::DecayRange> out;
  for (const auto& t : layout.tensors) {
    bool decay = ms::find_param(all, t.id).shape.size() == 2;
    if (!out.empty() && out.back().decay == decay && out.back().offset + out.back().count == t.offset) {
      out.back().count += t.numel;
    } else {
      out.push_back({t.offset, t.numel, decay});
    }
  }
  return out;
}

enum class Precision { kFp32, kBf16, kFp16 };

}  // namespace

struct Trainer::Impl {
  config::JobConfig cfg;
  TrainOptions opt;
  ms::Gpt2Shape shape;
  Precision precision = Precision::kFp32;
  int B = 0, T = 0, G = 1;
  int rank = 0;

  Allocator& alloc = Allocator::process();
  std::unique_ptr<Gpt2> model;
  Gpt2Activations acts;
  Buffer master, exp_avg, exp_avg_sq;  // optimizer state (fp32), master only with bf16/fp16
  Buffer tokens;                       // inputs and targets (B*T int32 each), workspace
  std::vector<optim::DecayRange> decay;

  std::unique_ptr<data::TokenFile> train_file, val_file;
  std::unique_ptr<data::DataLoader> loader;
  std::unique_ptr<data::ValidationLoader> val_loader;
  std::unique_ptr<optim::LrScheduler> schedule;
  std::unique_ptr<optim::LossScaler> scaler;
  int64_t adam_steps = 0;  // applied optimizer updates (AdamW's t)
  int64_t next_step = 1;   // the step the next run() executes

  float* master_params() { return precision == Precision::kFp32 ? model->params() : master.as<float>(); }

  // Rounds the model's parameters (or gradients) to the storage precision, in place.
  void round_to_precision(float* x, int64_t n) {
    if (precision == Precision::kFp32) return;
    if (precision == Precision::kBf16) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) x[i] = f16_to_f32(f32_to_f16(x[i]));
    }
  }

  void sync_model_from_master() {
    if (precision == Precision::kFp32) return;
    std::copy_n(master.as<float>(), model->num_params(), model->params());
    round_to_precision(model->params(), model->num_params());
  }

  nlohmann::json manifest(int64_t step) const {
    nlohmann::json m;
    m["format"] = "dstrain-checkpoint-1";
    m["step"] = step;
    m["adam_steps"] = adam_steps;
    m["config"] = cfg.to_json();
    m["layout"] = {{"world_size", cfg.world_size},
                   {"data_parallel_size", cfg.data_parallel_size},
                   {"tensor_parallel_size", cfg.tensor_parallel.size},
                   {"pipeline_stages", cfg.pipeline.stages},
                   {"zero_stage", cfg.zero.stage},
                   {"num_params", model->num_params()}};
    m["data"] = loader->state().to_json();
    m["lr_schedule"] = schedule->state();
    m["loss_scaler"] = scaler->state();
    m["rng"] = {{"seed", cfg.training.seed}, {"note", "initial weights and data order derive from the seed alone"}};
    return m;
  }

  void save_checkpoint(int64_t step) {
    const auto& root = cfg.training.checkpoint_dir;
    std::string tmp = ckpt::begin_checkpoint(root, step);
    ckpt::ShardWriter w;
    int64_t n = model->num_params();
    size_t bytes = static_cast<size_t>(n) * sizeof(float);
    w.add("params", "f32", {n}, model->params(), bytes);
    if (precision != Precision::kFp32) w.add("master", "f32", {n}, master.data(), bytes);
    w.add("exp_avg", "f32", {n}, exp_avg.data(), bytes);
    w.add("exp_avg_sq", "f32", {n}, exp_avg_sq.data(), bytes);
    w.write(tmp + "/" + ckpt::shard_file_name(rank));
    std::string dir = ckpt::commit_checkpoint(root, step, manifest(step), cfg.training.keep_last);
    spdlog::info("saved checkpoint {}", dir);
  }

  void load_checkpoint(const std::string& dir) {
    auto m = ckpt::read_manifest(dir);
    std::string where = dir + "/manifest.json";
    try {
      int64_t n = model->num_params();
      if (m.at("layout").at("num_params").get<int64_t>() != n) {
        throw invalid_argument("{}: the checkpoint holds {} parameters per rank but the config's "
                               "model has {}",
                               where, m["layout"]["num_params"].get<int64_t>(), n);
      }
      ckpt::ShardReader r(dir + "/" + ckpt::shard_file_name(rank));
      size_t bytes = static_cast<size_t>(n) * sizeof(float);
      r.read("params", "f32", {n}, model->params(), bytes);
      if (precision != Precision::kFp32) {
        if (!r.has("master")) {
          throw invalid_argument("{}: the checkpoint was written without bf16/fp16 master weights; "
                                 "resume it with the same precision settings", where);
        }
        r.read("master", "f32", {n}, master.data(), bytes);
      }
      r.read("exp_avg", "f32", {n}, exp_avg.data(), bytes);
      r.read("exp_avg_sq", "f32", {n}, exp_avg_sq.data(), bytes);
      adam_steps = m.at("adam_steps").get<int64_t>();
      next_step = m.at("step").get<int64_t>() + 1;
      loader->restore(data::LoaderState::from_json(m.at("data"), where + ": data"));
      schedule->restore(m.at("lr_schedule"), where + ": lr_schedule");
      scaler->restore(m.at("loss_scaler"), where + ": loss_scaler");
    } catch (const nlohmann::json::exception& e) {
      throw invalid_argument("{}: corrupt checkpoint manifest: {}", where, e.what());
    }
    spdlog::info("resumed from {} (continuing at step {})", dir, next_step);
  }

  double evaluate() {
    val_loader->begin();
    int32_t* in = tokens.as<int32_t>();
    int32_t* tg = in + static_cast<size_t>(B) * T;
    double sum = 0;
    for (int64_t i = 0; i < val_loader->eval_steps(); ++i) {
      val_loader->next(in, tg);
      sum += model->forward(acts, in, tg);
    }
    return sum / static_cast<double>(val_loader->eval_steps());
  }
};

Trainer::Trainer(const config::JobConfig& config, const TrainOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.cfg = config;
  s.opt = options;
  config::require_training_sections(s.cfg);
  if (s.cfg.training.device != "cpu") {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}: $.training.device: '{}' training is not available in this build",
                            s.cfg.path, s.cfg.training.device),
                "set training.device to \"cpu\"");
  }
  if (s.cfg.data_parallel_size != 1 || s.cfg.tensor_parallel.size != 1 || s.cfg.pipeline.stages != 1) {
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}: this trainer runs one process, but the config resolves to "
                            "data-parallel {} x tensor-parallel {} x pipeline {}",
                            s.cfg.path, s.cfg.data_parallel_size, s.cfg.tensor_parallel.size,
                            s.cfg.pipeline.stages),
                "run it with world size 1 (no launcher or --nproc-per-node 1)");
  }
  s.rank = static_cast<int>(env::get_int("RANK"));
  s.shape = shape_of(s.cfg.model);
  s.B = static_cast<int>(s.cfg.train_micro_batch_size_per_gpu);
  s.T = s.cfg.model.seq_len;
  s.G = static_cast<int>(s.cfg.gradient_accumulation_steps);
  if (s.cfg.bf16.enabled) s.precision = Precision::kBf16;
  if (s.cfg.fp16.enabled) s.precision = Precision::kFp16;

  // Data first: a bad corpus should fail before we allocate the model.
  s.train_file = std::make_unique<data::TokenFile>(s.cfg.data.train, s.cfg.model.vocab_size);
  data::LoaderOptions lo;
  lo.batch_size = s.B;
  lo.seq_len = s.T;
  lo.data_parallel_size = s.cfg.data_parallel_size;
  lo.data_parallel_rank = 0;
  lo.grad_accum_steps = s.G;
  lo.shuffle = s.cfg.data.shuffle;
  lo.seed = s.cfg.training.seed;
  s.loader = std::make_unique<data::DataLoader>(*s.train_file, lo);
  if (!s.cfg.data.val.empty() && s.cfg.training.eval_interval > 0) {
    s.val_file = std::make_unique<data::TokenFile>(s.cfg.data.val, s.cfg.model.vocab_size);
    s.val_loader = std::make_unique<data::ValidationLoader>(
        *s.val_file, s.B, s.T, s.cfg.data_parallel_size, 0, s.cfg.training.eval_steps);
  }

  Gpt2Options mo;
  mo.B = s.B;
  mo.T = s.T;
  mo.recompute = s.cfg.activation_checkpointing.enabled;
  s.model = std::make_unique<Gpt2>(s.shape, ms::ModelPart::whole(s.shape), mo, s.alloc);
  s.acts = s.model->make_activations();
  int64_t n = s.model->num_params();
  size_t bytes = static_cast<size_t>(n) * sizeof(float);
  if (s.precision != Precision::kFp32) s.master = s.alloc.allocate(bytes, MemTag::kOptimizer, "master weights");
  s.exp_avg = s.alloc.allocate(bytes, MemTag::kOptimizer, "adam exp_avg");
  s.exp_avg_sq = s.alloc.allocate(bytes, MemTag::kOptimizer, "adam exp_avg_sq");
  s.tokens = s.alloc.allocate(2 * static_cast<size_t>(s.B) * s.T * sizeof(int32_t), MemTag::kWorkspace,
                              "tokens");
  s.decay = decay_ranges(s.shape, s.model->layout());

  s.schedule = std::make_unique<optim::LrScheduler>(schedule_of(s.cfg));
  optim::LossScalerConfig lsc;
  lsc.enabled = s.cfg.fp16.enabled;
  lsc.loss_scale = s.cfg.fp16.loss_scale;
  lsc.initial_scale_power = s.cfg.fp16.initial_scale_power;
  lsc.loss_scale_window = s.cfg.fp16.loss_scale_window;
  lsc.hysteresis = s.cfg.fp16.hysteresis;
  lsc.min_loss_scale = s.cfg.fp16.min_loss_scale;
  s.scaler = std::make_unique<optim::LossScaler>(lsc);

  std::optional<std::string> resume_dir;
  if (s.opt.resume) {
    if (s.cfg.training.checkpoint_dir.empty()) {
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("--resume needs training.checkpoint_dir in {}", s.cfg.path),
                  "set training.checkpoint_dir (and checkpoint_interval) in the config");
    }
    resume_dir = ckpt::latest_checkpoint(s.cfg.training.checkpoint_dir);
    if (!resume_dir) spdlog::info("--resume: no checkpoint in {} yet, starting fresh", s.cfg.training.checkpoint_dir);
  }
  std::string init_from = !s.opt.init_from.empty() ? s.opt.init_from : s.cfg.model.init_from;
  if (resume_dir) {
    s.load_checkpoint(*resume_dir);
  } else if (!init_from.empty()) {
    ckpt::load_llmc(init_from, s.shape, s.model->part(), s.model->params());
    spdlog::info("initialised weights from llm.c checkpoint {}", init_from);
  } else {
    s.model->init_weights(s.cfg.training.seed);
  }
  if (s.precision != Precision::kFp32 && !resume_dir) {
    std::copy_n(s.model->params(), n, s.master.as<float>());
    s.sync_model_from_master();
  }
}

Trainer::~Trainer() = default;

TrainResult Trainer::run() {
  Impl& s = *impl_;
  TrainResult result;
  result.first_step = s.next_step;
  const int64_t total = s.cfg.training.steps;
  int64_t stop = total;
  if (s.opt.max_steps >= 0) stop = std::min(stop, s.opt.max_steps);
  bool reporter_on = s.rank == 0 || s.opt.metrics_all_ranks;
  MetricsReporter reporter(reporter_on, s.opt.metrics_path, s.next_step > 1, s.cfg.training.log_interval);
  if (s.next_step == 1) {
    reporter.note(fmt::format(
        "training GPT-2 (L={} H={} C={} V={} T={}): {} parameters, micro-batch {} x {} tokens, "
        "{} accumulation step(s), {} steps, {} threads",
        s.shape.n_layer, s.shape.n_head, s.shape.n_embd, s.shape.vocab_size, s.shape.seq_len,
        s.model->num_params(), s.B, s.T, s.G, total, omp_get_max_threads()));
  }

  const int64_t n = s.model->num_params();
  int32_t* in = s.tokens.as<int32_t>();
  int32_t* tg = in + static_cast<size_t>(s.B) * s.T;
  const double tokens_per_step = static_cast<double>(s.B) * s.T * s.G * s.cfg.data_parallel_size;
  optim::AdamWConfig ac;
  ac.lr = s.cfg.optimizer.lr;
  ac.beta1 = s.cfg.optimizer.beta1;
  ac.beta2 = s.cfg.optimizer.beta2;
  ac.eps = s.cfg.optimizer.eps;
  ac.weight_decay = s.cfg.optimizer.weight_decay;
  ac.adam_w_mode = s.cfg.optimizer.adam_w_mode;
  s.alloc.reset_peaks();

  for (int64_t step = s.next_step; step <= stop; ++step) {
    auto t0 = Clock::now();
    s.model->zero_grads();
    const double loss_scale = s.scaler->scale();
    const float grad_scale = static_cast<float>(loss_scale / s.G);
    double loss_sum = 0;
    for (int g = 0; g < s.G; ++g) {
      s.loader->next(in, tg);
      loss_sum += s.model->forward_backward(s.acts, in, tg, grad_scale);
    }
    const double loss = loss_sum / s.G;
    float* grads = s.model->grads();
    if (step == s.opt.inject_inf_at_step) grads[0] = std::numeric_limits<float>::infinity();
    if (s.precision == Precision::kFp16) s.round_to_precision(grads, n);

    const double sumsq = optim::sum_of_squares(grads, n);
    const bool overflow = !std::isfinite(sumsq);
    const double norm = std::sqrt(sumsq) / loss_scale;
    const double lr = s.schedule->lr();
    const bool skip = s.scaler->update(overflow);
    if (!skip) {
      if (overflow) {
        throw remote_error("step {}: the gradients hold inf or nan (loss {}) and fp16 loss scaling "
                           "is off: training diverged",
                           step, loss);
      }
      const double coef = optim::clip_coefficient(norm, s.cfg.gradient_clipping);
      ++s.adam_steps;
      auto st = optim::adamw_step_scalars(ac, s.adam_steps, lr, coef / loss_scale);
      optim::adamw_update_partition(st, s.master_params(), grads, s.exp_avg.as<float>(),
                                    s.exp_avg_sq.as<float>(), 0, n, s.decay);
      s.sync_model_from_master();
      s.schedule->step();
    }
    auto t1 = Clock::now();
    double ms_step = std::chrono::duration<double, std::milli>(t1 - t0).count();

    StepRecord r;
    r.step = step;
    r.total_steps = total;
    r.loss = loss;
    r.lr = lr;
    r.grad_norm = norm;
    r.loss_scale = loss_scale;
    r.skipped = skip;
    r.ms_per_step = ms_step;
    r.tokens_per_s = tokens_per_step / (ms_step / 1000.0);
    auto stats = s.alloc.stats();
    for (int t = 0; t < kNumMemTags; ++t) r.peak_bytes[mem_tag_name(static_cast<MemTag>(t))] = stats.peak[t];
    r.peak_bytes["total"] = stats.peak_total;
    if (s.val_loader && (step % s.cfg.training.eval_interval == 0 || step == total)) {
      r.val_loss = s.evaluate();
      result.last_val_loss = r.val_loss;
    }
    reporter.report(r);
    result.losses.push_back(loss);
    result.last_step = step;
    s.next_step = step + 1;
    if (!s.cfg.training.checkpoint_dir.empty() && s.cfg.training.checkpoint_interval > 0 &&
        (step % s.cfg.training.checkpoint_interval == 0 || step == total)) {
      s.save_checkpoint(step);
    }
  }
  return result;
}

void Trainer::export_llmc(const std::string& path) const {
  const Impl& s = *impl_;
  ckpt::save_llmc(path, s.shape, s.precision == Precision::kFp32 ? s.model->params() : s.master.as<float>());
}

}  // namespace ds::rt::train
