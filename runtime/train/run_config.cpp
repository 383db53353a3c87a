// The job config translated into the trainer's pieces (run_config.h).
#include "train/run_config.h"

#include <fmt/format.h>

#include "common/env.h"
#include "common/error.h"
#include "core/cuda_memory_table.h"
#include "model_spec/family.h"
#include "store/prefix_store.h"
#include "store/tcp_store_client.h"

namespace ds::rt::train {

namespace ms = ds::model_spec;

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

optim::LossScalerConfig loss_scaler_of(const config::Fp16Config& f) {
  optim::LossScalerConfig l;
  l.enabled = f.enabled;
  l.loss_scale = f.loss_scale;
  l.initial_scale_power = f.initial_scale_power;
  l.loss_scale_window = f.loss_scale_window;
  l.hysteresis = f.hysteresis;
  l.min_loss_scale = f.min_loss_scale;
  return l;
}

UpdateSettings update_settings_of(const config::JobConfig& c) {
  UpdateSettings u;
  u.adamw.lr = c.optimizer.lr;
  u.adamw.beta1 = c.optimizer.beta1;
  u.adamw.beta2 = c.optimizer.beta2;
  u.adamw.eps = c.optimizer.eps;
  u.adamw.weight_decay = c.optimizer.weight_decay;
  u.adamw.adam_w_mode = c.optimizer.adam_w_mode;
  u.gradient_clipping = c.gradient_clipping;
  return u;
}

DType dtype_of_precision(layout::Precision p) {
  switch (p) {
    case layout::Precision::kFp32: return DType::kF32;
    case layout::Precision::kBf16: return DType::kBF16;
    case layout::Precision::kFp16: return DType::kF16;
  }
  return DType::kF32;
}

parallel::EngineSpec engine_spec_of(const config::JobConfig& c, int rank, int local_rank, Device device) {
  parallel::EngineSpec e;
  e.rank = rank;
  e.world = c.world_size;
  e.tp = c.tensor_parallel.size;
  e.dp = c.data_parallel_size;
  e.pp = c.pipeline.stages;
  e.cp = c.context_parallel.size;
  e.ep = c.expert_parallel.size;
  e.cp_method = c.context_parallel.method;
  e.split = c.pipeline.partition;
  e.schedule = c.pipeline.schedule;
  e.micro_batches = static_cast<int>(c.gradient_accumulation_steps);
  e.device = device;
  e.cuda_device = local_rank;
  const auto& z = c.zero;
  e.zero.stage = z.stage;
  e.zero.overlap_comm = z.overlap_comm;
  e.zero.reduce_bucket_size = z.reduce_bucket_size;
  e.zero.allgather_bucket_size = z.allgather_bucket_size;
  e.zero.prefetch_bucket_size = z.stage3_prefetch_bucket_size;
  e.zero.param_persistence_threshold = z.stage3_param_persistence_threshold;
  e.zero.max_live_parameters = z.stage3_max_live_parameters;
  e.model.B = static_cast<int>(c.train_micro_batch_size_per_gpu);
  e.model.T = c.model.shape.seq_len;
  e.model.recompute = c.activation_checkpointing.full();
  e.model.sequence_parallel = c.tensor_parallel.sequence_parallel;
  if (c.data.packing == config::Packing::kDocument) e.model.document_token = static_cast<int>(c.data.document_token);
  // Mixed precision: parameters, activations and their gradients in the 16-bit storage type;
  // parameter gradients in grad_accum_dtype / communication_data_type (the storage type unless
  // the config says fp32).
  // On a GPU bf16 is stored as such (the CUDA dispatch's bf16 twins) and fp16 in fp32 buffers
  // (no fp16 CUDA kernels): layout::stored_precision, which the plan counts with.
  const bool cuda = device == Device::kCuda;
  e.model.dtype = dtype_of_precision(layout::stored_precision(c.precision(), cuda));
  e.model.grad_dtype = dtype_of_precision(layout::stored_precision(c.gradient_dtype(), cuda));
  e.comm_timeout = Millis(static_cast<int64_t>(c.training.comm_timeout * 1000));
  return e;
}

// The rank's device: the CPU, or the GPU given by LOCAL_RANK (torchrun's and DeepSpeed's
// contract), made current before anything allocates on it or an NCCL group binds to it. The
// CUDA module is loaded here, its errors naming the config key.
Device select_device(const config::JobConfig& c, int rank, int local_rank) {
  if (c.training.device == "cpu") return Device::kCpu;
  if (c.training.device != "cuda") {
    throw invalid_argument("{}: $.training.device: '{}' is not one of \"cpu\", \"cuda\"", c.path, c.training.device);
  }
  const std::string who =
      fmt::format("{}: $.training.device \"cuda\" on rank {} (LOCAL_RANK {})", c.path, rank, local_rank);
  cuda_memory(who).set_device(local_rank, who);
  return Device::kCuda;
}

// One store generation per launcher restart, so a restarted job never meets stale keys.
std::shared_ptr<store::Store> job_store(int world) {
  if (world == 1) return nullptr;
  return std::make_shared<store::PrefixStore>(fmt::format("train/gen{}/", env::get_int("DSTRAIN_RESTART_COUNT")),
                                              store::connect_from_env());
}

}  // namespace ds::rt::train
