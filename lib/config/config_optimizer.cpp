// The optimizer and scheduler sections, with DeepSpeed's names. The optimizer is Adam or AdamW
// (decoupled weight decay: always for "AdamW", for "Adam" unless params.adam_w_mode is false, as
// in DeepSpeed). The scheduler is one of DeepSpeed's warmup schedules (WarmupLR, WarmupDecayLR,
// WarmupCosineLR, deepspeed/runtime/lr_schedules.py), read in two steps: its type where the
// file's order puts it, its parameters once optimizer.lr and training.steps are known, since
// WarmupLR's warmup_max_lr defaults to the lr and the decaying schedules' total_num_steps to the
// training steps. A parameter of another schedule type is an error, as DeepSpeed's constructors
// reject unexpected keyword arguments.
#include <fmt/format.h>

#include "config/config_sections.h"

namespace ds::config::detail {

namespace {

const std::vector<std::string> kDsOptimizerIgnored = {"legacy_fusion"};
const std::vector<std::string> kDsOptimizerParamsIgnored = {"torch_adam", "bias_correction",
                                                            "amsgrad", "max_grad_norm"};

void read_betas(ReadContext& ctx, Section& p, OptimizerConfig& out) {
  const Json* betas = p.raw("betas");
  if (!betas || auto_needs_value(ctx, p.child("betas"), *betas)) return;
  bool ok = betas->is_array() && betas->size() == 2 && (*betas)[0].is_number() &&
            (*betas)[1].is_number();
  double b1 = ok ? (*betas)[0].get<double>() : 0, b2 = ok ? (*betas)[1].get<double>() : 0;
  if (!ok || b1 < 0 || b1 >= 1 || b2 < 0 || b2 >= 1) {
    ctx.error(p.child("betas"),
              fmt::format("expected [beta1, beta2] with each in [0, 1), got {}", show(*betas)));
  } else {
    out.beta1 = b1;
    out.beta2 = b2;
  }
}

void read_adam_w_mode(ReadContext& ctx, Section& p, OptimizerConfig& out) {
  bool w_mode = true;
  bool w_given = p.get_bool("adam_w_mode", w_mode);
  if (out.type == "AdamW") {
    if (w_given && !w_mode) {
      ctx.warn(p.child("adam_w_mode"),
               "ignored: \"AdamW\" always uses decoupled weight decay (as in DeepSpeed); use "
               "\"Adam\" with adam_w_mode false for L2 weight decay");
    }
    out.adam_w_mode = true;
  } else {
    out.adam_w_mode = w_mode;
  }
}

// The decaying schedules' total_num_steps: given, or training.steps.
void read_total_num_steps(ReadContext& ctx, Section& sched, Section& p, const JobConfig& cfg,
                          bool steps_valid, SchedulerConfig& out) {
  if (p.has("total_num_steps")) {
    p.get_int("total_num_steps", out.total_num_steps, 1, kI64Max);
    return;
  }
  p.raw("total_num_steps");
  if (steps_valid) {
    out.total_num_steps = cfg.training.steps;
  } else {
    ctx.error(p.present() ? p.path() : sched.path(),
              fmt::format("{} needs params.total_num_steps (or training.steps to take it from)",
                          out.type));
  }
}

// Parameters of the other DeepSpeed warmup schedules: name the type they do not fit.
void reject_foreign_params(ReadContext& ctx, Section& p, const std::string& type) {
  std::vector<std::string> foreign;
  if (type == "WarmupCosineLR") {
    foreign = {"warmup_min_lr", "warmup_max_lr"};
  } else {
    foreign = {"warmup_min_ratio", "cos_min_ratio"};
    if (type == "WarmupLR") foreign.push_back("total_num_steps");
  }
  for (const auto& k : foreign) {
    if (!p.has(k)) continue;
    p.raw(k);
    ctx.error(p.child(k), fmt::format("not a parameter of {} (DeepSpeed would reject it)", type));
  }
}

void read_params_of_type(ReadContext& ctx, Section& sched, Section& p, const JobConfig& cfg,
                         bool steps_valid, SchedulerConfig& out) {
  const std::string& t = out.type;
  if (t != "WarmupCosineLR") {
    p.get_number("warmup_min_lr", out.warmup_min_lr, 0);
    bool max_given = p.get_number("warmup_max_lr", out.warmup_max_lr, 0);
    if (!max_given && t == "WarmupLR" && !p.has("warmup_max_lr")) {
      out.warmup_max_lr = cfg.optimizer.lr;
    }
  } else {
    p.get_number("warmup_min_ratio", out.warmup_min_ratio, 0, 1);
    p.get_number("cos_min_ratio", out.cos_min_ratio, 0, 1);
  }
  p.get_int("warmup_num_steps", out.warmup_num_steps, 1, kI64Max);
  p.get_choice("warmup_type", out.warmup_type, {"log", "linear"});
  if (t != "WarmupLR") read_total_num_steps(ctx, sched, p, cfg, steps_valid, out);
  if (p.has("last_batch_iteration")) {
    p.raw("last_batch_iteration");
    ctx.warn(p.child("last_batch_iteration"),
             "DeepSpeed key accepted but not acted on by dstrain (resuming restores the step "
             "from the checkpoint)");
  }
  reject_foreign_params(ctx, p, t);
}

}  // namespace

void read_optimizer(ReadContext& ctx, Section& root, OptimizerConfig& out) {
  Section s = root.section("optimizer");
  s.get_choice("type", out.type, {"Adam", "AdamW"}, /*case_insensitive=*/true);
  Section p = s.section("params");
  p.get_number("lr", out.lr, 0);
  read_betas(ctx, p, out);
  p.get_number("eps", out.eps, 0, kInf, /*lo_open=*/true);
  p.get_number("weight_decay", out.weight_decay, 0);
  read_adam_w_mode(ctx, p, out);
  p.ignored(kDsOptimizerParamsIgnored);
  p.finish();
  s.ignored(kDsOptimizerIgnored);
  s.finish();
}

Json optimizer_to_json(const OptimizerConfig& c) {
  return Json{{"type", c.type},
              {"params", Json{{"lr", c.lr},
                              {"betas", Json::array({c.beta1, c.beta2})},
                              {"eps", c.eps},
                              {"weight_decay", c.weight_decay},
                              {"adam_w_mode", c.adam_w_mode}}}};
}

SchedulerSection read_scheduler_type(ReadContext& ctx, Section& root, SchedulerConfig& out) {
  SchedulerSection sched{root.section("scheduler", /*nullable=*/true)};
  if (!sched.section.present()) return sched;
  Section& s = sched.section;
  const Json* t = s.raw("type");
  if (!t) {
    ctx.error(s.path(), "missing \"type\" (expected one of \"WarmupLR\", \"WarmupDecayLR\", "
                        "\"WarmupCosineLR\"; omit the section for a constant lr)");
  } else if (t->is_string() && (t->get<std::string>() == "OneCycle" ||
                                t->get<std::string>() == "LRRangeTest")) {
    ctx.error(s.child("type"),
              fmt::format("{} is a DeepSpeed schedule dstrain does not implement (expected one "
                          "of \"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\")",
                          show(*t)));
  } else {
    sched.type_valid =
        s.get_choice("type", out.type, {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"});
  }
  return sched;
}

void read_scheduler_params(ReadContext& ctx, SchedulerSection& sched, const JobConfig& cfg,
                           bool steps_valid, SchedulerConfig& out) {
  if (!sched.section.present()) return;
  Section p = sched.section.section("params");
  if (sched.type_valid) {
    read_params_of_type(ctx, sched.section, p, cfg, steps_valid, out);
  } else {
    // Unknown type: the type error says it all; accept every DeepSpeed parameter name.
    for (const char* k : {"warmup_min_lr", "warmup_max_lr", "warmup_min_ratio", "cos_min_ratio",
                          "total_num_steps", "warmup_num_steps", "warmup_type",
                          "last_batch_iteration"}) {
      p.raw(k);
    }
  }
  p.finish();
  sched.section.finish();
}

Json scheduler_to_json(const SchedulerConfig& c) {
  if (c.type.empty()) return nullptr;
  Json p = Json::object();
  if (c.type == "WarmupCosineLR") {
    p["warmup_min_ratio"] = c.warmup_min_ratio;
    p["cos_min_ratio"] = c.cos_min_ratio;
  } else {
    p["warmup_min_lr"] = c.warmup_min_lr;
    p["warmup_max_lr"] = c.warmup_max_lr;
  }
  p["warmup_num_steps"] = c.warmup_num_steps;
  p["warmup_type"] = c.warmup_type;
  if (c.type != "WarmupLR") p["total_num_steps"] = c.total_num_steps;
  return Json{{"type", c.type}, {"params", p}};
}

}  // namespace ds::config::detail
