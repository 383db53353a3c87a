// The precision sections: fp16 (with DeepSpeed's dynamic loss scaling keys) and bf16, which
// DeepSpeed also accepts under its old name "bfloat16". That both cannot be enabled is a rule
// across the two, checked with the other cross-section rules (config_validate.cpp).
#include <fmt/format.h>

#include "config/config_sections.h"

namespace ds::config::detail {

namespace {

const std::vector<std::string> kDsFp16Ignored = {"auto_cast", "consecutive_hysteresis",
                                                 "fused_mode", "fp16_master_weights_and_grads"};
const std::vector<std::string> kDsBf16Ignored = {"immediate_grad_update", "check_grad_overflow",
                                                 "bf16_master_weights_and_grads",
                                                 "bf16_optimizer_states"};

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
  s.finish();
}

Json bf16_to_json(const Bf16Config& c) { return Json{{"enabled", c.enabled}}; }

}  // namespace ds::config::detail
