// The trainer's pieces configured from the job config and the worker's environment: the model's
// shape, the precision, the device, the job's store, the parallel engine's spec, the LR schedule,
// the loss scaler and the update's settings. Translations of a validated config; an unsupported
// scheduler type or device is an invalid_argument naming the key.
#pragma once

#include "config/job_config.h"
#include "core/allocator.h"
#include "layout/choices.h"
#include "model_spec/shape.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "parallel/engine.h"
#include "store/store.h"
#include "train/step_math.h"

namespace ds::rt::train {

optim::LrScheduleConfig schedule_of(const config::JobConfig& c);
optim::LossScalerConfig loss_scaler_of(const config::Fp16Config& f);
UpdateSettings update_settings_of(const config::JobConfig& c);
// The engine of world rank `rank` (GPU `local_rank` when device is kCuda).
// The data plane's element type of a precision (fp32, bf16, fp16).
DType dtype_of_precision(layout::Precision p);
// The parallel engine's spec; the model's storage type is the config's precision and its
// gradients' type the config's gradient_dtype().
parallel::EngineSpec engine_spec_of(const config::JobConfig& c, int rank, int local_rank, Device device);
// The rank's device: the CPU, or the GPU given by LOCAL_RANK (torchrun's and DeepSpeed's
// contract), made current before anything allocates on it or an NCCL group binds to it. Loads
// the CUDA module for "cuda"; its errors name the config key.
Device select_device(const config::JobConfig& c, int rank, int local_rank);
// The job's store under this restart's generation prefix (DSTRAIN_STORE, DSTRAIN_RESTART_COUNT),
// so a restarted job never meets stale keys; null for a single process.
std::shared_ptr<store::Store> job_store(int world);

}  // namespace ds::rt::train
