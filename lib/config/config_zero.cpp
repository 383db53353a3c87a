// The zero_optimization section, as DeepSpeed reads it: the stage and its buckets, the two
// offload sections, the stage3_* sizes under both of the names DeepSpeed's pydantic model
// accepts, and the deprecated forms DeepSpeed still maps onto the current keys (a boolean
// section, cpu_offload, cpu_offload_param, cpu_offload_use_pin_memory), each with a warning.
// Resolved here: overlap_comm's default depends on the stage (true for 3), and an offload the
// stage cannot use is dropped with a warning, as DeepSpeed ignores it. "nvme" offload is an
// error: dstrain has no NVMe swapper.
#include <fmt/format.h>

#include "config/config_sections.h"

namespace ds::config::detail {

namespace {

const std::vector<std::string> kDsZeroIgnored = {
    "allgather_partitions", "use_multi_rank_bucket_allreduce", "load_from_fp32_weights",
    "elastic_checkpoint", "zenflow", "sub_group_size", "stage3_model_persistence_threshold",
    "model_persistence_threshold", "stage3_max_reuse_distance", "max_reuse_distance",
    "stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
    "stage3_gather_fp16_weights_on_model_save", "stage3_module_granularity_threshold",
    "module_granularity_threshold", "stage3_use_all_reduce_for_fetch_params",
    "use_all_reduce_for_fetch_params", "stage3_allgather_sequential", "allgather_sequential",
    "stage3_partition_stream_chunk_size", "partition_stream_chunk_size",
    "ignore_unused_parameters", "legacy_stage1", "round_robin_gradients",
    "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_nontrainable_weights",
    "zero_quantized_gradients", "zeropp_loco_param", "mics_shard_size",
    "mics_hierarchical_params_gather", "memory_efficient_linear", "pipeline_loading_checkpoint",
    "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks",
    "save_muon_momentum_buffer_in_memory", "leaf_module"};
const std::vector<std::string> kDsOffloadIgnored = {
    "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pipeline_read", "pipeline_write",
    "fast_init", "ratio", "super_offload", "convert_grad_on_cpu", "cpuadam_cores_perc"};

void read_offload(ReadContext& ctx, Section& zero, const std::string& key, OffloadConfig& out) {
  Section s = zero.section(key, /*nullable=*/true);
  if (!s.present()) return;
  const Json* dev = s.raw("device");
  if (dev && dev->is_string() && dev->get<std::string>() == "nvme") {
    ctx.error(s.child("device"),
              "\"nvme\" offload is not supported by dstrain (expected \"none\" or \"cpu\")");
  } else {
    s.get_choice("device", out.device, {"none", "cpu"});
  }
  s.get_bool("pin_memory", out.pin_memory);
  s.ignored(kDsOffloadIgnored);
  s.finish();
}

// The stage3_* names, and the short names DeepSpeed's pydantic model also accepts.
void read_stage3_sizes(ReadContext& ctx, Section& s, ZeroConfig& out) {
  auto aliased = [&](const char* name, const char* alias, int64_t& value, int64_t lo) {
    if (s.has(name) && s.has(alias)) {
      s.raw(alias);
      ctx.error(s.child(alias),
                fmt::format("both \"{}\" and its alias \"{}\" are given", name, alias));
    }
    if (!s.get_int(name, value, lo, kI64Max)) s.get_int(alias, value, lo, kI64Max);
  };
  aliased("stage3_prefetch_bucket_size", "prefetch_bucket_size", out.stage3_prefetch_bucket_size,
          0);
  aliased("stage3_param_persistence_threshold", "param_persistence_threshold",
          out.stage3_param_persistence_threshold, 0);
  aliased("stage3_max_live_parameters", "max_live_parameters", out.stage3_max_live_parameters, 1);
}

// Deprecated DeepSpeed booleans that DeepSpeed still maps onto the offload sections.
void read_deprecated_offload_keys(ReadContext& ctx, Section& s, ZeroConfig& out) {
  bool b = false;
  if (s.get_bool("cpu_offload", b)) {
    ctx.warn(s.child("cpu_offload"),
             "deprecated DeepSpeed key; read as offload_optimizer.device \"cpu\"");
    if (b && !s.has("offload_optimizer")) out.offload_optimizer.device = "cpu";
  }
  if (s.get_bool("cpu_offload_param", b)) {
    ctx.warn(s.child("cpu_offload_param"),
             "deprecated DeepSpeed key; read as offload_param.device \"cpu\"");
    if (b && !s.has("offload_param")) out.offload_param.device = "cpu";
  }
  if (s.get_bool("cpu_offload_use_pin_memory", b)) {
    ctx.warn(s.child("cpu_offload_use_pin_memory"),
             "deprecated DeepSpeed key; read as pin_memory of the offload sections");
    if (!s.has("offload_optimizer")) out.offload_optimizer.pin_memory = b;
    if (!s.has("offload_param")) out.offload_param.pin_memory = b;
  }
}

// An offload the stage cannot use is ignored, as in DeepSpeed: a warning, and "none".
void drop_offload_below_stage(ReadContext& ctx, const Section& s, ZeroConfig& out) {
  if (out.offload_optimizer.device != "none" && out.stage == 0) {
    ctx.warn(s.child("offload_optimizer"),
             "ignored with ZeRO stage 0 (optimizer offload needs stage 1-3, as in DeepSpeed)");
    out.offload_optimizer = OffloadConfig{};
  }
  if (out.offload_param.device != "none" && out.stage < 3) {
    ctx.warn(s.child("offload_param"),
             fmt::format("ignored with ZeRO stage {} (parameter offload needs stage 3, as in "
                         "DeepSpeed)",
                         out.stage));
    out.offload_param = OffloadConfig{};
  }
}

// The section as an object; returns whether the stage was valid.
bool read_zero_object(ReadContext& ctx, Section& root, ZeroConfig& out) {
  Section s = root.section("zero_optimization");
  const bool stage_valid = !s.has("stage") || s.get_int("stage", out.stage, 0, 3);
  if (!s.has("stage")) s.raw("stage");
  s.get_bool("contiguous_gradients", out.contiguous_gradients);
  bool overlap_given = s.get_bool("overlap_comm", out.overlap_comm);
  if (!overlap_given && !s.has("overlap_comm")) out.overlap_comm = out.stage == 3;
  s.get_bool("reduce_scatter", out.reduce_scatter);
  s.get_int("reduce_bucket_size", out.reduce_bucket_size, 1, kI64Max);
  s.get_int("allgather_bucket_size", out.allgather_bucket_size, 1, kI64Max);
  read_offload(ctx, s, "offload_optimizer", out.offload_optimizer);
  read_offload(ctx, s, "offload_param", out.offload_param);
  read_stage3_sizes(ctx, s, out);
  read_deprecated_offload_keys(ctx, s, out);
  s.ignored(kDsZeroIgnored);
  s.finish();
  if (stage_valid) drop_offload_below_stage(ctx, s, out);
  return stage_valid;
}

Json offload_to_json(const OffloadConfig& o) {
  return Json{{"device", o.device}, {"pin_memory", o.pin_memory}};
}

}  // namespace

bool read_zero(ReadContext& ctx, Section& root, ZeroConfig& out) {
  const Json* z = root.raw("zero_optimization");
  if (!z || !z->is_boolean()) return read_zero_object(ctx, root, out);
  // DeepSpeed's deprecated form: true means stage 1.
  out.stage = z->get<bool>() ? 1 : 0;
  ctx.warn(root.child("zero_optimization"),
           "deprecated DeepSpeed form; read as {\"stage\": " + std::to_string(out.stage) + "}");
  out.overlap_comm = false;
  return true;
}

Json zero_to_json(const ZeroConfig& c) {
  return Json{{"stage", c.stage},
              {"contiguous_gradients", c.contiguous_gradients},
              {"overlap_comm", c.overlap_comm},
              {"reduce_scatter", c.reduce_scatter},
              {"reduce_bucket_size", c.reduce_bucket_size},
              {"allgather_bucket_size", c.allgather_bucket_size},
              {"offload_optimizer", offload_to_json(c.offload_optimizer)},
              {"offload_param", offload_to_json(c.offload_param)},
              {"stage3_prefetch_bucket_size", c.stage3_prefetch_bucket_size},
              {"stage3_param_persistence_threshold", c.stage3_param_persistence_threshold},
              {"stage3_max_live_parameters", c.stage3_max_live_parameters}};
}

}  // namespace ds::config::detail
