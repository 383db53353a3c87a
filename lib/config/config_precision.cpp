// The precision sections: fp16 (with DeepSpeed's dynamic loss scaling keys) and bf16, which
// DeepSpeed also accepts under its old name "bfloat16"; and the gradients' type, DeepSpeed's
// data_types.grad_accum_dtype and top-level communication_data_type. That fp16 and bf16 cannot
// both be enabled, and which gradient types go with a storage type, are rules across sections
// (config_validate.cpp).
#include <fmt/format.h>

#include "config/config_sections.h"

namespace ds::config::detail {

namespace {

const std::vector<std::string> kDsFp16Ignored = {"auto_cast", "consecutive_hysteresis",
                                                 "fused_mode", "fp16_master_weights_and_grads"};
const std::vector<std::string> kDsBf16Ignored = {"immediate_grad_update", "check_grad_overflow",
                                                 "bf16_master_weights_and_grads",
                                                 "bf16_optimizer_states"};

// fp16's loss-scaling keys, found inside bf16 in configs copied from fp16 ones (DeepSpeed's own
// tests/torch_compile configs carried loss_scale, loss_scale_window, hysteresis, min_loss_scale and
// initial_scale_power until 2026). DeepSpeed up to 0.17.0 read bf16 key by key and ignored them;
// from 0.17.1 its DeepSpeedBF16Config forbids unknown keys. bf16 needs no loss scaling, so dstrain
// ignores them with a warning that says so; any other unknown bf16 key is an error.
const std::vector<std::string> kFp16KeysInBf16 = {"loss_scale", "initial_scale_power", "loss_scale_window",
                                                  "hysteresis", "consecutive_hysteresis", "min_loss_scale",
                                                  "auto_cast"};

void warn_fp16_keys_in_bf16(ReadContext& ctx, Section& s) {
  for (const auto& k : kFp16KeysInBf16) {
    if (s.raw(k) == nullptr) continue;  // declared either way, so a misspelling gets its did-you-mean
    ctx.warn(s.child(k), "fp16's loss-scaling key inside bf16, ignored: bf16 needs no loss scaling (DeepSpeed "
                         "0.17.0 and older ignore it too; DeepSpeed 0.17.1 and newer reject it, so remove it)");
  }
}

}  // namespace

void read_fp16(Section& root, Fp16Config& out) {
  Section s = root.section("fp16");
  s.get_bool("enabled", out.enabled);
  s.get_number("loss_scale", out.loss_scale, 0);
  s.get_int("initial_scale_power", out.initial_scale_power, 0, 63);
  s.get_int("loss_scale_window", out.loss_scale_window, 1);
  s.get_int("hysteresis", out.hysteresis, 1);
  s.get_number("min_loss_scale", out.min_loss_scale, 0, kInf, /*lo_open=*/true);
  s.ignored(kDsFp16Ignored);
  s.finish();
}

Json fp16_to_json(const Fp16Config& c) {
  return Json{{"enabled", c.enabled},
              {"loss_scale", c.loss_scale},
              {"initial_scale_power", c.initial_scale_power},
              {"loss_scale_window", c.loss_scale_window},
              {"hysteresis", c.hysteresis},
              {"min_loss_scale", c.min_loss_scale}};
}

void read_bf16(ReadContext& ctx, Section& root, Bf16Config& out) {
  bool new_name = root.has("bf16"), old_name = root.has("bfloat16");
  root.raw("bf16");
  root.raw("bfloat16");
  if (new_name && old_name) {
    ctx.error(root.child("bfloat16"),
              "both \"bf16\" and its old name \"bfloat16\" are given; keep \"bf16\"");
  }
  const std::string key = (!new_name && old_name) ? "bfloat16" : "bf16";
  if (key == "bfloat16") {
    ctx.warn(root.child(key), "old DeepSpeed name for \"bf16\"; read as \"bf16\"");
  }
  Section s = root.section(key);
  s.get_bool("enabled", out.enabled);
  s.ignored(kDsBf16Ignored);
  warn_fp16_keys_in_bf16(ctx, s);
  s.finish();
}

Json bf16_to_json(const Bf16Config& c) { return Json{{"enabled", c.enabled}}; }

namespace {
// One of DeepSpeed's dtype names (fp32/float32/float, bf16/bfloat16, fp16/float16/half).
void read_dtype(Section& s, const std::string& key, std::optional<layout::Precision>& out) {
  std::string name;
  if (!s.get_choice(key, name, {"fp32", "bf16", "fp16", "float32", "float", "bfloat16", "float16", "half"}, true)) {
    return;
  }
  if (name == "fp32" || name == "float32" || name == "float") out = layout::Precision::kFp32;
  else if (name == "bf16" || name == "bfloat16") out = layout::Precision::kBf16;
  else out = layout::Precision::kFp16;
}
}  // namespace

void read_gradient_types(Section& root, GradientTypesConfig& out) {
  Section s = root.section("data_types");
  read_dtype(s, "grad_accum_dtype", out.grad_accum_dtype);
  s.finish();
  if (root.has("communication_data_type") && root.raw("communication_data_type")->is_null()) return;
  read_dtype(root, "communication_data_type", out.communication_data_type);
}

void gradient_types_to_json(const JobConfig& c, Json& out) {
  const char* name = layout::precision_name(c.gradient_dtype());
  out["data_types"] = Json{{"grad_accum_dtype", name}};
  out["communication_data_type"] = name;
}

}  // namespace ds::config::detail
